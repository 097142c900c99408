//! `prune`: retention. Keeps the newest versions of branches along first parents and drops
//! the rest of their history, then runs gc so the space is freed. The oldest version kept
//! becomes a version whose history is dropped, recorded in `.ckpt/pruned` before anything is
//! deleted (docs/format.md, "Pruned history"); every walk over history stops there
//! ([`super::partial::HistoryCuts`]). A version that another branch, a detached `HEAD` or a
//! partial clone's cut reaches is kept with its history; a tag or a remote-tracking ref keeps
//! its own version (and a remote-tracking ref what its remote lacks); the report names the
//! root. Pending delta rewrites of dropped versions are forgotten, not kept alive.
//!
//! It must not rewrite a version (ids stay; tags, remotes and clones keep meaning the same
//! thing) nor delete anything a root it was not asked to prune still needs.

use super::gc::{GcOptions, GcReport};
use super::graph::{self, Node};
use super::partial::HistoryCuts;
use super::{Error, Head, RefKind, Repo, Result, VersionId};
use crate::object_id::ObjectId;
use crate::store::{DeltaOutcome, Feedback, ObjectKind};
use std::collections::{HashMap, HashSet};

/// `.ckpt/pruned`: JSON, [`PrunedHistory`].
const PRUNED_FILE: &str = "pruned";

/// The record of pruned history, `.ckpt/pruned` (absent when nothing was ever pruned).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrunedHistory {
    /// Versions kept whose parents were dropped: walks over history never follow their
    /// parents, even while some are still on disk.
    pub cut: Vec<VersionId>,
    /// Versions dropped, so that asking for one later says what became of it.
    #[serde(default)]
    pub dropped: Vec<VersionId>,
}

/// Settings of [`Repo::prune`].
#[derive(Clone, Debug, Default)]
pub struct PruneOptions {
    /// The branches to prune; empty: the current one.
    pub branches: Vec<String>,
    /// Say what would go; change nothing.
    pub dry_run: bool,
    /// The gc run after the record is written; `None`: the config's grace period.
    pub gc: Option<GcOptions>,
}

/// A version a prune dropped (or would drop).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PrunedVersion {
    /// The version.
    pub id: VersionId,
    /// Its commit time, seconds since the Unix epoch.
    pub time: i64,
    /// Its message.
    pub message: String,
}

/// A version older than the ones kept that stays because another root needs it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct KeptVersion {
    /// The version.
    pub id: VersionId,
    /// Its commit time, seconds since the Unix epoch.
    pub time: i64,
    /// Its message.
    pub message: String,
    /// What keeps it: a ref's full name (`refs/tags/best`), `HEAD` (detached) or a record
    /// (`.ckpt/partial`).
    pub root: String,
}

/// One branch of a prune.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BranchPruned {
    /// The branch.
    pub name: String,
    /// Versions kept as its newest (fewer than asked when its history is shorter).
    pub kept: usize,
    /// Where its history now ends, when the prune dropped some of it.
    pub cut: Option<VersionId>,
}

/// What [`Repo::prune`] did or, with `dry_run`, would do.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PruneReport {
    /// Nothing changed on purpose.
    pub dry_run: bool,
    /// Versions kept per branch.
    pub keep_last: usize,
    /// The branches pruned.
    pub branches: Vec<BranchPruned>,
    /// Versions dropped, newest first.
    pub dropped: Vec<PrunedVersion>,
    /// Older versions kept because another root needs them, newest first.
    pub kept_by: Vec<KeptVersion>,
    /// Pending delta rewrites of dropped versions forgotten (`.ckpt/pending-deltas`).
    pub pending_forgotten: usize,
    /// Blobs of kept versions recoded because they were deltas against blobs only
    /// dropped versions list (`delta_policy` `previous`, `base`, `skip`).
    pub recoded: usize,
    /// Bytes of those objects before.
    pub recoded_bytes_before: u64,
    /// Bytes of those objects after.
    pub recoded_bytes_after: u64,
    /// Bytes of blobs that only dropped versions list but that stay, because a kept version's
    /// blob is a delta against them.
    pub base_bytes_kept: u64,
    /// The gc (with `dry_run`: what it would delete; `temp_files` is not counted then).
    pub gc: GcReport,
}

