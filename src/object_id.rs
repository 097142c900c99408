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
/// Every bulk hash of a whole buffer goes through here, so the threshold lives in one place
/// (workers hashing what they just decoded use [`RangeHashes`] instead).
pub(crate) fn hash_update(hasher: &mut blake3::Hasher, bytes: &[u8]) {
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

/// The blake3 hash of an input that is produced in contiguous ranges with arbitrary boundaries,
/// by different threads in any order: each worker hashes the parts of blake3's tree that lie
/// wholly inside its range (`RangeHashes::hash_range`) right after producing the bytes, and
/// [`RangeHashes::join`] combines them, hashing only the blake3 chunks (1 KiB) that straddle two
/// ranges. The result is exactly `blake3::hash` of the whole input.
///
/// Why: decoding runs on every core, and hashing what a worker just decoded, while it is in
/// cache, keeps the hash off any single thread and out of a separate pass. In a checkout a
/// worker's range is a run of a blob's chunks (on blake3's 1 KiB grid, so the join needs no
/// bytes); in an in-memory decompression it is a run of the container's chunks, whose
/// boundaries follow tensors; in a compression it is a stripe the worker just coded
/// ([`RangeHashJoin`] joins those as they are written). blake3 is a Merkle tree and
/// `blake3::hazmat` gives the subtree hashes and merges but not this composition over
/// arbitrary ranges, hence these lines; a proptest checks them against `blake3::hash`.
/// (Hashing batch by batch on the pool instead cost two fork-joins per 2 MiB batch, each
/// waking a sleeping worker: the pool sat idle 12–14% of a two-thread decompression on the
/// project's VM.)
#[derive(Clone, Copy, Debug)]
pub struct RangeHashes {
    total_len: u64,
}

/// A chaining value of the subtree of blake3's tree over `len` bytes at `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeHash {
    offset: u64,
    len: u64,
    cv: [u8; 32],
}

impl RangeHashes {
    /// For an input of `total_len` bytes.
    pub fn new(total_len: u64) -> RangeHashes {
        RangeHashes { total_len }
    }

    /// Hashes the maximal subtrees of the input's blake3 tree that lie wholly inside `range`,
    /// whose bytes are `bytes`, and appends them to `out` (for an input of one blake3 chunk or
    /// less, when `range` is all of it: the root hash). Nothing when `bytes` is not `range`'s
    /// length.
    pub(crate) fn hash_range(&self, range: std::ops::Range<u64>, bytes: &[u8], out: &mut Vec<NodeHash>) {
        if bytes.len() as u64 != range.end.saturating_sub(range.start) || range.end > self.total_len {
            return;
        }
        if self.total_len <= blake3::CHUNK_LEN as u64 {
            if range == (0..self.total_len) {
                out.push(NodeHash { offset: 0, len: self.total_len, cv: *blake3::hash(bytes).as_bytes() });
            }
            return;
        }
        let mut visit = |offset: u64, len: u64| {
            let part = &bytes[(offset - range.start) as usize..(offset + len - range.start) as usize];
            out.push(NodeHash { offset, len, cv: node_cv(offset, part) });
        };
        for (offset, len) in root_children(self.total_len) {
            inside_nodes(offset, len, &range, &mut visit);
        }
    }

    /// The hash of the whole input from the subtree hashes of its ranges (any order). Any part
    /// of the tree no node covers (the 1 KiB chunks that straddle two ranges, or ranges never
    /// hashed) is hashed from `input`. `None` if such a part exists and `input` is not given
    /// (ranges on multiples of 1 KiB that cover the input never need it), or if `input` is not
    /// `total_len` bytes.
    pub fn join(&self, mut nodes: Vec<NodeHash>, input: Option<&[u8]>) -> Option<blake3::Hash> {
        use blake3::hazmat::{merge_subtrees_root, Mode};
        if input.is_some_and(|i| i.len() as u64 != self.total_len) {
            return None;
        }
        if self.total_len <= blake3::CHUNK_LEN as u64 {
            return match nodes.iter().find(|n| n.offset == 0 && n.len == self.total_len) {
                Some(root) => Some(blake3::Hash::from_bytes(root.cv)),
                None => input.map(blake3::hash),
            };
        }
        nodes.sort_unstable_by_key(|n| (n.offset, std::cmp::Reverse(n.len)));
        let [(lo, ll), (ro, rl)] = root_children(self.total_len);
        let left = subtree_cv(lo, ll, &nodes, input)?;
        let right = subtree_cv(ro, rl, &nodes, input)?;
        Some(merge_subtrees_root(&left, &right, Mode::Hash))
    }
}

