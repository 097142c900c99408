//! Reading blobs: a blob opened with its whole reference chain ([`BlobChain`]), decoded chunk
//! by chunk or window by window, and a stored chain as the reference of a new delta.

use super::super::{Error, ObjectHeader, ObjectKind, RawObject, Result, Store, MAX_CHAIN_DEPTH};
use super::{window_len, BlobForm};
use crate::codec::chunk::GroupedReference;
use crate::codec::container::Container;
use crate::codec::cross_precision::{self, Conversion};
use crate::codec::{byte_group, Grouping, Method};
use crate::dtype::Dtype;
use crate::object_id::{hash_update, ObjectId};
use rayon::prelude::*;
use std::io::Write;
use std::ops::Range;
use std::sync::Mutex;

thread_local! {
    /// Grouped form of one chunk while a delta chain is decoded (one per worker thread).
    static CHAIN_SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    /// One reusable window buffer per thread. A fresh 32 MiB buffer per blob cost a page fault
    /// and a kernel page clear per 4 KiB (or 2 MiB huge page) every time: perf of a checkout put
    /// 13% of its time in `clear_page_erms`. Reusing it pays that once per process and thread.
    static WINDOW: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Takes this thread's window buffer out of its slot (a second reader on the thread gets a
/// fresh one); [`return_window`] puts it back.
fn take_window() -> Vec<u8> {
    WINDOW.with(|w| std::mem::take(&mut *w.borrow_mut()))
}

/// Gives a window buffer back to this thread's slot, keeping the larger of the two.
fn return_window(buf: Vec<u8>) {
    WINDOW.with(|w| {
        let mut slot = w.borrow_mut();
        if slot.capacity() < buf.capacity() {
            *slot = buf;
        }
    });
}

/// A blob opened with its whole reference chain, checked for consistency (kinds, lengths,
/// dtypes, chunk sizes and grouping, depths). Decoding verifies the result against the blob's id.
pub struct BlobChain {
    /// `[target, its reference, ..., standalone base]`, or down to a derived blob.
    objects: Vec<RawObject>,
    chunk_size: usize,
    chunk_count: usize,
    /// When the last object is derived: how it is predicted, and its reference's chain.
    derived: Option<(Conversion, Box<BlobChain>)>,
}

impl Store {
    /// Opens blob `id` and every blob it is a delta against.
    pub fn open_blob(&self, id: &ObjectId) -> Result<BlobChain> {
        self.open_chain_from(None, id)
    }

    /// Opens blob `id` and its chain as [`Store::open_blob`] does, each object read by `read`
    /// instead of from the store: what a remote reader uses to decode chunks of partial copies
    /// of a remote's objects ([`Store::raw_at`]) with the store's own checks and decoder.
    pub fn open_blob_with(id: &ObjectId, read: &dyn Fn(&ObjectId) -> Result<RawObject>) -> Result<BlobChain> {
        open_chain_within(read, None, id, MAX_CHAIN_DEPTH)
    }

    /// Opens the chain of blob `id`, whose own object is `first` when given (an object not in
    /// the store yet: `Store::import` checks a received object this way), else read from the
    /// store; its references are read from the store.
    pub(in crate::store) fn open_chain_from(&self, first: Option<RawObject>, id: &ObjectId) -> Result<BlobChain> {
        open_chain_within(&|id| self.raw(id), first, id, MAX_CHAIN_DEPTH)
    }
}

/// Opens the chain of blob `id` (its own object `first` when given, else read by `read`, as
/// are its references), following at most `budget` references in all (through derived blobs
/// too), so that a damaged store with a cycle of references ends in an error.
fn open_chain_within(
    read: &dyn Fn(&ObjectId) -> Result<RawObject>,
    first: Option<RawObject>,
    id: &ObjectId,
    budget: u32,
) -> Result<BlobChain> {
    let mut objects: Vec<RawObject> = Vec::new();
    let mut first = first;
    let mut next = Some(*id);
    while let Some(current) = next {
        let got = match first.take() {
            Some(raw) => Ok(raw),
            None => read(&current),
        };
        let raw = match (got, objects.last()) {
            (Ok(raw), _) => raw,
            (Err(Error::Missing { id: missing }), Some(referrer)) => {
                return Err(Error::Corrupt {
                    id: referrer.id,
                    reason: format!("its delta reference {missing} is missing"),
                })
            }
            (Err(e), _) => return Err(e),
        };
        if raw.header.kind != ObjectKind::Blob {
            return Err(match objects.last() {
                None => Error::WrongKind { id: current, expected: ObjectKind::Blob, found: raw.header.kind },
                Some(referrer) => Error::Corrupt {
                    id: referrer.id,
                    reason: format!("its delta reference {current} is a {}", raw.header.kind),
                },
            });
        }
        if let Some(referrer) = objects.last() {
            let h = &referrer.header;
            // The header's depth is not compared with the reference's: a reverse-delta
            // commit turns a standalone reference into a delta, which deepens the chains
            // above it without rewriting them (docs/format.md, "Objects"). The chain's
            // real depth is its length, bounded below.
            let problem = if raw.header.raw_len != h.raw_len {
                Some(format!("{} bytes over a reference of {} bytes", h.raw_len, raw.header.raw_len))
            } else if raw.header.dtype != h.dtype {
                Some("dtype differs from its reference".to_string())
            } else {
                None
            };
            if let Some(reason) = problem {
                return Err(Error::Corrupt { id: referrer.id, reason });
            }
        }
        if objects.len() as u32 > budget {
            return Err(Error::Corrupt { id: *id, reason: "delta chain too long".into() });
        }
        next = raw.header.reference;
        let derived = raw.header.conversion.is_some();
        objects.push(raw);
        if derived {
            break;
        }
    }
    let base = objects.last().expect("at least the target");
    let chunk_size = base.container()?.chunk_size();
    let len = base.header.raw_len;
    let chunk_count = usize::try_from(len.div_ceil(chunk_size as u64))
        .map_err(|_| Error::Corrupt { id: base.id, reason: "too many chunks".into() })?;
    let derived = match (base.header.conversion, base.header.reference) {
        (Some(conversion), Some(reference)) => {
            let rest = budget.saturating_sub(objects.len() as u32);
            Some((conversion, Box::new(open_derived_reference(read, base, conversion, reference, rest)?)))
        }
        _ => None,
    };
    if let Some((_, source)) = &derived {
        // Chunk i of the derived blob holds the elements of its reference's chunk i.
        let width = |d: Option<Dtype>| d.map_or(1, Dtype::size);
        let (w, ws) = (width(base.header.dtype), width(source.dtype()));
        if source.chunk_size * w != chunk_size * ws || source.chunk_count != chunk_count {
            return Err(Error::Corrupt {
                id: base.id,
                reason: format!(
                    "chunks of {chunk_size} bytes do not line up with its cross-precision reference's {}",
                    source.chunk_size
                ),
            });
        }
    }
    let chain = BlobChain { objects, chunk_size, chunk_count, derived };
    // Opening every container checks its layout; decoding re-opens them (cheap: the index).
    chain.containers()?;
    Ok(chain)
}

/// Opens the chain of `reference`, the cross-precision reference of the derived blob `base`
/// (whose conversion is `conversion`), following at most `budget` references; checks that
/// the two pair (dtypes fit the conversion, equal element counts). Errors blame `base`.
fn open_derived_reference(
    read: &dyn Fn(&ObjectId) -> Result<RawObject>,
    base: &RawObject,
    conversion: Conversion,
    reference: ObjectId,
    budget: u32,
) -> Result<BlobChain> {
    let corrupt = |reason: String| Error::Corrupt { id: base.id, reason };
    if budget == 0 {
        return Err(corrupt("delta chain too long".into()));
    }
    let source = match open_chain_within(read, None, &reference, budget - 1) {
        Ok(source) => source,
        Err(Error::Missing { id }) if id == reference => {
            return Err(corrupt(format!("its cross-precision reference {reference} is missing")))
        }
        Err(Error::WrongKind { found, .. }) => {
            return Err(corrupt(format!("its cross-precision reference {reference} is a {found}")))
        }
        Err(e) => return Err(e),
    };
    let target = base.header.dtype.ok_or_else(|| corrupt("a derived blob without a dtype".into()))?;
    let fits = source.dtype().is_some_and(|d| conversion.fits(d, target));
    let elements = |len: u64, d: Option<Dtype>| d.map(|d| (len / d.size() as u64, len % d.size() as u64));
    if !fits || elements(source.len(), source.dtype()) != elements(base.header.raw_len, Some(target)) {
        return Err(corrupt(format!(
            "{} bytes of {target:?} cannot be derived by {conversion} from {} bytes of {:?}",
            base.header.raw_len,
            source.len(),
            source.dtype()
        )));
    }
    Ok(source)
}

impl Store {
    /// How many deltas lie between blob `id` and its standalone base now, read from the
    /// headers along its chain. (A header's own depth field is the depth when it was written,
    /// which a reverse-delta commit may have deepened since.)
    pub fn chain_depth(&self, id: &ObjectId) -> Result<u32> {
        let mut depth = 0;
        let mut next = self.header(id)?.reference;
        while let Some(reference) = next {
            depth += 1;
            if depth > MAX_CHAIN_DEPTH {
                return Err(Error::Corrupt { id: *id, reason: "delta chain too long".into() });
            }
            next = self.header(&reference)?.reference;
        }
        Ok(depth)
    }
}

/// A stored blob chain as the reference of a new delta: chunk `i` in grouped form is the base's
/// groups XORed with every delta's ([`BlobChain::apply_member_groups`]).
pub(super) struct ChainReference<'a> {
    chain: &'a BlobChain,
    containers: Vec<Container<'a>>,
    /// The first store error, kept with its object id (the codec's error type cannot carry it).
    error: Mutex<Option<Error>>,
}

