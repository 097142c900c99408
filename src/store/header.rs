//! The fixed 72-byte header in front of every stored object (docs/format.md, "Objects").

use super::{Error, Result};
use crate::codec::cross_precision::Conversion;
use crate::dtype::Dtype;
use crate::object_id::ObjectId;

/// First bytes of every object file.
pub const OBJECT_MAGIC: [u8; 8] = *b"\x89CKO\r\n\x1a\n";
/// The object format version this code writes and reads.
pub const OBJECT_FORMAT_VERSION: u16 = 1;
/// Size of the header; the codec container starts right after it.
pub const HEADER_LEN: usize = 72;
/// Flag bit: the object is an XOR delta against `reference`.
const FLAG_DELTA: u8 = 1;
/// Flag bit, only with [`FLAG_DELTA`]: the object is derived, i.e. an XOR residual against a
/// conversion of `reference`, a blob of another float dtype; byte 13 names the conversion.
const FLAG_DERIVED: u8 = 2;
/// Longest reference chain a reader follows. Writers keep chains far shorter (`base_every`);
/// this bound only stops a damaged header from sending a reader around in circles.
pub const MAX_CHAIN_DEPTH: u32 = 1000;

/// What an object holds. The numbers are on-disk tags and never change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum ObjectKind {
    /// Tensor bytes or opaque bytes (a safetensors header, a gap, a whole non-safetensors file).
    Blob = 1,
    /// A file manifest: the segments of one committed file (JSON).
    Manifest = 2,
    /// A version (commit): files, parents, message, time (JSON).
    Version = 3,
}

impl ObjectKind {
    /// All kinds, in tag order.
    pub const ALL: [ObjectKind; 3] = [ObjectKind::Blob, ObjectKind::Manifest, ObjectKind::Version];

    /// Lowercase name for messages and JSON.
    pub fn name(self) -> &'static str {
        match self {
            ObjectKind::Blob => "blob",
            ObjectKind::Manifest => "manifest",
            ObjectKind::Version => "version",
        }
    }

    /// The kind with on-disk tag `tag`.
    pub(crate) fn from_tag(tag: u8) -> Option<ObjectKind> {
        ObjectKind::ALL.into_iter().find(|k| *k as u8 == tag)
    }
}

impl std::fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The decoded object header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectHeader {
    /// What the object holds.
    pub kind: ObjectKind,
    /// Element type of a tensor blob (`None`: opaque bytes, and always for manifests/versions).
    pub dtype: Option<Dtype>,
    /// The blob this one is an XOR delta against.
    pub reference: Option<ObjectId>,
    /// Number of deltas between this object and a standalone base (0: standalone).
    pub depth: u32,
    /// For a derived blob (a cross-precision reference): how its prediction is made from
    /// `reference`, a blob of another float dtype with as many elements. `None` for a plain
    /// delta (same dtype and length as `reference`) and for standalone objects.
    pub conversion: Option<Conversion>,
    /// Length of the logical content (tensor bytes, JSON bytes).
    pub raw_len: u64,
}

impl ObjectHeader {
    /// The header of a standalone blob of `dtype` elements (`None`: opaque bytes), `raw_len`
    /// bytes long.
    pub(crate) fn standalone_blob(dtype: Option<Dtype>, raw_len: u64) -> ObjectHeader {
        ObjectHeader { kind: ObjectKind::Blob, dtype, reference: None, depth: 0, conversion: None, raw_len }
    }

