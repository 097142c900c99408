//! Refs: `HEAD`, branches (`refs/heads/NAME`) and tags (`refs/tags/NAME`), small text files
//! holding a version id (or, for `HEAD`, `ref: refs/heads/NAME`), each replaced atomically
//! (temp file, fsync, rename, fsync of the directory), and remote-tracking refs
//! (`refs/remotes/REMOTE/BRANCH`). They are the roots of history: `gc` keeps what any of them
//! reaches ([`Refs::all`], docs/format.md "What gc keeps").

use super::graph::{self, Node};
use super::{Error, Result};
use crate::object_id::ObjectId;
use std::io::Write;
use std::path::{Path, PathBuf};

/// What `HEAD` points at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Head {
    /// A branch (which may not exist yet: a new repository's `main`).
    Branch(String),
    /// A version directly.
    Detached(ObjectId),
}

/// Branch or tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefKind {
    /// `refs/heads/`.
    Branch,
    /// `refs/tags/`.
    Tag,
}

impl RefKind {
    pub(super) fn dir(self) -> &'static str {
        match self {
            RefKind::Branch => "heads",
            RefKind::Tag => "tags",
        }
    }
    /// "branch" or "tag".
    pub fn name(self) -> &'static str {
        match self {
            RefKind::Branch => "branch",
            RefKind::Tag => "tag",
        }
    }
}

/// The ref files of one repository.
#[derive(Clone, Debug)]
pub struct Refs {
    dir: PathBuf,
}

fn io<'p>(action: &'static str, path: &'p Path) -> impl FnOnce(std::io::Error) -> Error + 'p {
    move |source| Error::Io { action, path: path.to_path_buf(), source }
}

/// Checks a branch or tag name: 1 to 200 characters from `A-Z a-z 0-9 . _ -`, not starting
/// with `.` or `-`, and not `HEAD` (names are file names under `refs/`, and `~` is revision
/// syntax).
pub fn check_name(name: &str) -> Result<()> {
    let bad = |reason: &str| Err(Error::InvalidRefName { name: name.to_string(), reason: reason.to_string() });
    if name.is_empty() || name.len() > 200 {
        return bad("must be 1 to 200 characters");
    }
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')) {
        return bad("only letters, digits, '.', '_' and '-' are allowed");
    }
    if name.starts_with(['.', '-']) {
        return bad("must not start with '.' or '-'");
    }
    if name == "HEAD" {
        return bad("HEAD is reserved");
    }
    Ok(())
}

impl Refs {
    pub fn new(dir: &Path) -> Refs {
        Refs { dir: dir.to_path_buf() }
    }

    /// Creates the ref directories and `HEAD` pointing at `branch`.
    pub fn init(&self, branch: &str) -> Result<()> {
        for kind in [RefKind::Branch, RefKind::Tag] {
            let d = self.dir.join("refs").join(kind.dir());
            std::fs::create_dir_all(&d).map_err(io("creating", &d))?;
        }
        self.set_head(&Head::Branch(branch.to_string()))
    }

    fn head_path(&self) -> PathBuf {
        self.dir.join("HEAD")
    }

    fn ref_path(&self, kind: RefKind, name: &str) -> PathBuf {
        self.dir.join("refs").join(kind.dir()).join(name)
    }

    pub fn head(&self) -> Result<Head> {
        let path = self.head_path();
        let text = read_ref_text(&path)?.ok_or_else(|| Error::Io {
            action: "reading",
            path: path.clone(),
            source: std::io::ErrorKind::NotFound.into(),
        })?;
        let text = text.trim_end_matches('\n');
        let corrupt = |reason: &str| Error::CorruptRef { path: path.clone(), reason: reason.to_string() };
        if let Some(branch) = text.strip_prefix("ref: refs/heads/") {
            check_name(branch).map_err(|_| corrupt("invalid branch name"))?;
            return Ok(Head::Branch(branch.to_string()));
        }
        parse_id(text).map(Head::Detached).ok_or_else(|| corrupt("neither a branch nor a version id"))
    }