/// What a prune drops and keeps, decided before anything changes.
struct Plan {
    branches: Vec<BranchPruned>,
    /// Versions the prune keeps as the branches' newest, oldest first.
    kept_oldest_first: Vec<VersionId>,
    /// Every version some root still needs, with the first root found needing it.
    needed: HashMap<VersionId, String>,
    /// Newest first.
    dropped: Vec<VersionId>,
    /// Older versions of the branches that other roots keep.
    kept_by: Vec<(VersionId, String)>,
    new_cuts: Vec<VersionId>,
    /// The roots after the prune (pending entries of dropped versions gone).
    roots: Vec<VersionId>,
    /// `.ckpt/pending-deltas` after the prune.
    pending: Vec<VersionId>,
    pending_forgotten: usize,
    /// New cuts that were pending: their parent's rewrites are moot, but a save may have stored
    /// their own blobs uncoded, which the compaction after the deletes codes.
    cuts_to_code: Vec<VersionId>,
    /// Where history ends after the prune.
    cuts: HistoryCuts,
}

/// A branch's newest versions a prune keeps (newest first), under the branch's ref name.
type KeptChain = (String, Vec<VersionId>);

/// The blobs a prune's recodes concern ([`Repo::recodes_of`]).
#[derive(Default)]
struct Recodes {
    /// The blobs the needed versions list.
    needed: HashSet<ObjectId>,
    /// The blobs the dropped versions list.
    dropped: HashSet<ObjectId>,
    /// The blobs to recode, each with the reference it loses.
    todo: Vec<(ObjectId, ObjectId)>,
}

impl Repo {
    /// The record of pruned history (empty when nothing was pruned).
    pub fn pruned_history(&self) -> Result<PrunedHistory> {
        Ok(self.read_record(PRUNED_FILE, "pruned history")?.unwrap_or_default())
    }

    /// Whether `ckpt prune` dropped the history before version `id` (a version with parents):
    /// where `log` ends.
    pub fn history_pruned_at(&self, id: &VersionId) -> Result<bool> {
        Ok(self.cut_versions()?.is_pruned(id) && !self.version_info(id)?.parents.is_empty())
    }

    /// The dropped version whose id starts with `prefix` (lowercase hex), if exactly one does.
    pub(super) fn pruned_with_prefix(&self, prefix: &str) -> Result<Option<VersionId>> {
        let history = self.pruned_history()?;
        let mut found = history.dropped.iter().filter(|id| id.to_hex().starts_with(prefix));
        Ok(match (found.next(), found.next()) {
            (Some(id), None) if !self.store.contains(id) => Some(*id),
            _ => None,
        })
    }

