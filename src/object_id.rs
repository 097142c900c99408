//! `ObjectId`: the blake3 hash that names every stored thing (tensor bytes, files, versions).

use std::fmt;
use std::str::FromStr;

/// A 32-byte blake3 digest, displayed as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId(pub [u8; 32]);

impl ObjectId {
    /// Hashes `bytes` with blake3.
    pub fn hash(bytes: &[u8]) -> ObjectId {
        ObjectId(*blake3::hash(bytes).as_bytes())
    }

    /// The raw digest bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Full lowercase hex form.
    pub fn to_hex(&self) -> String {
        blake3::Hash::from(self.0).to_hex().to_string()
    }

    /// The first `n` hex digits (a short id for display).
    pub fn short(&self, n: usize) -> String {
        let mut hex = self.to_hex();
        hex.truncate(n.min(64));
        hex
    }
}

/// Feeds `bytes` to `hasher`, on the rayon pool when it has several threads and the input is
/// large enough to split (1 MiB and up); below that the fork-join costs more than it saves.
/// Every bulk hash of the crate goes through here, so the threshold lives in one place.
pub fn hash_update(hasher: &mut blake3::Hasher, bytes: &[u8]) {
    if rayon::current_num_threads() > 1 && bytes.len() >= 1 << 20 {
        hasher.update_rayon(bytes);
    } else {
        hasher.update(bytes);
    }
}

impl From<blake3::Hash> for ObjectId {
    fn from(h: blake3::Hash) -> Self {
        ObjectId(*h.as_bytes())
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjectId({})", self.short(16))
    }
}

/// The blake3 hash of an input cut into equal pieces of a power-of-two length (the last may be
/// shorter), computed from hashes of the pieces taken independently, in any order, on any
/// thread ([`PieceHashes::hash_piece`]), then joined ([`PieceHashes::join`]). The result is
/// exactly `blake3::hash` of the whole input.
///
/// Why: a checkout decodes a tensor piece by piece on every core; hashing each piece in the
/// worker that decoded it, while it is in cache, takes the hash off the single writing thread
/// (where it was 15% of a delta checkout). blake3 is a Merkle tree, and a power-of-two piece at
/// a multiple of its length is exactly one of its subtrees, so this is the tree's own
/// composition: the piece's chaining value from `blake3::hazmat` and parents merged along
/// `hazmat::left_subtree_len`. The crate gives those primitives but not the composition over
/// fixed pieces, hence these few lines; a test checks them against `blake3::hash`.
#[derive(Clone, Copy, Debug)]
pub struct PieceHashes {
    piece_len: u64,
    total_len: u64,
}

/// The hash of one piece ([`PieceHashes::hash_piece`]): a blake3 chaining value, or the root
/// hash itself when the piece is the whole input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PieceHash([u8; 32]);

impl PieceHashes {
    /// Pieces of `piece_len` bytes over an input of `total_len`; `None` unless `piece_len` is a
    /// power of two of at least blake3's chunk (1024 bytes).
    pub fn new(piece_len: u64, total_len: u64) -> Option<PieceHashes> {
        (piece_len.is_power_of_two() && piece_len >= blake3::CHUNK_LEN as u64)
            .then_some(PieceHashes { piece_len, total_len })
    }

    /// Number of pieces (0 for an empty input).
    pub fn count(&self) -> u64 {
        self.total_len.div_ceil(self.piece_len)
    }

    /// Bytes of piece `index`, or `None` past the last piece.
    pub fn piece_range(&self, index: u64) -> Option<std::ops::Range<u64>> {
        let start = index.checked_mul(self.piece_len).filter(|s| *s < self.total_len)?;
        Some(start..(start + self.piece_len).min(self.total_len))
    }

    /// Hashes piece `index`, whose bytes are `bytes`; `None` if `bytes` is not exactly that
    /// piece's length.
    pub fn hash_piece(&self, index: u64, bytes: &[u8]) -> Option<PieceHash> {
        use blake3::hazmat::HasherExt;
        let range = self.piece_range(index)?;
        if bytes.len() as u64 != range.end - range.start {
            return None;
        }
        if self.total_len <= self.piece_len {
            return Some(PieceHash(*blake3::hash(bytes).as_bytes()));
        }
        let mut hasher = blake3::Hasher::new();
        hasher.set_input_offset(range.start).update(bytes);
        Some(PieceHash(hasher.finalize_non_root()))
    }