impl<'a> ChainReference<'a> {
    /// `chain` as a reference, its containers opened.
    pub(super) fn open(chain: &'a BlobChain) -> Result<Self> {
        Ok(ChainReference { chain, containers: chain.containers()?, error: Mutex::new(None) })
    }

    /// Drops the pages of the chain's objects read so far ([`BlobChain::release_pages`]).
    pub(super) fn release_pages(&self) {
        self.chain.release_pages();
    }

    /// The first store error met while the codec read this reference.
    pub(super) fn into_error(self) -> Option<Error> {
        self.error.into_inner().unwrap_or_else(|p| p.into_inner())
    }
}

impl GroupedReference for ChainReference<'_> {
    fn grouped(&self, offset: usize, grouped: &mut [u8]) -> crate::codec::Result<()> {
        let chain = self.chain;
        let i = offset / chain.chunk_size;
        if !offset.is_multiple_of(chain.chunk_size)
            || i >= chain.chunk_count
            || chain.chunk_range(i).len() != grouped.len()
        {
            return Err(crate::codec::Error::InvalidInput(format!(
                "{} reference bytes at offset {offset} are not a chunk of the reference",
                grouped.len()
            )));
        }
        chain.apply_member_groups(&self.containers, i, 0..chain.objects.len(), grouped).map_err(|e| {
            let reason = e.to_string();
            self.error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
            crate::codec::Error::Corrupt(format!("delta reference: {reason}"))
        })
    }
}

