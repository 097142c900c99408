use super::*;
use crate::ObjectId;

/// The contract every remote keeps: create-if-absent uploads, compare-and-swap on small files,
/// listing, bounded downloads, atomic replacement, deletion, ranged head reads.
fn contract(remote: &dyn Remote) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("obj");
    std::fs::write(&file, b"object bytes").unwrap();
    let id = ObjectId::hash(b"x");
    let key = object_key(&id);
    assert_eq!(object_of_key(&key), Some(id));
    assert_eq!(
        remote.upload(&key, &std::fs::File::open(&file).unwrap(), &file, 12, UploadMode::CreateOnly).unwrap(),
        Uploaded::Created
    );
    assert!(remote.exists(&key).unwrap());
    assert!(!remote.exists(&object_key(&ObjectId::hash(b"absent"))).unwrap());
    std::fs::write(&file, b"OTHER bytes!").unwrap();
    assert_eq!(
        remote.upload(&key, &std::fs::File::open(&file).unwrap(), &file, 12, UploadMode::CreateOnly).unwrap(),
        Uploaded::Existed
    );
    let mut out = Vec::new();
    remote.download(&key, &mut out, 100).unwrap();
    assert_eq!(out, b"object bytes", "an existing object is never replaced");
    // A resumed download: the bytes after those a killed one kept.
    let mut rest = Vec::new();
    assert_eq!(remote.download_from(&key, 7, &mut rest, 100).unwrap(), 5);
    assert_eq!(rest, b"bytes");
    assert_eq!(remote.download_from(&key, 12, &mut Vec::new(), 100).unwrap(), 0, "nothing was missing");
    assert!(matches!(remote.download_from(&key, 13, &mut Vec::new(), 100), Err(Error::Shorter { size: 12, .. })));
    assert!(matches!(remote.download_from(&key, 7, &mut Vec::new(), 11), Err(Error::TooLarge { .. })));
    assert!(matches!(remote.download(&key, &mut Vec::new(), 5), Err(Error::TooLarge { .. })));
    assert!(matches!(remote.download("objects/00/none", &mut Vec::new(), 5), Err(Error::NotFound { .. })));
    assert_eq!(remote.list("objects/").unwrap(), vec![key.clone()]);

    assert_eq!(remote.get_small("refs/heads/main").unwrap(), None);
    remote.put_small("refs/heads/main", b"one\n", &Expect::Absent).unwrap();
    assert!(matches!(remote.put_small("refs/heads/main", b"two\n", &Expect::Absent), Err(Error::Conflict { .. })));
    let seen = remote.get_small("refs/heads/main").unwrap().unwrap();
    assert_eq!(seen.bytes, b"one\n");
    remote.put_small("refs/heads/main", b"two\n", &Expect::Tag(seen.tag.clone())).unwrap();
    assert!(
        matches!(remote.put_small("refs/heads/main", b"three\n", &Expect::Tag(seen.tag)), Err(Error::Conflict { .. })),
        "a stale tag loses"
    );
    assert_eq!(remote.get_small("refs/heads/main").unwrap().unwrap().bytes, b"two\n");
    let mut refs = remote.list("refs/").unwrap();
    refs.sort();
    assert_eq!(refs, vec!["refs/heads/main".to_string()]);

    // Replace (a mirror push's recode, a journal): the new bytes, whole; a ranged head read.
    std::fs::write(&file, b"replacement, longer").unwrap();
    remote.replace(&key, &std::fs::File::open(&file).unwrap(), &file, 19).unwrap();
    let mut out = Vec::new();
    remote.download(&key, &mut out, 100).unwrap();
    assert_eq!(out, b"replacement, longer");
    assert_eq!(remote.read_head(&key, 5).unwrap(), (b"repla".to_vec(), 19));
    assert_eq!(remote.read_head(&key, 100).unwrap(), (b"replacement, longer".to_vec(), 19));
    assert!(matches!(remote.read_head("objects/00/none", 5), Err(Error::NotFound { .. })));
    // Ranged reads: exactly the range, or an error (never fewer bytes).
    assert_eq!(remote.read_range(&key, 3..9).unwrap(), b"laceme");
    assert_eq!(remote.read_range(&key, 0..19).unwrap(), b"replacement, longer");
    assert_eq!(remote.read_range(&key, 4..4).unwrap(), b"");
    let past = remote.read_range(&key, 15..25);
    assert!(matches!(past, Err(Error::WrongRange { start: 15, end: 25, got: 4, .. })), "{past:?}");
    assert!(matches!(remote.read_range("objects/00/none", 0..5), Err(Error::NotFound { .. })));
    remote.replace("pending/x", &std::fs::File::open(&file).unwrap(), &file, 19).unwrap();
    assert_eq!(remote.list("pending/").unwrap(), vec!["pending/x".to_string()]);
    remote.delete("pending/x").unwrap();
    remote.delete("pending/x").unwrap();
    assert_eq!(remote.list("pending/").unwrap(), Vec::<String>::new());
    assert!(remote.requests() > 0);
}