    /// The hash of the whole input from the hashes of all its pieces, in order; `None` if
    /// their number is wrong.
    pub fn join(&self, pieces: &[PieceHash]) -> Option<blake3::Hash> {
        use blake3::hazmat::{left_subtree_len, merge_subtrees_non_root, merge_subtrees_root, Mode};
        if pieces.len() as u64 != self.count() {
            return None;
        }
        match pieces {
            [] => return Some(blake3::hash(&[])),
            [whole] => return Some(blake3::Hash::from_bytes(whole.0)),
            _ => {}
        }
        // The two children of the subtree over `pieces` (`len` bytes), split as blake3 splits
        // it: the left one holds the largest power-of-two number of blake3 chunks that leaves
        // the right one non-empty, which for more than one piece is a whole number of pieces.
        fn children(pieces: &[PieceHash], len: u64, piece_len: u64) -> [[u8; 32]; 2] {
            let left_len = left_subtree_len(len);
            let (left, right) = pieces.split_at((left_len / piece_len) as usize);
            [subtree(left, left_len, piece_len), subtree(right, len - left_len, piece_len)]
        }
        fn subtree(pieces: &[PieceHash], len: u64, piece_len: u64) -> [u8; 32] {
            match pieces {
                [one] => one.0,
                _ => {
                    let [left, right] = children(pieces, len, piece_len);
                    merge_subtrees_non_root(&left, &right, Mode::Hash)
                }
            }
        }
        let [left, right] = children(pieces, self.total_len, self.piece_len);
        Some(merge_subtrees_root(&left, &right, Mode::Hash))
    }
}

/// Error for a string that is not 64 hex digits.
#[derive(Debug, thiserror::Error)]
#[error("not an object id (64 hex digits expected): {0:?}")]
pub struct ParseObjectIdError(pub String);

impl FromStr for ObjectId {
    type Err = ParseObjectIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        blake3::Hash::from_hex(s).map(ObjectId::from).map_err(|_| ParseObjectIdError(s.chars().take(80).collect()))
    }
}

/// Serialized as its 64-digit lowercase hex form (the form manifests and versions use).
impl serde::Serialize for ObjectId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for ObjectId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        // Only the canonical lowercase form: an id has exactly one spelling.
        match s.parse::<ObjectId>() {
            Ok(id) if id.to_hex() == *s => Ok(id),
            _ => Err(serde::de::Error::custom(ParseObjectIdError(s.chars().take(80).collect()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_known_vector() {
        let id = ObjectId::hash(b"");
        // blake3 of the empty input, from the blake3 test vectors.
        assert_eq!(id.to_hex(), "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262");
        assert_eq!(id.to_hex().parse::<ObjectId>().unwrap(), id);
        assert_eq!(id.short(8), "af1349b9");
        assert!("xyz".parse::<ObjectId>().is_err());
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, format!("\"{}\"", id.to_hex()));
        assert_eq!(serde_json::from_str::<ObjectId>(&json).unwrap(), id);
        assert!(serde_json::from_str::<ObjectId>(&json.to_uppercase()).is_err());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Pieces hashed separately and joined give blake3 of the whole, for every piece size,
        /// input length around the piece boundaries, and hashing order.
        #[test]
        fn pieces_join_to_the_hash_of_the_whole(
            piece_log in 10u32..15,
            pieces in 0u64..9,
            extra in proptest::prop_oneof![proptest::strategy::Just(0i64), proptest::strategy::Just(1), proptest::strategy::Just(-1), -1023i64..1024],
            seed: u64,
        ) {
            let piece_len = 1u64 << piece_log;
            let total = (pieces as i64 * piece_len as i64 + extra).max(0) as u64;
            let mut s = seed | 1;
            let data: Vec<u8> = (0..total).map(|_| { s ^= s << 13; s ^= s >> 7; s ^= s << 17; s as u8 }).collect();
            let layout = PieceHashes::new(piece_len, total).unwrap();
            // Hashed last piece first, to show that the order does not matter.
            let mut hashes: Vec<(u64, PieceHash)> = (0..layout.count()).rev().map(|i| {
                let r = layout.piece_range(i).unwrap();
                (i, layout.hash_piece(i, &data[r.start as usize..r.end as usize]).unwrap())
            }).collect();
            hashes.sort_by_key(|h| h.0);
            let hashes: Vec<PieceHash> = hashes.into_iter().map(|h| h.1).collect();
            proptest::prop_assert_eq!(layout.join(&hashes), Some(blake3::hash(&data)));
            if let Some((_, fewer)) = hashes.split_last() {
                proptest::prop_assert_eq!(layout.join(fewer), None);
            }
        }
    }

    #[test]
    fn piece_layouts_and_lengths_are_checked() {
        assert!(PieceHashes::new(1536, 10_000).is_none(), "not a power of two");
        assert!(PieceHashes::new(512, 10_000).is_none(), "below a blake3 chunk");
        let layout = PieceHashes::new(1024, 2500).unwrap();
        assert_eq!(layout.count(), 3);
        assert_eq!(layout.piece_range(2), Some(2048..2500));
        assert_eq!(layout.piece_range(3), None);
        assert_eq!(layout.hash_piece(2, &[0; 1024]), None, "the last piece is 452 bytes");
        assert_eq!(layout.hash_piece(3, &[]), None);
        assert_eq!(PieceHashes::new(1 << 20, u64::MAX).unwrap().piece_range(u64::MAX), None);
    }
}
