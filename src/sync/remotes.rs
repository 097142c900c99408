//! The remote list (`.ckpt/remotes`: NAME → URL and settings) and the remote's refs
//! (`refs/heads/NAME`, `refs/tags/NAME` holding a version id), moved by compare-and-swap.

use super::layout::Layout;
use super::transfer::OBJECT_ATTEMPTS;
use super::{Error, Result};
use crate::object_id::ObjectId;
use crate::remote::{self, Expect, Remote, S3Options};
use crate::repo::Error as RepoError;
use crate::repo::{check_name, RefKind, Repo, VersionId};
use std::collections::BTreeMap;
use std::path::Path;

/// The list of remotes, a JSON object NAME → [`RemoteConfig`].
const REMOTES_FILE: &str = "remotes";

/// One configured remote.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteConfig {
    /// `s3://bucket/prefix`, `file:///path` or a directory path.
    pub url: String,
    /// S3 settings stored with the remote (never credentials).
    #[serde(default, skip_serializing_if = "is_default")]
    pub s3: S3Options,
    /// How the remote stores versions ([`Layout::Mirror`] unless set; the default is not
    /// written).
    #[serde(default, skip_serializing_if = "Layout::is_default")]
    pub layout: Layout,
}

fn is_default(o: &S3Options) -> bool {
    *o == S3Options::default()
}

/// `url` with a relative directory path (plain or `file://`) made absolute against `base`;
/// any other URL as it is.
pub fn absolute_dir_url(url: &str, base: &Path) -> String {
    let (scheme, path) = match url.strip_prefix("file://") {
        Some(p) => ("file://", p),
        None if url.contains("://") => return url.to_string(),
        None => ("", url),
    };
    if path.is_empty() || Path::new(path).is_absolute() {
        return url.to_string();
    }
    let joined = base.join(path);
    match joined.to_str() {
        Some(p) => format!("{scheme}{p}"),
        None => url.to_string(),
    }
}

/// What happened to one ref.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RefUpdate {
    /// `branch` or `tag`.
    pub kind: &'static str,
    /// Its name.
    pub name: String,
    /// Where it was (on the remote for a push, locally for a fetch), if anywhere.
    pub old: Option<VersionId>,
    /// Where it is now.
    pub new: VersionId,
}

pub(super) fn ref_key(kind: RefKind, name: &str) -> String {
    match kind {
        RefKind::Branch => format!("refs/heads/{name}"),
        RefKind::Tag => format!("refs/tags/{name}"),
    }
}

pub(super) fn parse_ref(remote: &dyn Remote, key: &str, bytes: &[u8]) -> Result<VersionId> {
    let bad = || Error::BadRemoteRef { remote: remote.url().to_string(), key: key.to_string() };
    let text = std::str::from_utf8(bytes).map_err(|_| bad())?;
    let hex = text.strip_suffix('\n').ok_or_else(bad)?;
    hex.parse::<ObjectId>().ok().filter(|id| id.to_hex() == hex).ok_or_else(bad)
}

/// Moves the remote ref `key` to `id` by compare-and-swap against `expect`. A failed put is
/// ambiguous (a dropped connection or a timeout may come after the server moved the ref), so
/// the ref is read back: if it holds `id`, the put took effect; if it is still as `expect`
/// says, the put is tried again (up to [`OBJECT_ATTEMPTS`] times; the compare-and-swap keeps
/// that safe); if it changed, that is [`remote::Error::Conflict`].
pub(super) fn put_ref(remote: &dyn Remote, key: &str, id: &VersionId, expect: &Expect) -> remote::Result<()> {
    let text = format!("{id}\n");
    let mut attempt = 1;
    loop {
        let error = match remote.put_small(key, text.as_bytes(), expect) {
            Ok(()) => return Ok(()),
            Err(e @ (remote::Error::Backend { .. } | remote::Error::Conflict { .. })) => e,
            Err(e) => return Err(e),
        };
        let Ok(current) = remote.get_small(key) else { return Err(error) };
        let unchanged = match (expect, &current) {
            (_, Some(small)) if small.bytes == text.as_bytes() => return Ok(()),
            (Expect::Absent, None) => true,
            (Expect::Tag(tag), Some(small)) => small.tag == *tag,
            _ => false,
        };
        if !unchanged || !matches!(error, remote::Error::Backend { .. }) || attempt >= OBJECT_ATTEMPTS {
            return Err(error);
        }
        std::thread::sleep(std::time::Duration::from_millis(100 << attempt));
        attempt += 1;
    }
}