#[test]
fn directory_remote_keeps_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().join("r").to_str().unwrap().to_string();
    assert!(matches!(local::DirRemote::open(&url), Err(Error::BadUrl { .. })), "a missing directory is an error");
    let remote = local::DirRemote::create(&url).unwrap();
    contract(&remote);
}

#[test]
fn memory_remote_keeps_the_contract() {
    contract(&s3::StoreRemote::memory());
}

#[test]
fn urls() {
    assert!(matches!(open("ftp://x", &S3Options::default()), Err(Error::BadUrl { .. })));
    assert!(matches!(open("s3://", &S3Options::default()), Err(Error::BadUrl { .. })));
    assert_eq!(object_of_key("objects/ab/cd"), None);
    assert_eq!(object_of_key("refs/heads/main"), None);
}

/// The error of opening `url`, which must fail.
fn refused(url: &str, options: &S3Options) -> Error {
    match open(url, options) {
        Ok(_) => panic!("{url} opened"),
        Err(e) => e,
    }
}

#[test]
fn gcs_and_azure_urls() {
    let none = S3Options::default();
    for bad in ["gs://", "gs:///prefix", "az://", "azure:///p"] {
        let err = refused(bad, &none);
        assert!(matches!(&err, Error::BadUrl { reason, .. } if reason.contains("no bucket")), "{bad}: {err}");
    }
    // Secrets in the URL, and a region, are refused before anything is built or contacted.
    for bad in ["gs://k:SeCrEt@bucket/p", "az://container/p?sig=SeCrEt", "azure://c/p#SeCrEt"] {
        let err = refused(bad, &none).to_string();
        assert!(!err.contains("SeCrEt") && err.contains("GOOGLE_APPLICATION_CREDENTIALS"), "{err}");
    }
    let region = S3Options { region: Some("eu-west-1".into()), ..S3Options::default() };
    for url in ["gs://bucket/p", "az://container/p"] {
        let err = refused(url, &region).to_string();
        assert!(err.contains("s3:// remotes only"), "{err}");
    }
    // An emulator given in process: no credentials are looked up; the URL shown is the remote's.
    let gcs = s3::StoreRemote::gcs_emulator("gs://bucket/team/run1/", "127.0.0.1:1").unwrap();
    assert_eq!(gcs.url(), "gs://bucket/team/run1/");
    let emulator = s3::StoreRemote::gcs_emulator("gs://bucket/p", "http://u:SeCrEt@127.0.0.1:1");
    assert!(emulator.is_ok(), "the in-process emulator host is the caller's to check");
    let endpoint = S3Options { endpoint: Some("http://127.0.0.1:1/devstoreaccount1".into()), ..S3Options::default() };
    let azure = s3::StoreRemote::azure_with_key("azure://container/p", &endpoint, "devstoreaccount1", "a2V5").unwrap();
    assert_eq!(azure.url(), "azure://container/p");
    let no_azure_env = ["AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_USE_EMULATOR", "AZURE_STORAGE_ACCOUNT"]
        .iter()
        .all(|v| std::env::var_os(v).is_none());
    if no_azure_env {
        let err = refused("az://container/p", &none).to_string();
        assert!(err.contains("AZURE_STORAGE_ACCOUNT_NAME"), "{err}");
    }
    assert!(is_object_store("gs://b") && is_object_store("az://c") && is_object_store("azure://c"));
    assert!(!is_object_store("file:///x") && !is_object_store("/data/gs://x"));
}

