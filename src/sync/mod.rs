//! Sync: the repository's remotes (the remote list, push, fetch/pull, clone and partial
//! clones, the transfer of files for the git filter, deltas on the wire). It sits above
//! [`crate::repo`] and moves objects between a repository and a [`crate::remote::Remote`].

pub(crate) mod file_objects;
pub(crate) mod partial;
pub(crate) mod remote;
mod wire_delta;