    pub(crate) fn set_head(&self, head: &Head) -> Result<()> {
        let text = match head {
            Head::Branch(b) => format!("ref: refs/heads/{b}\n"),
            Head::Detached(id) => format!("{id}\n"),
        };
        self.write(&self.head_path(), &text)
    }

    /// The version `HEAD` points at (`None` on an unborn branch).
    pub fn head_version(&self) -> Result<Option<ObjectId>> {
        match self.head()? {
            Head::Branch(b) => self.get(RefKind::Branch, &b),
            Head::Detached(id) => Ok(Some(id)),
        }
    }

    pub fn get(&self, kind: RefKind, name: &str) -> Result<Option<ObjectId>> {
        if check_name(name).is_err() {
            return Ok(None);
        }
        let path = self.ref_path(kind, name);
        read_ref_file(path)
    }

    pub fn set(&self, kind: RefKind, name: &str, id: &ObjectId) -> Result<()> {
        check_name(name)?;
        self.write(&self.ref_path(kind, name), &format!("{id}\n"))
    }

    /// Every ref of `kind`, sorted by name. Files with invalid names are skipped; unreadable
    /// contents are errors.
    pub fn list(&self, kind: RefKind) -> Result<Vec<(String, ObjectId)>> {
        let dir = self.dir.join("refs").join(kind.dir());
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(io("listing", &dir))? {
            let entry = entry.map_err(io("listing", &dir))?;
            let Some(name) = entry.file_name().to_str().map(str::to_string) else { continue };
            if check_name(&name).is_err() {
                continue;
            }
            if let Some(id) = self.get(kind, &name)? {
                out.push((name, id));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Deletes a branch or tag file (a missing one is no error).
    pub fn delete(&self, kind: RefKind, name: &str) -> Result<()> {
        check_name(name)?;
        let path = self.ref_path(kind, name);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(Error::Io { action: "deleting", path, source: e })
            }
            _ => {
                let dir = path.parent().expect("ref paths have a parent");
                std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io("syncing", dir))
            }
        }
    }

    fn remote_dir(&self, remote: &str) -> PathBuf {
        self.dir.join("refs").join("remotes").join(remote)
    }

    /// The remote-tracking ref `refs/remotes/REMOTE/BRANCH`: where `BRANCH` was on `REMOTE` at
    /// the last fetch or push.
    pub(crate) fn get_remote(&self, remote: &str, branch: &str) -> Result<Option<ObjectId>> {
        if check_name(remote).is_err() || check_name(branch).is_err() {
            return Ok(None);
        }
        let path = self.remote_dir(remote).join(branch);
        read_ref_file(path)
    }

    /// Sets a remote-tracking ref.
    pub fn set_remote(&self, remote: &str, branch: &str, id: &ObjectId) -> Result<()> {
        check_name(remote)?;
        check_name(branch)?;
        let dir = self.remote_dir(remote);
        std::fs::create_dir_all(&dir).map_err(io("creating", &dir))?;
        self.write(&dir.join(branch), &format!("{id}\n"))
    }

