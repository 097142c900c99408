//! The history of the weight files git keeps through the filter: along a revision's first
//! parents, each commit whose ckpt pointers differ from its parent's, with those pointers
//! (`ckpt git report` draws one column per such commit).

use super::pointer::{self, Pointer};
use super::{Error, Result};
use crate::object_id::ObjectId;
use std::collections::HashMap;

/// A git commit that changed weight files, and every ckpt pointer of its tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PointerCommit {
    /// The commit id (hex).
    pub id: String,
    /// Commit time, seconds since the Unix epoch.
    pub time: i64,
    /// The commit message.
    pub message: String,
    /// (path, pointer) per weight file of its tree, in path order.
    pub pointers: Vec<(String, Pointer)>,
}

/// The commits along first parents up to `range`'s end (`REV`, or git's `FROM..TO`) whose
/// pointers differ from the commit before, oldest first from the root, and the index of the
/// first one in the range (with `FROM..TO`: the first after `FROM`; the one before it holds the
/// pointers as of `FROM`).
pub fn pointer_commits(git: &git2::Repository, range: &str) -> Result<(Vec<PointerCommit>, usize)> {
    let (from, to) = match range.split_once("..") {
        Some((a, b)) => (Some(a).filter(|a| !a.is_empty()), if b.is_empty() { "HEAD" } else { b }),
        None => (None, range),
    };
    let resolve = |rev: &str| {
        git.revparse_single(rev)
            .and_then(|o| o.peel_to_commit())
            .map(|c| c.id())
            .map_err(super::git(format!("resolving {rev:?} to a commit")))
    };
    let end = resolve(to)?;
    let start = from.map(resolve).transpose()?;
    let mut walk = git.revwalk().map_err(super::git("walking history"))?;
    walk.push(end).map_err(super::git("walking history"))?;
    walk.simplify_first_parent().map_err(super::git("walking history"))?;
    walk.set_sorting(git2::Sort::TOPOLOGICAL | git2::Sort::REVERSE).map_err(super::git("walking history"))?;
    let mut parsed: HashMap<git2::Oid, Option<Pointer>> = HashMap::new();
    let mut out = Vec::new();
    let mut previous: Option<Vec<(String, ObjectId)>> = None;
    let mut shown = start.is_none().then_some(0);
    for oid in walk {
        let oid = oid.map_err(super::git("walking history"))?;
        let commit = git.find_commit(oid).map_err(super::git(format!("reading commit {oid}")))?;
        let pointers = tree_pointers(git, &commit, &mut parsed)?;
        let key: Vec<(String, ObjectId)> = pointers.iter().map(|(p, ptr)| (p.clone(), ptr.manifest)).collect();
        if previous.as_ref() != Some(&key) && !pointers.is_empty() {
            out.push(PointerCommit {
                id: oid.to_string(),
                time: commit.time().seconds(),
                message: commit.message().unwrap_or_default().trim_end().to_string(),
                pointers,
            });
        }
        previous = Some(key);
        if Some(oid) == start {
            shown = Some(out.len());
        }
    }
    let shown = shown.ok_or_else(|| Error::Git {
        action: format!("reading {range}"),
        source: git2::Error::from_str(&format!(
            "{} is not on the first-parent history of {to}",
            from.unwrap_or_default()
        )),
    })?;
    Ok((out, shown))
}

/// The ckpt pointers of the tree of `HEAD`'s commit, in path order; none before the first
/// commit.
pub(super) fn head_pointers(git: &git2::Repository) -> Result<Vec<(String, Pointer)>> {
    let Ok(head) = git.head() else { return Ok(Vec::new()) };
    let commit = head.peel_to_commit().map_err(super::git("reading HEAD's commit".to_string()))?;
    tree_pointers(git, &commit, &mut HashMap::new())
}

/// The ckpt pointers of `commit`'s tree, in path order; each git blob parsed once (`parsed`).
fn tree_pointers(
    git: &git2::Repository,
    commit: &git2::Commit<'_>,
    parsed: &mut HashMap<git2::Oid, Option<Pointer>>,
) -> Result<Vec<(String, Pointer)>> {
    let tree = commit.tree().map_err(super::git(format!("reading the tree of {}", commit.id())))?;
    let mut out = Vec::new();
    let mut failure = None;
    tree.walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
        if entry.kind() != Some(git2::ObjectType::Blob) {
            return git2::TreeWalkResult::Ok;
        }
        let found = match parsed.get(&entry.id()) {
            Some(p) => p.clone(),
            None => {
                let blob = match git.find_blob(entry.id()) {
                    Ok(b) => b,
                    Err(e) => {
                        failure = Some(e);
                        return git2::TreeWalkResult::Abort;
                    }
                };
                let p = (blob.size() <= pointer::MAX_LEN).then(|| Pointer::parse(blob.content()).ok()).flatten();
                parsed.insert(entry.id(), p.clone());
                p
            }
        };
        if let Some(p) = found {
            out.push((format!("{dir}{}", String::from_utf8_lossy(entry.name_bytes())), p));
        }
        git2::TreeWalkResult::Ok
    })
    .map_err(super::git(format!("reading the tree of {}", commit.id())))?;
    if let Some(e) = failure {
        return Err(Error::Git { action: format!("reading a blob of {}", commit.id()), source: e });
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}
