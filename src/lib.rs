//! ckpt: version control for machine-learning checkpoints.
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod cli;
pub mod codec;
pub mod dtype;
pub mod file_codec;
pub mod index;
pub mod mmap;
pub mod object_id;
pub mod repo;
pub mod safetensors;
pub mod store;

pub use dtype::Dtype;
pub use object_id::ObjectId;
