//! Paths of committed files: relative to the repository root, `/`-separated, normalized, never
//! escaping the root and never inside `.ckpt`. Paths read from stored versions are checked
//! again before anything is written, so a crafted version cannot write outside the target.

use super::{Error, Result};
use std::path::{Component, Path, PathBuf};

/// A validated repository-relative path.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RepoPath(String);

/// Longest accepted path, in bytes.
const MAX_PATH_LEN: usize = 4096;

impl RepoPath {
    /// Checks a stored path string.
    pub fn parse(s: &str) -> std::result::Result<RepoPath, &'static str> {
        if s.is_empty() {
            return Err("empty path");
        }
        if s.len() > MAX_PATH_LEN {
            return Err("path too long");
        }
        if s.contains('\0') {
            return Err("NUL in path");
        }
        for (i, c) in s.split('/').enumerate() {
            match c {
                "" => return Err("empty path component (leading, trailing or double '/')"),
                "." | ".." => return Err("'.' or '..' component"),
                ".ckpt" if i == 0 => return Err("inside the .ckpt directory"),
                _ => {}
            }
        }
        Ok(RepoPath(s.to_string()))
    }

    /// The path of `input` relative to `root` (both absolute, `root` canonical). A relative
    /// `input` is taken relative to `root`. `.` and `..` are resolved lexically; if the result
    /// is not under `root`, the parent directory is canonicalized (to see through symlinks such
    /// as `/tmp` -> `/private/tmp`) and tried again.
    pub(crate) fn from_input(root: &Path, input: &Path) -> Result<RepoPath> {
        let invalid = |reason: &str| Error::InvalidPath { path: input.to_path_buf(), reason: reason.to_string() };
        let absolute = if input.is_absolute() { input.to_path_buf() } else { root.join(input) };
        let normal = normalize(&absolute).ok_or_else(|| invalid("'..' goes above the file system root"))?;
        let relative = match normal.strip_prefix(root) {
            Ok(r) => r.to_path_buf(),
            Err(_) => {
                let canonical = match (normal.parent(), normal.file_name()) {
                    (Some(parent), Some(name)) => std::fs::canonicalize(parent).ok().map(|p| p.join(name)),
                    _ => None,
                };
                canonical
                    .and_then(|c| c.strip_prefix(root).ok().map(Path::to_path_buf))
                    .ok_or_else(|| invalid("outside the repository"))?
            }
        };
        let mut parts = Vec::new();
        for c in relative.components() {
            match c {
                Component::Normal(s) => parts.push(s.to_str().ok_or_else(|| invalid("not valid UTF-8"))?),
                _ => return Err(invalid("not a plain relative path")),
            }
        }
        if parts.is_empty() {
            return Err(invalid("the repository root is not a file"));
        }
        RepoPath::parse(&parts.join("/")).map_err(invalid)
    }

    /// The path string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Where the file lives under `dir`.
    pub fn under(&self, dir: &Path) -> PathBuf {
        let mut p = dir.to_path_buf();
        p.extend(self.0.split('/'));
        p
    }

    /// The first directory on the way to this path under `dir` that is a symbolic link, if
    /// any. A file beyond one is not in the tree at `dir` but wherever the link leads (outside
    /// it, possibly): as git refuses such a path ("beyond a symbolic link"), nothing is tracked,
    /// written or deleted through it, and a tracked file there counts as missing. One `lstat`
    /// per directory, stopping at the first that is not there.
    pub(crate) fn symlinked_dir(&self, dir: &Path) -> Option<PathBuf> {
        let mut at = dir.to_path_buf();
        let (parents, _) = self.0.rsplit_once('/')?;
        for part in parents.split('/') {
            at.push(part);
            match std::fs::symlink_metadata(&at) {
                Ok(m) if m.file_type().is_symlink() => return Some(at),
                Ok(m) if m.is_dir() => {}
                // Missing, or a file: nothing can be beyond it.
                _ => return None,
            }
        }
        None
    }

    /// Fails when [`RepoPath::symlinked_dir`] finds a link on the way to this path under `dir`,
    /// naming both; `doing` says what is refused ("tracked", "written", "deleted").
    pub(super) fn refuse_beyond_symlink(&self, dir: &Path, doing: &str) -> Result<()> {
        match self.symlinked_dir(dir) {
            None => Ok(()),
            Some(link) => Err(Error::InvalidPath {
                path: self.under(dir),
                reason: format!(
                    "is beyond a symbolic link, {}; not {doing} through it (it could lead anywhere)",
                    link.display()
                ),
            }),
        }
    }
}

impl std::fmt::Display for RepoPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The first pair of paths among `paths` that cannot both exist in one tree: a file `a` and a
/// file `a/b` under it (`a` would have to be a file and a directory). Returned as (file,
/// path under it). Linear in the total number of path components.
pub(crate) fn prefix_conflict<'a>(paths: impl IntoIterator<Item = &'a str>) -> Option<(String, String)> {
    let all: std::collections::BTreeSet<&str> = paths.into_iter().collect();
    for p in &all {
        for (i, _) in p.match_indices('/') {
            if all.contains(&p[..i]) {
                return Some((p[..i].to_string(), p.to_string()));
            }
        }
    }
    None
}

/// Resolves `.` and `..` lexically; `None` if `..` would go above the root.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                if !out.pop() || out.as_os_str().is_empty() {
                    return None;
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}