    /// Deletes every remote-tracking ref of `remote`.
    pub fn remove_remote(&self, remote: &str) -> Result<()> {
        check_name(remote)?;
        let dir = self.remote_dir(remote);
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(Error::Io { action: "deleting", path: dir, source: e })
            }
            _ => Ok(()),
        }
    }

    /// Every ref file under `refs/`, in any namespace (`heads/`, `tags/`, `remotes/REMOTE/` and
    /// whatever else is ever written there), by full name (`refs/remotes/origin/main`), sorted,
    /// each with the version it holds or why it cannot be read (a directory that cannot be
    /// listed is one such entry). Names starting with `.` (the temporary files of [`Self::write`])
    /// are not refs. This is the ref part of the roots of reachability (`Repo::roots`): a
    /// namespace added later is covered without touching gc or verify.
    pub fn all(&self) -> Vec<(String, Result<ObjectId>)> {
        let mut out = Vec::new();
        // (directory, its ref-name prefix, depth); depth bounds a hostile tree.
        let mut stack = vec![(self.dir.join("refs"), "refs".to_string(), 0usize)];
        while let Some((dir, prefix, depth)) = stack.pop() {
            let entries = match std::fs::read_dir(&dir) {
                Ok(e) => e,
                Err(source) => {
                    out.push((prefix, Err(Error::Io { action: "listing", path: dir, source })));
                    continue;
                }
            };
            for entry in entries {
                let entry = match entry {
                    Ok(e) => e,
                    Err(source) => {
                        out.push((prefix.clone(), Err(Error::Io { action: "listing", path: dir.clone(), source })));
                        continue;
                    }
                };
                let file_name = entry.file_name().to_string_lossy().into_owned();
                if file_name.starts_with('.') {
                    continue;
                }
                let name = format!("{prefix}/{file_name}");
                let path = entry.path();
                // Not followed: a symbolic link to a directory would let a walk go around in circles.
                let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
                if is_dir && holds_ref_files_only(&prefix) {
                    // `refs/heads/main` made a directory: main's versions are not "none".
                    let reason = "a directory where a ref file belongs".to_string();
                    out.push((name, Err(Error::CorruptRef { path, reason })));
                    continue;
                }
                if is_dir && depth < MAX_REF_DEPTH {
                    stack.push((path, name, depth + 1));
                    continue;
                }
                let read = match read_ref_file(path.clone()) {
                    Ok(Some(id)) => Ok(id),
                    // Listed a moment ago: deleted since (a remote removed), not a ref any more.
                    Ok(None) => continue,
                    Err(e) => Err(e),
                };
                out.push((name, read));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Writes `text` to `path` atomically.
    pub(crate) fn write(&self, path: &Path, text: &str) -> Result<()> {
        let dir = path.parent().expect("ref paths have a parent");
        let mut tmp =
            tempfile::Builder::new().prefix(".ref-").tempfile_in(dir).map_err(io("creating a file in", dir))?;
        tmp.write_all(text.as_bytes()).map_err(io("writing", path))?;
        tmp.as_file().sync_all().map_err(io("syncing", path))?;
        tmp.persist(path).map_err(|e| Error::Io {
            action: "renaming to",
            path: path.to_path_buf(),
            source: e.error,
        })?;
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io("syncing", dir))
    }
}

/// How deep [`Refs::all`] descends below `refs/` (`refs/remotes/REMOTE/BRANCH` is 3).
const MAX_REF_DEPTH: usize = 16;
impl RefKind {
    /// The other kind: a branch and a tag of one name would make the name ambiguous.
    fn other(self) -> RefKind {
        match self {
            RefKind::Branch => RefKind::Tag,
            RefKind::Tag => RefKind::Branch,
        }
    }
}

/// What [`super::Repo::delete_branch`] and [`super::Repo::delete_tag`] deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeletedRef {
    /// The version the ref pointed at (`ckpt branch NAME ID` restores it, until `gc`).
    pub id: ObjectId,
}

/// Branch and tag maintenance: delete, rename, move. Names are one namespace: a branch and a
/// tag never share a name (creating one where the other exists is refused), so a revision
/// name always means one thing. Each holds the writer lock.
impl super::Repo {
    /// Refuses `name` for a new ref of `kind` when a ref of the other kind has it.
    pub(super) fn check_no_namesake(&self, kind: RefKind, name: &str) -> Result<()> {
        if self.refs.get(kind.other(), name)?.is_some() {
            return Err(Error::RefRefused {
                kind,
                name: name.to_string(),
                reason: format!(
                    "a {} has this name; a {} of the same name would make it ambiguous (choose another name)",
                    kind.other().name(),
                    kind.name()
                ),
            });
        }
        Ok(())
    }

