//! Computing the changes a report draws, from the store, without a whole checkpoint in memory.
//!
//! A tensor's contents across consecutive versions are read as one run, in passes of up to 16
//! contents: window by window (64 MiB of whole chunks for the whole pass), each version's window
//! is decoded and compared with the previous version's, so each content is decoded once however
//! many columns it takes part in. A content stored as a delta on its neighbour in the run (the
//! parent a reverse-delta commit rewrote as a delta on the new content, or a forward delta's
//! child) is decoded from that neighbour's window with only its own delta, not through its whole
//! chain. A content that stays the same blob across versions (a frozen layer) is decoded once,
//! for its NaN and Inf count. Small tensors kept in bundles are read version by version
//! instead, each bundle decoded once per version. Every content read whole is checked against
//! its id.
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
            // Contents that are the same blob (a frozen layer) are computed too, once (then
            // cached as any pair): nothing moved, but NaN or Inf in them must still show.
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

/// Bytes of the windows of one pass of a run, all its contents together (rounded down to whole
/// chunks of the first content's chain, at least one chunk per content).
const PASS_WINDOWS: u64 = if cfg!(test) { 256 << 10 } else { 64 << 20 };

/// Most contents read side by side in one pass of a run: a longer run is read in passes that
/// share their boundary content (decoded once more per pass).
const PASS_CONTENTS: usize = 16;

/// One content of a run being read window by window.
struct Source<'a> {
    chain: &'a BlobChain,
    decoder: ChainDecoder<'a>,
    hasher: blake3::Hasher,
    /// The content of the pass this one is stored as a delta on, if it is read from that
    /// content's grouped window ([`ChainDecoder::decode_over`]) instead of through its chain.
    over: Option<usize>,
    /// Whether another content is read over this one (so its grouped window is kept).
    keep_groups: bool,
    /// The current window: its bytes and, when kept, their grouped form.
    bytes: Vec<u8>,
    grouped: Vec<u8>,
}

impl Source<'_> {
    /// Decodes bytes `at..at + len` of the content into `self.bytes`, hashing them: windows must
    /// come in order and cover the content. `reference` is the grouped window of the content
    /// this one is read over (same window), when it is.
    fn read(&mut self, at: u64, len: usize, reference: Option<&[u8]>, scratch: &mut Vec<u8>) -> Result<()> {
        let cs = self.chain.chunk_size().max(1) as u64;
        let chunks = (at / cs) as usize..(at + len as u64).div_ceil(cs).min(self.decoder.chunk_count() as u64) as usize;
        let span = self.decoder.byte_range(chunks.clone());
        self.bytes.resize(len, 0);
        let aligned = span.start as u64 == at && span.len() == len;
        if self.keep_groups || reference.is_some() {
            // Only contents whose chunks the pass's windows align with are linked (`link`).
            self.grouped.resize(len, 0);
            match reference {
                Some(reference) => self.decoder.decode_over(reference, chunks, &mut self.grouped, &mut self.bytes)?,
                None => self.decoder.decode_keeping_groups(chunks, &mut self.grouped, &mut self.bytes)?,
            }
        } else if aligned {
            self.decoder.decode_into_parallel(chunks, &mut self.bytes)?;
        } else {
            scratch.resize(span.len(), 0);
            self.decoder.decode_into_parallel(chunks, scratch)?;
            let from = (at - span.start as u64) as usize;
            let slice = scratch.get(from..from + len).ok_or_else(|| crate::store::Error::Corrupt {
                id: self.chain.id(),
                reason: "shorter than its manifest says".into(),
            })?;
            self.bytes.copy_from_slice(slice);
        }
        crate::object_id::hash_update(&mut self.hasher, &self.bytes);
        self.chain.release_pages();
        Ok(())
    }
}