    /// Keeps the newest `keep_last` versions of each branch (along first parents) and drops
    /// the rest of their history, then deletes what no root needs any more, as `gc` does
    /// (its grace period applies, except to the dropped version objects themselves).
    ///
    /// A version another root reaches (a tag, another branch, a remote-tracking ref, a
    /// detached `HEAD`, a partial clone's cut) stays with its history; the report names the
    /// root. Pending delta rewrites of dropped versions are forgotten. Blobs of kept versions
    /// that are deltas against blobs only dropped versions list are recoded first (same ids,
    /// bit-exact: whole, or against the oldest kept version's blob), so that those go too.
    ///
    /// A git filter's store is refused ([`Error::GitFilterStore`]): git's pointers, not its
    /// branch, say what it must keep.
    ///
    /// Crash safety: recodes replace an object atomically with the same content; then the
    /// record (`.ckpt/pruned`) is written, fsynced, before anything is deleted. A prune killed
    /// at any point leaves every kept version whole; the next gc or prune finishes it.
    pub fn prune(&self, keep_last: usize, options: &PruneOptions) -> Result<PruneReport> {
        if keep_last == 0 {
            return Err(Error::KeepLastZero);
        }
        if self.dir.join(super::store_file::PATH_RECORDS).exists() {
            return Err(Error::GitFilterStore { operation: "prune" });
        }
        let _lock = self.lock()?;
        let branches = self.branches_to_prune(&options.branches)?;
        let gc_options = options.gc.unwrap_or_else(|| self.gc_options());
        let plan = self.plan_prune(keep_last, &branches)?;
        let mut report = PruneReport {
            dry_run: options.dry_run,
            keep_last,
            branches: plan.branches.clone(),
            pending_forgotten: plan.pending_forgotten,
            ..PruneReport::default()
        };
        for id in &plan.dropped {
            let v = self.version_info(id)?;
            report.dropped.push(PrunedVersion { id: *id, time: v.time, message: v.message });
        }
        for (id, root) in &plan.kept_by {
            let v = self.version_info(id)?;
            report.kept_by.push(KeptVersion { id: *id, time: v.time, message: v.message, root: root.clone() });
        }
        let dropped: HashSet<ObjectId> = plan.dropped.iter().copied().collect();
        let Recodes { needed: needed_blobs, dropped: dropped_blobs, todo: recode } = self.recodes_of(&plan)?;
        if options.dry_run {
            // The recodes are not done, but their bases are counted as freed (the objects
            // recoded grow, which the preview does not know: `recoded_bytes_after` stays 0).
            let whole: HashSet<ObjectId> = recode.iter().map(|(blob, _)| *blob).collect();
            report.recoded = recode.len();
            report.recoded_bytes_before = recode.iter().map(|(b, _)| self.store.stored_len(b).unwrap_or(0)).sum();
            report.base_bytes_kept = self.base_bytes_kept(&plan, &whole, &needed_blobs, &dropped_blobs)?;
            report.gc = self.gc_preview(&plan.roots, &plan.cuts, &whole, &gc_options, &dropped)?;
            return Ok(report);
        }

        // 1. Same content, new coding: safe at any point, and before the bases go.
        self.recode(&recode, &mut report)?;
        report.base_bytes_kept = self.base_bytes_kept(&plan, &HashSet::new(), &needed_blobs, &dropped_blobs)?;
        // 2. The record, before anything is deleted: from here on, walks stop at the cuts.
        if !plan.dropped.is_empty() {
            let before = self.pruned_history()?;
            let mut record = PrunedHistory {
                cut: before.cut.iter().chain(&plan.new_cuts).copied().filter(|v| !dropped.contains(v)).collect(),
                dropped: before.dropped,
            };
            record.cut.sort();
            record.cut.dedup();
            record.cut.retain(|v| self.store.contains(v));
            let known: HashSet<VersionId> = record.dropped.iter().copied().collect();
            record.dropped.extend(plan.dropped.iter().filter(|id| !known.contains(id)));
            self.write_pruned_history(&record)?;
        }
        // 3. Rewrites of dropped versions' blobs would be wasted work: forgotten.
        if plan.pending_forgotten > 0 {
            self.write_pending_deltas(&plan.pending)?;
        }
        // 4. The remaining rewrites make the kept versions smaller, as `ckpt gc` does first.
        self.compact_locked(&super::CompactOptions::default())?;
        // 5. Delete. The dropped version objects go whatever their age: no save in flight
        // writes them, and a walk that ignored the record would find them missing rather
        // than follow them into a half-deleted history.
        report.gc = self.gc_locked(&gc_options, &dropped)?;
        // 6. A kept save's own uncoded blobs (a `ckpt.dcp.Writer` save stores its tensors as
        // written): coded now that its parent is gone, so nothing of the parent is rewritten.
        let to_code: Vec<VersionId> = plan.cuts_to_code.iter().copied().filter(|v| self.store.contains(v)).collect();
        if !to_code.is_empty() {
            let mut pending = self.pending_deltas()?;
            for v in to_code {
                if !pending.contains(&v) {
                    pending.push(v);
                }
            }
            self.write_pending_deltas(&pending)?;
            self.compact_locked(&super::CompactOptions::default())?;
        }
        Ok(report)
    }

