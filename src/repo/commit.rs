//! `commit`: the one commit pipeline, plan → hash → pair → code → store → manifest → version →
//! ref ([`Repo::commit_inputs`]), and its entry point for files on disk ([`Repo::commit`]).
//! The other entry points hand it their inputs (memory files: `commit_memory`; the git filter:
//! `store_file`) or run its stages alone (a DCP save's objects and version: `commit_stored`).
//! All inputs are parsed before anything is written, so an invalid file changes nothing.

use super::chains::since_base_after;
use super::commit_objects::ObjectPlan;
use super::cut::{Input, Rules};
use super::model::{FileEntry, Version, MODEL_FORMAT};
use super::status::now_ns;
use super::{now_secs, DeltaPolicy, Error, Head, RefKind, Repo, Result, VersionId};
use crate::object_id::ObjectId;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

/// Settings of one commit. `Default` takes everything from the repository config.
#[derive(Clone, Debug, Default)]
pub struct CommitOptions {
    /// Commit time in seconds since the Unix epoch (default: now).
    pub time: Option<i64>,
    /// Overrides the config's `delta_policy`.
    pub delta_policy: Option<DeltaPolicy>,
    /// Overrides the config's `base_every`.
    pub base_every: Option<u32>,
    /// With the `reverse` delta policy: leave the rewrite of the parent's blobs as deltas to
    /// [`Repo::compact`] (recorded in `.ckpt/pending-deltas`) instead of doing it before
    /// returning. The commit then costs one coding pass instead of two; `ckpt commit` runs the
    /// compaction in a background process.
    pub defer_deltas: bool,
}

impl Repo {
    /// Commits `paths` (absolute, or relative to the repository root) as a new version on top
    /// of `HEAD`, with every file of the parent version that is not named again and not
    /// `rm`-ed. A directory stands for every file under it, as it is now: files the parent
    /// version tracked under it that are gone are dropped (`git add DIR` does the same), so a
    /// DCP checkpoint saved again on fewer ranks leaves no stale rank file
    /// (`.ckpt` and `.git` skipped; a link to a directory refused). Returns the new version's id.
    ///
    /// Files named `*.safetensors` must be valid safetensors; other files are stored tensor by
    /// tensor if they parse as safetensors, storage by storage if they are `torch.save` archives
    /// ([`crate::torch_zip`]), and as opaque bytes otherwise.
    pub fn commit<P: AsRef<Path>>(&self, paths: &[P], message: &str, options: &CommitOptions) -> Result<VersionId> {
        let _lock = self.lock()?;
        let (files, dropped) = self.expand_directories(paths)?;
        let inputs = self.read_inputs(&files)?;
        self.commit_inputs(inputs, Onto::Head { dropped: &dropped }, message, options)
    }

    /// `paths` with each directory replaced by the files under it (sorted; `.ckpt` and `.git`
    /// directories skipped; a symbolic link to a file is the file, as when named, and one to a
    /// directory is refused rather than followed, which could loop or leave the tree), and the
    /// paths `HEAD` tracks under those directories that are no longer there. A directory with
    /// no file under it and none tracked is an error: there is nothing to commit from it.
    fn expand_directories<P: AsRef<Path>>(&self, paths: &[P]) -> Result<(Vec<PathBuf>, Vec<String>)> {
        let mut files = Vec::new();
        let mut dropped = Vec::new();
        let mut head = None;
        for p in paths {
            let p = p.as_ref();
            let absolute = if p.is_absolute() { p.to_path_buf() } else { self.root.join(p) };
            if !std::fs::metadata(&absolute).is_ok_and(|m| m.is_dir()) {
                // Files, and what is not there: `read_input` names the problem.
                files.push(absolute);
                continue;
            }
            let prefix = if std::fs::canonicalize(&absolute).is_ok_and(|c| c == self.root) {
                String::new()
            } else if std::fs::symlink_metadata(&absolute).is_ok_and(|m| m.file_type().is_symlink()) {
                // As inside a directory (`files_under`): its files are not in the working tree.
                return Err(Error::InvalidPath { path: p.to_path_buf(), reason: LINKED_DIRECTORY.into() });
            } else {
                self.repo_path(&absolute)?.to_string()
            };
            let found = files_under(&absolute)?;
            let mut present = HashSet::new();
            for f in &found {
                present.insert(self.repo_path(f)?.to_string());
            }
            if head.is_none() {
                head = Some(self.refs.head_version()?.map(|id| self.version(&id)).transpose()?);
            }
            let tracked_gone: Vec<String> = head
                .iter()
                .flatten()
                .flat_map(|v| v.files_under(&prefix))
                .filter(|f| !present.contains(&f.path))
                .map(|f| f.path.clone())
                .collect();
            if found.is_empty() && tracked_gone.is_empty() {
                return Err(Error::InvalidPath {
                    path: p.to_path_buf(),
                    reason: "a directory with no file under it: nothing to commit".into(),
                });
            }
            files.extend(found);
            dropped.extend(tracked_gone);
        }
        Ok((files, dropped))
    }