/// The changes between consecutive contents of `places` (one tensor in consecutive versions,
/// each its own blob): `places.len() − 1` of them, read in passes of at most
/// [`PASS_CONTENTS`] contents.
fn stream_run(repo: &Repo, places: &[&TensorAt]) -> Result<Vec<Change>> {
    let mut changes = Vec::with_capacity(places.len() - 1);
    let mut start = 0;
    while start + 1 < places.len() {
        let end = (start + PASS_CONTENTS).min(places.len());
        changes.extend(stream_pass(repo, &places[start..end])?);
        start = end - 1;
    }
    Ok(changes)
}

/// The contents of a pass that are stored as a delta on a neighbour in the pass whose chunks
/// line up with the windows (chunk size `chunk`): read over that neighbour's grouped window.
/// A reverse-delta series links each content to the next; a forward one, to the previous.
fn link(sources: &mut [Source], chunk: usize) {
    for k in 0..sources.len() {
        let neighbours = [k.checked_sub(1), Some(k + 1).filter(|&j| j < sources.len())];
        let over = neighbours.into_iter().flatten().find(|&j| {
            sources[k].chain.chunk_size() == chunk
                && sources[j].over != Some(k)
                && sources[k].chain.is_delta_on(sources[j].chain)
        });
        sources[k].over = over;
        if let Some(j) = over {
            sources[j].keep_groups = true;
        }
    }
}

/// The order in which a pass's contents are read per window: each after the content it is
/// read over.
fn read_order(sources: &[Source]) -> Vec<usize> {
    fn visit(k: usize, sources: &[Source], done: &mut Vec<bool>, order: &mut Vec<usize>) {
        if done[k] {
            return;
        }
        done[k] = true;
        if let Some(j) = sources[k].over {
            visit(j, sources, done, order);
        }
        order.push(k);
    }
    let mut done = vec![false; sources.len()];
    let mut order = Vec::with_capacity(sources.len());
    for k in 0..sources.len() {
        visit(k, sources, &mut done, &mut order);
    }
    order
}

/// [`stream_run`] of at most [`PASS_CONTENTS`] contents: each decoded once, window by window,
/// all of the pass's windows held at once, and checked against its id at the end.
fn stream_pass(repo: &Repo, places: &[&TensorAt]) -> Result<Vec<Change>> {
    let dtype = places[0].dtype;
    // The same content in consecutive places (a frozen layer) is read once.
    let mut content_of = Vec::with_capacity(places.len());
    let mut distinct: Vec<&TensorAt> = Vec::new();
    for (k, p) in places.iter().enumerate() {
        if k == 0 || !p.same_bytes(places[k - 1]) {
            distinct.push(p);
        }
        content_of.push(distinct.len() - 1);
    }
    let chains: Vec<BlobChain> = distinct.iter().map(|p| repo.store().open_blob(&p.blob)).collect::<Result<_, _>>()?;
    let len = places[0].len();
    for (c, p) in chains.iter().zip(&distinct) {
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
        .map(|chain| {
            Ok(Source {
                chain,
                decoder: chain.decoder()?,
                hasher: blake3::Hasher::new(),
                over: None,
                keep_groups: false,
                bytes: Vec::new(),
                grouped: Vec::new(),
            })
        })
        .collect::<Result<_>>()?;
    let chunk = chains[0].chunk_size().max(1);
    link(&mut sources, chunk);
    let order = read_order(&sources);
    let chunk = chunk as u64;
    let window = (PASS_WINDOWS / sources.len() as u64 / chunk).max(1) * chunk;
    let mut changes = vec![Change::default(); places.len() - 1];
    let mut scratch = Vec::new();
    let mut at = 0u64;
    while at < len {
        let n = window.min(len - at) as usize;
        for &k in &order {
            let reference = sources[k].over.map(|j| std::mem::take(&mut sources[j].grouped));
            let read = sources[k].read(at, n, reference.as_deref(), &mut scratch);
            if let (Some(j), Some(grouped)) = (sources[k].over, reference) {
                sources[j].grouped = grouped;
            }
            read?;
        }
        for k in 1..places.len() {
            changes[k - 1].add(dtype, &sources[content_of[k - 1]].bytes, &sources[content_of[k]].bytes);
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
