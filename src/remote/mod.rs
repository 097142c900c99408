//! Remotes: where `push` sends objects and refs and `fetch` and `clone` take them from. A
//! [`Remote`] is a flat key → bytes store with two guarantees the repository builds on:
//! create-if-absent puts (an upload never replaces an object) and compare-and-swap puts on small
//! files (a ref moves only if it still holds what the pusher saw). The one put that replaces,
//! [`Remote::replace`], is atomic: a mirror push uses it to recode an object as another
//! encoding of the same content, under the rules of docs/format.md ("A mirror push"). Two
//! implementations: a directory ([`local::DirRemote`], for NFS and tests) and any
//! `object_store` backend ([`s3::StoreRemote`]: S3-compatible storage, Google Cloud Storage,
//! Azure Blob Storage, and an in-memory store for tests).
//!
//! Layout under the remote's root (docs/format.md, "Remotes"): `objects/ab/<62 hex>` holds the
//! same bytes as the local object file, `refs/heads/NAME` and `refs/tags/NAME` the same text as
//! the local ref files. This module moves bytes; it does not know what an object means, does not
//! verify what it downloads (the repository does, with the store's code, before anything enters
//! the local store) and never imports `store`, `index` or `repo`.

pub mod local;
pub mod s3;
pub(crate) mod upload_state;

use std::io::Write;
use std::path::{Path, PathBuf};

/// Largest ref file a reader accepts (a ref is 65 bytes).
pub(crate) const MAX_REF_LEN: u64 = 4096;

/// Most keys one listing returns (docs/format.md, "Caps on untrusted sizes"): a listing is
/// held in memory (about 100 bytes a key), and a remote, or whatever answers in its name, could
/// otherwise page out keys forever. 4 Mi keys: a thousand-tensor model with 4,000 versions.
pub(crate) const MAX_LIST_KEYS: usize = 1 << 22;

/// Longest key a listing keeps (S3's own limit); longer ones are not ckpt's and are skipped
/// (they still count towards [`MAX_LIST_KEYS`]).
pub(crate) const MAX_KEY_LEN: usize = 1024;