/// [`RangeHashes::join`] for ranges that are produced by workers in any order but reach one
/// thread in input order, after which their bytes are gone (a compression writes each stripe
/// and moves on). That thread passes each range's bytes and its workers' subtree hashes to
/// [`Self::add`], which keeps only the bytes of the 1 KiB blake3 chunks that straddle two
/// ranges and hashes each as soon as it is whole; [`Self::finish`] joins without the input.
pub struct RangeHashJoin {
    shape: RangeHashes,
    nodes: Vec<NodeHash>,
    /// Offset and bytes so far of the straddling blake3 chunk being assembled.
    leaf_at: u64,
    leaf: Vec<u8>,
    /// End of the last range added; a range that does not start there breaks the join.
    next: u64,
    broken: bool,
}

impl RangeHashJoin {
    /// For an input of `total_len` bytes.
    pub fn new(total_len: u64) -> RangeHashJoin {
        RangeHashJoin {
            shape: RangeHashes::new(total_len),
            nodes: Vec::new(),
            leaf_at: 0,
            leaf: Vec::new(),
            next: 0,
            broken: false,
        }
    }

    /// What the workers hash their ranges with.
    pub fn shape(&self) -> RangeHashes {
        self.shape
    }

    /// Adds the next range of the input: its bytes and the subtree hashes a worker took of it
    /// with `RangeHashes::hash_range`. Ranges must come in order, each starting where the
    /// previous ended; anything else makes [`Self::finish`] return `None`.
    pub fn add(&mut self, range: std::ops::Range<u64>, bytes: &[u8], nodes: Vec<NodeHash>) {
        let total = self.shape.total_len;
        if range.start != self.next
            || range.end < range.start
            || bytes.len() as u64 != range.end - range.start
            || range.end > total
        {
            self.broken = true;
            return;
        }
        self.next = range.end;
        self.nodes.extend(nodes);
        if range.is_empty() {
            return;
        }
        let chunk = blake3::CHUNK_LEN as u64;
        let (first, last) = (range.start / chunk * chunk, (range.end - 1) / chunk * chunk);
        for leaf in std::iter::once(first).chain((last != first).then_some(last)) {
            let leaf_end = (leaf + chunk).min(total);
            if range.start <= leaf && leaf_end <= range.end {
                continue; // wholly inside: hashed by the worker
            }
            let (from, to) = (range.start.max(leaf), range.end.min(leaf_end));
            if self.leaf.is_empty() {
                self.leaf_at = leaf;
            }
            self.leaf.extend_from_slice(&bytes[(from - range.start) as usize..(to - range.start) as usize]);
            if to == leaf_end {
                self.nodes.push(self.leaf_node(leaf_end - leaf));
                self.leaf.clear();
            }
        }
    }

    /// The node of the assembled straddling chunk (the root hash when it is the whole input).
    fn leaf_node(&self, len: u64) -> NodeHash {
        let cv = if self.shape.total_len <= blake3::CHUNK_LEN as u64 {
            *blake3::hash(&self.leaf).as_bytes()
        } else {
            node_cv(self.leaf_at, &self.leaf)
        };
        NodeHash { offset: self.leaf_at, len, cv }
    }

    /// The input bytes added so far.
    pub fn covered(&self) -> u64 {
        self.next
    }

    /// The hash of the whole input; `None` unless ranges covering it were added in order.
    pub fn finish(self) -> Option<blake3::Hash> {
        if self.broken || self.next != self.shape.total_len {
            return None;
        }
        if self.shape.total_len == 0 {
            return Some(blake3::hash(&[]));
        }
        self.shape.join(self.nodes, None)
    }
}

/// The chaining value of the subtree over `bytes` at `offset` in an input of more than one
/// blake3 chunk (a subtree of the tree, so `offset` is a multiple of its length).
fn node_cv(offset: u64, bytes: &[u8]) -> [u8; 32] {
    use blake3::hazmat::HasherExt;
    blake3::Hasher::new().set_input_offset(offset).update(bytes).finalize_non_root()
}