    /// The branches named (or the current one) with their tips, each once.
    fn branches_to_prune(&self, names: &[String]) -> Result<Vec<(String, VersionId)>> {
        let names: Vec<String> = if names.is_empty() {
            match self.refs.head()? {
                Head::Branch(b) => vec![b],
                Head::Detached(_) => return Err(Error::NoCurrentBranch { operation: "prune" }),
            }
        } else {
            names.to_vec()
        };
        let mut out: Vec<(String, VersionId)> = Vec::new();
        for name in names {
            super::check_name(&name)?;
            if out.iter().any(|(n, _)| *n == name) {
                continue;
            }
            let tip = match self.refs.get(RefKind::Branch, &name)? {
                Some(tip) => tip,
                None if self.refs.head()? == Head::Branch(name.clone()) => return Err(Error::Unborn { branch: name }),
                None => return Err(Error::NoSuchBranch { name }),
            };
            out.push((name, tip));
        }
        Ok(out)
    }

    /// Decides what a prune of `branches` to their newest `keep_last` versions drops.
    fn plan_prune(&self, keep_last: usize, branches: &[(String, VersionId)]) -> Result<Plan> {
        let cuts = self.cut_versions()?;
        let (mut needed, others) = self.needed_by_others(branches, &cuts)?;
        let (mut plans, chains) = self.newest_of(keep_last, branches, &cuts, &mut needed)?;
        let mut kept_oldest_first = Vec::new();
        let mut kept = HashSet::new();
        for (root, chain) in &chains {
            for id in chain {
                if kept.insert(*id) {
                    kept_oldest_first.push(*id);
                }
                needed.entry(*id).or_insert_with(|| root.clone());
            }
        }
        kept_oldest_first.reverse();
        // What the branches hold beyond that: dropped unless another root needs it.
        // (Per branch: one branch's older version may be among another's newest.)
        let mut older = Vec::new();
        let mut listed = HashSet::new();
        for (_, chain) in &chains {
            let own: HashSet<&VersionId> = chain.iter().collect();
            let history = self.mark_history(&chain[..1], &cuts, "", &mut HashMap::new())?;
            older.extend(history.into_iter().filter(|id| !own.contains(id) && listed.insert(*id)));
        }
        self.mark_unpushed(&older, &others, &cuts, &mut needed)?;
        let (kept_by, dropped): (Vec<VersionId>, Vec<VersionId>) =
            older.into_iter().partition(|id| needed.contains_key(id));
        let kept_by: Vec<(VersionId, String)> = kept_by.into_iter().map(|id| (id, needed[&id].clone())).collect();
        let dropped_set: HashSet<VersionId> = dropped.iter().copied().collect();
        // History now ends at each kept version with a dropped parent (only versions the
        // branches hold can have one: a version a tag or remote-tracking ref keeps alone, or
        // one of the branches' newest).
        let mut new_cuts = Vec::new();
        for id in kept_oldest_first.iter().chain(kept_by.iter().map(|(id, _)| id)) {
            if self.parents_followed(&cuts, id)?.iter().any(|p| dropped_set.contains(p)) {
                new_cuts.push(*id);
            }
        }
        new_cuts.sort();
        new_cuts.dedup();
        for (plan, (_, tip)) in plans.iter_mut().zip(branches) {
            for info in self.first_parents(*tip, &cuts) {
                let id = info?.id;
                if new_cuts.contains(&id) {
                    plan.cut = Some(id);
                    break;
                }
            }
        }
        let pending_before = self.pending_deltas()?;
        let (cuts_to_code, pending): (Vec<VersionId>, Vec<VersionId>) =
            pending_before.iter().filter(|v| !dropped_set.contains(v)).partition(|v| new_cuts.contains(v));
        let mut roots: Vec<VersionId> = others.iter().map(|r| r.id).collect();
        roots.extend(branches.iter().map(|(_, tip)| *tip));
        roots.extend(pending.iter().copied().filter(|v| self.store.contains(v)));
        let mut after = cuts.clone();
        after.pruned.extend(new_cuts.iter().copied());
        Ok(Plan {
            branches: plans,
            kept_oldest_first,
            needed,
            dropped,
            kept_by,
            new_cuts,
            roots,
            pending_forgotten: pending_before.len() - pending.len(),
            cuts_to_code,
            pending,
            cuts: after,
        })
    }

