//! Standalone compression of one file: a safetensors file is coded tensor by tensor (each with
//! its dtype's byte grouping; header, gaps and trailing bytes as plain bytes), a `torch.save`
//! archive storage by storage (zip headers, pickle and other entries as plain bytes), any other
//! file as plain bytes. Pure: bytes in, bytes out, so the CLI and the fuzzers share it.

use crate::codec::chunk::{Data, Reference};
use crate::codec::container::{is_container, Container, ContainerWriter, FileKind, SegmentInput};
use crate::codec::{self, cross_precision, Method, Options};
use crate::dtype::Dtype;
use crate::safetensors;
use crate::torch_zip;
use std::io::Write;
use std::ops::Range;

mod dups;
pub(crate) use dups::precision_key;

/// Errors of whole-file compression.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The input claimed to be safetensors and is not valid.
    #[error("invalid safetensors file")]
    Safetensors(#[from] safetensors::Error),
    /// Coding failed or the container is damaged.
    #[error(transparent)]
    Codec(#[from] codec::Error),
}

/// How to treat the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Must be safetensors.
    Safetensors,
    /// Plain bytes.
    Bytes,
    /// Safetensors if it parses as such, else a `torch.save` archive if it is one
    /// ([`crate::torch_zip`]), else plain bytes.
    Detect,
}

/// A byte range of the original file, the element type it is coded with (`None`: bytes) and,
/// for a segment that is one tensor, its row length (last dimension) for grids.
pub(crate) type SegmentPlan = (Range<u64>, Option<Dtype>, Option<u64>);

/// The tensor (a safetensors tensor, a `torch.save` storage) one segment of a [`cut`] holds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CutTensor<'f> {
    pub(crate) name: &'f str,
    pub(crate) dtype: Dtype,
    pub(crate) shape: &'f [u64],
}

/// How a file of `len` bytes is cut into segments, in file order, covering it: a safetensors
/// file (`header`) as its header, tensors (an empty one as a zero-length segment where it
/// sits) and the gaps between them; a `torch.save` archive (`torch`, when `header` is `None`)
/// as its storages and the bytes between them; anything else as one segment of bytes. The one
/// cut: a commit's segments ([`crate::repo`]) and a container's ([`plan_segments`]) are both
/// made from it.
pub(crate) fn cut<'f>(
    len: u64,
    header: Option<&'f safetensors::Header>,
    torch: Option<&'f torch_zip::StorageMap>,
) -> Vec<(Range<u64>, Option<CutTensor<'f>>)> {
    if let (None, Some(layout)) = (header, torch) {
        let storage = |s: &'f torch_zip::Storage| CutTensor { name: &s.name, dtype: s.dtype, shape: &s.shape };
        return layout.segments().into_iter().map(|(range, s)| (range, s.map(storage))).collect();
    }
    let Some(header) = header else {
        return vec![(0..len, None)];
    };
    let mut out = vec![(0..header.data_start, None)];
    let mut at = header.data_start;
    for t in &header.tensors {
        let tensor = Some(CutTensor { name: &t.name, dtype: t.dtype, shape: &t.shape });
        if t.is_empty() {
            out.push((at..at, tensor));
            continue;
        }
        if t.begin > at {
            out.push((at..t.begin, None));
        }
        out.push((t.begin..t.end, tensor));
        at = t.end;
    }
    if at < len {
        out.push((at..len, None));
    }
    out
}

/// Tensors below this many bytes are small: [`plan_segments`] codes runs of them as one segment.
pub const SMALL_TENSOR_BYTES: u64 = 16 << 10;

/// The kind of `file` read as `format`, and its segments: the file's cut (`cut`), without
/// zero-length tensors, where a run of small safetensors tensors (below
/// [`SMALL_TENSOR_BYTES`] each) of one dtype that follow each other without a gap is one
/// segment: each segment costs its chunks' index entries and each chunk its own Huffman
/// tables, which for 20,000 tensors of 128 bytes made the container larger than the file
/// (101%). Coded together, their byte groups share chunks (the container's format is the same:
/// a segment is any run of whole elements of one dtype).
pub fn plan_segments(file: &[u8], format: Format) -> Result<(FileKind, Vec<SegmentPlan>), Error> {
    let (kind, planned) = plan(file, format)?;
    Ok((kind, planned.into_iter().map(|p| (p.range, p.dtype, p.row_len)).collect()))
}