impl BlobChain {
    /// The blob's id.
    pub fn id(&self) -> ObjectId {
        self.objects[0].id
    }
    /// The blob's header.
    pub fn header(&self) -> &ObjectHeader {
        &self.objects[0].header
    }
    /// Length of the blob's content.
    pub fn len(&self) -> u64 {
        self.header().raw_len
    }
    /// Whether the blob is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Element type.
    pub fn dtype(&self) -> Option<Dtype> {
        self.header().dtype
    }
    /// Number of deltas above the standalone base (0: the blob is standalone): the chain's
    /// length now, which may exceed the depth its header recorded when it was written.
    pub fn depth(&self) -> u32 {
        let own = (self.objects.len() - 1) as u32;
        match &self.derived {
            Some((_, source)) => own + 1 + source.depth(),
            None => own,
        }
    }
    /// When the chain ends at a derived blob: its conversion and its reference's chain.
    pub fn derived_from(&self) -> Option<(Conversion, &BlobChain)> {
        self.derived.as_ref().map(|(c, source)| (*c, source.as_ref()))
    }
    /// Chunk size shared by every object of the chain.
    pub fn chunk_size(&self) -> usize {
        self.chunk_size
    }
    /// Drops the chain's mapped object pages from the process's resident set (they are read
    /// from the page cache again if touched). See `mmap::Map::release`.
    pub fn release_pages(&self) {
        for o in &self.objects {
            o.release_pages();
        }
        if let Some((_, source)) = &self.derived {
            source.release_pages();
        }
    }

