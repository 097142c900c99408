//! The error type of the safetensors parser and header writer.

use crate::dtype::{Dtype, ALL_DTYPES};

/// Why a safetensors file (or a header to write) was rejected.
///
/// Messages name the tensor and the offending values; they do not name the file, which the
/// caller adds. Tensor names and JSON keys are shown with Rust string escaping (`"..."`), so
/// control characters in untrusted names cannot reach the terminal raw. Offsets in messages are
/// the header's own `data_offsets` values (relative to the start of the data buffer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file is shorter than the 8-byte header-length prefix.
    #[error(
        "file is {file_len} bytes long, too short for a safetensors file \
         (which starts with an 8-byte header length)"
    )]
    TooShort {
        /// Length of the file in bytes.
        file_len: u64,
    },

    /// The caller passed fewer bytes than needed (the file itself is long enough).
    #[error("internal error: {available} bytes of the file were provided to the parser, {needed} are needed")]
    PrefixTooShort {
        /// Bytes needed from the start of the file.
        needed: u64,
        /// Bytes provided.
        available: u64,
    },

    /// The header length in the first 8 bytes exceeds [`super::MAX_HEADER_LEN`].
    #[error(
        "header length {header_len} bytes exceeds the maximum of {max} bytes \
         (corrupt file, or not a safetensors file)"
    )]
    HeaderTooLarge {
        /// The header length (from the file, or of the header being written).
        header_len: u64,
        /// The maximum allowed.
        max: u64,
    },

    /// The header (8 + N bytes) extends past the end of the file.
    #[error(
        "header length {header_len} bytes extends past the end of the file: the header would \
         end at byte {header_end} but the file is {file_len} bytes long (truncated file?)"
    )]
    HeaderPastEnd {
        /// The header length N from the first 8 bytes.
        header_len: u64,
        /// 8 + N.
        header_end: u64,
        /// Length of the file in bytes.
        file_len: u64,
    },

    /// The JSON header is not valid UTF-8.
    #[error("header is not valid UTF-8 (invalid byte sequence at file offset {offset})")]
    HeaderNotUtf8 {
        /// Absolute file offset of the first invalid byte.
        offset: u64,
    },

    /// The header is not valid JSON (syntax error, or bytes other than JSON whitespace after it).
    #[error("header is not valid JSON: {detail}")]
    InvalidJson {
        /// The JSON parser's message, with line and column within the header.
        detail: String,
    },

    /// The top level of the header is not a JSON object.
    #[error("header must be a JSON object mapping tensor names to tensor entries, found {found}")]
    NotAnObject {
        /// What was found instead (e.g. "an array").
        found: String,
    },

    /// A tensor entry is not a JSON object.
    #[error(
        "tensor {tensor:?}: entry must be an object with \"dtype\", \"shape\" and \
         \"data_offsets\", found {found}"
    )]
    EntryNotAnObject {
        /// Tensor name.
        tensor: String,
        /// What was found instead.
        found: String,
    },

    /// A tensor entry lacks a required field.
    #[error("tensor {tensor:?}: missing field \"{field}\"")]
    MissingField {
        /// Tensor name.
        tensor: String,
        /// The missing field: "dtype", "shape" or "data_offsets".
        field: &'static str,
    },

    /// A tensor entry has a field other than "dtype", "shape" and "data_offsets".
    #[error(
        "tensor {tensor:?}: unexpected field {field:?} (only \"dtype\", \"shape\" and \
         \"data_offsets\" are allowed)"
    )]
    UnknownField {
        /// Tensor name.
        tensor: String,
        /// The unexpected field name.
        field: String,
    },

    /// A tensor entry has the same field twice.
    #[error("tensor {tensor:?}: field \"{field}\" appears more than once")]
    DuplicateField {
        /// Tensor name.
        tensor: String,
        /// The repeated field.
        field: &'static str,
    },

    /// A field of a tensor entry has the wrong JSON type or shape.
    #[error("tensor {tensor:?}: field \"{field}\" must be {expected}, found {found}")]
    WrongType {
        /// Tensor name.
        tensor: String,
        /// The field: "dtype", "shape" or "data_offsets".
        field: &'static str,
        /// What the field must be.
        expected: &'static str,
        /// What was found.
        found: String,
    },

    /// A tensor's dtype is not one ckpt supports.
    #[error("tensor {tensor:?}: unsupported dtype {dtype:?} (supported: {})", supported_dtypes())]
    UnknownDtype {
        /// Tensor name.
        tensor: String,
        /// The dtype string from the header.
        dtype: String,
    },

    /// Two entries of the header have the same tensor name.
    #[error("tensor name {tensor:?} appears more than once in the header")]
    DuplicateTensor {
        /// The repeated name.
        tensor: String,
    },

    /// `__metadata__` appears more than once in the header.
    #[error("\"__metadata__\" appears more than once in the header")]
    DuplicateMetadata,

    /// `__metadata__` is not a JSON object.
    #[error("\"__metadata__\" must be an object mapping strings to strings, found {found}")]
    MetadataNotObject {
        /// What was found instead.
        found: String,
    },

    /// A value in `__metadata__` is not a string.
    #[error("\"__metadata__\" key {key:?}: value must be a string, found {found}")]
    MetadataValueNotString {
        /// The metadata key.
        key: String,
        /// What was found instead.
        found: String,
    },

    /// A key appears more than once in `__metadata__`.
    #[error("\"__metadata__\" key {key:?} appears more than once")]
    DuplicateMetadataKey {
        /// The repeated key.
        key: String,
    },

    /// A tensor's data_offsets has begin > end.
    #[error("tensor {tensor:?}: data_offsets [{begin}, {end}] has begin greater than end")]
    OffsetsReversed {
        /// Tensor name.
        tensor: String,
        /// `data_offsets[0]`.
        begin: u64,
        /// `data_offsets[1]`.
        end: u64,
    },

    /// A tensor's data extends past the end of the file.
    #[error(
        "tensor {tensor:?}: data_offsets [{begin}, {end}) extend past the end of the data \
         buffer ({data_len} bytes)"
    )]
    OffsetsPastEnd {
        /// Tensor name.
        tensor: String,
        /// `data_offsets[0]`.
        begin: u64,
        /// `data_offsets[1]`.
        end: u64,
        /// Length of the data buffer (file length - 8 - header length).
        data_len: u64,
    },

    /// Two non-empty tensors share bytes.
    #[error(
        "tensors {first:?} (data_offsets [{first_begin}, {first_end})) and {second:?} \
         (data_offsets [{second_begin}, {second_end})) overlap"
    )]
    Overlap {
        /// The tensor that starts first (by begin offset, then name).
        first: String,
        /// Its `data_offsets[0]`.
        first_begin: u64,
        /// Its `data_offsets[1]`.
        first_end: u64,
        /// The other tensor.
        second: String,
        /// Its `data_offsets[0]`.
        second_begin: u64,
        /// Its `data_offsets[1]`.
        second_end: u64,
    },

    /// The byte size implied by shape and dtype does not fit in 64 bits.
    #[error("tensor {tensor:?}: shape {shape:?} of {dtype} is larger than 2^64 bytes")]
    SizeOverflow {
        /// Tensor name.
        tensor: String,
        /// The shape.
        shape: Vec<u64>,
        /// The dtype.
        dtype: Dtype,
    },

    /// The byte size implied by shape and dtype differs from the data_offsets span.
    #[error(
        "tensor {tensor:?}: shape {shape:?} of {dtype} needs {expected} bytes, but \
         data_offsets [{begin}, {end}) span {actual} bytes"
    )]
    SizeMismatch {
        /// Tensor name.
        tensor: String,
        /// The shape.
        shape: Vec<u64>,
        /// The dtype.
        dtype: Dtype,
        /// Bytes implied by shape and dtype.
        expected: u64,
        /// `data_offsets[0]`.
        begin: u64,
        /// `data_offsets[1]`.
        end: u64,
        /// end - begin.
        actual: u64,
    },

    /// [`super::write_header`]: a tensor is named `__metadata__`, the key reserved for metadata.
    #[error("tensor name \"__metadata__\" is reserved for the header's metadata entry")]
    ReservedName,

    /// [`super::write_header`]: the tensors together exceed 2^64 bytes of data.
    #[error("tensor {tensor:?}: total data size of the tensors up to this one exceeds 2^64 bytes")]
    DataTooLarge {
        /// The tensor at which the running offset overflowed.
        tensor: String,
    },
}

/// "BOOL, U8, ..." for error messages.
fn supported_dtypes() -> String {
    let names: Vec<&str> = ALL_DTYPES.iter().map(|d| d.safetensors_name()).collect();
    names.join(", ")
}
