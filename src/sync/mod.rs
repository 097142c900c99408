//! Sync: a repository's remotes. The remote list (`.ckpt/remotes`), push, fetch and pull,
//! clone and partial clones, and the file transfers of the git filter, with deltas on the
//! wire. The [`crate::remote`] layer moves bytes; this module decides which objects move, in
//! which order, and hands everything it receives to the repository, which checks it with the
//! store's own verification before it enters the local store.
//!
//! It sits above [`crate::repo`]: it uses the repository's public API and a small crate-only
//! surface of the core (the writer lock, ref files, importing a received object, recording a
//! version, checking a version out, the partial-clone record, progress). Of `.ckpt/` it owns
//! only `remotes` and the fetches' staging directories in `incoming/`.
//!
//! Invariants (docs/format.md, "Remotes"):
//! - On either side, an object is present only once everything it needs is: push uploads a
//!   delta's reference before the delta and every object before any ref; fetch imports blobs
//!   bases first, then manifests, then versions parents first, then moves refs. So an
//!   interrupted push or fetch leaves both sides valid, and a rerun skips what arrived.
//! - A remote ref moves by compare-and-swap against the state the pusher read, and only
//!   forward (the old version must be an ancestor of the new): otherwise the push is rejected.
//! - Uploads never replace an object. Only a mirror push's recodes do, each an older blob
//!   recoded against a newer one that was absent when the push listed the remote and is
//!   standalone when the recode is written: no reference cycle can form (`layout.rs`); and a
//!   repair, which writes an object's standalone form over a copy found damaged (`checked.rs`).
//! - Nothing goes up unverified: every object a write uploads or codes a delta against is
//!   decoded and hashed here first, and a recode codes only against a remote blob known good
//!   (`checked.rs`).
//!
//! Modules: `remotes` (the list, remote refs), `transfer` (one object up or down, retries,
//! staging), `checked` (what is verified before it goes up, checks and repairs of remote
//! copies), `push`, `fetch`, `clone` (pull and clone), `partial` (partial clones),
//! `layout` (mirror or deltas: a mirror push's recodes and their journal), `wire_delta`
//! (which blobs go up as deltas in the deltas layout), `file_objects` (the git filter's transfers by
//! file), `stored` (versions written straight to a remote by the ranks of a distributed save, and
//! byte ranges of stored files read back), `rank_cache` (the cache a rank keeps between such
//! saves).

mod checked;
mod clone;
mod error;
mod fetch;
mod file_objects;
mod layout;
mod partial;
mod push;
mod rank_cache;
mod read_ahead;
mod remote_gc;
mod remotes;
mod stored;
mod transfer;
mod wire_delta;

pub use clone::{clone_from, clone_with_depth, pull, PullOutcome};
pub use error::{Error, Result};
pub use fetch::{fetch, fetch_from, FetchReport};
pub use file_objects::FileTransfer;
pub use layout::Layout;
pub use partial::fetch_revision;
pub use push::{push, push_to, PushOptions, PushReport};
pub use rank_cache::{default_cache_root, rank_cache_dir, RankCache, CACHE_DIR_VAR};
pub use read_ahead::{ReadAhead, ReadAheadLimits};
pub use remote_gc::{
    gc_remote, Moment, RemoteGcOptions, RemoteGcReport, FRESH_FOR, GC_RECORDS, GIT_FILTER_MARKER, REMOTE_GRACE,
    WRITE_DEADLINE,
};
pub use remotes::{
    absolute_dir_url, add_remote, default_remote, open_remote, remote_layout, remotes, remove_remote, RefUpdate,
    RemoteConfig,
};
pub use stored::{
    commit_to_remote, fetch_stored_file, fetch_version, finish_recodes, remote_branch_tip, resolve_remote,
    store_file_to_remote, upload_file_to_remote, PendingRecodes, RemoteFile, RemoteTip, StoredFileReader,
};

use crate::object_id::ObjectId;
use crate::remote::Remote;
use crate::repo::Repo;
use std::collections::HashMap;

/// Uploads to `remote` what the files `manifests` (manifest ids) need and the remote lacks,
/// bases before deltas and each manifest after its blobs; a file neither side holds is listed
/// in [`FileTransfer::missing`]. The git filter's pre-push.
pub fn push_files(repo: &Repo, remote: &dyn Remote, manifests: &[ObjectId]) -> Result<FileTransfer> {
    repo.push_files(remote, manifests)
}

/// [`push_files`] in `layout`, `previous` mapping a file to the one the remote holds for the
/// same path. Mirror: the new files go up as stored here (whole), then the previous files'
/// blobs that local compaction recoded against the new ones are replaced on the remote by
/// those deltas (docs/format.md, "A mirror push"). Deltas: a blob goes up as an XOR delta
/// against the blob of the same tensor in the previous file, where that pays and the remote's
/// chain stays within bounds (docs/format.md, "Deltas on the wire").
pub fn push_files_against(
    repo: &Repo,
    remote: &dyn Remote,
    manifests: &[ObjectId],
    previous: &HashMap<ObjectId, ObjectId>,
    layout: Layout,
) -> Result<FileTransfer> {
    repo.push_files_against(remote, manifests, previous, layout)
}

/// Downloads the file whose manifest is `manifest` from `remote` into `repo`'s store (unless
/// it is there), every object verified against its id before it is stored, bases first and
/// the manifest last. The git filter's smudge of a file the local store lacks.
pub fn fetch_file(repo: &Repo, remote: &dyn Remote, manifest: &ObjectId) -> Result<FileTransfer> {
    repo.fetch_file(remote, manifest)
}