    /// Deletes branch `name`. Refused for the branch `HEAD` is on, and, unless `force`, for a
    /// branch whose tip no other branch, tag or `HEAD` reaches (its versions would be lost to
    /// the next `gc`): git's `branch -d` / `-D`, with "reachable from another ref" where git
    /// asks "merged into HEAD".
    pub fn delete_branch(&self, name: &str, force: bool) -> Result<DeletedRef> {
        check_name(name)?;
        let _lock = self.lock()?;
        let refused = |reason: String| Error::RefRefused { kind: RefKind::Branch, name: name.to_string(), reason };
        let id = self.refs.get(RefKind::Branch, name)?.ok_or_else(|| Error::NoSuchBranch { name: name.to_string() })?;
        if self.refs.head()? == Head::Branch(name.to_string()) {
            return Err(refused("HEAD is on it; switch to another branch first".into()));
        }
        if !force && !self.reached_by_other_refs(&id, RefKind::Branch, name)? {
            return Err(refused(format!(
                "its version {} is not reachable from HEAD or any other branch or tag, so the next gc would \
                 delete its versions; tag it first, or delete it anyway with -D",
                id.short(12)
            )));
        }
        self.refs.delete(RefKind::Branch, name)?;
        Ok(DeletedRef { id })
    }

    /// Renames branch `old` to `new` (`HEAD` follows when it is on `old`). `new` must be free
    /// as a branch and a tag name.
    pub fn rename_branch(&self, old: &str, new: &str) -> Result<ObjectId> {
        check_name(old)?;
        check_name(new)?;
        let _lock = self.lock()?;
        let id = self.refs.get(RefKind::Branch, old)?.ok_or_else(|| Error::NoSuchBranch { name: old.to_string() })?;
        if old == new {
            return Ok(id);
        }
        if self.refs.get(RefKind::Branch, new)?.is_some() {
            return Err(Error::RefExists { kind: RefKind::Branch, name: new.to_string() });
        }
        self.check_no_namesake(RefKind::Branch, new)?;
        // New name first, then HEAD, then the old name: an interruption leaves both names (or
        // HEAD on the new one), never neither.
        self.refs.set(RefKind::Branch, new, &id)?;
        if self.refs.head()? == Head::Branch(old.to_string()) {
            self.refs.set_head(&Head::Branch(new.to_string()))?;
        }
        self.refs.delete(RefKind::Branch, old)?;
        Ok(id)
    }

    /// Deletes tag `name`.
    pub fn delete_tag(&self, name: &str) -> Result<DeletedRef> {
        check_name(name)?;
        let _lock = self.lock()?;
        let id = self.refs.get(RefKind::Tag, name)?.ok_or_else(|| Error::RefRefused {
            kind: RefKind::Tag,
            name: name.to_string(),
            reason: "no such tag".into(),
        })?;
        self.refs.delete(RefKind::Tag, name)?;
        Ok(DeletedRef { id })
    }

    /// Points tag `name` at `rev` (default `HEAD`), creating it or moving it (git's `tag -f`);
    /// returns the new target and the old one.
    pub fn move_tag(&self, name: &str, rev: Option<&str>) -> Result<(ObjectId, Option<ObjectId>)> {
        check_name(name)?;
        let _lock = self.lock()?;
        self.check_no_namesake(RefKind::Tag, name)?;
        let old = self.refs.get(RefKind::Tag, name)?;
        let id = self.resolve(rev.unwrap_or("HEAD"))?;
        self.refs.set(RefKind::Tag, name, &id)?;
        Ok((id, old))
    }

    /// Whether `id` is an ancestor of (or equal to) `HEAD` or a branch or tag other than
    /// `kind` `name`. Walks all parents; versions missing from the store (a partial clone's
    /// cut) end their line.
    fn reached_by_other_refs(&self, id: &ObjectId, kind: RefKind, name: &str) -> Result<bool> {
        let mut starts: Vec<ObjectId> = self.refs.head_version()?.into_iter().collect();
        for k in [RefKind::Branch, RefKind::Tag] {
            starts.extend(self.refs.list(k)?.into_iter().filter(|(n, _)| !(k == kind && n == name)).map(|(_, i)| i));
        }
        let mut found = false;
        let enter = |n: &Node| {
            found |= n.id() == *id;
            !found && self.store.contains(&n.id())
        };
        // Last start and last parent first, as this walk always went.
        let starts = starts.into_iter().rev().map(Node::Version);
        let parents = |_, edges: Vec<Node>| Ok(graph::versions(&edges).into_iter().rev().map(Node::Version).collect());
        graph::walk(self, starts, enter, parents)?;
        Ok(found)
    }
}