/// Counts one more key of a listing of `prefix` on `remote` into `seen`: past
/// [`MAX_LIST_KEYS`], [`Error::TooManyKeys`].
fn count_listed(seen: &mut usize, remote: &str, prefix: &str) -> Result<()> {
    *seen += 1;
    if *seen > MAX_LIST_KEYS {
        return Err(Error::TooManyKeys { remote: remote.into(), prefix: prefix.into(), limit: MAX_LIST_KEYS });
    }
    Ok(())
}

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
        /// The backend's error (with its HTTP status where there is one), its URLs masked.
        source: Masked,
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
    /// A file larger than the reader's limit (`MAX_REF_LEN` for a ref).
    #[error("{remote}: {key} is larger than {limit} bytes")]
    TooLarge {
        /// The remote.
        remote: String,
        /// The key.
        key: String,
        /// The limit.
        limit: u64,
    },
    /// A listing with more keys than `MAX_LIST_KEYS`.
    #[error("{remote}: listing {prefix} gave more than {limit} keys")]
    TooManyKeys {
        /// The remote.
        remote: String,
        /// The prefix listed.
        prefix: String,
        /// The limit.
        limit: usize,
    },
    /// A resumed download asked for bytes past the object's end: the object is shorter than
    /// what a killed run already had of it (it was replaced meanwhile).
    #[error("{remote}: {key} has {size} bytes, fewer than the {offset} a resumed download holds")]
    Shorter {
        /// The remote.
        remote: String,
        /// The key.
        key: String,
        /// Where the download resumed.
        offset: u64,
        /// The object's size.
        size: u64,
    },
    /// A ranged read answered with another number of bytes than asked for
    /// ([`Remote::read_range`]): the object is shorter than the range, or the remote (or what
    /// answers in its name) sent more.
    #[error("{remote}: {key}: asked for bytes {start}..{end}, got {got}{}", if *got_more { " or more" } else { "" })]
    WrongRange {
        /// The remote.
        remote: String,
        /// The key.
        key: String,
        /// First byte asked for.
        start: u64,
        /// End of the range asked for.
        end: u64,
        /// Bytes received (counting stopped one past the range when `got_more`).
        got: u64,
        /// Whether more bytes than asked were coming.
        got_more: bool,
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

/// An error of another layer (the object store's, its HTTP client's) as text: its message and
/// those of its causes, with every URL in them masked (`mask_urls`). It has no source of its
/// own, so nothing that prints an error with its causes (the CLI, `anyhow`) can reach the
/// unmasked text: an endpoint's `user:password@` or a query token would be printed with every
/// failed request ("Error performing GET http://user:password@host/...").
#[derive(Debug)]
pub struct Masked(String);

impl Masked {
    /// `error` and its chain of causes (each once: many quote their cause already), masked.
    pub fn new(error: &(dyn std::error::Error + 'static)) -> Masked {
        let mut text = error.to_string();
        let mut cause = error.source();
        while let Some(c) = cause {
            let more = c.to_string();
            if !text.contains(&more) {
                text.push_str(": ");
                text.push_str(&more);
            }
            cause = c.source();
        }
        Masked::from(text)
    }
}

impl From<String> for Masked {
    fn from(text: String) -> Masked {
        Masked(mask_urls(&text))
    }
}

impl From<&str> for Masked {
    fn from(text: &str) -> Masked {
        Masked(mask_urls(text))
    }
}

impl std::fmt::Display for Masked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Masked {}

/// `text` with every `scheme://` URL in it passed through [`redact_url`]: the one mask for text
/// ckpt did not write (another library's error messages). A URL runs to the next white space,
/// quote or angle bracket; closing punctuation at its end (`).,;]`) is kept out of it, so that a
/// URL in parentheses keeps its closing one.
pub(crate) fn mask_urls(text: &str) -> String {
    let in_scheme = |c: char| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.');
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let start = rest[..at].trim_end_matches(in_scheme).len();
        let end = rest[at..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '`'))
            .map_or(rest.len(), |e| at + e);
        // Never shorter than its "://": the trimmed characters stop at its '/'.
        let url = rest[start..end].trim_end_matches([')', '.', ',', ';', ']']);
        out.push_str(&rest[..start]);
        out.push_str(&redact_url(url));
        rest = &rest[start + url.len()..];
    }
    out.push_str(rest);
    out
}

/// The environment variable that sets the stall timeout of remote reads, in seconds (decimals
/// allowed): how long an S3 request, or a read of a directory remote, may wait without
/// progress before it is abandoned (and, for S3, retried).
pub(crate) const TIMEOUT_ENV: &str = "CKPT_REMOTE_TIMEOUT";
/// The stall timeout when [`TIMEOUT_ENV`] is not set.
pub(crate) const DEFAULT_TIMEOUT_SECS: u64 = 30;

/// The stall timeout: [`TIMEOUT_ENV`], or [`DEFAULT_TIMEOUT_SECS`]; a value that is not a
/// positive number is an error naming the remote at `url`.
fn stall_timeout(url: &str) -> Result<std::time::Duration> {
    let Some(value) = std::env::var_os(TIMEOUT_ENV) else {
        return Ok(std::time::Duration::from_secs(DEFAULT_TIMEOUT_SECS));
    };
    let secs = value.to_str().and_then(|v| v.trim().parse::<f64>().ok()).filter(|s| s.is_finite() && *s > 0.0);
    match secs {
        // At least a millisecond: the S3 client's settings are written in whole milliseconds.
        Some(s) => Ok(std::time::Duration::from_secs_f64(s.min(1e6)).max(std::time::Duration::from_millis(1))),
        None => Err(Error::BadUrl {
            url: redact_url(url),
            reason: format!("{TIMEOUT_ENV}={value:?}: expected a positive number of seconds"),
        }),
    }
}

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
    /// Its bytes (at most `MAX_REF_LEN`).
    pub bytes: Vec<u8>,
    /// Opaque version tag (an ETag, or the content itself for a directory remote).
    pub tag: String,
}

/// A key of a listing with its age and size ([`Remote::list_modified`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// The key, relative to the remote's root.
    pub key: String,
    /// When it was last written, by the remote's clock.
    pub modified: std::time::SystemTime,
    /// Its size in bytes.
    pub size: u64,
}