#[test]
fn emulator_settings_are_read_as_google_and_azure_tools_read_them() {
    assert_eq!(s3::emulator_url("127.0.0.1:4443"), "http://127.0.0.1:4443");
    assert_eq!(s3::emulator_url(" http://localhost:9023/ "), "http://localhost:9023");
    assert_eq!(s3::emulator_url("https://gcs.test"), "https://gcs.test");
    for yes in ["true", "TRUE", "1", "yes", "on", "y"] {
        assert!(s3::is_truthy(yes), "{yes}");
    }
    for no in ["false", "0", "", "no", "off", "2"] {
        assert!(!s3::is_truthy(no), "{no}");
    }
}

#[test]
fn urls_are_redacted_and_secrets_refused() {
    assert_eq!(redact_url("s3://AKIA:secret@bucket/p"), "s3://***@bucket/p");
    assert_eq!(redact_url("s3://bucket/p?X-Amz-Signature=abc&x=1#frag"), "s3://bucket/p?X-Amz-Signature=***&x=***#***");
    assert_eq!(redact_url("http://u:p@host:9000"), "http://***@host:9000");
    assert_eq!(redact_url("/data/remote@2"), "/data/remote@2", "a plain path is not a URL");
    assert_eq!(redact_url("s3://bucket/a@b"), "s3://bucket/a@b", "an @ in the path is not user information");
    for bad in ["s3://k:s@bucket/p", "s3://bucket/p?token=x", "http://h:1/#x", "file://u@localhost/x"] {
        let err = check_no_secrets(bad).unwrap_err().to_string();
        assert!(err.contains("AWS_ACCESS_KEY_ID") && !err.contains(":s@") && !err.contains("token=x"), "{err}");
    }
    for good in ["s3://bucket/p", "/data/a@b?c", "file:///data/x", "http://127.0.0.1:9000", "s3://bucket/a@b"] {
        assert!(check_no_secrets(good).is_ok(), "{good}");
    }
}

#[test]
fn urls_in_other_layers_messages_are_masked() {
    let text = "Error performing GET http://u:SeCrEt@127.0.0.1:9000/bk?list-type=2&prefix=x%2F in 5s - \
                error sending request for url (https://h/p?X-Amz-Signature=SeCrEt). See \"s3://k:SeCrEt@b/p\".";
    let masked = mask_urls(text);
    assert!(!masked.contains("SeCrEt"), "{masked}");
    assert!(masked.contains("GET http://***@127.0.0.1:9000/bk?list-type=***&prefix=*** in 5s"), "{masked}");
    assert!(masked.contains("(https://h/p?X-Amz-Signature=***)."), "closing punctuation is kept: {masked}");
    assert!(masked.contains("\"s3://***@b/p\""), "{masked}");
    assert_eq!(mask_urls("no url: a :// b, /data/a@b?c"), "no url: a :// b, /data/a@b?c");
    assert_eq!(mask_urls("://u:p@h"), "://***@h", "a URL without a scheme is masked too");
    // A backend error's whole chain, masked, with no source left to print unmasked.
    let inner = std::io::Error::other("connect to http://u:SeCrEt@h:1/ failed");
    let outer = Error::Io { remote: "r".into(), action: "reading", path: "k".into(), source: inner };
    let m = Masked::new(&outer);
    assert!(!m.to_string().contains("SeCrEt") && m.to_string().contains("http://***@h:1/"), "{m}");
    assert!(std::error::Error::source(&m).is_none());
}

