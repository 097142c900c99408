//! What versions need: the versions themselves, their ancestors, their manifests, the blobs
//! those list and every blob a delta is coded against, down to its standalone base (a derived
//! blob's cross-precision reference, a blob of another dtype, is followed the same way: it is
//! the `reference` of its header, docs/format.md "Derived blobs"). `gc`
//! keeps this set for the versions [`Repo::roots`] names; `verify` checks it for the same
//! roots; `push` sends the part of it the remote lacks; `fetch` walks the same relation on the
//! remote's side.

use super::graph::{self, Node};
use super::partial::HistoryCuts;
use super::{Repo, Result, VersionId};
use crate::object_id::ObjectId;
use crate::store::{ObjectKind, MAX_CHAIN_DEPTH};
use std::collections::HashSet;

/// One object a set of versions needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Needed {
    /// The object.
    pub id: ObjectId,
    /// Its kind.
    pub kind: ObjectKind,
    /// For a delta blob, the blob it is coded against (also in the set, unless skipped); for a
    /// derived blob, its cross-precision reference.
    pub reference: Option<ObjectId>,
}

/// A version the repository keeps because something names it (docs/format.md, "What gc keeps").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Root {
    /// What names it: a ref's full name (`refs/remotes/origin/main`), `HEAD` (detached), or
    /// the record (`.ckpt/partial`, `.ckpt/pending-deltas`).
    pub name: String,
    /// The version.
    pub id: VersionId,
}

impl Repo {
    /// The roots of reachability, the one list that `gc` keeps everything below and `verify`
    /// checks everything below: every ref file under `refs/` in any namespace (branches, tags,
    /// remote-tracking refs, and any namespace added later), a detached `HEAD` (a `HEAD` on a
    /// branch is that branch's ref), and the versions two records name: a partial clone's cut
    /// versions (each downloaded on purpose, `.ckpt/partial`) and the versions whose parents'
    /// blobs are still to be rewritten as deltas against theirs (`.ckpt/pending-deltas`). A
    /// version a record names that is no longer stored is not a root (both records tolerate
    /// that: compaction drops such a version, a partial clone downloads it again); a ref that
    /// names one is, and its walk fails.
    ///
    /// A ref or record that cannot be read is an `Err` entry: `gc` refuses to run (it cannot
    /// know what that ref keeps), `verify` reports it.
    pub fn roots(&self) -> Vec<Result<Root>> {
        let mut out = Vec::new();
        let refs = self.refs.all();
        match self.refs.head() {
            Ok(super::Head::Detached(id)) => out.push(Ok(Root { name: "HEAD".into(), id })),
            // The branch is a root of `Refs::all` when its ref file is there; when the walk
            // did not list it, it is read here so that a ref `HEAD` names which cannot be
            // read is an error, never an unborn branch.
            Ok(super::Head::Branch(b)) => {
                let name = format!("refs/heads/{b}");
                if !refs.iter().any(|(listed, _)| *listed == name) {
                    if let Err(e) = self.refs.get(super::RefKind::Branch, &b) {
                        out.push(Err(e));
                    }
                }
            }
            Err(e) => out.push(Err(e)),
        }
        for (name, read) in refs {
            out.push(read.map(|id| Root { name, id }));
        }
        let records: [(&str, Result<Vec<VersionId>>); 2] = [
            (".ckpt/partial", self.partial_clone().map(|p| p.map(|p| p.cut).unwrap_or_default())),
            (".ckpt/pending-deltas", self.pending_deltas()),
        ];
        for (name, ids) in records {
            match ids {
                Ok(ids) => out.extend(
                    ids.into_iter().filter(|id| self.store.contains(id)).map(|id| Ok(Root { name: name.into(), id })),
                ),
                Err(e) => out.push(Err(e)),
            }
        }
        out
    }

    /// Every object the versions `roots` need (docs/format.md: a version names its parents and
    /// manifests, a manifest its blobs, a delta blob its reference), each once, in the order
    /// found: a version before its manifests, a delta before its reference. An object for
    /// which `skip` returns true is left out together with everything below it that is reached
    /// only through it (for objects known to be elsewhere with all they need).
    ///
    /// Every version and manifest reached is read and every blob's header: an unreadable one
    /// is an error (gc must not delete what it cannot see the needs of).
    pub fn reachable(&self, roots: &[VersionId], skip: &dyn Fn(&ObjectId) -> bool) -> Result<Vec<Needed>> {
        self.walk(roots, skip, true, &self.cut_versions()?, &HashSet::new())
    }