/// Whether an upload wrote the object or found it there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Uploaded {
    /// This call wrote it.
    Created,
    /// The key already existed; nothing was written.
    Existed,
    /// Written over whatever the key held, if anything (a multipart upload, which cannot be
    /// conditional; a writer's standalone rewrite of an old object): a concurrent
    /// `ckpt gc --remote` may have listed the key before, so the writer checks it is still
    /// there once no gc runs (docs/format.md, "Garbage on a remote").
    Replaced,
}

/// How an object may be uploaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UploadMode {
    /// Only if the key is absent (an existing object is left as it is). Used for every delta
    /// blob: replacing an object by another encoding of the same content could close a
    /// reference cycle between two pushers' encodings; the mirror layout's recodes, which do
    /// replace, go through [`Remote::replace`] under rules that exclude cycles
    /// (docs/format.md, "Remotes").
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
    /// the remote's root, in no particular order; more than `MAX_LIST_KEYS` is
    /// [`Error::TooManyKeys`], and keys longer than `MAX_KEY_LEN` are left out.
    fn list(&self, prefix: &str) -> Result<Vec<String>>;
    /// Whether object `key` exists (one HEAD request). The default downloads nothing past
    /// the first byte.
    fn exists(&self, key: &str) -> Result<bool> {
        match self.download(key, &mut std::io::sink(), 0) {
            Ok(_) | Err(Error::TooLarge { .. }) => Ok(true),
            Err(Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }
    /// Every object under `prefix` as [`Remote::list`] gives it, with when it was last written
    /// (S3's `LastModified`, a file's mtime) and its size: what `ckpt gc --remote` and the
    /// writers' freshness rule go by (docs/format.md, "Garbage on a remote"). No default: an
    /// age made up here would be wrong for gc or for writers.
    fn list_modified(&self, prefix: &str) -> Result<Vec<Listed>>;
    /// When object `key` was last written (one HEAD request); `None` if it does not exist.
    fn modified(&self, key: &str) -> Result<Option<std::time::SystemTime>>;
    /// Reads a small file and its tag; `None` if it does not exist.
    fn get_small(&self, key: &str) -> Result<Option<Small>>;
    /// Writes a small file if the key is as `expect` says; else [`Error::Conflict`].
    fn put_small(&self, key: &str, bytes: &[u8], expect: &Expect) -> Result<()>;
    /// Uploads the open file `file` (`len` bytes from its start; `path` names it in errors)
    /// under `key`. The caller passes the file it read the object's header from, so a
    /// concurrent rewrite of the path (a compaction renaming a delta over it) cannot change
    /// what goes up.
    fn upload(&self, key: &str, file: &std::fs::File, path: &Path, len: u64, mode: UploadMode) -> Result<Uploaded>;
    /// Writes `len` bytes of the open file `file` under `key`, replacing what the key holds:
    /// atomically, so a reader gets the old bytes or the new ones, never a mix. Only for keys
    /// whose every version is valid: an object recoded as another encoding of the same content
    /// (a mirror push's recode, docs/format.md "Remotes"), or a push's journal.
    fn replace(&self, key: &str, file: &std::fs::File, path: &Path, len: u64) -> Result<()>;
    /// Deletes `key`; a key that does not exist is no error. A push deletes its journal, and
    /// `ckpt gc --remote` the objects no ref reaches that are older than its grace period
    /// (docs/format.md, "Garbage on a remote"); nothing else deletes.
    fn delete(&self, key: &str) -> Result<()>;
    /// The first `len` bytes of the object `key` (fewer if it is shorter) and the object's
    /// whole size: a ranged read, such as an object's header.
    fn read_head(&self, key: &str, len: u64) -> Result<(Vec<u8>, u64)>;
    /// Bytes `range` of the object `key`, exactly: an answer shorter (the object ends inside the
    /// range) or longer than the range is [`Error::WrongRange`], and no more than the range's
    /// length (and one byte) is ever held. The default reads the object's first `range.end`
    /// bytes ([`Remote::read_head`]); the directory and `object_store` remotes send one ranged
    /// read of the range alone.
    fn read_range(&self, key: &str, range: std::ops::Range<u64>) -> Result<Vec<u8>> {
        let (head, _) = self.read_head(key, range.end)?;
        let start = usize::try_from(range.start).unwrap_or(usize::MAX);
        let got = head.get(start..).unwrap_or_default();
        checked_range(self.url(), key, &range, got.to_vec(), false)
    }
    /// Streams the object `key` into `out`, at most `limit` bytes (more is an error naming the
    /// key); returns the bytes written.
    fn download(&self, key: &str, out: &mut dyn Write, limit: u64) -> Result<u64>;
    /// Requests sent so far (for tests and `--json` summaries).
    fn requests(&self) -> u64;
    /// Streams the object `key` from byte `offset` on into `out`: the rest of a download that
    /// a killed run kept the first `offset` bytes of. `limit` caps the whole object, `offset`
    /// included (more is [`Error::TooLarge`]); an object shorter than `offset` is
    /// [`Error::Shorter`]. Returns the bytes written. The default downloads the whole object
    /// and drops its first `offset` bytes.
    fn download_from(&self, key: &str, offset: u64, out: &mut dyn Write, limit: u64) -> Result<u64> {
        let mut rest = SkipFirst { out, skip: offset, written: 0 };
        let size = self.download(key, &mut rest, limit)?;
        if size < offset {
            return Err(Error::Shorter { remote: self.url().into(), key: key.into(), offset, size });
        }
        Ok(rest.written)
    }
    /// Keeps the state of multipart uploads in `dir` (a repository's `.ckpt/transfers/`), so
    /// that an upload killed part way is resumed by the next upload of the same object from the
    /// parts that arrived (docs/format.md, "Transfer state"); uploads left there a week
    /// untouched are aborted. The default keeps nothing: a directory remote copies a file
    /// whole.
    fn resume_uploads_in(&mut self, dir: &Path) {
        let _ = dir;
    }
}

/// A writer that drops the first `skip` bytes written to it and passes the rest to `out`.
struct SkipFirst<'a> {
    out: &'a mut dyn Write,
    skip: u64,
    written: u64,
}

