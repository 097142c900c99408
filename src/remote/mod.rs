//! Remotes: where `push` sends objects and refs and `fetch` and `clone` take them from. A
//! [`Remote`] is a flat key → bytes store with two guarantees the repository builds on:
//! create-if-absent puts (an object key, once written, keeps its bytes) and compare-and-swap
//! puts on small files (a ref moves only if it still holds what the pusher saw). Two
//! implementations: a directory ([`local::DirRemote`], for NFS and tests) and any
//! `object_store` backend ([`s3::StoreRemote`]: S3-compatible storage, and an in-memory store
//! for tests).
//!
//! Layout under the remote's root (docs/format.md, "Remotes"): `objects/ab/<62 hex>` holds the
//! same bytes as the local object file, `refs/heads/NAME` and `refs/tags/NAME` the same text as
//! the local ref files. This module moves bytes; it does not know what an object means, does not
//! verify what it downloads (the repository does, with the store's code, before anything enters
//! the local store) and never imports `store`, `index` or `repo`.

pub mod local;
pub mod s3;

use std::io::Write;
use std::path::{Path, PathBuf};

/// Largest ref file a reader accepts (a ref is 65 bytes).
pub const MAX_REF_LEN: u64 = 4096;

/// Errors of remote operations. Every variant names the remote (its URL, without credentials).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A local file system operation failed (a directory remote, or a local temp file).
    #[error("{remote}: {action} {}: {source}", path.display())]
    Io {
        /// The remote.
        remote: String,
        /// What was being done.
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The object store answered with an error (after its retries, for transient ones).
    #[error("{remote}: {action} {key}: {source}")]
    Backend {
        /// The remote.
        remote: String,
        /// What was being done.
        action: &'static str,
        /// The key involved.
        key: String,
        /// The backend's error (with its HTTP status where there is one).
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A key that does not exist.
    #[error("{remote}: {key} does not exist")]
    NotFound {
        /// The remote.
        remote: String,
        /// The key.
        key: String,
    },
    /// A conditional put lost: the key was created or changed since it was read.
    #[error("{remote}: {key} changed since it was read")]
    Conflict {
        /// The remote.
        remote: String,
        /// The key.
        key: String,
    },
    /// A file larger than the reader's limit ([`MAX_REF_LEN`] for a ref).
    #[error("{remote}: {key} is larger than {limit} bytes")]
    TooLarge {
        /// The remote.
        remote: String,
        /// The key.
        key: String,
        /// The limit.
        limit: u64,
    },
    /// A URL or setting that does not describe a remote.
    #[error("remote {url:?}: {reason}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// What is wrong.
        reason: String,
    },
}

/// Shorthand for remote results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a conditional small put requires of the key's current state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    /// The key must not exist.
    Absent,
    /// The key must still be the version read with this tag ([`Small::tag`]).
    Tag(String),
}

/// A small file read from a remote, with the tag that identifies this version of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Small {
    /// Its bytes (at most [`MAX_REF_LEN`]).
    pub bytes: Vec<u8>,
    /// Opaque version tag (an ETag, or the content itself for a directory remote).
    pub tag: String,
}

/// Whether an upload wrote the object or found it there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Uploaded {
    /// This call wrote it.
    Created,
    /// The key already existed; nothing was written.
    Existed,
}

/// How an object may be uploaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UploadMode {
    /// Only if the key is absent (an existing object is left as it is). Used for every delta
    /// blob: replacing an object by another encoding of the same content could close a
    /// reference cycle between two pushers' encodings (docs/format.md, "Remotes").
    CreateOnly,
    /// May replace an existing object with these bytes (same id, so same content), which lets
    /// large uploads go in parallel parts (multipart uploads cannot be conditional). Only for
    /// objects that reference nothing.
    MayReplace,
}

/// A remote object store. Implementations retry transient errors themselves.
pub trait Remote: Send + Sync {
    /// The URL it was opened from, without credentials (for messages).
    fn url(&self) -> &str;
    /// Every key under `prefix` (a `/`-terminated directory such as `objects/`), relative to
    /// the remote's root, in no particular order.
    fn list(&self, prefix: &str) -> Result<Vec<String>>;
    /// Reads a small file and its tag; `None` if it does not exist.
    fn get_small(&self, key: &str) -> Result<Option<Small>>;
    /// Writes a small file if the key is as `expect` says; else [`Error::Conflict`].
    fn put_small(&self, key: &str, bytes: &[u8], expect: &Expect) -> Result<()>;
    /// Uploads the open file `file` (`len` bytes from its start; `path` names it in errors)
    /// under `key`. The caller passes the file it read the object's header from, so a
    /// concurrent rewrite of the path (a compaction renaming a delta over it) cannot change
    /// what goes up.
    fn upload(&self, key: &str, file: &std::fs::File, path: &Path, len: u64, mode: UploadMode) -> Result<Uploaded>;
    /// Streams the object `key` into `out`, at most `limit` bytes (more is an error naming the
    /// key); returns the bytes written.
    fn download(&self, key: &str, out: &mut dyn Write, limit: u64) -> Result<u64>;
    /// Requests sent so far (for tests and `--json` summaries).
    fn requests(&self) -> u64;
}

/// The key of an object: `objects/ab/<62 hex>`, the local store's layout.
pub fn object_key(id: &crate::ObjectId) -> String {
    let hex = id.to_hex();
    format!("objects/{}/{}", &hex[..2], &hex[2..])
}

/// The id named by an object key, if it is one.
pub fn object_of_key(key: &str) -> Option<crate::ObjectId> {
    let rest = key.strip_prefix("objects/")?;
    let (fan, name) = rest.split_once('/')?;
    if fan.len() != 2 || name.len() != 62 {
        return None;
    }
    let hex = format!("{fan}{name}");
    hex.parse::<crate::ObjectId>().ok().filter(|id| id.to_hex() == hex)
}

/// Settings of an S3 remote beyond what the `AWS_*` environment variables give (these take
/// precedence over the environment). Credentials are never stored here.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3Options {
    /// Endpoint URL (`http://127.0.0.1:9000` for a local server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Allow plain HTTP (a local endpoint).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_http: bool,
}

/// Opens the remote at `url`: `s3://bucket[/prefix]`, `file:///path` or a local path (an
/// existing directory). `memory://` is a fresh in-memory store (tests).
pub fn open(url: &str, s3: &S3Options) -> Result<Box<dyn Remote>> {
    if url.starts_with("s3://") {
        return Ok(Box::new(s3::StoreRemote::s3(url, s3)?));
    }
    if url == "memory://" {
        return Ok(Box::new(s3::StoreRemote::memory()));
    }
    if let Some((scheme, _)) = url.split_once("://") {
        if scheme != "file" {
            return Err(Error::BadUrl { url: url.into(), reason: format!("unknown scheme {scheme:?} (s3 or file)") });
        }
    }
    Ok(Box::new(local::DirRemote::open(url)?))
}

#[cfg(test)]
mod tests;