    /// [`Repo::reachable`] (nothing skipped) with history ending at `cut` instead of the
    /// recorded cuts, and the blobs `whole` taken as standalone (their references not
    /// followed): what a prune would keep, before it records or recodes anything.
    pub(super) fn reachable_with_cuts(
        &self,
        roots: &[VersionId],
        cut: &HistoryCuts,
        whole: &HashSet<ObjectId>,
    ) -> Result<Vec<Needed>> {
        self.walk(roots, &|_| false, true, cut, whole)
    }

    /// The objects the versions `roots` name: [`Repo::reachable`] without the blobs that are
    /// only references of deltas. What another store holds for these versions is these ids,
    /// each with a chain of that store's own: the references here are how this store encodes
    /// them (a compaction may have made an old blob a delta against a newer one).
    pub fn named(&self, roots: &[VersionId]) -> Result<Vec<Needed>> {
        self.walk(roots, &|_| false, false, &self.cut_versions()?, &HashSet::new())
    }

    /// The walk of [`Repo::reachable`] and [`Repo::named`]: history ends at `cut` (a partial
    /// clone's cut versions, pruned history: partial.rs); the references of blobs in `whole`
    /// are not followed.
    fn walk(
        &self,
        roots: &[VersionId],
        skip: &dyn Fn(&ObjectId) -> bool,
        chains: bool,
        cut: &HistoryCuts,
        whole: &HashSet<ObjectId>,
    ) -> Result<Vec<Needed>> {
        let mut out = Vec::new();
        let roots = roots.iter().map(|id| Node::Version(*id));
        graph::walk(
            self,
            roots,
            |node| !skip(&node.id()),
            |node, edges| {
                let id = node.id();
                let reference = match node {
                    Node::Blob(_) => edges.first().map(Node::id),
                    _ => None,
                };
                out.push(Needed { id, kind: node.kind(), reference });
                Ok(match node {
                    // A version's files (each with its blobs' chains) before its history.
                    Node::Version(_) => {
                        let here = self.parents_here(cut, &id, &graph::versions(&edges));
                        let manifests = edges.into_iter().filter(|n| matches!(n, Node::Manifest(_)));
                        manifests.chain(here.into_iter().rev().map(Node::Version)).collect()
                    }
                    Node::Manifest(_) => edges,
                    Node::Blob(_) if chains && !whole.contains(&id) => edges,
                    Node::Blob(_) => Vec::new(),
                })
            },
        )?;
        Ok(out)
    }

    /// Every object the files `manifests` need: each manifest, the blobs it lists and every
    /// blob a delta among them is coded against, each once, a reference before the delta coded
    /// against it and a manifest after its blobs (the order an upload must follow). Every
    /// object is read (manifests whole, blobs' headers): a missing or unreadable one is an
    /// error naming it.
    pub(crate) fn file_objects(&self, manifests: &[ObjectId]) -> Result<Vec<Needed>> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for manifest in manifests {
            if !seen.insert(*manifest) {
                continue;
            }
            for blob in graph::edges(self, Node::Manifest(*manifest))?.iter().map(Node::id) {
                // The chain down to its standalone base (or to a blob already listed), then
                // listed base first.
                let mut chain = Vec::new();
                let mut next = Some(blob);
                while let Some(id) = next {
                    if seen.contains(&id) {
                        break;
                    }
                    if chain.len() as u32 > MAX_CHAIN_DEPTH {
                        return Err(crate::store::Error::Corrupt {
                            id: blob,
                            reason: format!("a delta chain deeper than {MAX_CHAIN_DEPTH}"),
                        }
                        .into());
                    }
                    let reference = graph::edges(self, Node::Blob(id))?.first().map(Node::id);
                    chain.push(Needed { id, kind: ObjectKind::Blob, reference });
                    next = reference;
                }
                for n in chain.into_iter().rev() {
                    if seen.insert(n.id) {
                        out.push(n);
                    }
                }
            }
            out.push(Needed { id: *manifest, kind: ObjectKind::Manifest, reference: None });
        }
        Ok(out)
    }
}
