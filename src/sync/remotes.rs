//! The remote list (`.ckpt/remotes`: NAME → URL and settings, among them the remote's
//! [`Layout`]). What a remote holds is read in `remote_view.rs`.

use super::{Error, Result};
use crate::remote::{self, Remote, S3Options};
use crate::repo::Error as RepoError;
use crate::repo::{check_name, Repo, VersionId};
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

/// How a remote stores versions (the `layout` key of a remote in `.ckpt/remotes`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// The newest version of each branch whole, older ones reverse deltas against newer ones,
    /// as the local store keeps them: a reader of the newest version downloads one checkpoint.
    #[default]
    Mirror,
    /// Forward deltas as the epochs were pushed, nothing on the remote ever replaced: a push
    /// uploads about what the epoch added.
    Deltas,
}

impl Layout {
    /// Its name in settings and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Mirror => "mirror",
            Layout::Deltas => "deltas",
        }
    }

    /// Whether this is the default ([`Layout::Mirror`]), which the remote list does not write.
    pub(crate) fn is_default(&self) -> bool {
        *self == Layout::default()
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Layout {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Layout, String> {
        match s {
            "mirror" => Ok(Layout::Mirror),
            "deltas" => Ok(Layout::Deltas),
            other => Err(format!("unknown remote layout {other:?} (mirror or deltas)")),
        }
    }
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
    let mut remote = remote::open(&absolute_dir_url(&config.url, repo.root()), &config.s3)?;
    // Multipart uploads killed part way are resumed by the next push (docs/format.md,
    // "Transfer state").
    remote.resume_uploads_in(&repo.ckpt_dir().join(super::transfer::TRANSFERS_DIR));
    Ok(remote)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_parse_print_and_serialize_by_name() {
        for layout in [Layout::Mirror, Layout::Deltas] {
            assert_eq!(layout.name().parse::<Layout>(), Ok(layout));
            assert_eq!(serde_json::to_string(&layout).unwrap(), format!("\"{layout}\""));
        }
        assert!("forward".parse::<Layout>().is_err());
        assert_eq!(Layout::default(), Layout::Mirror);
        assert!(Layout::Mirror.is_default() && !Layout::Deltas.is_default());
    }
}