    /// Serializes the header.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[..8].copy_from_slice(&OBJECT_MAGIC);
        h[8..10].copy_from_slice(&OBJECT_FORMAT_VERSION.to_le_bytes());
        h[10] = self.kind as u8;
        h[11] = self.dtype.map_or(0, Dtype::code);
        h[12] = match (self.reference, self.conversion) {
            (None, _) => 0,
            (Some(_), None) => FLAG_DELTA,
            (Some(_), Some(_)) => FLAG_DELTA | FLAG_DERIVED,
        };
        h[13] = self.conversion.filter(|_| self.reference.is_some()).map_or(0, |c| c as u8);
        h[16..20].copy_from_slice(&self.depth.to_le_bytes());
        h[24..32].copy_from_slice(&self.raw_len.to_le_bytes());
        if let Some(r) = self.reference {
            h[32..64].copy_from_slice(r.as_bytes());
        }
        let check = checksum(&h[..64]);
        h[64..72].copy_from_slice(&check);
        h
    }

    /// The most bytes the object file of this header takes: the header and a container of
    /// `raw_len` bytes ([`crate::codec::container::max_len`]). A download stops there.
    pub(crate) fn max_stored_len(&self) -> u64 {
        crate::codec::container::max_len(self.raw_len).saturating_add(HEADER_LEN as u64)
    }

    /// Refuses, from the header alone, a manifest or version longer than
    /// [`super::MAX_DATA_OBJECT_LEN`] (the object of `id`): read whole and parsed, it is capped
    /// before a byte of it is decoded (or downloaded past the header). Blobs are streamed, never
    /// held whole: no cap.
    pub(crate) fn check_data_len(&self, id: &ObjectId) -> Result<()> {
        if self.kind != ObjectKind::Blob && self.raw_len > super::MAX_DATA_OBJECT_LEN {
            return Err(Error::Corrupt {
                id: *id,
                reason: format!("a {} of {} bytes (at most {})", self.kind, self.raw_len, super::MAX_DATA_OBJECT_LEN),
            });
        }
        Ok(())
    }

    /// Parses and checks the header at the start of `bytes`, the object file of `id`.
    pub fn decode(id: ObjectId, bytes: &[u8]) -> Result<ObjectHeader> {
        let corrupt = |reason: String| Error::Corrupt { id, reason };
        let h = bytes
            .get(..HEADER_LEN)
            .ok_or_else(|| corrupt(format!("{} bytes is too short for an object header", bytes.len())))?;
        if h[..8] != OBJECT_MAGIC {
            return Err(corrupt("not a ckpt object (bad magic)".into()));
        }
        if checksum(&h[..64]) != h[64..72] {
            return Err(corrupt("object header checksum mismatch".into()));
        }
        let version = u16::from_le_bytes([h[8], h[9]]);
        if version != OBJECT_FORMAT_VERSION {
            return Err(corrupt(format!("object format version {version}, this ckpt reads {OBJECT_FORMAT_VERSION}")));
        }
        let kind = ObjectKind::from_tag(h[10]).ok_or_else(|| corrupt(format!("unknown object kind {}", h[10])))?;
        let dtype = match h[11] {
            0 => None,
            c => Some(Dtype::from_code(c).ok_or_else(|| corrupt(format!("unknown dtype code {c}")))?),
        };
        let flags = h[12];
        if flags & !(FLAG_DELTA | FLAG_DERIVED) != 0
            || flags == FLAG_DERIVED
            || h[14..16].iter().chain(&h[20..24]).any(|&b| b != 0)
        {
            return Err(corrupt("unknown flags or non-zero reserved header bytes".into()));
        }
        let conversion = if flags & FLAG_DERIVED != 0 {
            let c = Conversion::from_tag(h[13]).ok_or_else(|| corrupt(format!("unknown conversion {}", h[13])))?;
            if !dtype.is_some_and(|d| matches!(d, Dtype::F32 | Dtype::Bf16 | Dtype::F16)) {
                return Err(corrupt(format!("a derived blob of dtype {dtype:?}")));
            }
            Some(c)
        } else if h[13] != 0 {
            return Err(corrupt("a conversion on an object that is not derived".into()));
        } else {
            None
        };
        let depth = u32::from_le_bytes(h[16..20].try_into().expect("4 bytes"));
        let raw_len = u64::from_le_bytes(h[24..32].try_into().expect("8 bytes"));
        let reference_bytes: [u8; 32] = h[32..64].try_into().expect("32 bytes");
        let reference = if flags & FLAG_DELTA != 0 { Some(ObjectId(reference_bytes)) } else { None };
        if reference.is_none() && (reference_bytes != [0; 32] || depth != 0) {
            return Err(corrupt("a standalone object with a reference id or a chain depth".into()));
        }
        if reference.is_some() && (kind != ObjectKind::Blob || depth == 0 || depth > MAX_CHAIN_DEPTH) {
            return Err(corrupt(format!("delta {kind} with chain depth {depth}")));
        }
        if kind != ObjectKind::Blob && dtype.is_some() {
            return Err(corrupt(format!("a {kind} with a dtype")));
        }
        if reference == Some(id) {
            return Err(corrupt("the object is a delta against itself".into()));
        }
        Ok(ObjectHeader { kind, dtype, reference, depth, conversion, raw_len })
    }
}

