//! ckpt: version control for machine-learning checkpoints.
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod cli;
pub mod codec;
pub mod dtype;
pub mod file_codec;
pub mod object_id;
pub mod safetensors;

pub use dtype::Dtype;
pub use object_id::ObjectId;