    /// What a blob derived from this one takes from it ([`BlobForm`]).
    pub fn form(&self) -> BlobForm {
        BlobForm {
            id: self.id(),
            dtype: self.dtype(),
            len: self.len(),
            chunk_size: self.chunk_size,
            depth: self.depth(),
            chain: self.ids(),
        }
    }

    /// Whether this blob is stored as a delta on `other` (`other` is its reference).
    pub fn is_delta_on(&self, other: &BlobChain) -> bool {
        self.objects.get(1).is_some_and(|reference| reference.id == other.id())
    }

    /// Ids of the chain, target first, standalone base last.
    pub fn ids(&self) -> Vec<ObjectId> {
        let mut ids: Vec<ObjectId> = self.objects.iter().map(|o| o.id).collect();
        if let Some((_, source)) = &self.derived {
            ids.extend(source.ids());
        }
        ids
    }
    /// Size of the standalone base's object file: an estimate of what this content costs
    /// stored on its own.
    pub(crate) fn base_stored_len(&self) -> u64 {
        self.objects.last().expect("at least the target").bytes().len() as u64
    }
    /// Whether this is a standalone tensor blob whose every byte group is stored raw: what
    /// [`Store::write_blob_uncoded`] writes, left for compaction to code. (A blob the codec
    /// chose to store all raw reads the same; coding it again only finds nothing smaller.)
    pub fn is_uncoded(&self) -> Result<bool> {
        if self.depth() != 0 || self.derived.is_some() || self.dtype().is_none() || self.is_empty() {
            return Ok(false);
        }
        let containers = self.own_containers()?;
        let Some(base) = containers.first() else { return Ok(false) };
        Ok((0..base.chunk_count()).all(|i| base.chunk(i).2.groups().iter().all(|g| g.method == Method::Raw)))
    }

    /// Size of the blob's own object file.
    pub fn stored_len(&self) -> u64 {
        self.objects[0].bytes().len() as u64
    }

