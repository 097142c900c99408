//! Computing the changes a report draws, from the store, without a whole checkpoint in memory.
//!
//! A tensor's contents across consecutive versions are read as one run: window by window (16 MiB
//! of whole chunks), each version's window is decoded through its delta chain, compared with the
//! previous version's window, and dropped, so each content is decoded once however many columns
//! it takes part in, and memory is two windows. Contents that are the same blob (a frozen layer)
//! are not decoded at all. Small tensors kept in bundles are read version by version instead,
//! each bundle decoded once per version. Every content read whole is checked against its id.
//!
//! Sums already in the index (keyed by both contents and the dtype) are not computed again:
//! a report after one more commit decodes only the new column's pairs.

use super::change::Change;
use super::Result;
use crate::dtype::Dtype;
use crate::object_id::ObjectId;
use crate::repo::Repo;
use crate::store::{BlobChain, ChainDecoder};
use std::collections::HashMap;
use std::ops::Range;

/// Bytes of one window of a run (rounded to whole chunks of the first content's chain).
const WINDOW: u64 = if cfg!(test) { 64 << 10 } else { 16 << 20 };

/// Largest content read whole for a comparison with a bundled tensor (bundles hold tensors of
/// under a file-system block; this leaves room for a tensor bundled on one side only).
const WHOLE_READ_MAX: u64 = 4 << 20;

/// Where one tensor's bytes are in one version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TensorAt {
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    /// The blob holding the bytes and their range in it.
    pub blob: ObjectId,
    pub range: Range<u64>,
    /// Whether the blob is a bundle (a tensor sharing its blob with others).
    pub bundled: bool,
}

impl TensorAt {
    /// Whether `next` can be compared with this (same dtype and shape).
    pub fn comparable(&self, next: &TensorAt) -> bool {
        self.dtype == next.dtype && self.shape == next.shape && self.range.end - self.range.start == next.len()
    }

    fn len(&self) -> u64 {
        self.range.end - self.range.start
    }

    fn same_bytes(&self, other: &TensorAt) -> bool {
        self.blob == other.blob && self.range == other.range
    }
}

/// The index key of the comparison of `a` with `b`.
fn cache_key(a: &TensorAt, b: &TensorAt) -> ObjectId {
    let mut h = blake3::Hasher::new_derive_key("ckpt 2026-11-29 report change of a tensor between two contents");
    h.update(&[a.dtype as u8]);
    for t in [a, b] {
        h.update(t.blob.as_bytes());
        h.update(&t.range.start.to_le_bytes());
        h.update(&t.range.end.to_le_bytes());
    }
    ObjectId(*h.finalize().as_bytes())
}

/// The changes of a report: per (row, state) the change from state − 1, and how many pairs had
/// to be decoded (the others were the same bytes or in the index).
#[derive(Debug, Default)]
pub(crate) struct Changes {
    pub by_cell: HashMap<(usize, usize), Change>,
    pub computed: u64,
    pub cached: u64,
}

/// Computes the change of every tensor of `series` (per row, per state: where its bytes are)
/// from state `s − 1` to `s`, for each `s` in `states` where both hold it comparably.
pub(crate) fn compute(repo: &Repo, series: &[Vec<Option<TensorAt>>], states: Range<usize>) -> Result<Changes> {
    let mut out = Changes::default();
    // Pairs to decode: per row, the states whose pair is needed; bundled pairs apart.
    let mut runs: Vec<(usize, Vec<usize>)> = Vec::new();
    let mut small: Vec<(usize, usize)> = Vec::new();
    let index = repo.shared_index();
    for (row, cells) in series.iter().enumerate() {
        let mut needed = Vec::new();
        for s in states.clone().filter(|&s| s > 0) {
            let (Some(Some(a)), Some(Some(b))) = (cells.get(s - 1), cells.get(s)) else { continue };
            if !a.comparable(b) {
                continue;
            }
            if a.same_bytes(b) {
                let elements = a.len() / a.dtype.size() as u64;
                out.by_cell.insert((row, s), Change { elements, ..Change::default() });
                continue;
            }
            if let Some(Ok(Some(r))) = index.map(|ix| ix.change(&cache_key(a, b))) {
                out.by_cell.insert((row, s), Change::from_record(&r));
                out.cached += 1;
                continue;
            }
            if a.bundled || b.bundled {
                small.push((s, row));
            } else {
                needed.push(s);
            }
        }
        if !needed.is_empty() {
            runs.push((row, needed));
        }
    }
    // Changes decoded now (written to the index at the end).
    let mut fresh: HashMap<(usize, usize), Change> = HashMap::new();
    for (row, needed) in runs {
        // Consecutive states form one run: [first − 1, ..., last].
        let mut start = 0;
        while start < needed.len() {
            let mut end = start + 1;
            while end < needed.len() && needed[end] == needed[end - 1] + 1 {
                end += 1;
            }
            let first = needed[start] - 1;
            let places: Vec<&TensorAt> =
                (first..=needed[end - 1]).map(|s| series[row][s].as_ref().expect("a needed pair")).collect();
            for (k, change) in stream_run(repo, &places)?.into_iter().enumerate() {
                fresh.insert((row, first + k + 1), change);
            }
            start = end;
        }
    }
    small.sort_unstable();
    compare_small(repo, series, &small, &mut fresh)?;
    out.computed = fresh.len() as u64;
    for ((row, s), change) in fresh {
        if let (Some(ix), Some(Some(a)), Some(Some(b))) = (index, series[row].get(s - 1), series[row].get(s)) {
            // The index is a cache: a failed write costs only a computation later.
            let _ = ix.put_change(&cache_key(a, b), &change.record());
        }
        out.by_cell.insert((row, s), change);
    }
    if let Some(ix) = index {
        let _ = ix.flush();
    }
    Ok(out)
}

