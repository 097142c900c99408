//! The header and footer of a container, read and checked against each other before its index.

use super::le::{read_u32, read_u64};
use super::{
    checksum, is_container, Error, FileKind, Result, END_MAGIC, FOOTER_LEN, HEADER_LEN, MIN_READ_VERSION,
    REFERENCE_FORMAT_VERSION,
};

/// The parts of a container around its chunks: the header's fields and where the footer says
/// the index is, checked against each other and the checksum ([`Container::open`]'s first step).
pub(super) struct Frame<'a> {
    pub(super) version: u16,
    pub(super) kind: FileKind,
    pub(super) chunk_size: usize,
    pub(super) original_len: u64,
    pub(super) index_offset: u64,
    pub(super) index: &'a [u8],
    pub(super) original_hash: blake3::Hash,
}

impl<'a> Frame<'a> {
    pub(super) fn read(bytes: &'a [u8]) -> Result<Frame<'a>> {
        let corrupt = |what: &str| Error::Corrupt(what.to_string());
        if bytes.len() < HEADER_LEN + FOOTER_LEN {
            return Err(Error::Corrupt(format!("{} bytes is too short for a container", bytes.len())));
        }
        if !is_container(bytes) {
            return Err(corrupt("not a ckpt container (bad magic)"));
        }
        let header = &bytes[..HEADER_LEN];
        let version = u16::from_le_bytes([header[8], header[9]]);
        if !(MIN_READ_VERSION..=REFERENCE_FORMAT_VERSION).contains(&version) {
            return Err(Error::Corrupt(format!(
                "container format version {version}, this ckpt reads {MIN_READ_VERSION} to {REFERENCE_FORMAT_VERSION}"
            )));
        }
        let kind = FileKind::from_tag(header[10])?;
        if header[11] != 0 || header[24..32].iter().any(|&b| b != 0) {
            return Err(corrupt("reserved header bytes are not zero"));
        }
        let chunk_size = read_u32(header, 12).expect("in header") as usize;
        if !crate::codec::chunk::is_valid_chunk_size(chunk_size) {
            return Err(Error::Corrupt(format!("chunk size {chunk_size} out of range")));
        }
        let original_len = read_u64(header, 16).expect("in header");
        let footer = &bytes[bytes.len() - FOOTER_LEN..];
        if footer[56..] != END_MAGIC {
            return Err(corrupt("truncated container (end marker missing)"));
        }
        let index_offset = read_u64(footer, 0).expect("in footer");
        let index_len = read_u64(footer, 8).expect("in footer");
        let index_end = (bytes.len() - FOOTER_LEN) as u64;
        if index_offset < HEADER_LEN as u64 || index_offset.checked_add(index_len) != Some(index_end) {
            return Err(corrupt("index position does not match the file length"));
        }
        let index = &bytes[index_offset as usize..index_end as usize];
        if checksum(header, index, &footer[..48]) != footer[48..56] {
            return Err(corrupt("header or index checksum mismatch"));
        }
        let original_hash = blake3::Hash::from_bytes(footer[16..48].try_into().expect("32 bytes"));
        Ok(Frame { version, kind, chunk_size, original_len, index_offset, index, original_hash })
    }
}