/// The configured remotes, by name.
pub fn remotes(repo: &Repo) -> Result<BTreeMap<String, RemoteConfig>> {
    let path = repo.ckpt_dir().join(REMOTES_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| Error::from(RepoError::Config { path: path.clone(), reason: format!("remotes: {e}") })),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(source) => Err(Error::Io { action: "reading", path, source }),
    }
}

pub(super) fn write_remotes(repo: &Repo, remotes: &BTreeMap<String, RemoteConfig>) -> Result<()> {
    let mut text = serde_json::to_string_pretty(remotes).expect("remotes serialize");
    text.push('\n');
    Ok(repo.refs().write(&repo.ckpt_dir().join(REMOTES_FILE), &text)?)
}

/// Adds remote `name` at `url` with `layout` (checked by opening it: a directory remote is
/// created). A relative directory path is stored made absolute against the current directory;
/// a URL with credentials in it (user information, a query string) is refused
/// ([`remote::check_no_secrets`]).
pub fn add_remote(repo: &Repo, name: &str, url: &str, s3: S3Options, layout: Layout) -> Result<()> {
    check_name(name)?;
    let _lock = repo.lock()?;
    let mut remotes = remotes(repo)?;
    if remotes.contains_key(name) {
        return Err(Error::RemoteExists { name: name.into() });
    }
    remote::check_no_secrets(url)?;
    if let Some(endpoint) = &s3.endpoint {
        remote::check_no_secrets(endpoint)?;
    }
    let cwd = std::env::current_dir().map_err(|e| Error::Io { action: "reading", path: ".".into(), source: e })?;
    let url = &absolute_dir_url(url, &cwd);
    let config = RemoteConfig { url: url.to_string(), s3, layout };
    if url.starts_with("s3://") || url.contains("://") && !url.starts_with("file://") {
        // Checks the URL; an S3 remote is not contacted (the credentials may only be set
        // where it is used).
        remote::open(url, &config.s3)?;
    } else {
        // A directory remote is created now (as `git init --bare` would).
        remote::local::DirRemote::create(url)?;
    }
    remotes.insert(name.to_string(), config);
    write_remotes(repo, &remotes)
}

/// Removes remote `name` and its remote-tracking refs.
pub fn remove_remote(repo: &Repo, name: &str) -> Result<()> {
    let _lock = repo.lock()?;
    let mut remotes = remotes(repo)?;
    if remotes.remove(name).is_none() {
        return Err(Error::NoSuchRemote { name: name.into() });
    }
    write_remotes(repo, &remotes)?;
    Ok(repo.refs().remove_remote(name)?)
}

/// Opens the remote `name`.
pub fn open_remote(repo: &Repo, name: &str) -> Result<Box<dyn Remote>> {
    let remotes = remotes(repo)?;
    let config = remotes.get(name).ok_or_else(|| Error::NoSuchRemote { name: name.into() })?;
    // A relative directory path (stored by an older ckpt) means the same wherever the
    // command runs: relative to the working tree's root.
    Ok(remote::open(&absolute_dir_url(&config.url, repo.root()), &config.s3)?)
}

/// The layout of the remote `name`.
pub fn remote_layout(repo: &Repo, name: &str) -> Result<Layout> {
    let remotes = remotes(repo)?;
    Ok(remotes.get(name).ok_or_else(|| Error::NoSuchRemote { name: name.into() })?.layout)
}

/// The remote a command uses when none is named: `origin`, or the only one.
pub fn default_remote(repo: &Repo) -> Result<String> {
    let remotes = remotes(repo)?;
    if remotes.contains_key("origin") || remotes.len() != 1 {
        return Ok("origin".into());
    }
    Ok(remotes.into_keys().next().expect("one remote"))
}