/// A segment [`plan_segments`] plans, with the name and shape of its tensor when it holds
/// exactly one (not a run of small tensors, a header or a gap).
#[derive(Clone, Debug)]
pub(crate) struct Planned {
    pub(crate) range: Range<u64>,
    pub(crate) dtype: Option<Dtype>,
    pub(crate) tensor: Option<(String, Vec<u64>)>,
    /// Elements per row of its tensor (the last dimension), when it holds exactly one.
    pub(crate) row_len: Option<u64>,
}

/// [`plan_segments`] with each segment's tensor.
fn plan(file: &[u8], format: Format) -> Result<(FileKind, Vec<Planned>), Error> {
    let header = match format {
        Format::Bytes => None,
        Format::Safetensors => Some(safetensors::parse(file)?),
        Format::Detect => safetensors::parse(file).ok(),
    };
    let torch = (header.is_none() && format == Format::Detect).then(|| torch_zip::parse(file).ok()).flatten();
    let kind = match (&header, &torch) {
        (Some(_), _) => FileKind::Safetensors,
        (None, Some(_)) => FileKind::Torch,
        (None, None) => FileKind::Bytes,
    };
    let mut segments: Vec<Planned> = Vec::new();
    // Whether the last segment is a run of small tensors that the next may join.
    let mut small_run = false;
    for (range, tensor) in cut(file.len() as u64, header.as_ref(), torch.as_ref()) {
        let dtype = tensor.map(|t| t.dtype);
        if range.is_empty() && tensor.is_some() {
            continue;
        }
        let small = header.is_some() && tensor.is_some() && range.end - range.start < SMALL_TENSOR_BYTES;
        let row_len = tensor.and_then(|t| t.shape.last().copied());
        match segments.last_mut() {
            Some(last)
                if small
                    && small_run
                    && last.dtype.is_some()
                    && last.dtype == dtype
                    && last.range.end == range.start =>
            {
                last.range.end = range.end;
                last.tensor = None;
                last.row_len = None;
            }
            _ => segments.push(Planned {
                range,
                dtype,
                tensor: tensor.map(|t| (t.name.to_string(), t.shape.to_vec())),
                row_len,
            }),
        }
        small_run = small;
    }
    Ok((kind, segments))
}

/// Compresses `file` into a container written to `out`; returns the writer and the blake3 hash
/// of `file`. `progress` is called with the number of input bytes done after each batch.
///
/// A tensor whose bytes equal an earlier tensor's is stored as a copy of it, and a float tensor
/// that is the rounding of an earlier one of another precision (or whose rounding an earlier one
/// is) as derived from it (docs/format.md, "Reference segments"); [`compress_with`] can turn
/// both off.
pub fn compress<W: Write>(
    file: &[u8],
    format: Format,
    options: &Options,
    out: W,
    progress: &mut dyn FnMut(u64),
) -> Result<(W, blake3::Hash), Error> {
    compress_with(file, format, options, true, out, progress)
}

/// [`compress`], with reference segments (copies and derived tensors) only when `references`.
pub fn compress_with<W: Write>(
    file: &[u8],
    format: Format,
    options: &Options,
    references: bool,
    out: W,
    progress: &mut dyn FnMut(u64),
) -> Result<(W, blake3::Hash), Error> {
    let (kind, segments) = plan(file, format)?;
    let links = if references { dups::plan_links(file, &segments) } else { vec![None; segments.len()] };
    let bytes = |range: &Range<u64>| &file[range.start as usize..range.end as usize];
    let predictors: Vec<Option<cross_precision::Predictor<'_>>> = segments
        .iter()
        .zip(&links)
        .map(|(segment, link)| {
            let (link, dtype) = (link.as_ref()?, segment.dtype?);
            let source = &segments[link.source as usize];
            let conversion = link.conversion?;
            Some(cross_precision::Predictor {
                conversion,
                source: bytes(&source.range),
                source_dtype: source.dtype?,
                dtype,
            })
        })
        .collect();
    let parts: Vec<SegmentInput<'_>> = segments
        .iter()
        .zip(&links)
        .zip(&predictors)
        .map(|((segment, link), predictor)| {
            let data = bytes(&segment.range);
            let reference = predictor.as_ref().map(|p| Reference::Grouped { source: p, offset: 0, len: data.len() });
            SegmentInput {
                data: Data::Bytes(data),
                dtype: segment.dtype,
                reference,
                link: *link,
                row_len: segment.row_len,
            }
        })
        .collect();
    let len = file.len() as u64;
    let mut writer = match links.iter().any(Option::is_some) {
        true => ContainerWriter::with_reference_segments(out, kind, len, options.clone())?,
        false => ContainerWriter::new(out, kind, len, options.clone())?,
    };
    writer.segment_inputs(&parts, progress)?;
    Ok(writer.finish()?)
}