/// Whether the directory of refs named `prefix` holds ref files only (branches, tags, one
/// remote's tracking refs: their names have no `/`), so a directory in it is damage.
fn holds_ref_files_only(prefix: &str) -> bool {
    match prefix.strip_prefix("refs/") {
        Some("heads" | "tags") => true,
        Some(rest) => rest.strip_prefix("remotes/").is_some_and(|remote| !remote.contains('/')),
        None => false,
    }
}

fn parse_id(text: &str) -> Option<ObjectId> {
    text.parse::<ObjectId>().ok().filter(|id| id.to_hex() == text)
}

/// The version id a ref file holds, or `None` when there is no such file.
fn read_ref_file(path: PathBuf) -> Result<Option<ObjectId>> {
    match read_ref_text(&path)? {
        Some(text) => parse_id(text.trim_end_matches('\n'))
            .map(Some)
            .ok_or_else(|| Error::CorruptRef { path, reason: "not a version id".into() }),
        None => Ok(None),
    }
}

/// Largest ref or `HEAD` file read (a ref is 65 bytes, `HEAD` at most 217).
const MAX_REF_FILE_LEN: u64 = 1024;

/// The text of a ref or `HEAD` file, or `None` when there is no such file. Anything but a
/// regular file (reached through symbolic links) is an error, never an empty ref: a directory,
/// a FIFO or a device in place of a ref is damage, and walking it as "no versions" would let gc
/// delete what the ref held. Opened by [`crate::mmap::open_regular`] (a FIFO never waits for a
/// writer) and read up to [`MAX_REF_FILE_LEN`].
fn read_ref_text(path: &Path) -> Result<Option<String>> {
    use std::io::Read;
    let corrupt = |reason: String| Error::CorruptRef { path: path.to_path_buf(), reason };
    let file = match crate::mmap::open_regular(path) {
        Ok(f) => f,
        // A symbolic link to nothing is a ref whose content is lost, not an absent ref.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && std::fs::symlink_metadata(path).is_err() => {
            return Ok(None)
        }
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => return Err(corrupt(e.to_string())),
        Err(source) => return Err(Error::Io { action: "reading", path: path.to_path_buf(), source }),
    };
    let mut bytes = Vec::new();
    file.take(MAX_REF_FILE_LEN + 1).read_to_end(&mut bytes).map_err(io("reading", path))?;
    if bytes.len() as u64 > MAX_REF_FILE_LEN {
        return Err(corrupt(format!("longer than {MAX_REF_FILE_LEN} bytes")));
    }
    String::from_utf8(bytes).map(Some).map_err(|_| corrupt("not UTF-8 text".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_round_trips() {
        for ok in ["main", "v1.0", "epoch_3", "a-b"] {
            check_name(ok).unwrap();
        }
        for bad in ["", "-x", ".x", "a/b", "a b", "x~1", "HEAD", "é"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        let dir = tempfile::tempdir().unwrap();
        let refs = Refs::new(dir.path());
        refs.init("main").unwrap();
        assert_eq!(refs.head().unwrap(), Head::Branch("main".into()));
        assert_eq!(refs.head_version().unwrap(), None);
        let id = ObjectId::hash(b"v");
        refs.set(RefKind::Branch, "main", &id).unwrap();
        refs.set(RefKind::Tag, "t1", &id).unwrap();
        assert_eq!(refs.head_version().unwrap(), Some(id));
        assert_eq!(refs.list(RefKind::Tag).unwrap(), vec![("t1".to_string(), id)]);
        refs.set_head(&Head::Detached(id)).unwrap();
        assert_eq!(refs.head().unwrap(), Head::Detached(id));
        std::fs::write(dir.path().join("HEAD"), "garbage").unwrap();
        assert!(matches!(refs.head(), Err(Error::CorruptRef { .. })));
    }
}