    /// What the roots other than `branches` (and the pending delta rewrites) keep, each
    /// version with the first root found keeping it, and those roots. Every other branch, a
    /// detached HEAD and a partial clone's cut keep their whole history (as far as it is held
    /// here): each is a line of work of its own. A tag and a remote-tracking ref keep their own
    /// version, not its history: a tag marks one checkpoint (tagging each save, or the best
    /// one, must not make `keep_last` keep everything), and a remote-tracking ref's history is
    /// on its remote (what was not pushed there yet stays: `mark_unpushed`). Pending delta
    /// rewrites are no reason to keep a version: those of dropped versions are forgotten.
    fn needed_by_others(
        &self,
        branches: &[(String, VersionId)],
        cuts: &HistoryCuts,
    ) -> Result<(HashMap<VersionId, String>, Vec<super::Root>)> {
        let pruned_refs: HashSet<String> = branches.iter().map(|(b, _)| format!("refs/heads/{b}")).collect();
        let mut needed: HashMap<VersionId, String> = HashMap::new();
        let mut others = Vec::new();
        for root in self.roots() {
            let root = root?;
            if pruned_refs.contains(&root.name) || root.name == ".ckpt/pending-deltas" {
                continue;
            }
            if root.name.starts_with("refs/tags/") || root.name.starts_with("refs/remotes/") {
                needed.entry(root.id).or_insert_with(|| root.name.clone());
            } else {
                self.mark_history(&[root.id], cuts, &root.name, &mut needed)?;
            }
            others.push(root);
        }
        Ok((needed, others))
    }

    /// Each branch's newest `keep_last` versions along first parents (newest first, with the
    /// branch's ref name), marking in `needed` whatever they merged.
    fn newest_of(
        &self,
        keep_last: usize,
        branches: &[(String, VersionId)],
        cuts: &HistoryCuts,
        needed: &mut HashMap<VersionId, String>,
    ) -> Result<(Vec<BranchPruned>, Vec<KeptChain>)> {
        let mut plans = Vec::new();
        let mut chains = Vec::new();
        for (name, tip) in branches {
            let root = format!("refs/heads/{name}");
            let chain: Vec<super::VersionInfo> =
                self.first_parents(*tip, cuts).take(keep_last).collect::<Result<_>>()?;
            // Marked before the kept versions themselves, whose own history is not needed.
            for v in &chain[..chain.len().saturating_sub(1)] {
                let merged: Vec<VersionId> = self.parents_here(cuts, &v.id, &v.parents).into_iter().skip(1).collect();
                self.mark_history(&merged, cuts, &root, needed)?;
            }
            plans.push(BranchPruned { name: name.clone(), kept: chain.len(), cut: None });
            chains.push((root, chain.into_iter().map(|v| v.id).collect()));
        }
        Ok((plans, chains))
    }

    /// Adds every version of the history of `starts` (stopping at `cuts`) to `into`, named
    /// `root`, down to versions already there; returns those added, in the order found (along
    /// first parents, newest first).
    fn mark_history(
        &self,
        starts: &[VersionId],
        cuts: &HistoryCuts,
        root: &str,
        into: &mut HashMap<VersionId, String>,
    ) -> Result<Vec<VersionId>> {
        let mut added = Vec::new();
        // A version already marked has its history marked too (same cuts).
        let enter = |n: &Node| !into.contains_key(&n.id());
        graph::walk(self, starts.iter().map(|id| Node::Version(*id)), enter, |node, edges| {
            added.push(node.id());
            // First parent first: a linear history comes out newest first.
            let parents = self.parents_here(cuts, &node.id(), &graph::versions(&edges));
            Ok(parents.into_iter().map(Node::Version).collect())
        })?;
        into.extend(added.iter().map(|id| (*id, root.to_string())));
        Ok(added)
    }