/// Decompresses a container, writing the original to `out` and verifying its hash. `progress`
/// is called with the original bytes written so far.
pub fn decompress<W: Write>(
    container: &[u8],
    out: &mut W,
    progress: &mut dyn FnMut(u64),
) -> Result<blake3::Hash, Error> {
    if !is_container(container) {
        return Err(codec::Error::Corrupt("not a ckpt container (bad magic)".into()).into());
    }
    Ok(Container::open(container)?.decode_to_reporting(None, out, progress)?)
}

/// Where the bytes of one (dtype, byte group) pair went, summed over a container.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct GroupReport {
    /// Element type, or `"bytes"` for headers, gaps and non-safetensors files.
    pub dtype: String,
    /// Byte position within the element (0 = least significant, after exponent extraction).
    pub group: usize,
    /// Original bytes of this group.
    pub raw_bytes: u64,
    /// Stored bytes. A Paired group's also carry the top bits of the group below it, whose
    /// Remainder group stores only the rest (docs/format.md, "Paired payload"): compare the
    /// two groups' sum with their entropies' sum.
    pub stored_bytes: u64,
    /// Chunks coded with each method, indexed by method tag: raw, zero, huffman, zstd, sparse,
    /// rans, paired, remainder.
    pub methods: [u64; Method::ALL.len()],
    /// Order-0 entropy of the group, computed per chunk and summed, in bytes: the bound for a
    /// per-chunk byte coder.
    pub entropy_bytes: f64,
    /// Order-1 entropy of the group (each byte given the one before it, one table per previous
    /// value, table costs not counted), computed per chunk and summed, in bytes: the bound for
    /// rANS with the previous byte as context (`--level max` gets near it on exponent groups).
    /// Not a size any coder reaches where contexts are sparse: on noise (a mantissa byte, 256
    /// contexts × 256 values in a chunk's 64 Ki bytes) it reads well under 8 bits per byte.
    pub order1_entropy_bytes: f64,
    /// What an adaptive order-1 coder spends on the group ([`adaptive_order1_bits`]), per chunk
    /// and summed, in bytes: a size a real coder reaches without sending tables, so the one
    /// `--level max` is held to.
    pub order1_adaptive_bytes: f64,
}

/// Code length in bits of `group` under an adaptive order-1 model over the group's alphabet:
/// the alphabet first (a bit per byte value, 256 bits), then each byte coded with the
/// probability the Krichevsky–Trofimov estimator gives it from the counts seen so far after
/// the same previous byte (the first byte after a 0), `(count + 1/2) / (seen + m/2)` for an
/// alphabet of `m` values. This is what "order-1 adaptive arithmetic coding" reaches
/// (shared/design/BACKGROUND.md): the model's cost is paid in the first bytes of each context
/// instead of in a table. The sequential product depends only on each context's final
/// counts, so it is summed from them: for a context seen `n` times with counts `c_v`,
/// `Σ_{i<n} log2(i + m/2) − Σ_v Σ_{i<c_v} log2(i + 1/2)`.
pub fn adaptive_order1_bits(group: &[u8]) -> f64 {
    if group.is_empty() {
        return 0.0;
    }
    let mut pairs = vec![0u32; 256 * 256];
    let mut present = [false; 256];
    let mut prev = 0usize;
    for &b in group {
        pairs[prev * 256 + b as usize] += 1;
        present[b as usize] = true;
        prev = b as usize;
    }
    let half_alphabet = present.iter().filter(|&&p| p).count() as f64 / 2.0;
    // log2 of the rising factorial `offset · (offset + 1) ⋯ (offset + n − 1)`.
    let rising = |offset: f64, n: u32| -> f64 { (0..n).map(|i| (f64::from(i) + offset).log2()).sum() };
    let coded: f64 = pairs
        .chunks_exact(256)
        .map(|row| {
            let seen: u32 = row.iter().sum();
            rising(half_alphabet, seen) - row.iter().filter(|&&c| c > 0).map(|&c| rising(0.5, c)).sum::<f64>()
        })
        .sum();
    256.0 + coded
}

