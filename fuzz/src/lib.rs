//! Helpers shared by the fuzz targets: repairing the checksums a fuzzer cannot forge.
//!
//! A mutated container or object almost never gets past its first blake3 check (the object
//! header's checksum, the container footer's checksum, the whole-content hash), so without help
//! a fuzzer spends its time on those three `if`s and never reaches the parsers behind them.
//! [`repair_object`] and [`repair_container`] recompute them for the mutated bytes, as
//! docs/format.md defines them, so the mutations reach the index, chunk and JSON parsers. The
//! checks themselves are covered by the unit tests (a flipped bit must be reported) and by the
//! targets, which also run each input unrepaired.
//!
//! What stays for the fuzzer to solve: the per-chunk XXH3 payload checksums (a `u64` `!=`,
//! which libFuzzer's comparison tracing solves by copying the computed value into the index)
//! and every structural check.

use ckpt::codec::container::{self, Container};
use ckpt::store::HEADER_LEN as OBJECT_HEADER_LEN;
use ckpt::ObjectId;

/// Largest original a repair decodes to recompute the content hash (bigger ones keep theirs,
/// so one run stays fast).
pub const MAX_REPAIR_DECODE: u64 = 4 << 20;

/// Bytes 0..64 of an object header are covered by the checksum at 64..72.
const OBJECT_CHECKED: usize = 64;

/// The first 8 bytes of blake3 over `parts`.
fn checksum8(parts: &[&[u8]]) -> [u8; 8] {
    let mut h = blake3::Hasher::new();
    for p in parts {
        h.update(p);
    }
    let mut out = [0u8; 8];
    out.copy_from_slice(&h.finalize().as_bytes()[..8]);
    out
}

/// Rewrites the footer checksum of the container in `bytes` (blake3 of header, index and
/// footer bytes 0..48) if the footer's index position lies inside the bytes. Returns whether
/// it could.
fn fix_footer_checksum(bytes: &mut [u8]) -> bool {
    let (header_len, footer_len) = (container::HEADER_LEN, container::FOOTER_LEN);
    let Some(index_end) = bytes.len().checked_sub(footer_len).filter(|&e| e >= header_len) else {
        return false;
    };
    let footer = &bytes[index_end..];
    let offset = u64::from_le_bytes(footer[..8].try_into().expect("8 bytes"));
    let len = u64::from_le_bytes(footer[8..16].try_into().expect("8 bytes"));
    if offset < header_len as u64 || offset.checked_add(len) != Some(index_end as u64) {
        return false;
    }
    let sum = checksum8(&[&bytes[..header_len], &bytes[offset as usize..index_end], &bytes[index_end..index_end + 48]]);
    bytes[index_end + 48..index_end + 56].copy_from_slice(&sum);
    true
}

/// Makes the container in `bytes` pass the checks a fuzzer cannot solve: its footer checksum,
/// and (for originals up to [`MAX_REPAIR_DECODE`] bytes whose chunks decode) the blake3 of the
/// original recorded in the footer. Returns that recorded hash, as the id an object holding
/// this container must have, if the container opens.
pub fn repair_container(bytes: &mut [u8]) -> Option<ObjectId> {
    if !container::is_container(bytes) || !fix_footer_checksum(bytes) {
        return None;
    }
    let decoded = {
        let c = Container::open(bytes).ok()?;
        if c.original_len() > MAX_REPAIR_DECODE {
            return Some(ObjectId(*c.original_hash().as_bytes()));
        }
        let mut out = vec![0u8; c.original_len() as usize];
        match c.decode_range(0..c.original_len(), &mut out) {
            Ok(()) => out,
            Err(_) => return Some(ObjectId(*c.original_hash().as_bytes())),
        }
    };
    let hash = blake3::hash(&decoded);
    let footer = bytes.len() - container::FOOTER_LEN;
    bytes[footer + 16..footer + 48].copy_from_slice(hash.as_bytes());
    fix_footer_checksum(bytes);
    Some(ObjectId(*hash.as_bytes()))
}

/// Makes the object file in `bytes` (a 72-byte store header, then a container) pass the
/// checks a fuzzer cannot solve: the container's ([`repair_container`]) and the header's
/// checksum. Returns the id the object must have (the content hash its container records).
pub fn repair_object(bytes: &mut [u8]) -> Option<ObjectId> {
    if bytes.len() < OBJECT_HEADER_LEN {
        return None;
    }
    let id = repair_container(&mut bytes[OBJECT_HEADER_LEN..]);
    let sum = checksum8(&[&bytes[..OBJECT_CHECKED]]);
    bytes[OBJECT_CHECKED..OBJECT_HEADER_LEN].copy_from_slice(&sum);
    id
}