#[test]
fn an_environment_endpoint_with_credentials_is_refused_in_its_words() {
    let err = check_env_endpoint("AWS_ENDPOINT_URL", "http://u:SeCrEt@h:1").unwrap_err().to_string();
    assert!(err.contains("AWS_ENDPOINT_URL") && err.contains("AWS_ACCESS_KEY_ID") && !err.contains("SeCrEt"), "{err}");
    assert!(check_env_endpoint("AWS_ENDPOINT_URL", "http://h:1").is_ok());
}

/// Makes `path` a named pipe.
fn mkfifo(path: &std::path::Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    #[allow(unsafe_code)]
    let made = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(made, 0);
}

#[test]
fn a_directory_remote_lists_what_is_not_a_file_and_refuses_to_read_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r");
    let remote = local::DirRemote::create(root.to_str().unwrap()).unwrap();
    remote.put_small("refs/heads/main", b"x\n", &Expect::Absent).unwrap();
    let heads = root.join("refs/heads");
    mkfifo(&heads.join("pipe"));
    std::os::unix::fs::symlink(heads.join("main"), heads.join("link")).unwrap();
    std::fs::create_dir(heads.join("empty")).unwrap();
    std::fs::create_dir_all(heads.join("full/deeper")).unwrap();
    std::fs::write(heads.join("full/deeper/x"), b"x\n").unwrap();
    let mut keys = remote.list("refs/").unwrap();
    keys.sort();
    let expected =
        ["refs/heads/empty", "refs/heads/full/deeper/x", "refs/heads/link", "refs/heads/main", "refs/heads/pipe"];
    assert_eq!(keys, expected, "the layout's own empty directories are no keys");
    assert_eq!(remote.list_modified("refs/").unwrap().len(), expected.len());
    for (key, what) in
        [("refs/heads/pipe", "named pipe"), ("refs/heads/link", "symbolic link"), ("refs/heads/empty", "directory")]
    {
        let err = remote.get_small(key).unwrap_err().to_string();
        assert!(err.contains(key) && err.contains(what), "{err}");
        for err in [
            remote.download(key, &mut Vec::new(), 100).unwrap_err(),
            remote.read_head(key, 10).unwrap_err(),
            remote.exists(key).unwrap_err(),
            remote.modified(key).unwrap_err(),
        ] {
            assert!(err.to_string().contains(what), "{err}");
        }
    }
    std::fs::create_dir_all(root.join("objects/ab")).unwrap();
    std::fs::create_dir_all(root.join("objects/cd/").join("e".repeat(62))).unwrap();
    assert_eq!(
        remote.list("objects/").unwrap(),
        [format!("objects/cd/{}", "e".repeat(62))],
        "fan-outs are the layout's"
    );
    assert_eq!(remote.get_small("refs/heads/main").unwrap().unwrap().bytes, b"x\n");
    assert!(remote.get_small("refs/heads/none").unwrap().is_none());
    // An upload onto a key that is not a file is an error naming it, not "already there".
    let file = dir.path().join("obj");
    std::fs::write(&file, b"bytes").unwrap();
    let err = remote.upload("refs/heads/pipe", &std::fs::File::open(&file).unwrap(), &file, 5, UploadMode::CreateOnly);
    assert!(err.unwrap_err().to_string().contains("named pipe"));
    // A directory of the layout that is a link to one (on another disk) is walked.
    let elsewhere = dir.path().join("tags-elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("v1"), b"x\n").unwrap();
    std::fs::remove_dir(root.join("refs/tags")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, root.join("refs/tags")).unwrap();
    assert!(remote.list("refs/").unwrap().contains(&"refs/tags/v1".to_string()));
    assert!(!remote.exists("refs/heads/none").unwrap());
}

