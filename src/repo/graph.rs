//! The object graph of docs/format.md, written once: a version points to its parents and its
//! manifests, a manifest to the blobs it lists, a blob to the blob its header names as its
//! reference (the base of an XOR delta, or the other-dtype source of a derived blob). Every
//! walk over objects (gc, verify, prune, push planning, fetch, remote gc, the git filter's gc)
//! asks [`edges`] where a node points, and reads the objects through an [`Objects`] source: the
//! local store ([`Repo`]) or a remote (`crate::sync`). What a walk does with the nodes (which
//! edges it follows, in which order, in parallel or not) is the walk's own business.

use super::{Manifest, Repo, Version, VersionId};
use crate::object_id::ObjectId;
use crate::store::{ObjectHeader, ObjectKind};
use std::collections::HashSet;

/// One object of the graph, with the kind its referrer says it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Node {
    /// A version (a commit).
    Version(VersionId),
    /// A manifest (one file of a version).
    Manifest(ObjectId),
    /// A blob (tensor bytes, a header, a gap, an opaque file).
    Blob(ObjectId),
}

impl Node {
    /// The object's id.
    pub fn id(&self) -> ObjectId {
        match self {
            Node::Version(id) | Node::Manifest(id) | Node::Blob(id) => *id,
        }
    }

    /// The object's kind.
    pub fn kind(&self) -> ObjectKind {
        match self {
            Node::Version(_) => ObjectKind::Version,
            Node::Manifest(_) => ObjectKind::Manifest,
            Node::Blob(_) => ObjectKind::Blob,
        }
    }

    /// The node of object `id` of kind `kind` (a header read tells the kind of an object no
    /// referrer names, as remote gc's young roots).
    pub(crate) fn of_kind(kind: ObjectKind, id: ObjectId) -> Node {
        match kind {
            ObjectKind::Version => Node::Version(id),
            ObjectKind::Manifest => Node::Manifest(id),
            ObjectKind::Blob => Node::Blob(id),
        }
    }
}

/// Where a walk reads the objects it needs the edges of.
pub trait Objects {
    /// What a failed read is.
    type Error: From<crate::store::Error>;
    /// Version `id`, parsed.
    fn version(&self, id: &VersionId) -> Result<Version, Self::Error>;
    /// Manifest `id`, parsed.
    fn manifest(&self, id: &ObjectId) -> Result<Manifest, Self::Error>;
    /// The header of object `id`.
    fn header(&self, id: &ObjectId) -> Result<ObjectHeader, Self::Error>;
}

impl Objects for Repo {
    type Error = super::Error;

    fn version(&self, id: &VersionId) -> super::Result<Version> {
        Repo::version(self, id)
    }

    fn manifest(&self, id: &ObjectId) -> super::Result<Manifest> {
        Repo::manifest(self, id)
    }

    fn header(&self, id: &ObjectId) -> super::Result<ObjectHeader> {
        Ok(self.store.header(id)?)
    }
}

/// Where `node` points (docs/format.md, "Objects"): a version's parents (first parent first)
/// and then its files' manifests, a manifest's blobs in file order, a blob's reference. Each
/// object is read through `objects`: an unreadable one is an error (a walk must not guess the
/// needs of what it cannot see), and so is a blob whose header says it is another kind.
pub fn edges<O: Objects + ?Sized>(objects: &O, node: Node) -> Result<Vec<Node>, O::Error> {
    Ok(match node {
        Node::Version(id) => {
            let version = objects.version(&id)?;
            let parents = version.parents.iter().map(|p| Node::Version(*p));
            parents.chain(version.files.iter().map(|f| Node::Manifest(f.manifest))).collect()
        }
        Node::Manifest(id) => objects.manifest(&id)?.blobs().map(Node::Blob).collect(),
        Node::Blob(id) => {
            let header = objects.header(&id)?;
            if header.kind != ObjectKind::Blob {
                let wrong = crate::store::Error::WrongKind { id, expected: ObjectKind::Blob, found: header.kind };
                return Err(wrong.into());
            }
            header.reference.map(Node::Blob).into_iter().collect()
        }
    })
}

/// The versions among `edges`: of a version's edges, its parents (first parent first).
pub fn versions(edges: &[Node]) -> Vec<VersionId> {
    edges.iter().filter_map(|n| if let Node::Version(id) = n { Some(*id) } else { None }).collect()
}

impl Repo {
    /// The blob that blob `id` is coded against (its edge), `None` for a standalone blob and
    /// for an object that cannot be read as a blob: for walks that keep more, never less, when
    /// a header is unreadable (gc's sparing of chains).
    pub(super) fn reference_of(&self, id: &ObjectId) -> Option<ObjectId> {
        edges(self, Node::Blob(*id)).ok()?.first().map(Node::id)
    }
}

/// Walks the graph from `roots` depth first, each node once, in the order a node is found:
/// a node before the nodes it points to, in [`edges`] order. `enter` is asked before a node is
/// read: a node it refuses is left out, with whatever is reached only through it. `visit` is
/// given each node entered and its edges, and returns the edges the walk follows.
pub fn walk<O: Objects + ?Sized>(
    objects: &O,
    roots: impl IntoIterator<Item = Node>,
    mut enter: impl FnMut(&Node) -> bool,
    mut visit: impl FnMut(Node, Vec<Node>) -> Result<Vec<Node>, O::Error>,
) -> Result<(), O::Error> {
    let mut seen = HashSet::new();
    let mut stack: Vec<Node> = roots.into_iter().collect();
    stack.reverse();
    while let Some(node) = stack.pop() {
        if seen.contains(&node.id()) || !enter(&node) {
            continue;
        }
        seen.insert(node.id());
        let follow = visit(node, edges(objects, node)?)?;
        stack.extend(follow.into_iter().rev());
    }
    Ok(())
}