/// Totals for a container.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Report {
    /// Original file size.
    pub original_bytes: u64,
    /// Container size including header, index and footer.
    pub stored_bytes: u64,
    /// Index and framing bytes.
    pub overhead_bytes: u64,
    /// Original bytes stored as copies of earlier segments (docs/format.md, "Reference
    /// segments"): nothing but their index record; not in `groups`.
    pub copied_bytes: u64,
    /// Per dtype and byte group, in dtype code order.
    pub groups: Vec<GroupReport>,
    /// The segments (tensors) in which a structure was found, in file order.
    pub structures: Vec<StructureReport>,
}

/// A segment whose chunks are coded with a structure ([`crate::codec::grid`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct StructureReport {
    /// The tensor's name, for a safetensors file.
    pub tensor: Option<String>,
    /// Where the segment starts in the original file.
    pub offset: u64,
    /// Element type.
    pub dtype: String,
    /// What was found: `grid: int4, group 128, zero point` (from the first structured chunk).
    pub structure: String,
    /// Elements stored as they are, over the segment.
    pub escapes: u64,
    /// Chunks coded with the structure, of `chunks`.
    pub structured_chunks: usize,
    /// Chunks of the segment.
    pub chunks: usize,
}

impl std::fmt::Display for StructureReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = self.tensor.clone().unwrap_or_else(|| format!("segment at {}", self.offset));
        write!(
            f,
            "{name} ({}): {}, {} escapes ({} of {} chunks)",
            self.dtype, self.structure, self.escapes, self.structured_chunks, self.chunks
        )
    }
}

/// The structures found in `container`'s segments, with tensor names from the safetensors
/// header when the original is a safetensors file.
fn structures(container: &Container<'_>) -> Result<Vec<StructureReport>, Error> {
    let mut out = Vec::new();
    for segment in container.segments() {
        let Some(dtype) = segment.dtype else { continue };
        let elements = (segment.range.end - segment.range.start) / dtype.size() as u64;
        let mut report: Option<StructureReport> = None;
        for i in segment.chunks.clone() {
            let (_, range, header) = container.chunk(i);
            let Some(stored) = container.grid_payload(i)? else { continue };
            let chunk_elements = ((range.end - range.start) / dtype.size() as u64) as usize;
            let info = codec::grid::info(stored, dtype.size(), chunk_elements)?;
            debug_assert_eq!(header.groups().last().map(|e| e.method), Some(Method::Grid));
            let r = report.get_or_insert_with(|| StructureReport {
                tensor: None,
                offset: segment.range.start,
                dtype: dtype.to_string(),
                structure: format!("grid: {}", info.describe(elements)),
                escapes: 0,
                structured_chunks: 0,
                chunks: segment.chunks.len(),
            });
            r.escapes += u64::from(info.escapes);
            r.structured_chunks += 1;
        }
        out.extend(report);
    }
    if container.kind() == FileKind::Safetensors && !out.is_empty() {
        let len = container.segments().first().map_or(0, |s| s.range.end - s.range.start);
        let mut prefix = vec![0u8; len as usize];
        container.decode_range(0..len, &mut prefix)?;
        if let Ok(header) = safetensors::parse_header(&prefix, container.original_len()) {
            for r in &mut out {
                r.tensor = header.tensors.iter().find(|t| t.begin == r.offset).map(|t| t.name.clone());
            }
        }
    }
    Ok(out)
}