/// The two children of the root of blake3's tree over `total_len` (> 1 chunk) bytes, as
/// (offset, length).
fn root_children(total_len: u64) -> [(u64, u64); 2] {
    let left = blake3::hazmat::left_subtree_len(total_len);
    [(0, left), (left, total_len - left)]
}

/// Calls `visit` for the maximal subtrees under the node (`offset`, `len`) that lie inside
/// `range`; a 1 KiB leaf that straddles the range's edge is skipped.
fn inside_nodes(offset: u64, len: u64, range: &std::ops::Range<u64>, visit: &mut impl FnMut(u64, u64)) {
    let end = offset + len;
    if end <= range.start || offset >= range.end {
        return;
    }
    if range.start <= offset && end <= range.end {
        visit(offset, len);
        return;
    }
    if len <= blake3::CHUNK_LEN as u64 {
        return;
    }
    let left = blake3::hazmat::left_subtree_len(len);
    inside_nodes(offset, left, range, visit);
    inside_nodes(offset + left, len - left, range, visit);
}

/// The chaining value of the node (`offset`, `len`): from `nodes` (sorted by offset, longest
/// first) when a worker hashed it, else merged from its children, or hashed from `input` for a
/// leaf (`None` without `input`).
fn subtree_cv(offset: u64, len: u64, nodes: &[NodeHash], input: Option<&[u8]>) -> Option<[u8; 32]> {
    use blake3::hazmat::{merge_subtrees_non_root, Mode};
    let at = nodes.partition_point(|n| n.offset < offset);
    if let Some(n) = nodes[at..].iter().take_while(|n| n.offset == offset).find(|n| n.len == len) {
        return Some(n.cv);
    }
    if len <= blake3::CHUNK_LEN as u64 {
        return Some(node_cv(offset, &input?[offset as usize..(offset + len) as usize]));
    }
    let left = blake3::hazmat::left_subtree_len(len);
    let l = subtree_cv(offset, left, nodes, input)?;
    let r = subtree_cv(offset + left, len - left, nodes, input)?;
    Some(merge_subtrees_non_root(&l, &r, Mode::Hash))
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
    use crate::test_data::random_bytes;

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

    /// Sorted, distinct range boundaries from 0 to `total` with `cuts` (taken modulo) between.
    fn cut_points(total: u64, cuts: Vec<u64>) -> Vec<u64> {
        let mut bounds: Vec<u64> = cuts.into_iter().map(|c| c % (total + 1)).collect();
        bounds.extend([0, total]);
        bounds.sort_unstable();
        bounds.dedup();
        bounds
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]
        /// Ranges with arbitrary boundaries, hashed in any order and joined, give blake3 of the
        /// whole; so does a join with some ranges never hashed.
        #[test]
        fn ranges_join_to_the_hash_of_the_whole(
            total in proptest::prop_oneof![0u64..3000, 3000u64..300_000],
            cuts in proptest::collection::vec(0u64..300_000, 0..12),
            skip in proptest::collection::vec(proptest::bool::ANY, 13),
            seed: u64,
        ) {
            let data = random_bytes(seed, total);
            let bounds = cut_points(total, cuts);
            let hashes = RangeHashes::new(total);
            let mut nodes = Vec::new();
            for (i, w) in bounds.windows(2).enumerate().rev() {
                if !skip[i % skip.len()] {
                    hashes.hash_range(w[0]..w[1], &data[w[0] as usize..w[1] as usize], &mut nodes);
                }
            }
            let all_hashed = skip.iter().take(bounds.len() - 1).all(|s| !s);
            let on_grid = bounds.iter().all(|b| b % 1024 == 0 || *b == total);
            if on_grid && all_hashed && total > 0 {
                // Ranges on blake3's 1 KiB grid that cover the input need no bytes at the join.
                proptest::prop_assert_eq!(hashes.join(nodes.clone(), None), Some(blake3::hash(&data)));
            }
            proptest::prop_assert_eq!(hashes.join(nodes, Some(&data)), Some(blake3::hash(&data)));
        }

        /// Units of a power-of-two number of bytes (as checkout decodes a blob), hashed without
        /// the input at the join.
        #[test]
        fn aligned_units_join_without_the_input(unit_log in 10u32..15, units in 0u64..9, extra in 0u64..2048, seed: u64) {
            let unit = 1u64 << unit_log;
            let total = units * unit + extra;
            let data = random_bytes(seed, total);
            let hashes = RangeHashes::new(total);
            let mut nodes = Vec::new();
            for start in (0..total).step_by(unit as usize).collect::<Vec<_>>().into_iter().rev() {
                let end = (start + unit).min(total);
                hashes.hash_range(start..end, &data[start as usize..end as usize], &mut nodes);
            }
            let expected = if total == 0 { None } else { Some(blake3::hash(&data)) };
            proptest::prop_assert_eq!(hashes.join(nodes, None), expected);
        }

        /// Ranges with arbitrary boundaries, added in order with the nodes their workers hashed,
        /// join to blake3 of the whole without the input; a gap or a reordering gives `None`.
        #[test]
        fn ordered_ranges_join_without_the_input(
            total in proptest::prop_oneof![0u64..3000, 3000u64..300_000],
            cuts in proptest::collection::vec(0u64..300_000, 0..12),
            seed: u64,
        ) {
            let data = random_bytes(seed, total);
            let bounds = cut_points(total, cuts);
            let mut ranges: Vec<_> = bounds.windows(2).map(|w| w[0]..w[1]).collect();
            let middle = bounds[bounds.len() / 2];
            ranges.insert(bounds.len() / 2, middle..middle); // an empty range (an empty tensor)
            let add_all = |order: &[std::ops::Range<u64>]| {
                let mut join = RangeHashJoin::new(total);
                for r in order {
                    let bytes = &data[r.start as usize..r.end as usize];
                    let mut nodes = Vec::new();
                    join.shape().hash_range(r.clone(), bytes, &mut nodes);
                    join.add(r.clone(), bytes, nodes);
                }
                join.finish()
            };
            proptest::prop_assert_eq!(add_all(&ranges), Some(blake3::hash(&data)));
            let nonempty: Vec<_> = ranges.iter().filter(|r| !r.is_empty()).cloned().collect();
            if nonempty.len() >= 2 {
                proptest::prop_assert_eq!(add_all(&nonempty[1..]), None, "a missing range");
                let mut swapped = nonempty.clone();
                swapped.swap(0, 1);
                proptest::prop_assert_eq!(add_all(&swapped), None, "ranges out of order");
            }
        }
    }

    /// Ranges that are reversed, of the wrong length or past the end break the join (no panic).
    #[test]
    fn bad_ranges_break_the_ordered_join() {
        let data = random_bytes(7, 5000);
        let join_of = |ranges: &[(std::ops::Range<u64>, usize)]| {
            let mut join = RangeHashJoin::new(5000);
            for (range, len) in ranges {
                let start = range.start.min(5000) as usize;
                let bytes = &data[start..start + len];
                let mut nodes = Vec::new();
                join.shape().hash_range(range.clone(), bytes, &mut nodes);
                join.add(range.clone(), bytes, nodes);
            }
            join.finish()
        };
        assert_eq!(join_of(&[(0..5000, 5000)]), Some(blake3::hash(&data)));
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = 3000..2000;
        assert_eq!(join_of(&[(0..3000, 3000), (reversed, 0), (3000..5000, 2000)]), None);
        assert_eq!(join_of(&[(0..3000, 2999), (3000..5000, 2000)]), None, "wrong length");
        assert_eq!(join_of(&[(0..3000, 3000), (3000..6000, 2000)]), None, "past the end");
        assert_eq!(join_of(&[(0..3000, 3000)]), None, "not covered");
    }

    #[test]
    fn range_hashes_check_lengths() {
        let hashes = RangeHashes::new(5000);
        let mut nodes = Vec::new();
        hashes.hash_range(0..4096, &[0; 100], &mut nodes);
        assert!(nodes.is_empty(), "bytes of the wrong length are not hashed");
        hashes.hash_range(0..6000, &[0; 6000], &mut nodes);
        assert!(nodes.is_empty(), "a range past the end is not hashed");
        assert_eq!(hashes.join(Vec::new(), Some(&[0; 4999])), None);
        assert_eq!(hashes.join(Vec::new(), None), None, "nothing hashed and no input");
        assert_eq!(hashes.join(Vec::new(), Some(&[7; 5000])), Some(blake3::hash(&[7; 5000])));
    }
}