impl Write for SkipFirst<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let drop = usize::try_from(self.skip).unwrap_or(usize::MAX).min(buf.len());
        self.skip -= drop as u64;
        self.out.write_all(&buf[drop..])?;
        self.written += (buf.len() - drop) as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// `bytes`, received for `range` of `key` on `remote` (`more`: bytes past them were coming),
/// if it is exactly the range; else [`Error::WrongRange`]. The one rule of a ranged read's answer.
pub(crate) fn checked_range(
    remote: &str,
    key: &str,
    range: &std::ops::Range<u64>,
    bytes: Vec<u8>,
    more: bool,
) -> Result<Vec<u8>> {
    let want = range.end.saturating_sub(range.start);
    if bytes.len() as u64 == want && !more {
        return Ok(bytes);
    }
    Err(Error::WrongRange {
        remote: remote.into(),
        key: key.into(),
        start: range.start,
        end: range.end,
        got: bytes.len() as u64,
        got_more: more || bytes.len() as u64 > want,
    })
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

/// Settings of an object-store remote (S3, and the endpoint and plain HTTP for GCS and Azure
/// too) beyond what each cloud's environment variables give (these take precedence over the
/// environment). Credentials are never stored here. (Named after its first backend.)
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3Options {
    /// Endpoint URL (`http://127.0.0.1:9000` for a local server; for GCS the base URL of its
    /// API, for Azure the account's blob service URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Region (S3 only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Allow plain HTTP (a local endpoint).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_http: bool,
}

/// `url` for messages and `ckpt remote -v`: with a `scheme://` URL's user information
/// (`user:password@`) and every query value replaced by `***`, since either may hold a secret
/// (a password, a token, a presigned URL's `X-Amz-Signature`). A plain path is returned as is.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let (before_fragment, fragment) = match rest.split_once('#') {
        Some((b, f)) => (b, Some(f)),
        None => (rest, None),
    };
    let (before_query, query) = match before_fragment.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (before_fragment, None),
    };
    let (authority, path) = match before_query.find('/') {
        Some(i) => before_query.split_at(i),
        None => (before_query, ""),
    };
    let host = match authority.rsplit_once('@') {
        Some((_, host)) => format!("***@{host}"),
        None => authority.to_string(),
    };
    let mut out = format!("{scheme}://{host}{path}");
    if let Some(q) = query {
        let pairs: Vec<String> = q
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((k, _)) => format!("{k}=***"),
                None => "***".to_string(),
            })
            .collect();
        out.push('?');
        out.push_str(&pairs.join("&"));
    }
    if fragment.is_some() {
        out.push_str("#***");
    }
    out
}