/// Where directory `dir` will be once created: its longest existing ancestor resolved by the
/// file system (symbolic links followed), the components that do not exist yet appended
/// lexically (a `..` among them undoes the directory before it, as creating them would). Lets a
/// caller see, before creating anything, that `out/../.ckpt` or a symlink to `.ckpt` leads into
/// the repository's own directory. `None` if not even the file system root resolves.
pub(super) fn resolve_prospective(dir: &Path) -> Option<PathBuf> {
    let absolute = if dir.is_absolute() { dir.to_path_buf() } else { std::env::current_dir().ok()?.join(dir) };
    let parts: Vec<Component> = absolute.components().collect();
    for n in (1..=parts.len()).rev() {
        let prefix: PathBuf = parts[..n].iter().collect();
        if let Ok(mut resolved) = std::fs::canonicalize(&prefix) {
            for c in &parts[n..] {
                match c {
                    Component::Normal(s) => resolved.push(s),
                    Component::ParentDir => {
                        resolved.pop();
                    }
                    _ => {}
                }
            }
            return Some(resolved);
        }
    }
    None
}

/// `create_dir_all`, with the real cause when a component of `dir` is a file: the OS reports
/// `EEXIST` ("File exists") for the last one, which would name the wrong problem.
pub(super) fn create_dirs(dir: &Path) -> Result<()> {
    let source = match std::fs::create_dir_all(dir) {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    // The deepest component that exists says what stood in the way.
    for at in dir.ancestors() {
        if let Ok(m) = std::fs::metadata(at) {
            if !m.is_dir() {
                return Err(Error::NotADirectory { path: at.to_path_buf(), creating: dir.to_path_buf() });
            }
            break;
        }
    }
    Err(Error::Io { action: "creating", path: dir.to_path_buf(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_normalized_and_confined() {
        let root = Path::new("/r/repo");
        let ok = |p: &str| RepoPath::from_input(root, Path::new(p)).map(|r| r.0);
        assert_eq!(ok("a.bin").unwrap(), "a.bin");
        assert_eq!(ok("./d/../d/e/f.safetensors").unwrap(), "d/e/f.safetensors");
        assert_eq!(ok("/r/repo/x/y").unwrap(), "x/y");
        assert!(ok("../other/a").is_err());
        assert!(ok("/r/repo").is_err());
        assert!(ok(".ckpt/config").is_err());
        assert!(ok("/elsewhere/a").is_err());
        assert_eq!(RepoPath::parse("a/b").unwrap().under(Path::new("/o")), Path::new("/o/a/b"));
        for bad in ["", "/a", "a/", "a//b", "..", "a/../b", ".ckpt", "a\0b"] {
            assert!(RepoPath::parse(bad).is_err(), "{bad:?}");
        }
        assert!(RepoPath::parse("x/.ckpt").is_ok());
    }

    #[test]
    fn files_and_paths_under_them_conflict() {
        assert_eq!(prefix_conflict(["a", "a-b", "a.c", "b/c"]), None);
        assert_eq!(prefix_conflict(["a", "a-b", "a/b"]), Some(("a".into(), "a/b".into())));
        assert_eq!(prefix_conflict(["x/y/z", "x/y"]), Some(("x/y".into(), "x/y/z".into())));
        assert_eq!(prefix_conflict(["x/y/z", "x"]), Some(("x".into(), "x/y/z".into())));
        assert_eq!(prefix_conflict(["ab/c", "a"]), None);
    }

    #[test]
    fn links_to_directories_on_the_way_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("d/e")).unwrap();
        std::os::unix::fs::symlink(root.join("d"), root.join("d/e/up")).unwrap();
        std::os::unix::fs::symlink("nowhere", root.join("dangling")).unwrap();
        std::os::unix::fs::symlink("loop", root.join("loop")).unwrap();
        std::fs::write(root.join("f"), b"").unwrap();
        let found = |p: &str| RepoPath::parse(p).unwrap().symlinked_dir(root);
        assert_eq!(found("d/e/x"), None);
        assert_eq!(found("x"), None, "no directory on the way");
        assert_eq!(found("d/e/up"), None, "the last component is the file itself");
        assert_eq!(found("d/e/up/x"), Some(root.join("d/e/up")));
        assert_eq!(found("d/e/up/e/up/x"), Some(root.join("d/e/up")), "the first one");
        assert_eq!(found("dangling/x"), Some(root.join("dangling")));
        assert_eq!(found("loop/x"), Some(root.join("loop")));
        assert_eq!(found("new/dir/x"), None, "nothing beyond what is missing");
        assert_eq!(found("f/x"), None, "nothing beyond a file");
        let err = RepoPath::parse("d/e/up/x").unwrap().refuse_beyond_symlink(root, "written").unwrap_err();
        assert!(err.to_string().contains("beyond a symbolic link") && err.to_string().contains("not written"), "{err}");
    }

    #[test]
    fn prospective_directories_resolve_links_and_dots() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(root.join("real")).unwrap();
        std::os::unix::fs::symlink(root.join("real"), root.join("link")).unwrap();
        let r = |p: &str| resolve_prospective(&root.join(p)).unwrap();
        assert_eq!(r("link/new/x"), root.join("real/new/x"));
        assert_eq!(r("new/../real/a/../b"), root.join("real/b"));
        assert_eq!(r("link/../real"), root.join("real"));
        // A file where a directory is needed: named as such, not as "File exists".
        std::fs::write(root.join("f"), b"").unwrap();
        for p in ["f", "f/sub"] {
            let err = create_dirs(&root.join(p)).unwrap_err();
            assert!(matches!(&err, Error::NotADirectory { path, .. } if *path == root.join("f")), "{err}");
        }
    }
}
