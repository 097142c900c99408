//! A whole file checked out: the chunks of all its blobs decoded in parallel, window by
//! window, hashed as they are decoded and written at their offsets.

use super::super::model::{FileEntry, Manifest, Segment};
use super::super::{Error, Repo, Result};
use crate::object_id::{NodeHash, ObjectId, RangeHashes};
use crate::store;
use rayon::prelude::*;
use std::ops::Range;

/// Chunks decoded per work unit of a parallel checkout (2 MiB with the default chunk size):
/// small enough to balance two cores on a 2 MiB tensor.
const UNIT_CHUNKS: usize = 8;
/// Bytes per window of a whole-file checkout, per worker thread: decoded in parallel, then
/// hashed and written by one thread while the next window decodes. Two such buffers are live.
/// 2 MiB per thread (one unit of 8 default chunks each; 4 MiB on two cores) rather than a
/// fixed 16 MiB: the buffers are fresh memory the kernel faults in and zeroes, which on a
/// 45 MB file was half of the checkout (0.08 s against 0.04 s on two cores, medians of 11, A/B;
/// 52 against 100 ms with transparent huge pages on);
/// on a 2 GiB file HEAD checked out in 1.09 s against 1.22 s, with 22 MiB of RSS instead of 53
/// (docs/BENCHMARKS.md, "Fixed costs again"). Per thread, so that many cores still find a unit
/// each in every window.
const WINDOW_BYTES_PER_THREAD: usize = 2 << 20;
/// The smallest window, whatever the thread count.
const MIN_WINDOW_BYTES: usize = 4 << 20;
/// Original bytes of the segments decoded together (at least one segment per batch).
const BATCH_BYTES: u64 = 64 << 20;

/// A run of chunks of one blob, decoded as one task of a whole-file checkout.
struct Unit {
    /// Index of the blob's decoder in the batch.
    decoder: usize,
    /// The blob's chunks.
    chunks: Range<usize>,
    /// Where the run's bytes go in the file.
    offset: u64,
    /// Length of the run's bytes.
    len: usize,
}

/// Where a whole-file checkout writes, and what it carries from one batch to the next.
struct WholeFile<'a> {
    file: &'a std::fs::File,
    path: &'a std::path::Path,
    /// Two window buffers: the pool decodes into one while this thread checks and writes the
    /// other (reused across batches: fresh buffers cost page faults).
    buffers: [Vec<u8>; 2],
    /// The subtree hashes of the blob being checked, so far.
    blob_nodes: Vec<NodeHash>,
    /// Bytes written so far, and the progress already reported before this file.
    done: u64,
    progress_base: u64,
}

impl WholeFile<'_> {
    fn write_at(&self, bytes: &[u8], offset: u64) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let source = |source| Error::Io { action: "writing", path: self.path.to_path_buf(), source };
        self.file.write_all_at(bytes, offset).map_err(source)
    }
}

/// A segment stored as its own blob, with where it starts in the file.
type SegmentAt<'m> = (u64, &'m Segment);

/// A blob of a batch, opened, with where its segment starts in the file.
type Placed = (u64, std::sync::Arc<store::BlobChain>);

impl Repo {
    /// Writes every segment of `manifest` into `tmp` at its offset, decoding chunks of all
    /// blobs in parallel (a file of many small tensors keeps every core busy, and the copy into
    /// the page cache is spread over the workers too). Each worker hashes the run of chunks it
    /// decoded, while the bytes are in cache, as part of the blob's blake3 ([`RangeHashes`]);
    /// once a blob's parts are in, its hash is checked against its id (naming the damaged
    /// chain if it differs). The file's hash is then derived from those ids and checked against
    /// the recorded one ([`super::super::model::file_hash`]).
    pub(super) fn write_whole_file(
        &self,
        entry: &FileEntry,
        manifest: &Manifest,
        tmp: &tempfile::NamedTempFile,
        progress_base: u64,
    ) -> Result<u64> {
        let (placed, bundled_at) = segment_offsets(entry, manifest)?;
        let file = tmp.as_file();
        let path = tmp.path();
        file.set_len(manifest.len).map_err(|source| Error::Io {
            action: "writing",
            path: path.to_path_buf(),
            source,
        })?;
        let mut out =
            WholeFile { file, path, buffers: [Vec::new(), Vec::new()], blob_nodes: Vec::new(), done: 0, progress_base };
        // Segments are opened a batch at a time: the objects of a batch's delta chains are
        // mapped (and count in the resident set) only while the batch is decoded.
        for batch in crate::codec::runs_within(placed.iter().map(|(_, s)| s.len), BATCH_BYTES) {
            let chains = self.open_batch(entry, manifest, &placed[batch])?;
            self.write_batch(&mut out, &chains)?;
        }
        self.write_bundles_and_check(entry, manifest, &mut out, &bundled_at)?;
        Ok(manifest.len)
    }

