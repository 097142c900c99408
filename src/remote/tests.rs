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