    /// Opens every container of the chain and checks that they line up: the chain's own
    /// objects first, then, for a chain ending at a derived blob, its reference's containers.
    fn containers(&self) -> Result<Vec<Container<'_>>> {
        let mut containers = self.own_containers()?;
        if let Some((_, source)) = &self.derived {
            containers.extend(source.containers()?);
        }
        Ok(containers)
    }

    fn own_containers(&self) -> Result<Vec<Container<'_>>> {
        let grouping = Grouping::for_dtype(self.dtype());
        let len = self.len();
        self.objects
            .iter()
            .map(|o| {
                let c = o.container()?;
                let corrupt = |reason: String| Error::Corrupt { id: o.id, reason };
                if c.chunk_size() != self.chunk_size {
                    return Err(corrupt(format!(
                        "chunk size {} differs from its chain's {}",
                        c.chunk_size(),
                        self.chunk_size
                    )));
                }
                if c.chunk_count() != self.chunk_count {
                    return Err(corrupt(format!(
                        "{} chunks where its chain has {}",
                        c.chunk_count(),
                        self.chunk_count
                    )));
                }
                if let Some(s) = c.segments().iter().find(|s| Grouping::for_dtype(s.dtype) != grouping) {
                    return Err(corrupt(format!("a segment of {:?} in a blob of {:?}", s.dtype, self.dtype())));
                }
                for i in 0..c.chunk_count() {
                    let expected = self.chunk_range(i);
                    let (_, range, _) = c.chunk(i);
                    if range != (expected.start as u64..expected.end as u64) {
                        return Err(corrupt(format!("chunk {i} covers bytes {range:?}, expected {expected:?}")));
                    }
                }
                debug_assert!(len == c.original_len());
                Ok(c)
            })
            .collect()
    }

    fn chunk_range(&self, i: usize) -> Range<usize> {
        let start = i * self.chunk_size;
        start..(start + self.chunk_size).min(self.len() as usize)
    }

    /// Decodes chunks `chunks` through the whole chain into `out` (their total length), in
    /// parallel. Not hash-checked.
    fn decode_chunks(&self, containers: &[Container<'_>], chunks: Range<usize>, out: &mut [u8]) -> Result<()> {
        let mut rest = out;
        let mut work = Vec::with_capacity(chunks.len());
        for i in chunks {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(self.chunk_range(i).len());
            rest = tail;
            work.push((i, head));
        }
        work.into_par_iter().try_for_each(|(i, dst)| self.decode_chunk(containers, i, dst))
    }

    fn decode_chunk(&self, containers: &[Container<'_>], i: usize, dst: &mut [u8]) -> Result<()> {
        let n = self.objects.len();
        let corrupt =
            |k: usize| move |e: crate::codec::Error| Error::Corrupt { id: self.objects[k].id, reason: e.to_string() };
        if n == 1 && self.derived.is_none() {
            return containers[0].decode_chunk_into(i, dst).map_err(corrupt(0));
        }
        // Decode the chain in grouped form: XOR the byte groups of every member into one buffer
        // and regroup once, instead of regrouping once per chain member.
        crate::codec::with_thread_buffer(&CHAIN_SCRATCH, dst.len(), |grouped| {
            self.decode_chunk_grouped(containers, i, grouped, dst)
        })
    }

    /// [`Self::decode_chunk`] of a chain, with `grouped` (the chunk's length) as scratch.
    fn decode_chunk_grouped(
        &self,
        containers: &[Container<'_>],
        i: usize,
        grouped: &mut [u8],
        dst: &mut [u8],
    ) -> Result<()> {
        let n = self.objects.len();
        self.apply_member_groups(containers, i, 0..n, grouped)?;
        self.regroup_chunk(grouped, dst, n - 1)
    }

    /// Writes the grouped form of the prediction of chunk `i` of the derived blob this chain
    /// ends at into `grouped`: the reference's chunk `i` decoded (through its own chain, from
    /// `containers`, the reference's), converted, split. Errors about the conversion blame the
    /// derived blob.
    fn predicted_groups(
        &self,
        conversion: Conversion,
        source: &BlobChain,
        containers: &[Container<'_>],
        i: usize,
        grouped: &mut [u8],
    ) -> Result<()> {
        let base = self.objects.last().expect("at least the target");
        let corrupt = |e: crate::codec::Error| Error::Corrupt { id: base.id, reason: e.to_string() };
        let mut plain = vec![0u8; source.chunk_range(i).len()];
        // Through neither `decode_chunk` nor the container's `decode_chunk_into`, even for a
        // standalone reference: their thread buffers are the callers' while this runs (the
        // codec's chunk scratch holds the input of a delta being coded against this chain).
        let mut scratch = vec![0u8; plain.len()];
        source.decode_chunk_grouped(containers, i, &mut scratch, &mut plain)?;
        let (Some(from), Some(to)) = (source.dtype(), self.dtype()) else {
            return Err(corrupt(crate::codec::Error::InvalidInput("a derived blob of opaque bytes".into())));
        };
        let mut predicted = vec![0u8; grouped.len()];
        cross_precision::predict(conversion, &plain, from, to, &mut predicted).map_err(corrupt)?;
        byte_group::split(&predicted, None, Grouping::for_dtype(self.dtype()), grouped).map_err(corrupt)
    }

    /// Applies chunk `i`'s byte groups of chain `members` (indices into the chain, oldest =
    /// highest first) to `grouped`. When `members` reaches the standalone base, its groups
    /// overwrite `grouped` (every byte is written before any delta); each delta's groups are
    /// XORed in. A delta chunk whose byte groups are all Zero leaves the reference unchanged
    /// (late in training most are): its empty payload is skipped.
    fn apply_member_groups(
        &self,
        containers: &[Container<'_>],
        i: usize,
        members: Range<usize>,
        grouped: &mut [u8],
    ) -> Result<()> {
        let base = self.objects.len() - 1;
        for k in members.rev() {
            let mut fresh = k == base;
            if let (true, Some((conversion, source))) = (fresh, &self.derived) {
                // The derived blob's residual applies to its prediction, not to nothing.
                self.predicted_groups(*conversion, source, &containers[base + 1..], i, grouped)?;
                fresh = false;
            }
            let (_, _, header) = containers[k].chunk(i);
            if !fresh && header.groups().iter().all(|g| g.method == Method::Zero) {
                continue;
            }
            containers[k]
                .decode_chunk_groups_into(i, grouped, !fresh)
                .map_err(|e| Error::Corrupt { id: self.objects[k].id, reason: e.to_string() })?;
        }
        Ok(())
    }

    /// Regroups one chunk from its grouped form into `dst`; errors blame chain member `blame`.
    fn regroup_chunk(&self, grouped: &[u8], dst: &mut [u8], blame: usize) -> Result<()> {
        let grouping = Grouping::for_dtype(self.dtype());
        let group_len = dst.len() / grouping.width;
        let groups: Vec<&[u8]> = (0..grouping.width).map(|g| &grouped[g * group_len..(g + 1) * group_len]).collect();
        byte_group::regroup(&groups, None, grouping, dst)
            .map_err(|e| Error::Corrupt { id: self.objects[blame].id, reason: e.to_string() })
    }

    /// Verifies a run of this chain's members at once, decoding every object once: `members`
    /// is how many chain members, counted from the standalone base's side up to and including
    /// the target, to check (1 = only the target; `ids().len()` = all of them, base first).
    /// Window by window, the oldest checked member's content is decoded through the rest of
    /// the chain in grouped form, then each newer member's delta groups are XORed on top and
    /// the result regrouped and hashed for that member. Checking the d + 1 members of a chain
    /// one by one would decode (d + 1)(d + 2) / 2 objects instead of d + 1.
    ///
    /// Errors name the first object found damaged; the caller can then check members one by
    /// one to find every affected one.
    pub fn verify_members(&self, members: usize) -> Result<()> {
        let n = self.objects.len();
        let members = members.clamp(1, n);
        let containers = self.containers()?;
        // Chain indices of the checked members, oldest first: members - 1, ..., 0.
        let oldest = members - 1;
        let mut hashers: Vec<blake3::Hasher> = (0..members).map(|_| blake3::Hasher::new()).collect();
        let per_window = (window_len(self.chunk_size) / self.chunk_size).max(1);
        let mut grouped = Vec::new();
        let mut plain = Vec::new();
        let mut first = 0;
        while first < self.chunk_count {
            let chunks = first..(first + per_window).min(self.chunk_count);
            let len: usize = chunks.clone().map(|i| self.chunk_range(i).len()).sum();
            grouped.resize(len, 0);
            plain.resize(len, 0);
            for k in (0..=oldest).rev() {
                // Per chunk, in parallel: bring the grouped state up to member k, regroup.
                let mut work = Vec::with_capacity(chunks.len());
                let (mut g_rest, mut p_rest) = (&mut grouped[..], &mut plain[..]);
                for i in chunks.clone() {
                    let l = self.chunk_range(i).len();
                    let (g, gt) = std::mem::take(&mut g_rest).split_at_mut(l);
                    let (p, pt) = std::mem::take(&mut p_rest).split_at_mut(l);
                    g_rest = gt;
                    p_rest = pt;
                    work.push((i, g, p));
                }
                // The oldest checked member starts from the standalone base; each newer one
                // applies only its own delta on top.
                let apply = if k == oldest { oldest..n } else { k..k + 1 };
                work.into_par_iter().try_for_each(|(i, g, p)| -> Result<()> {
                    self.apply_member_groups(&containers, i, apply.clone(), g)?;
                    self.regroup_chunk(g, p, k)
                })?;
                hash_update(&mut hashers[k], &plain);
            }
            self.release_pages();
            first = chunks.end;
        }
        for (k, hasher) in hashers.iter().enumerate() {
            if ObjectId(*hasher.finalize().as_bytes()) != self.objects[k].id {
                return Err(Error::Corrupt {
                    id: self.objects[k].id,
                    reason: "decoded bytes do not match the object id".into(),
                });
            }
        }
        Ok(())
    }

    /// Opens every container of the chain for decoding arbitrary chunk ranges in any order, on
    /// any thread ([`ChainDecoder`]). Nothing it decodes is hash-checked: the caller verifies
    /// the assembled content (e.g. a whole file against its recorded hash).
    pub fn decoder(&self) -> Result<ChainDecoder<'_>> {
        Ok(ChainDecoder { chain: self, containers: self.containers()? })
    }

    /// Checks that `hash`, the blake3 of the blob's content as a caller decoded it, is the
    /// blob's id; names the chain when it is not.
    pub(crate) fn check_hash(&self, hash: ObjectId) -> Result<()> {
        if hash == self.id() {
            return Ok(());
        }
        let reason = if self.objects.len() > 1 {
            format!(
                "decoded bytes hash to {hash} (through a delta chain of {} objects: {})",
                self.objects.len(),
                self.ids().iter().map(|i| i.short(12)).collect::<Vec<_>>().join(" <- ")
            )
        } else {
            format!("decoded bytes hash to {hash}")
        };
        Err(Error::Corrupt { id: self.id(), reason })
    }

    /// A reader that decodes the blob window by window (about 32 MiB of whole chunks each) and
    /// checks the blake3 of the whole content against the id after the last window.
    pub fn reader(&self) -> Result<BlobReader<'_>> {
        let containers = self.containers()?;
        let per_window = (window_len(self.chunk_size) / self.chunk_size).max(1);
        Ok(BlobReader {
            chain: self,
            containers,
            per_window,
            next_chunk: 0,
            buf: take_window(),
            hasher: blake3::Hasher::new(),
            done: false,
        })
    }

    /// Writes the blob's content to `out`, in windows, verifying its blake3 against the id at
    /// the end. On an error the caller must discard what was written.
    pub fn copy_to(&self, out: &mut dyn Write) -> Result<u64> {
        self.copy_to_with_progress(out, &|_| {})
    }

    /// [`Self::copy_to`], calling `progress` with the bytes written so far after each window.
    pub(crate) fn copy_to_with_progress(&self, out: &mut dyn Write, progress: &dyn Fn(u64)) -> Result<u64> {
        let mut reader = self.reader()?;
        let mut done = 0u64;
        while let Some(window) = reader.next_window()? {
            out.write_all(window).map_err(|source| Error::Output { id: self.id(), source })?;
            done += window.len() as u64;
            progress(done);
        }
        Ok(done)
    }
}

/// Decodes chunks of a blob in any order ([`BlobChain::decoder`]); `Sync`, so workers can
/// share it. Each payload is checksum-checked as it is decoded; the content as a whole is not.
pub struct ChainDecoder<'a> {
    chain: &'a BlobChain,
    containers: Vec<Container<'a>>,
}

impl ChainDecoder<'_> {
    /// Number of chunks.
    pub fn chunk_count(&self) -> usize {
        self.chain.chunk_count
    }
    /// Byte range of chunks `chunks` within the blob's content.
    pub fn byte_range(&self, chunks: Range<usize>) -> Range<usize> {
        if chunks.is_empty() {
            return 0..0;
        }
        self.chain.chunk_range(chunks.start).start..self.chain.chunk_range(chunks.end - 1).end
    }
    /// Decodes chunks `chunks` through the chain into `out` (exactly their length), on the
    /// calling thread. A chunk index past the end is an error, not a panic.
    pub fn decode_into(&self, chunks: Range<usize>, out: &mut [u8]) -> Result<()> {
        if chunks.end > self.chain.chunk_count || out.len() != self.byte_range(chunks.clone()).len() {
            return Err(Error::Output {
                id: self.chain.id(),
                source: std::io::Error::other(format!("chunks {chunks:?} do not fit the request")),
            });
        }
        let mut rest = out;
        for i in chunks {
            let (dst, tail) = std::mem::take(&mut rest).split_at_mut(self.chain.chunk_range(i).len());
            rest = tail;
            self.chain.decode_chunk(&self.containers, i, dst)?;
        }
        Ok(())
    }

    /// [`Self::decode_into`] with one chunk per rayon task, each decoded straight into its
    /// place in `out`.
    pub fn decode_into_parallel(&self, chunks: Range<usize>, out: &mut [u8]) -> Result<()> {
        let mut no_groups = [];
        self.for_each_chunk(chunks, out, &mut no_groups, |i, dst, _| self.chain.decode_chunk(&self.containers, i, dst))
    }

    /// [`Self::decode_into_parallel`], also leaving the chunks' grouped form (the XOR of the
    /// chain's byte groups, chunk after chunk) in `grouped` (`out`'s length): what
    /// [`Self::decode_over`] decodes a blob stored as a delta on this one from.
    pub fn decode_keeping_groups(&self, chunks: Range<usize>, grouped: &mut [u8], out: &mut [u8]) -> Result<()> {
        let members = self.chain.objects.len();
        self.for_each_chunk(chunks, out, grouped, |i, dst, grouped| {
            self.chain.apply_member_groups(&self.containers, i, 0..members, grouped)?;
            self.chain.regroup_chunk(grouped, dst, members - 1)
        })
    }

    /// Decodes chunks `chunks` of a blob stored as a delta on another ([`BlobChain::is_delta_on`])
    /// from `reference`, the grouped form of the same chunks of that other blob (from
    /// [`Self::decode_keeping_groups`] or this method): only this blob's own delta is decoded,
    /// not the chain below it. Leaves this blob's grouped form in `grouped`.
    ///
    /// Why: with reverse deltas a commit stores the new content whole and rewrites its parent
    /// as a delta on it, so reading both (`ckpt report` comparing them) would otherwise decode
    /// the new content twice.
    pub fn decode_over(
        &self,
        reference: &[u8],
        chunks: Range<usize>,
        grouped: &mut [u8],
        out: &mut [u8],
    ) -> Result<()> {
        if self.chain.objects.len() < 2 || reference.len() != grouped.len() {
            return Err(Error::Output {
                id: self.chain.id(),
                source: std::io::Error::other("not a delta on the reference given"),
            });
        }
        grouped.copy_from_slice(reference);
        self.for_each_chunk(chunks, out, grouped, |i, dst, grouped| {
            self.chain.apply_member_groups(&self.containers, i, 0..1, grouped)?;
            self.chain.regroup_chunk(grouped, dst, 0)
        })
    }

    /// Runs `decode(i, out_i, grouped_i)` for every chunk `i` of `chunks`, one rayon task each,
    /// with `out_i` its place in `out` and `grouped_i` its place in `grouped` (empty when
    /// `grouped` is). A chunk index past the end or a buffer of the wrong length is an error.
    fn for_each_chunk(
        &self,
        chunks: Range<usize>,
        out: &mut [u8],
        grouped: &mut [u8],
        decode: impl Fn(usize, &mut [u8], &mut [u8]) -> Result<()> + Sync,
    ) -> Result<()> {
        let len = self.byte_range(chunks.clone()).len();
        if chunks.end > self.chain.chunk_count || out.len() != len || !(grouped.is_empty() || grouped.len() == len) {
            return Err(Error::Output {
                id: self.chain.id(),
                source: std::io::Error::other(format!("chunks {chunks:?} do not fit the request")),
            });
        }
        let (mut rest, mut rest_grouped) = (out, grouped);
        let mut work = Vec::with_capacity(chunks.len());
        for i in chunks {
            let n = self.chain.chunk_range(i).len();
            let (dst, tail) = std::mem::take(&mut rest).split_at_mut(n);
            rest = tail;
            let g = if rest_grouped.is_empty() {
                &mut [][..]
            } else {
                let (g, tail) = std::mem::take(&mut rest_grouped).split_at_mut(n);
                rest_grouped = tail;
                g
            };
            work.push((i, dst, g));
        }
        work.into_par_iter().try_for_each(|(i, dst, g)| decode(i, dst, g))
    }
}