    /// Opens the blobs of `placed` (segments with their file offsets), each once however many
    /// segments name it: a forged manifest naming one blob 70,000 times ran out of maps
    /// (`vm.max_map_count`).
    fn open_batch(&self, entry: &FileEntry, manifest: &Manifest, placed: &[(u64, &Segment)]) -> Result<Vec<Placed>> {
        let mut opened: std::collections::HashMap<ObjectId, std::sync::Arc<store::BlobChain>> =
            std::collections::HashMap::new();
        placed
            .iter()
            .map(|(o, s)| {
                let blob = manifest.location(s).0;
                let chain = match opened.get(&blob) {
                    Some(chain) if chain.len() == s.len => chain.clone(),
                    _ => {
                        let chain = std::sync::Arc::new(self.open_segment(entry, manifest, s)?);
                        opened.insert(blob, chain.clone());
                        chain
                    }
                };
                Ok((*o, chain))
            })
            .collect()
    }

    /// Decodes the blobs of one batch window by window, the pool decoding window k while this
    /// thread checks each finished blob's hash and writes window k-1.
    fn write_batch(&self, out: &mut WholeFile<'_>, chains: &[Placed]) -> Result<()> {
        let decoders = chains.iter().map(|(_, c)| c.decoder()).collect::<Result<Vec<_>, _>>()?;
        // Units start on blake3's 1 KiB grid: a chain's chunk size is a power of two of at
        // least 4 KiB (`Container::open` rejects any other), so the units' subtree hashes
        // cover each blob and join without its bytes.
        let blob_hashes: Vec<RangeHashes> = chains.iter().map(|(_, chain)| RangeHashes::new(chain.len())).collect();
        let units = units(&decoders, chains);
        // Windows: runs of consecutive units (in file order) of about this many bytes.
        let window_bytes = (rayon::current_num_threads() * WINDOW_BYTES_PER_THREAD).max(MIN_WINDOW_BYTES);
        let windows = crate::codec::runs_within(units.iter().map(|u| u.len as u64), window_bytes as u64);
        // Decodes window `w` into `buf` and returns the hash of each of its units.
        let decode_window = |w: &Range<usize>, buf: &mut Vec<u8>| -> Result<Vec<Vec<NodeHash>>> {
            let len: usize = units[w.clone()].iter().map(|u| u.len).sum();
            buf.resize(len, 0);
            let mut rest = &mut buf[..];
            let mut work = Vec::with_capacity(w.len());
            for u in &units[w.clone()] {
                let (head, tail) = std::mem::take(&mut rest).split_at_mut(u.len);
                rest = tail;
                work.push((u, head));
            }
            let hashes = work
                .into_par_iter()
                .map(|(u, dst)| -> Result<Vec<NodeHash>> {
                    decoders[u.decoder].decode_into(u.chunks.clone(), dst)?;
                    // Where the unit starts within its blob (the blob starts at chains[d].0).
                    let start = u.offset - chains[u.decoder].0;
                    let mut nodes = Vec::new();
                    blob_hashes[u.decoder].hash_range(start..start + dst.len() as u64, dst, &mut nodes);
                    Ok(nodes)
                })
                .collect::<Result<Vec<_>>>()?;
            // The chain objects' pages of a decoded window are not read again: drop them
            // from the resident set, or a deep delta chain keeps (depth + 1) compressed
            // copies of the batch resident (measured: 319 MiB RSS at depth 10 on a 91 MB
            // fp32 file).
            let mut last = None;
            for u in &units[w.clone()] {
                if last != Some(u.decoder) {
                    chains[u.decoder].1.release_pages();
                    last = Some(u.decoder);
                }
            }
            Ok(hashes)
        };
        let mut buffers = std::mem::take(&mut out.buffers);
        let written = crate::codec::double_buffered(
            windows.len(),
            &mut buffers,
            |k, buf| decode_window(&windows[k], buf),
            |p, decoded, hashes| {
                for (u, nodes) in units[windows[p].clone()].iter().zip(hashes) {
                    out.blob_nodes.extend(nodes);
                    if u.chunks.end == decoders[u.decoder].chunk_count() {
                        let (_, chain) = &chains[u.decoder];
                        let joined = blob_hashes[u.decoder]
                            .join(std::mem::take(&mut out.blob_nodes), None)
                            .expect("the blob's units cover it on blake3's grid");
                        chain.check_hash(ObjectId(*joined.as_bytes()))?;
                    }
                }
                // One pwrite per run of units contiguous in the file: bundled tensors
                // (written below) leave holes between the blobs' segments.
                let mut at = 0;
                let window = &units[windows[p].clone()];
                for run in window.chunk_by(|a, b| a.offset + a.len as u64 == b.offset) {
                    let len: usize = run.iter().map(|u| u.len).sum();
                    out.write_at(&decoded[at..at + len], run[0].offset)?;
                    at += len;
                }
                out.done += decoded.len() as u64;
                self.progress.set(out.progress_base + out.done);
                Ok(())
            },
        );
        out.buffers = buffers;
        written
    }