/// A multipart upload resumes the upload its state file names, or, when that cannot be done
/// (the upload is gone, the state describes other bytes or is garbage), starts over; either
/// way the object arrives whole and the state file is removed.
#[test]
fn a_multipart_upload_resumes_or_starts_over_from_its_state() {
    use super::upload_state::{state_path, write_state, PartDone, UploadState, FORMAT};
    let dir = tempfile::tempdir().unwrap();
    let transfers = dir.path().join("transfers");
    let file = dir.path().join("obj");
    let data: Vec<u8> = (0..330u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(&file, &data).unwrap();
    let key = object_key(&crate::ObjectId::hash(b"big"));
    let part = |index: u64, bytes: &[u8]| PartDone {
        index,
        size: bytes.len() as u64,
        etag: "\"e\"".into(),
        blake3: blake3::hash(bytes).to_hex().to_string(),
    };
    let state = |len: u64, parts: Vec<PartDone>| UploadState {
        format: FORMAT,
        remote: "memory://".into(),
        key: key.clone(),
        len,
        part_size: 64,
        upload_id: "999".into(),
        parts,
    };
    let path = state_path(&transfers, "memory://", &key);
    let cases: Vec<(&str, Option<Vec<u8>>)> = vec![
        ("no state", None),
        (
            "an upload the remote does not have",
            Some(serde_json::to_vec(&state(330, vec![part(0, &data[..64])])).unwrap()),
        ),
        ("another length", Some(serde_json::to_vec(&state(331, vec![])).unwrap())),
        ("a part whose bytes changed", Some(serde_json::to_vec(&state(330, vec![part(1, b"other")])).unwrap())),
        ("garbage", Some(b"\x00{not json".to_vec())),
        (
            "another key",
            Some(serde_json::to_vec(&UploadState { key: "objects/00/x".into(), ..state(330, vec![]) }).unwrap()),
        ),
    ];
    for (what, bytes) in cases {
        let mut remote = s3::StoreRemote::memory().with_part_size(64);
        remote.resume_uploads_in(&transfers);
        if let Some(bytes) = bytes {
            std::fs::create_dir_all(&transfers).unwrap();
            std::fs::write(&path, bytes).unwrap();
        }
        let f = std::fs::File::open(&file).unwrap();
        let uploaded = remote.upload(&key, &f, &file, 330, UploadMode::MayReplace).unwrap();
        assert_eq!(uploaded, Uploaded::Replaced, "{what}");
        let mut back = Vec::new();
        remote.download(&key, &mut back, 1000).unwrap();
        assert_eq!(back, data, "{what}");
        assert!(!path.exists(), "{what}: the state stays");
    }
    // A state written by a run that is then refused (a part of another length) never
    // resumes: checked before use.
    write_state(&path, &state(330, vec![PartDone { size: 63, ..part(0, &data[..64]) }])).unwrap();
    let mut remote = s3::StoreRemote::memory().with_part_size(64);
    remote.resume_uploads_in(&transfers);
    let f = std::fs::File::open(&file).unwrap();
    remote.upload(&key, &f, &file, 330, UploadMode::MayReplace).unwrap();
    assert!(!path.exists());
}

#[test]
fn a_range_answer_of_another_length_is_an_error() {
    let range = 10..20;
    assert_eq!(checked_range("r", "k", &range, vec![1; 10], false).unwrap(), vec![1; 10]);
    for (bytes, more) in [(vec![1; 9], false), (vec![1; 11], false), (vec![1; 10], true)] {
        let e = checked_range("r", "k", &range, bytes, more).unwrap_err().to_string();
        assert!(e.contains("asked for bytes 10..20"), "{e}");
    }
}
