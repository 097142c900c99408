//! ckpt: version control for machine-learning checkpoints.
//!
//! A [`repo::Repo`] stores each committed file as content-addressed blobs (one per tensor of a
//! safetensors file, plus its header and any gaps; one for any other file), delta-coded against
//! the same tensor in an earlier version where that pays, and checks every file out bit-exactly,
//! verified by its blake3 hash. The layers, bottom up:
//!
//! - [`dtype`], [`object_id`] ([`ObjectId`]): element types and blake3 ids;
//! - [`safetensors`] (strict parser) and [`codec`] (byte grouping, XOR deltas, per-chunk
//!   Huffman/zstd/zero/raw, the container), both pure; [`file_codec`] for whole files;
//! - [`store`] (immutable objects on disk) and [`index`] (a rebuildable sled cache), which do
//!   not know each other;
//! - [`remote`] (a directory or S3-compatible object storage), which knows neither;
//! - [`repo`]: commit, checkout, log, refs, gc, verify;
//! - [`sync`]: remotes (push, fetch, pull, clone, partial clones), above [`repo`];
//! - [`report`]: `ckpt report`'s numbers and page (store over time, layer drift), above [`repo`];
//! - `watch` (feature `watch`, on by default): commits each checkpoint that appears in a
//!   directory, through [`repo::Repo`]'s public methods;
//! - [`git_filter`]: the git filter driver (pointers, git's filter protocol, set-up).
//!
//! The `ckpt` command (src/cli) is a module of the binary, not of this library: with
//! `default-features = false` the library builds without clap, indicatif, anyhow and notify.
//!
//! ```
//! use ckpt::repo::{CommitOptions, Repo};
//!
//! let dir = tempfile::tempdir()?;
//! let repo = Repo::init(dir.path())?;
//! std::fs::write(dir.path().join("notes.txt"), b"epoch 1")?;
//! let v1 = repo.commit(&["notes.txt"], "epoch 1", &CommitOptions::default())?;
//! std::fs::write(dir.path().join("notes.txt"), b"epoch 2")?;
//! repo.commit(&["notes.txt"], "epoch 2", &CommitOptions::default())?;
//!
//! assert_eq!(repo.log("HEAD")?.len(), 2);
//! let out = dir.path().join("restored");
//! repo.checkout("HEAD~1", None, Some(&out), None)?;
//! assert_eq!(std::fs::read(out.join("notes.txt"))?, b"epoch 1");
//! assert_eq!(repo.resolve("HEAD~1")?, v1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]
#![deny(unsafe_code)]
// The MSRV is 1.89 (std file locks); the codec's `len % width != 0` checks predate
// `is_multiple_of` and read as the format spec states them.

pub mod codec;
pub mod dtype;
pub mod file_codec;
pub mod git_filter;
pub mod index;
mod mmap;
pub mod object_id;
pub mod remote;
pub mod repo;
pub mod report;
pub mod safetensors;
pub mod store;
pub mod sync;
#[cfg(test)]
mod test_data;
pub mod torch_zip;
#[cfg(feature = "watch")]
pub mod watch;

pub use dtype::Dtype;
pub use mmap::{MappedFile, MappedFileError};
pub use object_id::ObjectId;