    /// Writes the bundled tensors at `bundled_at` and checks the file's hash. Each bundle is
    /// decoded whole (at most `BUNDLE_MAX` bytes, checked against its id), its tensors written
    /// where they belong and hashed: their ids are not recorded, the file hash binds them.
    /// Every other non-empty segment matched its blob id as it was decoded; empty ones are the
    /// empty blob.
    fn write_bundles_and_check(
        &self,
        entry: &FileEntry,
        manifest: &Manifest,
        out: &mut WholeFile<'_>,
        bundled_at: &[u64],
    ) -> Result<()> {
        let empty = ObjectId::hash(&[]);
        let mut ids: Vec<ObjectId> =
            manifest.segments.iter().map(|s| if s.len == 0 { empty } else { s.blob.unwrap_or(empty) }).collect();
        for (bundle, members) in manifest.bundles.iter().zip(manifest.bundle_members()) {
            let bytes = super::super::bundle::read_bundle(self, bundle)?;
            for i in members {
                let slice = &bytes[super::super::bundle::slice(manifest, &manifest.segments[i])];
                ids[i] = ObjectId::hash(slice);
                out.write_at(slice, bundled_at[i])?;
            }
            out.done += bundle.len;
            self.progress.set(out.progress_base + out.done);
        }
        let hash = super::super::model::file_hash(manifest.len, manifest.segments.iter().map(|s| s.len).zip(ids));
        if hash != entry.hash {
            return Err(Error::HashMismatch { path: entry.path.clone(), expected: entry.hash, actual: hash });
        }
        Ok(())
    }
}

/// (file offset, segment) of every non-empty segment of `manifest` stored as its own blob, and
/// the file offset of every segment (read for the bundled ones), checked to cover the file.
fn segment_offsets<'m>(entry: &FileEntry, manifest: &'m Manifest) -> Result<(Vec<SegmentAt<'m>>, Vec<u64>)> {
    let mut placed = Vec::new();
    let mut bundled_at = vec![0u64; manifest.segments.len()];
    let mut offset = 0u64;
    for (i, s) in manifest.segments.iter().enumerate() {
        if s.bundle.is_some() {
            bundled_at[i] = offset;
        } else if s.len > 0 {
            placed.push((offset, s));
        }
        offset = offset
            .checked_add(s.len)
            .ok_or_else(|| Error::CorruptMetadata { id: entry.manifest, reason: "segment lengths overflow".into() })?;
    }
    if offset != manifest.len {
        return Err(Error::CorruptMetadata {
            id: entry.manifest,
            reason: format!("segments cover {offset} bytes of a {}-byte file", manifest.len),
        });
    }
    Ok((placed, bundled_at))
}

/// The work units of a batch, in file order: runs of [`UNIT_CHUNKS`] chunks of each blob.
fn units(decoders: &[store::ChainDecoder<'_>], chains: &[Placed]) -> Vec<Unit> {
    decoders
        .iter()
        .enumerate()
        .flat_map(|(d, dec)| {
            let offset = chains[d].0;
            (0..dec.chunk_count()).step_by(UNIT_CHUNKS).map(move |first| {
                let chunks = first..(first + UNIT_CHUNKS).min(dec.chunk_count());
                let range = dec.byte_range(chunks.clone());
                Unit { decoder: d, chunks, offset: offset + range.start as u64, len: range.len() }
            })
        })
        .collect()
}