    /// The pipeline every commit of inputs runs, under the writer lock the caller holds: plan
    /// the version ([`Self::plan_version`]), store the inputs' objects ([`Self::store_inputs`]:
    /// hash, pair, code, store, manifests), rewrite the parent's blobs as deltas under the
    /// `reverse` policy, write the version, move `HEAD`'s branch to it. `onto` says which
    /// version it follows and which files it keeps.
    pub(super) fn commit_inputs(
        &self,
        inputs: Vec<Input>,
        onto: Onto<'_>,
        message: &str,
        options: &CommitOptions,
    ) -> Result<VersionId> {
        let beside = match onto {
            Onto::Stored { beside, .. } => beside,
            Onto::Head { .. } => None,
        };
        let mut plan = self.plan_version(&inputs, onto, options)?;
        let stored = self.store_inputs(
            &inputs,
            ObjectPlan {
                reference: plan.reference.as_ref(),
                deltas: (plan.policy != DeltaPolicy::Reverse).then_some(plan.base_every),
                derive: Some((&plan.files, plan.parent.as_ref())),
                beside,
                pieces: Vec::new(),
                locked: true,
            },
        )?;
        // Reverse deltas: the parent's blobs become deltas against the new ones, now durable,
        // here or (deferred) in a later `compact`. (Only tensors are rewritten: a commit of
        // opaque files leaves nothing to do.)
        let reverse_parent = plan.parent.as_ref().filter(|_| {
            plan.policy == DeltaPolicy::Reverse
                && plan.base_every >= 2
                && inputs.iter().any(|i| i.header.is_some() || i.torch.is_some())
        });
        let (mut rewritten, mut compaction_error) = (Vec::new(), None);
        if let (Some(parent), false) = (reverse_parent, options.defer_deltas) {
            match self.rewrite_parent_now(&stored.entries, parent) {
                Ok(r) => rewritten = r,
                // The version itself is complete and durable: it is committed anyway, with the
                // parent left whole and this version pending (below), as a deferred commit
                // leaves it; the failure is recorded once the version has an id.
                Err(e) => compaction_error = Some(e),
            }
        }
        let leave_pending = reverse_parent.is_some() && (options.defer_deltas || compaction_error.is_some());
        // What the store grew by: rewritten objects replace larger ones.
        let written: u64 = stored.objects.iter().chain(rewritten.iter().map(|(w, _)| w)).map(|w| w.stored_len).sum();
        let stored_bytes = written.saturating_sub(rewritten.iter().map(|(_, old_len)| old_len).sum());
        for (w, _) in &rewritten {
            self.index_object(w);
        }
        for entry in &stored.entries {
            plan.files.insert(entry.path.clone(), entry.clone());
        }
        let new = NewVersion {
            parents: plan.parents,
            since_base: plan.since_base,
            files: plan.files.into_values().collect(),
            stored_bytes,
            message,
            time: options.time,
        };
        let id = self.write_version(new)?;
        // The ref moves last: until here, the new objects are unreferenced.
        match plan.head {
            Head::Branch(b) => self.refs.set(RefKind::Branch, &b, &id)?,
            Head::Detached(_) => self.refs.set_head(&Head::Detached(id))?,
        }
        if leave_pending {
            self.leave_pending(&id)?;
        }
        if let Some(e) = compaction_error {
            // Reported through `.ckpt/compact.log` and the pending list (`ckpt commit` warns);
            // the commit succeeded.
            let _ = self.compaction_failed(&id, e);
        }
        self.write_removals(&[])?;
        self.record_stats(&inputs, &stored.entries);
        self.flush_index();
        Ok(id)
    }