    /// Marks as needed the versions of `older` (what the pruned branches hold beyond the
    /// versions kept) that descend from a remote-tracking ref's version: not pushed to that
    /// remote yet. Dropping them would leave the branch unpushable there (the remote's tip
    /// would no longer be an ancestor of it) and the remote without them for good.
    fn mark_unpushed(
        &self,
        older: &[VersionId],
        roots: &[super::Root],
        cuts: &HistoryCuts,
        needed: &mut HashMap<VersionId, String>,
    ) -> Result<()> {
        let tracking: Vec<&super::Root> = roots.iter().filter(|r| r.name.starts_with("refs/remotes/")).collect();
        if tracking.is_empty() {
            return Ok(());
        }
        let older_set: HashSet<VersionId> = older.iter().copied().collect();
        let mut children: HashMap<VersionId, Vec<VersionId>> = HashMap::new();
        for id in older {
            for p in self.parents_followed(cuts, id)? {
                children.entry(p).or_default().push(*id);
            }
        }
        for root in tracking {
            let reason = format!("{} (not pushed there yet)", root.name);
            let mut stack = vec![root.id];
            let mut seen = HashSet::new();
            while let Some(id) = stack.pop() {
                if !seen.insert(id) {
                    continue;
                }
                if older_set.contains(&id) && id != root.id {
                    needed.entry(id).or_insert_with(|| reason.clone());
                }
                stack.extend(children.get(&id).into_iter().flatten().copied());
            }
        }
        Ok(())
    }

