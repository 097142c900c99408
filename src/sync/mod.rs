//! Sync: a repository's remotes. The remote list (`.ckpt/remotes`), push, fetch and pull,
//! clone and partial clones, and the file transfers of the git filter, with deltas on the
//! wire. The [`crate::remote`] layer moves bytes; this module decides which objects move, in
//! which order, and hands everything it receives to the repository, which verifies it against
//! its id before it enters the store.
//!
//! It sits above [`crate::repo`] and uses the repository's public API plus a small crate
//! surface of the core: the writer lock ([`Repo::lock`]), ref files, importing a received
//! object, recording a version, checking a version out, the partial-clone record and progress.
//! It never reads the repository's files other than its own (`.ckpt/remotes`, the staging
//! directories in `.ckpt/incoming`).
//!
//! [`Repo::lock`]: crate::repo::Repo

mod error;
mod file_objects;
mod partial;
mod remote;
mod wire_delta;

pub use error::{Error, Result};
pub use file_objects::{fetch_file, push_files, push_files_against, FileTransfer};
pub use partial::fetch_revision;
pub use remote::{
    absolute_dir_url, add_remote, clone_from, clone_with_depth, default_remote, fetch, fetch_from, open_remote, pull,
    push, push_to, remotes, remove_remote, FetchReport, PullOutcome, PushOptions, PushReport, RefUpdate, RemoteConfig,
};