fn checksum(bytes: &[u8]) -> [u8; 8] {
    let mut out = [0u8; 8];
    out.copy_from_slice(&blake3::hash(bytes).as_bytes()[..8]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_tags_are_pinned() {
        let tags: Vec<(u8, &str)> = ObjectKind::ALL.iter().map(|k| (*k as u8, k.name())).collect();
        assert_eq!(tags, vec![(1, "blob"), (2, "manifest"), (3, "version")]);
        assert_eq!(ObjectKind::from_tag(0), None);
        assert_eq!(ObjectKind::from_tag(4), None);
    }

    #[test]
    fn round_trip_and_golden_bytes() {
        let id = ObjectId::hash(b"x");
        let reference = ObjectId([7; 32]);
        let h = ObjectHeader {
            kind: ObjectKind::Blob,
            dtype: Some(Dtype::Bf16),
            reference: Some(reference),
            depth: 3,
            conversion: None,
            raw_len: 0x0102,
        };
        let bytes = h.encode();
        assert_eq!(&bytes[..32], b"\x89CKO\r\n\x1a\n\x01\x00\x01\x09\x01\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00\x02\x01\x00\x00\x00\x00\x00\x00");
        assert_eq!(&bytes[32..64], &[7; 32]);
        assert_eq!(ObjectHeader::decode(id, &bytes).unwrap(), h);
        let plain = ObjectHeader {
            kind: ObjectKind::Version,
            dtype: None,
            reference: None,
            depth: 0,
            conversion: None,
            raw_len: 5,
        };
        assert_eq!(ObjectHeader::decode(id, &plain.encode()).unwrap(), plain);
        // A derived blob: flags 3, conversion tag in byte 13.
        let derived = ObjectHeader { conversion: Some(Conversion::NarrowTruncate), ..h };
        let bytes = derived.encode();
        assert_eq!(bytes[12..14], [3, 2]);
        assert_eq!(ObjectHeader::decode(id, &bytes).unwrap(), derived);
        // Unknown conversion tags, a conversion without the flag, the flag without a reference
        // and a derived opaque blob are refused.
        let reseal = |mut b: [u8; HEADER_LEN]| {
            let sum = checksum(&b[..64]);
            b[64..72].copy_from_slice(&sum);
            b
        };
        for (at, value) in [(13, 0u8), (13, 4), (12, 2)] {
            let mut bad = bytes;
            bad[at] = value;
            assert!(ObjectHeader::decode(id, &reseal(bad)).is_err(), "byte {at} = {value}");
        }
        let mut no_flag = h.encode();
        no_flag[13] = 1;
        assert!(ObjectHeader::decode(id, &reseal(no_flag)).is_err());
        let opaque = ObjectHeader { dtype: None, ..derived };
        assert!(ObjectHeader::decode(id, &opaque.encode()).is_err());
    }

    #[test]
    fn every_flipped_bit_is_rejected() {
        let id = ObjectId::hash(b"x");
        let h = ObjectHeader {
            kind: ObjectKind::Blob,
            dtype: None,
            reference: None,
            depth: 0,
            conversion: None,
            raw_len: 9,
        };
        let bytes = h.encode();
        for at in 0..HEADER_LEN {
            for bit in 0..8 {
                let mut bad = bytes;
                bad[at] ^= 1 << bit;
                assert!(ObjectHeader::decode(id, &bad).is_err(), "byte {at} bit {bit}");
            }
        }
        assert!(ObjectHeader::decode(id, &bytes[..HEADER_LEN - 1]).is_err());
    }
}