    /// The first step of [`Self::commit_inputs`], before any input is read: where the version
    /// goes, what it keeps, what its tensors are delta-coded against. Fails when there is
    /// nothing to commit, or when the version would hold both `a` and `a/b`.
    fn plan_version(&self, inputs: &[Input], onto: Onto<'_>, options: &CommitOptions) -> Result<VersionPlan> {
        let policy = options.delta_policy.unwrap_or(self.config.delta_policy);
        let base_every = self.base_every(options.base_every);
        let head = self.refs.head()?;
        let head_version = self.refs.head_version()?;
        let parent_id = match onto {
            Onto::Head { .. } => head_version,
            Onto::Stored { on, .. } => on,
        };
        let parent = parent_id.map(|id| self.version(&id)).transpose()?;
        let mut removals = self.pending_removals()?;
        let mut parents: Vec<VersionId> = parent_id.into_iter().collect();
        let mut files = BTreeMap::new();
        match onto {
            Onto::Head { dropped } => {
                removals.extend(dropped.iter().cloned());
                files.extend(parent.iter().flat_map(|p| &p.files).map(|f| (f.path.clone(), f.clone())));
            }
            Onto::Stored { .. } => parents.extend(head_version.filter(|h| Some(*h) != parent_id)),
        }
        if inputs.is_empty() && removals.is_empty() {
            return Err(Error::NothingToCommit);
        }
        for r in &removals {
            files.remove(r);
        }
        // A version holding both `a` and `a/b` could never be checked out: refused before
        // anything is stored, naming both (one may be kept from the parent).
        let named = inputs.iter().map(|i| i.path.as_str());
        let conflict = match onto {
            Onto::Head { .. } => super::path::prefix_conflict(files.keys().map(String::as_str).chain(named)),
            Onto::Stored { .. } => None,
        };
        if let Some((file, under)) = conflict {
            return Err(Error::InvalidPath {
                path: PathBuf::from(&under),
                reason: format!(
                    "cannot be in the same version as the file {file:?}: {file:?} cannot be both a file and a \
                     directory; stop tracking one of them first (ckpt rm)"
                ),
            });
        }
        let since_base = since_base_after(parent.as_ref(), base_every);
        let reference = self.delta_reference(parent.as_ref(), since_base, policy);
        Ok(VersionPlan { head, parents, parent, since_base, policy, base_every, reference, files })
    }

    /// The last step of every commit: writes the version `new` describes (its manifests and
    /// blobs stored) and returns its id; no ref moves.
    pub(crate) fn write_version(&self, new: NewVersion<'_>) -> Result<VersionId> {
        let version = Version {
            format: MODEL_FORMAT,
            parents: new.parents,
            time: new.time.unwrap_or_else(now_secs),
            message: new.message.to_string(),
            since_base: new.since_base,
            raw_bytes: new.files.iter().map(|f| f.len).sum(),
            stored_bytes: new.stored_bytes,
            files: new.files,
        };
        version.check_limits().map_err(|reason| Error::OverLimit { what: "the version".into(), reason })?;
        self.record_version(&version)
    }

    /// Maps and parses every input; fails on the first invalid one before anything is stored.
    fn read_inputs<P: AsRef<Path>>(&self, paths: &[P]) -> Result<Vec<Input>> {
        let mut seen = HashSet::new();
        let mut inputs = Vec::new();
        for p in paths {
            let path = self.repo_path(p.as_ref())?;
            if !seen.insert(path.clone()) {
                continue;
            }
            inputs.push(self.read_input(p.as_ref())?);
        }
        Ok(inputs)
    }