/// Decodes every chunk of `container` (in parallel) and reports, per dtype and byte group, the
/// methods chosen, stored bytes and the order-0 and order-1 entropy of the original group bytes.
pub fn analyze(container: &Container<'_>) -> Result<Report, Error> {
    use crate::codec::{byte_group, select::GroupStats, Grouping};
    use rayon::prelude::*;
    use std::collections::BTreeMap;
    type Key = (u8, usize);
    let copy = |i: usize| container.chunk(i).0.link.is_some_and(|l| l.conversion.is_none());
    let per_chunk = (0..container.chunk_count())
        .into_par_iter()
        .filter(|&i| !copy(i))
        .map(|i| -> Result<Vec<(Key, GroupReport)>, Error> {
            let (segment, range, header) = container.chunk(i);
            let grouping = Grouping::for_dtype(segment.dtype);
            let mut original = vec![0u8; (range.end - range.start) as usize];
            container.decode_chunk_into(i, &mut original)?;
            let mut grouped = vec![0u8; original.len()];
            byte_group::split(&original, None, grouping, &mut grouped)?;
            let n = original.len() / grouping.width;
            let code = segment.dtype.map_or(0, Dtype::code);
            Ok(header
                .groups()
                .iter()
                .enumerate()
                .map(|(g, e)| {
                    let mut methods = [0u64; Method::ALL.len()];
                    methods[e.method as usize] = 1;
                    let report = GroupReport {
                        dtype: segment.dtype.map_or("bytes".to_string(), |d| d.to_string()),
                        group: g,
                        raw_bytes: n as u64,
                        stored_bytes: e.stored_len as u64,
                        methods,
                        entropy_bytes: GroupStats::of(&grouped[g * n..(g + 1) * n]).entropy_bits() / 8.0,
                        order1_entropy_bytes: crate::codec::rans::order1_entropy_bits(&grouped[g * n..(g + 1) * n])
                            / 8.0,
                        order1_adaptive_bytes: adaptive_order1_bits(&grouped[g * n..(g + 1) * n]) / 8.0,
                    };
                    ((code, g), report)
                })
                .collect())
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let mut totals: BTreeMap<Key, GroupReport> = BTreeMap::new();
    for (key, r) in per_chunk.into_iter().flatten() {
        let t = totals.entry(key).or_insert_with(|| GroupReport {
            dtype: r.dtype.clone(),
            group: r.group,
            ..Default::default()
        });
        t.raw_bytes += r.raw_bytes;
        t.stored_bytes += r.stored_bytes;
        t.entropy_bytes += r.entropy_bytes;
        t.order1_entropy_bytes += r.order1_entropy_bytes;
        t.order1_adaptive_bytes += r.order1_adaptive_bytes;
        for (a, b) in t.methods.iter_mut().zip(r.methods) {
            *a += b;
        }
    }
    let payload: u64 = totals.values().map(|g| g.stored_bytes).sum();
    let structures = structures(container)?;
    Ok(Report {
        structures,
        original_bytes: container.original_len(),
        stored_bytes: container.stored_len(),
        overhead_bytes: container.stored_len() - payload,
        copied_bytes: (0..container.chunk_count())
            .filter(|&i| copy(i))
            .map(|i| {
                let (_, range, _) = container.chunk(i);
                range.end - range.start
            })
            .sum(),
        groups: totals.into_values().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::adaptive_order1_bits;
    use crate::codec::rans::order1_entropy_bits;
    use proptest::prelude::*;

    #[test]
    fn an_adaptive_coder_pays_for_noise_what_a_static_table_hides() {
        // 64 Ki bytes of noise: the static order-1 figure reads far under 8 bits per byte (each
        // of 256 contexts saw about 256 bytes), the adaptive one cannot.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..1 << 16)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect();
        let per_byte = |bits: f64| bits / noise.len() as f64;
        assert!(per_byte(order1_entropy_bits(&noise)) < 7.5, "{}", per_byte(order1_entropy_bits(&noise)));
        assert!(per_byte(adaptive_order1_bits(&noise)) > 8.0, "{}", per_byte(adaptive_order1_bits(&noise)));
        // A byte that always follows from the one before: the alphabet, then about (m − 1)/2 ·
        // log2(n) bits per context to learn it (4 contexts of 16 Ki bytes).
        let cycle: Vec<u8> = (0..1 << 16).map(|i| (i % 4) as u8 * 60).collect();
        assert!(adaptive_order1_bits(&cycle) < 256.0 + 4.0 * 32.0, "{}", adaptive_order1_bits(&cycle));
        assert_eq!(adaptive_order1_bits(&[]), 0.0);
    }

    proptest! {
        /// No sequential coder beats the empirical conditional entropy of the data it coded.
        #[test]
        fn adaptive_is_never_under_the_static_order1_entropy(group in proptest::collection::vec(0u8..8, 0..2000)) {
            prop_assert!(adaptive_order1_bits(&group) + 1e-6 >= order1_entropy_bits(&group));
        }
    }
}