/// What in a `scheme://` URL looks like a secret, if anything: user information
/// (`user:password@host`), a query string (tokens, presigned signatures) or a fragment.
fn secret_in(url: &str) -> Option<&'static str> {
    let (_, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        Some("it holds user information (user:password@)")
    } else if rest.contains('?') || rest.contains('#') {
        Some("it has a query string or fragment (such as a token or X-Amz-Signature)")
    } else {
        None
    }
}

/// Where credentials go instead of a URL.
const CREDENTIALS_HOME: &str = "give credentials through the environment instead (AWS_ACCESS_KEY_ID, \
                                AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN or ~/.aws/credentials; \
                                GOOGLE_APPLICATION_CREDENTIALS; AZURE_STORAGE_ACCOUNT_KEY or \
                                AZURE_STORAGE_SAS_TOKEN)";

/// Refuses a `scheme://` URL (a remote's, or an S3 endpoint) that carries what looks like a
/// secret (`secret_in`). Such a URL would be written to `.ckpt/remotes` and shown by
/// `ckpt remote -v`; credentials belong in the environment (`AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`) or `~/.aws/credentials`, which are never stored.
pub fn check_no_secrets(url: &str) -> Result<()> {
    let Some(reason) = secret_in(url) else { return Ok(()) };
    Err(Error::BadUrl {
        url: redact_url(url),
        reason: format!("{reason}, which would be stored in .ckpt/remotes; {CREDENTIALS_HOME}"),
    })
}

/// Refuses an endpoint (S3's, GCS's, Azure's, an emulator's) set in the environment variable `variable` that carries what looks
/// like a secret, as [`check_no_secrets`] refuses one given to `remote add --endpoint`: it is not
/// stored, but it would be sent and printed with every request's error.
fn check_env_endpoint(variable: &str, endpoint: &str) -> Result<()> {
    let Some(reason) = secret_in(endpoint) else { return Ok(()) };
    Err(Error::BadUrl { url: redact_url(endpoint), reason: format!("{variable}: {reason}; {CREDENTIALS_HOME}") })
}

/// Opens the remote at `url`: `s3://bucket[/prefix]`, `gs://bucket[/prefix]` (Google Cloud
/// Storage), `az://container[/prefix]` or `azure://container[/prefix]` (Azure Blob Storage),
/// `file:///path` or a local path (an existing directory). `memory://` is a fresh in-memory
/// store (tests). `options` apply to the object stores (a region to S3 only).
pub fn open(url: &str, options: &S3Options) -> Result<Box<dyn Remote>> {
    if url.starts_with("s3://") {
        return Ok(Box::new(s3::StoreRemote::s3(url, options)?));
    }
    if url.starts_with("gs://") {
        return Ok(Box::new(s3::StoreRemote::gcs(url, options)?));
    }
    if url.starts_with("az://") || url.starts_with("azure://") {
        return Ok(Box::new(s3::StoreRemote::azure(url, options)?));
    }
    if url == "memory://" {
        return Ok(Box::new(s3::StoreRemote::memory()));
    }
    if let Some((scheme, _)) = url.split_once("://") {
        if scheme != "file" {
            return Err(Error::BadUrl {
                url: redact_url(url),
                reason: format!("unknown scheme {scheme:?} (s3, gs, az, azure or file)"),
            });
        }
    }
    Ok(Box::new(local::DirRemote::open(url)?))
}

/// Whether `url` names an object store (`s3://`, `gs://`, `az://`, `azure://`, `memory://`)
/// rather than a directory.
pub fn is_object_store(url: &str) -> bool {
    ["s3://", "gs://", "az://", "azure://", "memory://"].iter().any(|scheme| url.starts_with(scheme))
}

#[cfg(test)]
mod tests;