    /// Maps and parses the file at `p` (absolute, or relative to the repository root). A named
    /// pipe, socket or device is refused before anything blocks on it (the writer lock is held),
    /// and so is a path beyond a symbolic link to a directory (git's rule: a later `switch`
    /// would delete, and a checkout write, wherever the link leads).
    pub(super) fn read_input(&self, p: &Path) -> Result<Input> {
        let path = self.repo_path(p)?;
        path.refuse_beyond_symlink(&self.root, "tracked")?;
        let abs = path.under(&self.root);
        Input::open(&abs, path, Rules::Commit, None)
    }

    /// Remembers size, mtime and hash of the committed files (`entries`, those of `inputs`)
    /// for `status`.
    fn record_stats(&self, inputs: &[Input], entries: &[FileEntry]) {
        let now = now_ns();
        for (input, entry) in inputs.iter().zip(entries).filter(|(i, _)| i.in_working_tree) {
            let record = super::status::stat_record(&input.metadata, entry.hash, now);
            self.index_stat(input.path.as_str(), &record);
        }
    }
}

/// Which version a commit follows, and which of its files the new one keeps.
#[derive(Clone, Copy)]
pub(super) enum Onto<'d> {
    /// `HEAD`'s version, keeping each of its files that is not named again, not `rm`-ed and
    /// not in `dropped`.
    Head { dropped: &'d [String] },
    /// The git filter's store (docs/format.md, "The git filter's store versions"): the version
    /// lists only the inputs, its first parent (what its deltas and `since_base` follow) is
    /// this version, and `HEAD`'s version, when another, is its last parent, so that every
    /// version stays reachable from the branch. `beside` (the git filter's): manifests of
    /// files stored beside it (cleaned earlier by the same process, the files of git's
    /// `HEAD`), whose F32 tensors its BF16 and F16 tensors may be derived from, as from a file
    /// of the same version; its F32 tensors are then never widened from narrow ones (their
    /// narrow copies are derived from them instead, if need be later:
    /// [`Repo::derive_copies_from`]).
    Stored { on: Option<VersionId>, beside: Option<&'d [ObjectId]> },
}

/// What [`Repo::plan_version`] decided.
struct VersionPlan {
    /// `HEAD` as the commit found it: the branch it moves.
    head: Head,
    parents: Vec<VersionId>,
    /// The first parent.
    parent: Option<Version>,
    since_base: u32,
    policy: DeltaPolicy,
    base_every: u32,
    /// The version whose tensors the new ones are delta-coded against.
    reference: Option<Version>,
    /// The files the version keeps, by path; the inputs' entries join them.
    files: BTreeMap<String, FileEntry>,
}

/// A version to write ([`Repo::write_version`]), as its entry point decided it.
pub(crate) struct NewVersion<'a> {
    pub(crate) parents: Vec<VersionId>,
    pub(crate) since_base: u32,
    pub(crate) files: Vec<FileEntry>,
    /// What the store grew by for it (`log`, `show`).
    pub(crate) stored_bytes: u64,
    pub(crate) message: &'a str,
    /// Seconds since the Unix epoch (default: now).
    pub(crate) time: Option<i64>,
}

/// Why a commit refuses a symbolic link to a directory.
const LINKED_DIRECTORY: &str = "a symbolic link to a directory: not followed (name its target to commit it)";

/// The files under directory `dir`, sorted ([`Repo::expand_directories`]).
fn files_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).map_err(super::error::io("reading the directory", &d))? {
            let entry = entry.map_err(super::error::io("reading the directory", &d))?;
            let path = entry.path();
            let kind = entry.file_type().map_err(super::error::io("reading", &path))?;
            if kind.is_dir() {
                if entry.file_name() != ".ckpt" && entry.file_name() != ".git" {
                    stack.push(path);
                }
            } else if kind.is_symlink() && std::fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
                return Err(Error::InvalidPath { path, reason: LINKED_DIRECTORY.into() });
            } else {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}