/// One content of a run being read window by window.
struct Source<'a> {
    chain: &'a BlobChain,
    decoder: ChainDecoder<'a>,
    hasher: blake3::Hasher,
}

impl Source<'_> {
    /// Decodes bytes `at..at + len` of the content into `out` (resized), hashing them: windows
    /// must come in order and cover the content.
    fn read(&mut self, at: u64, len: usize, out: &mut Vec<u8>, scratch: &mut Vec<u8>) -> Result<()> {
        let cs = self.chain.chunk_size().max(1) as u64;
        let chunks = (at / cs) as usize..(at + len as u64).div_ceil(cs).min(self.decoder.chunk_count() as u64) as usize;
        let span = self.decoder.byte_range(chunks.clone());
        out.resize(len, 0);
        if span.start as u64 == at && span.len() == len {
            self.decoder.decode_into_parallel(chunks, out)?;
        } else {
            scratch.resize(span.len(), 0);
            self.decoder.decode_into_parallel(chunks, scratch)?;
            let from = (at - span.start as u64) as usize;
            let slice = scratch.get(from..from + len).ok_or_else(|| crate::store::Error::Corrupt {
                id: self.chain.id(),
                reason: "shorter than its manifest says".into(),
            })?;
            out.copy_from_slice(slice);
        }
        crate::object_id::hash_update(&mut self.hasher, out);
        self.chain.release_pages();
        Ok(())
    }
}

/// The changes between consecutive contents of `places` (one tensor in consecutive versions,
/// each its own blob): `places.len() − 1` of them. Each content is decoded once, window by
/// window, and checked against its id at the end.
fn stream_run(repo: &Repo, places: &[&TensorAt]) -> Result<Vec<Change>> {
    let dtype = places[0].dtype;
    let chains: Vec<BlobChain> = places.iter().map(|p| repo.store().open_blob(&p.blob)).collect::<Result<_, _>>()?;
    let len = places[0].len();
    for (c, p) in chains.iter().zip(places) {
        if c.len() != p.len() {
            return Err(crate::store::Error::Corrupt {
                id: p.blob,
                reason: format!("{} bytes where its manifest says {}", c.len(), p.len()),
            }
            .into());
        }
    }
    let mut sources: Vec<Source> = chains
        .iter()
        .map(|chain| Ok(Source { chain, decoder: chain.decoder()?, hasher: blake3::Hasher::new() }))
        .collect::<Result<_>>()?;
    let chunk = chains[0].chunk_size().max(1) as u64;
    let window = (WINDOW / chunk).max(1) * chunk;
    let mut changes = vec![Change::default(); places.len() - 1];
    let (mut prev, mut cur, mut scratch) = (Vec::new(), Vec::new(), Vec::new());
    let mut at = 0u64;
    while at < len {
        let n = window.min(len - at) as usize;
        sources[0].read(at, n, &mut prev, &mut scratch)?;
        for (k, source) in sources.iter_mut().enumerate().skip(1) {
            source.read(at, n, &mut cur, &mut scratch)?;
            changes[k - 1].add(dtype, &prev, &cur);
            std::mem::swap(&mut prev, &mut cur);
        }
        at += n as u64;
    }
    for s in sources {
        s.chain.check_hash(ObjectId(*s.hasher.finalize().as_bytes()))?;
    }
    Ok(changes)
}

/// The changes of the pairs `small` ((state, row), sorted) where a side is a bundled tensor: both
/// sides read whole, state by state, each bundle decoded once while its state is compared.
fn compare_small(
    repo: &Repo,
    series: &[Vec<Option<TensorAt>>],
    small: &[(usize, usize)],
    by_cell: &mut HashMap<(usize, usize), Change>,
) -> Result<()> {
    let mut bundles: HashMap<ObjectId, (usize, Vec<u8>)> = HashMap::new();
    for &(s, row) in small {
        // Bundles last used before state s − 1 are no longer needed.
        bundles.retain(|_, (used, _)| *used + 1 >= s);
        let (Some(a), Some(b)) = (&series[row][s - 1], &series[row][s]) else { continue };
        let old = read_small(repo, a, s - 1, &mut bundles)?;
        let new = read_small(repo, b, s, &mut bundles)?;
        let mut change = Change::default();
        change.add(a.dtype, &old, &new);
        by_cell.insert((row, s), change);
    }
    Ok(())
}

/// The bytes of a small tensor: a slice of its bundle (decoded once, kept in `bundles` with the
/// last state that used it), or its own blob read whole.
fn read_small(
    repo: &Repo,
    t: &TensorAt,
    state: usize,
    bundles: &mut HashMap<ObjectId, (usize, Vec<u8>)>,
) -> Result<Vec<u8>> {
    let corrupt = |reason: &str| crate::store::Error::Corrupt { id: t.blob, reason: reason.into() };
    if !t.bundled {
        if t.len() > WHOLE_READ_MAX {
            return Err(corrupt("a tensor compared with a bundled one is too large").into());
        }
        let mut bytes = Vec::with_capacity(t.len() as usize);
        repo.store().open_blob(&t.blob)?.copy_to(&mut bytes)?;
        return bytes
            .get(t.range.start as usize..t.range.end as usize)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| corrupt("shorter than its manifest says").into());
    }
    let (used, bytes) = match bundles.entry(t.blob) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(e) => {
            let mut bytes = Vec::new();
            repo.store().open_blob(&t.blob)?.copy_to(&mut bytes)?;
            e.insert((state, bytes))
        }
    };
    *used = (*used).max(state);
    let slice = bytes
        .get(t.range.start as usize..t.range.end as usize)
        .ok_or_else(|| corrupt("shorter than its manifest says"))?;
    Ok(slice.to_vec())
}
