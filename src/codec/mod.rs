//! The codec: turns tensor bytes into compressed chunks and back, bit-exactly.
//!
//! Pipeline per chunk (docs/format.md, "Chunk coding"):
//! 1. optional XOR with the reference bytes ([`xor_delta`]),
//! 2. exponent extraction for floats and byte grouping ([`byte_group`]),
//! 3. per byte group, a [`Method`] picked from cheap statistics ([`select`]) and applied:
//!    [`huffman`] (zstd's huff0, entropy coding only), [`zstd_block`], zero-run tokens then zstd
//!    ([`sparse`]), rANS with a context ([`rans`]), all-zero truncation or raw; or for a float's
//!    top two groups together, the exponent and the top mantissa bits as one symbol ([`paired`]),
//! 4. framing: [`container`] writes chunk tables and a whole-file container with a chunk index.
//!
//! This layer is pure: bytes in, bytes out. It never opens files and never panics on untrusted
//! input; every size read from encoded data is checked against caller-known limits before use.

pub mod byte_group;
pub mod chunk;
pub mod container;
pub mod cross_precision;
pub mod grid;
pub mod huffman;
pub mod masked;
pub mod paired;
pub mod rans;
pub mod select;
pub mod sparse;
pub mod xor_delta;
pub mod zstd_block;

#[cfg(test)]
mod golden_containers;

pub use chunk::{decode_chunk, encode_chunk, ChunkHeader, GroupEntry};
pub use select::{Level, Options};

use crate::dtype::Dtype;
use std::ops::Range;

/// Splits consecutive items of lengths `lens` into runs whose total length is at most `budget`
/// (an item longer than `budget` is a run of its own). Every bounded-memory loop over chunks,
/// stripes or windows (compression batches, fused decode-and-hash batches, checkout batches and
/// windows) cuts its work this way.
pub(crate) fn runs_within(lens: impl IntoIterator<Item = u64>, budget: u64) -> Vec<Range<usize>> {
    let mut runs = Vec::new();
    let (mut start, mut count, mut total) = (0, 0, 0u64);
    for len in lens {
        if count > start && total + len > budget {
            runs.push(start..count);
            (start, total) = (count, 0);
        }
        total += len;
        count += 1;
    }
    if count > start {
        runs.push(start..count);
    }
    runs
}

/// A two-stage pipeline over `count` batches with two reused buffers: while the pool runs
/// `produce(k, buffer)` for batch k, the calling thread runs `consume(k - 1, buffer, output)` on
/// the batch before. Every decode that writes to a file (checkout, `ckpt decompress`) runs this
/// way: one thread writes in order (parallel writes to one file serialise on its inode lock:
/// perf once showed a third of a checkout spinning in `rwsem_spin_on_owner`),
/// and the pool never waits for the write. The buffers are the caller's so a caller with several
/// runs reuses them (fresh buffers cost page faults). An error from `consume` is returned
/// before one from the batch being produced alongside it.
pub(crate) fn double_buffered<T: Send, E: Send>(
    count: usize,
    buffers: &mut [Vec<u8>; 2],
    produce: impl Fn(usize, &mut Vec<u8>) -> Result<T, E> + Sync,
    mut consume: impl FnMut(usize, &[u8], T) -> Result<(), E>,
) -> Result<(), E> {
    let mut pending: Option<(usize, T)> = None;
    for k in 0..=count {
        let [even, odd] = &mut *buffers;
        let (fill, full) = if k % 2 == 0 { (even, &*odd) } else { (odd, &*even) };
        let mut produced = None;
        rayon::in_place_scope(|scope| -> Result<(), E> {
            if k < count {
                let (produced, produce) = (&mut produced, &produce);
                scope.spawn(move |_| *produced = Some(produce(k, fill)));
            }
            match pending.take() {
                Some((j, output)) => consume(j, full, output),
                None => Ok(()),
            }
        })?;
        if let Some(output) = produced {
            pending = Some((k, output?));
        }
    }
    Ok(())
}

/// A reusable per-thread byte buffer: a `thread_local!` slot for [`with_thread_buffer`].
pub(crate) type ThreadBuffer = std::thread::LocalKey<std::cell::RefCell<Vec<u8>>>;

/// Runs `f` with the first `len` bytes of this thread's buffer in `slot`, grown on first need and
/// kept for the next call: the per-chunk loops of coding and decoding would otherwise allocate
/// (and page-fault) a buffer per chunk. The bytes are whatever the last user left. A slot is
/// borrowed for the duration, so code that nests these calls uses one slot per level.
pub fn with_thread_buffer<T>(slot: &'static ThreadBuffer, len: usize, f: impl FnOnce(&mut [u8]) -> T) -> T {
    slot.with(|cell| {
        let mut buf = cell.borrow_mut();
        if buf.len() < len {
            buf.resize(len, 0);
        }
        f(&mut buf[..len])
    })
}

