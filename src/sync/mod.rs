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
//!   standalone when the recode is written: no reference cycle can form (`recode.rs`); and a
//!   repair, which writes an object's standalone form over a copy found damaged (`checked.rs`).
//! - Nothing goes up unverified: every object a write uploads or codes a delta against is
//!   decoded and hashed here first, and a recode codes only against a remote blob known good
//!   (`checked.rs`).
//!
//! Modules: `remotes` (the list and each remote's settings, its [`Layout`] among them),
//! `remote_view` (the one place that reads what a remote holds: its refs, object headers,
//! versions and manifests as the object graph's walks read them), `transfer` (one object down,
//! retries, staging directories), `stage` (downloads staged without the lock and stored under
//! it, bottom-up), `freshness` (what a writer counts on among the objects it finds, deadlines,
//! gc records), `upload` (what a write sends, in an order that keeps the remote valid), `checked` (what is verified before it goes up, checks
//! and repairs of remote copies), `push`, `fetch`, `clone` (pull and clone), `partial` (partial
//! clones), `recode` (a mirror push's recodes and their journal), `wire_delta` (which blobs go
//! up as deltas in the deltas layout), `file_objects` (transfers by file: the git filter's and
//! a rank's), `stored` (versions written straight to a remote by the ranks of a distributed
//! save, and byte ranges of stored files read back), `rank_cache` (the cache a rank keeps
//! between such saves), `remote_gc` (`ckpt gc --remote`), `reader` (a read-only handle on a
//! remote without a repository) and `blob_ranges` (its partial copies of remote blobs, filled
//! by ranged reads).

mod blob_ranges;
mod checked;
mod clone;
mod error;
mod fetch;
mod file_objects;
mod freshness;
mod partial;
mod push;
mod rank_cache;
mod read_ahead;
mod reader;
mod recode;
mod remote_gc;
mod remote_view;
mod remotes;
mod stage;
mod stored;
mod transfer;
mod upload;
mod wire_delta;

pub use clone::{clone_from, clone_with_depth, pull, PullOutcome};
pub use error::{Error, Result};
pub use fetch::{fetch, fetch_from, FetchReport};
pub use file_objects::{fetch_file, push_files, push_files_against, FileTransfer};
pub use freshness::{Moment, FRESH_FOR, GC_RECORDS, GIT_FILTER_MARKER, REMOTE_GRACE, WRITE_DEADLINE};
pub use partial::fetch_revision;
pub use push::{push, push_to, PushOptions, PushReport};
pub use rank_cache::{default_cache_root, rank_cache_dir, RankCache, CACHE_DIR_VAR};
pub use read_ahead::{ReadAhead, ReadAheadLimits};
pub use reader::{ReaderCache, RemoteReader, RemoteTensor};
pub use remote_gc::{gc_remote, RemoteGcOptions, RemoteGcReport};
pub use remote_view::{remote_branch_tip, resolve_remote, RemoteTip};
pub use remotes::{
    absolute_dir_url, add_remote, default_remote, open_remote, remote_layout, remotes, remove_remote, Layout,
    RefUpdate, RemoteConfig,
};
pub use stored::{
    commit_to_remote, fetch_stored_file, fetch_version, finish_recodes, store_file_to_remote, upload_file_to_remote,
    FileUpload, PendingRecodes, RemoteCommit, RemoteFile, StoredFileReader,
};