/// Decodes a blob window by window ([`BlobChain::reader`]): memory is one window.
pub struct BlobReader<'a> {
    chain: &'a BlobChain,
    containers: Vec<Container<'a>>,
    per_window: usize,
    next_chunk: usize,
    buf: Vec<u8>,
    hasher: blake3::Hasher,
    done: bool,
}

impl Drop for BlobReader<'_> {
    fn drop(&mut self) {
        return_window(std::mem::take(&mut self.buf));
    }
}

impl BlobReader<'_> {
    /// The next window of the blob's content (a whole number of chunks; every window but the
    /// last is a multiple of the chunk size), or `None` after the last one. Returning `None`
    /// means the whole content hashed to the blob's id; otherwise it is [`Error::Corrupt`].
    pub fn next_window(&mut self) -> Result<Option<&[u8]>> {
        let chain = self.chain;
        if self.next_chunk >= chain.chunk_count {
            self.buf.clear();
            if !self.done {
                self.done = true;
                chain.check_hash(ObjectId(*self.hasher.finalize().as_bytes()))?;
            }
            return Ok(None);
        }
        let first = self.next_chunk;
        let last = (first + self.per_window).min(chain.chunk_count);
        let len = chain.chunk_range(last - 1).end - chain.chunk_range(first).start;
        self.buf.resize(len, 0);
        chain.decode_chunks(&self.containers, first..last, &mut self.buf)?;
        hash_update(&mut self.hasher, &self.buf);
        self.next_chunk = last;
        Ok(Some(&self.buf))
    }

    /// The window the last [`Self::next_window`] returned (empty before the first call).
    pub fn current(&self) -> &[u8] {
        &self.buf
    }
}