/// How one byte group of one chunk is stored. The numbers are on-disk tags and never change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Method {
    /// The bytes are stored as they are.
    Raw = 0,
    /// Every byte is zero; nothing is stored.
    Zero = 1,
    /// Canonical Huffman coding of single bytes (zstd's huff0, 4 interleaved streams).
    Huffman = 2,
    /// A zstd frame.
    Zstd = 3,
    /// The zero-run tokens of the group ([`sparse`]) as a zstd frame, after their length
    /// (u32 LE): for groups that are mostly zero, such as XOR deltas late in training.
    Sparse = 4,
    /// rANS with 12-bit frequency tables, order-0 or with a context ([`rans`]): below one bit
    /// per byte for mostly-zero groups, below the order-0 entropy for exponents whose
    /// neighbours agree. Added in container format 4; format 5 added context sources other than
    /// the previous byte (the same element's exponent, a delta's reference), binned and bit-packed tables.
    Rans = 5,
    /// This group (a float's exponent) and the top bits of the group below it as one Huffman
    /// symbol per element ([`paired`]); the group below is [`Method::Remainder`]. Added in
    /// container format 6.
    Paired = 6,
    /// The low bits of each byte of a group whose top bits are coded in the [`Method::Paired`]
    /// group above it, bit-packed. Added in container format 6.
    Remainder = 7,
    /// The whole chunk as codes on a grid ([`grid`]): scales, codes and escapes, each a nested
    /// chunk. Only the top group of a 2- or 4-byte float chunk; every group below it is
    /// [`Method::Within`]. Added in container format 7.
    Grid = 8,
    /// A group stored inside the structured group above it ([`Method::Grid`],
    /// [`Method::Masked`]); nothing of its own. Added in container format 7.
    Within = 9,
    /// The whole chunk as a bitmap of its non-zero elements and those elements ([`masked`]):
    /// pruned weights. Only the top group of a chunk of 2 or more bytes per element; every group
    /// below it is [`Method::Within`]. Added in container format 7.
    Masked = 10,
}

impl Method {
    /// All methods, in tag order.
    pub const ALL: [Method; 11] = [
        Method::Raw,
        Method::Zero,
        Method::Huffman,
        Method::Zstd,
        Method::Sparse,
        Method::Rans,
        Method::Paired,
        Method::Remainder,
        Method::Grid,
        Method::Within,
        Method::Masked,
    ];

    /// Lowercase name for tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Method::Raw => "raw",
            Method::Zero => "zero",
            Method::Huffman => "huffman",
            Method::Zstd => "zstd",
            Method::Sparse => "sparse",
            Method::Rans => "rans",
            Method::Paired => "paired",
            Method::Remainder => "remainder",
            Method::Grid => "grid",
            Method::Within => "within",
            Method::Masked => "masked",
        }
    }
}

impl TryFrom<u8> for Method {
    type Error = Error;
    fn try_from(tag: u8) -> Result<Self, Error> {
        match tag {
            0 => Ok(Method::Raw),
            1 => Ok(Method::Zero),
            2 => Ok(Method::Huffman),
            3 => Ok(Method::Zstd),
            4 => Ok(Method::Sparse),
            5 => Ok(Method::Rans),
            6 => Ok(Method::Paired),
            7 => Ok(Method::Remainder),
            8 => Ok(Method::Grid),
            9 => Ok(Method::Within),
            10 => Ok(Method::Masked),
            other => Err(Error::Corrupt(format!("unknown method tag {other}"))),
        }
    }
}

/// How a tensor's elements are cut into byte groups: element width in bytes and whether the
/// exponent is extracted (the sign moves below the top byte so the exponent fills it;
/// docs/format.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Grouping {
    /// Element width in bytes: 1, 2, 4 or 8. Also the number of byte groups.
    pub width: usize,
    /// Rotate each element left by one bit before grouping (floats).
    pub extract_exponent: bool,
}

impl Grouping {
    /// Plain bytes: one group, no transform.
    pub(crate) const BYTES: Grouping = Grouping { width: 1, extract_exponent: false };

    /// The grouping for a tensor of `dtype`, or plain bytes for `None`.
    pub fn for_dtype(dtype: Option<Dtype>) -> Grouping {
        match dtype {
            None => Grouping::BYTES,
            Some(d) => Grouping { width: d.size(), extract_exponent: d.extracts_exponent() },
        }
    }
}

/// Errors of the codec layer. Encoded data that fails a check is `Corrupt`, with what failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Encoded data is malformed, truncated or inconsistent.
    #[error("corrupt data: {0}")]
    Corrupt(String),
    /// The caller passed arguments that cannot be coded (a bug in the caller, not bad data).
    #[error("invalid codec input: {0}")]
    InvalidInput(String),
    /// zstd reported an error.
    #[error("zstd: {0}")]
    Zstd(String),
    /// The bytes coded are not the bytes the caller hashed ([`container::ContainerWriter::with_known_hash`]):
    /// the input changed while it was being read (a file rewritten during a commit).
    #[error("the input changed while it was being coded")]
    InputChanged,
    /// Writing the coded or decoded bytes to the caller's output failed (a full disk, a closed
    /// pipe): the caller's I/O, not the codec's input, so it keeps the OS error for the caller to
    /// name the file.
    #[error("{action}: {source}")]
    Io {
        /// What was being written.
        action: &'static str,
        /// The output's error.
        source: std::io::Error,
    },
}

/// Shorthand for codec results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    #[test]
    fn runs_within_cuts_at_the_budget() {
        assert_eq!(runs_within([], 10), Vec::<Range<usize>>::new());
        assert_eq!(runs_within([4, 4, 4, 20, 1, 9, 0], 10), vec![0..2, 2..3, 3..4, 4..7]);
        assert_eq!(runs_within([0, 0], 0), vec![0..2]);
    }

    use super::*;

    #[test]
    fn method_tags_are_pinned() {
        let tags: Vec<(u8, &str)> = Method::ALL.iter().map(|m| (*m as u8, m.name())).collect();
        assert_eq!(
            tags,
            vec![
                (0, "raw"),
                (1, "zero"),
                (2, "huffman"),
                (3, "zstd"),
                (4, "sparse"),
                (5, "rans"),
                (6, "paired"),
                (7, "remainder"),
                (8, "grid"),
                (9, "within"),
                (10, "masked")
            ]
        );
        for m in Method::ALL {
            assert_eq!(Method::try_from(m as u8).unwrap(), m);
        }
        assert!(Method::try_from(11).is_err());
    }
}