    /// The blobs the files of `versions` list (not their delta references), each once, in
    /// the order listed.
    fn listed_blobs<'a>(&self, versions: impl IntoIterator<Item = &'a VersionId>) -> Result<Vec<ObjectId>> {
        let mut blobs = Vec::new();
        let mut seen = HashSet::new();
        graph::walk(
            self,
            versions.into_iter().map(|id| Node::Version(*id)),
            |_| true,
            |node, edges| {
                Ok(match node {
                    // Its files, not its history.
                    Node::Version(_) => edges.into_iter().filter(|n| matches!(n, Node::Manifest(_))).collect(),
                    _ => {
                        blobs.extend(edges.iter().map(Node::id).filter(|b| seen.insert(*b)));
                        Vec::new()
                    }
                })
            },
        )?;
        Ok(blobs)
    }

    /// The blobs the needed versions list, those the dropped ones list, and the recodes: the
    /// blobs of the needed versions (older versions other roots keep, then the branches' kept
    /// versions oldest first, then any other needed version) whose delta reference no needed
    /// version lists, each with that reference. Under `previous` (and `base`, `skip`) the
    /// oldest kept version is coded against the version before it (or an older full base),
    /// and under `reverse` an older version a tag keeps against the version after it; either
    /// would otherwise keep the dropped blobs as bases.
    fn recodes_of(&self, plan: &Plan) -> Result<Recodes> {
        if plan.dropped.is_empty() {
            return Ok(Recodes::default());
        }
        let needed: HashSet<ObjectId> = self.listed_blobs(plan.needed.keys())?.into_iter().collect();
        let dropped: HashSet<ObjectId> = self.listed_blobs(&plan.dropped)?.into_iter().collect();
        // Every version still needed, not only the branches' newest: under `reverse` an
        // older version a tag keeps is a delta against the next one, which is dropped.
        let mut order: Vec<VersionId> = plan.kept_by.iter().map(|(id, _)| *id).collect();
        order.extend(plan.kept_oldest_first.iter().copied());
        let listed: HashSet<VersionId> = order.iter().copied().collect();
        let mut others: Vec<VersionId> = plan.needed.keys().filter(|id| !listed.contains(id)).copied().collect();
        others.sort_unstable();
        order.extend(others);
        let mut todo = Vec::new();
        for blob in self.listed_blobs(&order)? {
            match graph::edges(self, Node::Blob(blob))?.first() {
                Some(r) if !needed.contains(&r.id()) => todo.push((blob, r.id())),
                _ => {}
            }
        }
        Ok(Recodes { needed, dropped, todo })
    }

    /// Recodes the blobs `todo` (each with the reference it loses): the first of each old
    /// reference whole, the others (the same tensor in newer versions, coded against one old
    /// full base under `base` and `skip`) as deltas against that one where smaller. The same
    /// content under the same id, written like any object (temp file, fsync, rename over the
    /// old one) and checked against its id as it is coded; the new reference is durable and
    /// whole before a delta names it. One tensor is held in memory at a time.
    fn recode(&self, todo: &[(ObjectId, ObjectId)], report: &mut PruneReport) -> Result<()> {
        let options = self.config.codec_options();
        let feedback = Feedback { progress: &|_| {}, release_input: &|_| {}, input_xxh3: None };
        let mut rebased: HashMap<ObjectId, (ObjectId, u64)> = HashMap::new();
        self.progress.start("recode", todo.len() as u64);
        for (n, (blob, old_reference)) in todo.iter().enumerate() {
            let (data, dtype, before) = {
                let chain = self.store.open_blob(blob)?;
                let mut data = Vec::new();
                chain.copy_to(&mut data)?;
                (data, chain.dtype(), chain.stored_len())
            };
            let mut written = None;
            if let Some((first, whole_len)) = rebased.get(old_reference) {
                let reference = self.store.open_blob(first)?;
                // Another length or dtype (not the same tensor after all) does not pair: whole.
                if reference.dtype() == dtype && reference.len() == data.len() as u64 {
                    if let Ok(DeltaOutcome::Written(w)) =
                        self.store.write_blob_delta(*blob, &data, &reference, *whole_len, &options, &feedback)
                    {
                        written = Some(w);
                    }
                }
            }
            let written = match written {
                Some(w) => w,
                None => {
                    let w = self.store.write_blob(*blob, &data, dtype, &options, &feedback)?;
                    rebased.entry(*old_reference).or_insert((*blob, w.stored_len));
                    w
                }
            };
            self.index_object(&written);
            report.recoded += 1;
            report.recoded_bytes_before += before;
            report.recoded_bytes_after += written.stored_len;
            self.progress.set(n as u64 + 1);
        }
        self.progress.finish();
        Ok(())
    }

    /// Bytes of blobs that only dropped versions list and that stay after the prune, because
    /// a kept blob's delta chain goes through them (the blobs `whole` taken as standalone).
    fn base_bytes_kept(
        &self,
        plan: &Plan,
        whole: &HashSet<ObjectId>,
        needed_blobs: &HashSet<ObjectId>,
        dropped_blobs: &HashSet<ObjectId>,
    ) -> Result<u64> {
        let reachable = self.reachable_with_cuts(&plan.roots, &plan.cuts, whole)?;
        Ok(reachable
            .iter()
            .filter(|n| n.kind == ObjectKind::Blob && dropped_blobs.contains(&n.id) && !needed_blobs.contains(&n.id))
            .map(|n| self.store.stored_len(&n.id).unwrap_or(0))
            .sum())
    }

    /// Replaces `.ckpt/pruned` (written to a temp file, fsynced, renamed).
    fn write_pruned_history(&self, record: &PrunedHistory) -> Result<()> {
        let mut text = serde_json::to_string(record).expect("plain data serializes");
        text.push('\n');
        self.refs.write(&self.dir.join(PRUNED_FILE), &text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_parses_without_dropped_and_rejects_unknown_keys() {
        let id = ObjectId::hash(b"v");
        let text = format!("{{\"cut\":[\"{id}\"]}}");
        let parsed: PrunedHistory = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed, PrunedHistory { cut: vec![id], dropped: vec![] });
        assert!(serde_json::from_str::<PrunedHistory>(r#"{"cut":[],"remote":"x"}"#).is_err());
        let written = serde_json::to_string(&PrunedHistory { cut: vec![id], dropped: vec![id] }).unwrap();
        assert_eq!(written, format!("{{\"cut\":[\"{id}\"],\"dropped\":[\"{id}\"]}}"));
    }
}
