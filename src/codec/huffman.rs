//! Order-0 Huffman coding of byte streams with zstd's own Huffman coder, huff0, called through
//! `zstd-sys` FFI.
//!
//! # Why huff0 over FFI
//!
//! Byte groups of float tensors (exponent bytes above all) are skewed but not repetitive: an
//! order-0 entropy coder gets almost all of the gain, and it must keep up with disk and hashing
//! speed. There is no maintained fast pure-Rust Huffman coder: `huffman-compress` 0.7 runs at
//! ~28 MB/s encode / ~40 MB/s decode and `constriction`'s rANS at ~72 / ~140 MB/s, while huff0
//! (4 interleaved streams, table-driven, BMI2/asm decode loops) codes bf16 exponent bytes at
//! ~550 / ~1300 MB/s on one core of the same machine (`cargo bench --bench huffman`), within 2%
//! of their order-0 entropy. `ruzstd` has a huff0 decoder but keeps it private. zstd itself is a
//! dependency, and its static library, built by `zstd-sys`, contains huff0; only the declarations
//! are missing from `zstd-sys`'s generated bindings, so this module declares them itself.
//!
//! huff0's API (`lib/common/huf.h`) is internal to zstd and changed shape in zstd 1.5.5 (the
//! `bmi2` argument became a `flags` bit set). That is why Cargo.toml pins `zstd-sys = "=2.1.2"`
//! (zstd 1.5.7): **the pin must only move together with this file**, after re-reading `huf.h`
//! of the new version and re-running the golden-vector test below, which pins the byte format.
//! The `ZSTD_SYS_USE_PKG_CONFIG` route of `zstd-sys` (linking a system libzstd) is not supported:
//! a shared system libzstd exports only the public API, not the `HUF_*` symbols.
//!
//! # Payload layout (docs/format.md, "Huffman payload")
//!
//! The payload starts with the input length as unsigned LEB128 (minimal, at most 10 bytes). The
//! caller knows that length too; storing it makes a payload decoded with the wrong length an
//! error (huff0's fast decoding loops do not check for that by themselves). The input is cut
//! into blocks of [`BLOCK_SIZE`] bytes (the last one shorter), each stored as a 4-byte
//! little-endian header `h` followed by its body; `kind = h & 3`, `n = h >> 2`:
//!
//! | kind | name  | `n`                         | body                                                 |
//! |------|-------|-----------------------------|------------------------------------------------------|
//! | 0    | raw   | block length                | the `n` bytes as they are                            |
//! | 1    | rle   | block length                | 1 byte, repeated `n` times                           |
//! | 2    | huff0 | body length, `1..block_len` | `HUF_compress4X_repeat` output: table + 4 streams    |
//! | 3    | —     | reserved, rejected          |                                                      |
//!
//! Blocks follow each other with no padding; nothing follows the last block. An empty input is
//! the single byte `00` (but [`encode`] returns `false` for it, as for anything not smaller).
//! Blocks are coded independently, each with its own table: reusing tables across blocks
//! (`HUF_repeat_*`) would save only the table description, tens of bytes per 128 KiB block.
//!
//! # Untrusted input
//!
//! [`decode`] checks every header against the remaining payload and the block length derived
//! from `out.len()` before touching a byte, allocates nothing, and lets huff0 (fuzzed upstream
//! with exact-size buffers) write exactly `block_len` bytes into `out`, checking its result.
#![allow(unsafe_code)]

use core::ffi::{c_int, c_uint, c_void};
use core::ptr;
use std::ffi::CStr;

use super::{Error, Result};

/// Bytes per independently coded block: `HUF_BLOCKSIZE_MAX` of huf.h.
pub const BLOCK_SIZE: usize = 128 * 1024;

/// Length of a block header.
const HEADER_LEN: usize = 4;

const KIND_RAW: u32 = 0;
const KIND_RLE: u32 = 1;
const KIND_HUF: u32 = 2;

// ---- huf.h of zstd 1.5.7 (zstd-sys 2.1.2) --------------------------------------------------

/// `HUF_SYMBOLVALUE_MAX`.
const HUF_SYMBOLVALUE_MAX: c_uint = 255;
/// `HUF_TABLELOG_MAX`: the largest code length huff0 supports, and what the decoder table is
/// sized for.
const HUF_TABLELOG_MAX: u32 = 12;
/// Code length limit handed to the encoder. 11 is `HUF_TABLELOG_DEFAULT` (what zstd uses for
/// literals). Measured on bf16 exponent bytes, 12 saves 0.06% and decodes ~25% slower.
const ENCODE_TABLE_LOG: c_uint = 11;
/// `HUF_CTABLEBOUND`: room for the table header in `HUF_COMPRESSBOUND`.
const HUF_CTABLEBOUND: usize = 129;
/// `HUF_CTABLE_SIZE_ST(HUF_SYMBOLVALUE_MAX)`: code table entries (`size_t`) for any alphabet.
const HUF_CTABLE_LEN: usize = HUF_SYMBOLVALUE_MAX as usize + 2;
/// `HUF_WORKSPACE_SIZE`: `(8 << 10) + 512` bytes.
const HUF_WORKSPACE_SIZE: usize = (8 << 10) + 512;
/// `HUF_DTABLE_SIZE(HUF_TABLELOG_MAX)` in `HUF_DTable` (u32) units: `1 + (1 << maxTableLog)`.
const HUF_DTABLE_LEN: usize = 1 + (1 << HUF_TABLELOG_MAX);
/// `HUF_DECOMPRESS_WORKSPACE_SIZE`: `(2 << 10) + (1 << 9)` bytes.
const HUF_DECOMPRESS_WORKSPACE_SIZE: usize = (2 << 10) + (1 << 9);
/// `HUF_flags_bmi2`: use the BMI2 code paths (only when the CPU has BMI2).
const HUF_FLAGS_BMI2: c_int = 1 << 0;
/// `HUF_flags_disableAsm`: decode with C loops only (tests cross-check the decoders).
#[cfg(test)]
const HUF_FLAGS_DISABLE_ASM: c_int = 1 << 4;
/// `HUF_flags_disableFast`: decode with the careful fallback loop only.
#[cfg(test)]
const HUF_FLAGS_DISABLE_FAST: c_int = 1 << 5;
/// Flags that change the coded bytes (part of the format pinned by the golden test). Not
/// `HUF_flags_optimalDepth` (`1 << 1`): measured on exponent bytes it picked the same tables as
/// the default heuristic and only cost time.
const ENCODE_FLAGS: c_int = 0;

extern "C" {
    /// huf.h: compresses `srcSize <= HUF_BLOCKSIZE_MAX` bytes into 4 streams with a table
    /// header. Returns the compressed size, 0 if not compressible (or `dst` too small), 1 if the
    /// input is one repeated symbol (then `dst[0]` holds it), or an error code. With `hufTable`
    /// and `repeat` NULL no previous table is considered.
    fn HUF_compress4X_repeat(
        dst: *mut c_void,
        dst_size: usize,
        src: *const c_void,
        src_size: usize,
        max_symbol_value: c_uint,
        table_log: c_uint,
        work_space: *mut c_void,
        wksp_size: usize,
        huf_table: *mut usize,
        repeat: *mut c_int,
        flags: c_int,
    ) -> usize;

    /// huf.h: the table log for `srcSize > 1` bytes of symbols `0..=maxSymbolValue` (without
    /// `HUF_flags_optimalDepth`: zstd's cheap FSE-based estimate; `workSpace`, `table` and
    /// `count` are not read then, but are passed as the encoder does).
    fn HUF_optimalTableLog(
        max_table_log: c_uint,
        src_size: usize,
        max_symbol_value: c_uint,
        work_space: *mut c_void,
        wksp_size: usize,
        table: *mut usize,
        count: *const c_uint,
        flags: c_int,
    ) -> c_uint;

    /// huf.h: builds the code table for `count[0..=maxSymbolValue]` with codes at most
    /// `maxNbBits` long. Returns the largest code length or an error code.
    fn HUF_buildCTable_wksp(
        tree: *mut usize,
        count: *const c_uint,
        max_symbol_value: c_uint,
        max_nb_bits: c_uint,
        work_space: *mut c_void,
        wksp_size: usize,
    ) -> usize;

    /// huf.h: writes the table description. Returns its size or an error code.
    fn HUF_writeCTable_wksp(
        dst: *mut c_void,
        max_dst_size: usize,
        ctable: *const usize,
        max_symbol_value: c_uint,
        huff_log: c_uint,
        work_space: *mut c_void,
        wksp_size: usize,
    ) -> usize;

    /// huf.h: codes `src` as 4 streams with `CTable`. Returns the size, 0 if it does not fit,
    /// or an error code.
    fn HUF_compress4X_usingCTable(
        dst: *mut c_void,
        dst_size: usize,
        src: *const c_void,
        src_size: usize,
        ctable: *const usize,
        flags: c_int,
    ) -> usize;

    /// huf.h: reads the table header from `cSrc` into `dctx`, then decodes exactly `dstSize`
    /// bytes of 4-stream data. Returns `dstSize` or an error code.
    fn HUF_decompress4X_hufOnly_wksp(
        dctx: *mut u32,
        dst: *mut c_void,
        dst_size: usize,
        c_src: *const c_void,
        c_src_size: usize,
        work_space: *mut c_void,
        wksp_size: usize,
        flags: c_int,
    ) -> usize;
}

/// Encoder scratch space, 8-byte aligned (huf.h asks for 4; huff0 aligns to `size_t` inside).
#[repr(C, align(8))]
struct CompressWorkspace([u8; HUF_WORKSPACE_SIZE]);

/// Decoder table and scratch space, as zstd lays them out in its own decoder context.
#[repr(C, align(64))]
struct DecodeTables {
    dtable: [u32; HUF_DTABLE_LEN],
    workspace: [u32; HUF_DECOMPRESS_WORKSPACE_SIZE / 4],
}

/// Whether huff0's result code is an error (`ERR_isError`: huff0 shares zstd's error codes).
fn is_error(code: usize) -> bool {
    // SAFETY: ZSTD_isError is a pure function of its integer argument.
    unsafe { zstd_sys::ZSTD_isError(code) != 0 }
}

/// zstd's name for an error code.
fn error_name(code: usize) -> String {
    // SAFETY: ZSTD_getErrorName returns a pointer to a static NUL-terminated string for any
    // argument (a generic message for unknown codes); it is never freed.
    unsafe { CStr::from_ptr(zstd_sys::ZSTD_getErrorName(code)) }.to_string_lossy().into_owned()
}

/// huff0 flags for this CPU. The flag only picks code paths; the coded bytes do not depend on it.
fn cpu_flags() -> c_int {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("bmi2") {
            return HUF_FLAGS_BMI2;
        }
    }
    0
}

/// Appends the Huffman coding of `input` to `out`. Returns `false` (and leaves `out` unchanged)
/// when the coding would not be smaller than `input`.
///
/// An empty input returns `false` (its coding, the length prefix alone, is one byte).
pub fn encode(input: &[u8], out: &mut Vec<u8>) -> Result<bool> {
    encode_counted(input, None, out)
}

/// [`encode`] given the byte histogram of `input` (as [`super::select::GroupStats`] builds
/// it), which must be exact. When `input` is a single block, huff0 then builds its table
/// from that histogram instead of counting the bytes again (perf: its count was ~8% of
/// compression time); the output is byte for byte the same as [`encode`]'s.
pub fn encode_counted(input: &[u8], histogram: Option<&[u32; 256]>, out: &mut Vec<u8>) -> Result<bool> {
    let start = out.len();
    let histogram = histogram.filter(|_| input.len() <= BLOCK_SIZE);
    let result = encode_blocks(input, histogram, out, cpu_flags() | ENCODE_FLAGS);
    if !matches!(result, Ok(true)) {
        out.truncate(start);
    }
    result
}

/// [`encode`] without restoring `out` on `false` or error. `histogram`, when given, is that of
/// `input`, which is then at most one block.
fn encode_blocks(input: &[u8], histogram: Option<&[u32; 256]>, out: &mut Vec<u8>, flags: c_int) -> Result<bool> {
    debug_assert!(histogram.is_none() || input.len() <= BLOCK_SIZE);
    let start = out.len();
    write_varint(out, input.len() as u64);
    let mut wksp = CompressWorkspace([0; HUF_WORKSPACE_SIZE]);
    for block in input.chunks(BLOCK_SIZE) {
        // Every block costs at least a header and one byte: give up as soon as the payload
        // cannot end up smaller than the input.
        if out.len() - start + HEADER_LEN + 1 >= input.len() {
            return Ok(false);
        }
        let header_at = out.len();
        out.extend_from_slice(&[0; HEADER_LEN]);
        // HUF_COMPRESSBOUND: with less room huff0 may fail with dstSize_tooSmall.
        let bound = HUF_CTABLEBOUND + block.len() + (block.len() >> 8) + 8;
        out.reserve(bound);
        let dst = out.spare_capacity_mut();
        debug_assert!(dst.len() >= bound);
        // SAFETY: `dst` points to `bound` <= `dst.len()` writable (uninitialised) bytes of
        // `out`'s spare capacity, which huff0 never writes past; `block` is
        // `block.len() <= HUF_BLOCKSIZE_MAX` readable bytes; the workspace is
        // `HUF_WORKSPACE_SIZE` bytes, 8-aligned; the previous-table and repeat pointers may be
        // NULL (huff0 checks them before use); the BMI2 flag is only set when the CPU has BMI2.
        // None of the buffers overlap.
        let code = match histogram {
            // SAFETY: as above for `dst`, `block` and the workspace.
            Some(count) => unsafe { compress_counted(dst.as_mut_ptr().cast(), bound, block, count, &mut wksp, flags) },
            None => unsafe {
                HUF_compress4X_repeat(
                    dst.as_mut_ptr().cast(),
                    bound,
                    block.as_ptr().cast(),
                    block.len(),
                    HUF_SYMBOLVALUE_MAX,
                    ENCODE_TABLE_LOG,
                    wksp.0.as_mut_ptr().cast(),
                    HUF_WORKSPACE_SIZE,
                    ptr::null_mut(),
                    ptr::null_mut(),
                    flags,
                )
            },
        };
        if is_error(code) {
            return Err(Error::Zstd(format!("huff0 compression failed: {}", error_name(code))));
        }
        // huff0 returns 0 unless the coding is at least 2 bytes smaller than the block.
        let (kind, n, stored) = match code {
            0 => (KIND_RAW, block.len(), 0),
            1 => (KIND_RLE, block.len(), 1),
            c if c < block.len() => (KIND_HUF, c, c),
            c => {
                return Err(Error::Zstd(format!("huff0 returned {c} bytes for a {}-byte block", block.len())));
            }
        };
        if stored > 0 {
            // SAFETY: huff0 initialised the first `stored` (<= bound) bytes of the spare
            // capacity: the RLE symbol (code 1) or the compressed block (code c).
            unsafe { out.set_len(out.len() + stored) };
        } else {
            out.extend_from_slice(block);
        }
        let header = (u32::try_from(n).expect("n <= BLOCK_SIZE") << 2) | kind;
        out[header_at..header_at + HEADER_LEN].copy_from_slice(&header.to_le_bytes());
    }
    Ok(out.len() - start < input.len())
}

/// What `HUF_compress4X_repeat` does for one block without a previous table (zstd 1.5.7
/// `HUF_compress_internal` with the flags used here: no `suspectUncompressible`, no
/// `preferRepeat`, no `optimalDepth`), with the histogram supplied instead of counted. Returns
/// the same codes: 0 (store raw), 1 (one repeated symbol, written to `dst[0]`), the coded size,
/// or a huff0 error code.
///
/// # Safety
/// `dst` must be valid for `dst_size >= HUF_COMPRESSBOUND(block.len())` bytes of writes and not
/// overlap `block`; `block.len()` must be in `1..=BLOCK_SIZE`; `count` must be the exact byte
/// histogram of `block`; the BMI2 flag may only be set when the CPU has BMI2.
unsafe fn compress_counted(
    dst: *mut u8,
    dst_size: usize,
    block: &[u8],
    count: &[u32; 256],
    wksp: &mut CompressWorkspace,
    flags: c_int,
) -> usize {
    let src_size = block.len();
    debug_assert!(src_size > 0 && src_size <= BLOCK_SIZE);
    debug_assert_eq!(count.iter().map(|&c| c as usize).sum::<usize>(), src_size);
    let largest = count.iter().copied().max().unwrap_or(0) as usize;
    if largest == src_size {
        // SAFETY: `dst` has room for at least one byte (caller).
        unsafe { *dst = block[0] };
        return 1;
    }
    if largest <= (src_size >> 7) + 4 {
        return 0;
    }
    // Some byte value occurs (largest > 0), so there is a highest one.
    let max_symbol = count.iter().rposition(|&c| c > 0).unwrap_or(0) as c_uint;
    let mut ctable = [0usize; HUF_CTABLE_LEN];
    let ws = wksp.0.as_mut_ptr().cast::<c_void>();
    // SAFETY: `ctable` has HUF_CTABLE_SIZE_ST(255) entries, enough for any `max_symbol`;
    // `count` has 256 entries; the workspace is HUF_WORKSPACE_SIZE bytes, 8-aligned, larger
    // than each of huff0's build and write workspaces; `src_size > 1` here (a 1-byte block
    // returned above as a repeated symbol), as HUF_optimalTableLog requires.
    unsafe {
        let table_log = HUF_optimalTableLog(
            ENCODE_TABLE_LOG,
            src_size,
            max_symbol,
            ws,
            HUF_WORKSPACE_SIZE,
            ctable.as_mut_ptr(),
            count.as_ptr(),
            flags,
        );
        let max_bits =
            HUF_buildCTable_wksp(ctable.as_mut_ptr(), count.as_ptr(), max_symbol, table_log, ws, HUF_WORKSPACE_SIZE);
        if is_error(max_bits) {
            return max_bits;
        }
        let header_len = HUF_writeCTable_wksp(
            dst.cast(),
            dst_size,
            ctable.as_ptr(),
            max_symbol,
            max_bits as c_uint,
            ws,
            HUF_WORKSPACE_SIZE,
        );
        if is_error(header_len) {
            return header_len;
        }
        if header_len + 12 >= src_size {
            return 0;
        }
        let coded = HUF_compress4X_usingCTable(
            dst.add(header_len).cast(),
            dst_size - header_len,
            block.as_ptr().cast(),
            src_size,
            ctable.as_ptr(),
            flags,
        );
        if is_error(coded) {
            return coded;
        }
        if coded == 0 || header_len + coded >= src_size - 1 {
            return 0;
        }
        header_len + coded
    }
}

/// Appends `value` as unsigned LEB128 (7 bits per byte, low first, high bit = more follows).
fn write_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Reads a minimal unsigned LEB128 `u64` from the front of `input`; returns it and the rest.
fn read_varint(input: &[u8]) -> Option<(u64, &[u8])> {
    let mut value = 0u64;
    for (i, &byte) in input.iter().enumerate().take(10) {
        let bits = u64::from(byte & 0x7F);
        if i == 9 && byte > 1 {
            return None; // more than 64 bits
        }
        value |= bits << (7 * i);
        if byte & 0x80 == 0 {
            if i > 0 && byte == 0 {
                return None; // not minimal
            }
            return Some((value, &input[i + 1..]));
        }
    }
    None
}

/// Decodes `input` (exactly the bytes [`encode`] appended) into exactly `out.len()` bytes; the
/// caller knows the original length. Malformed input, a payload for a different length, and
/// trailing bytes are [`Error::Corrupt`]. Never panics; on error `out` holds unspecified bytes.
pub fn decode(input: &[u8], out: &mut [u8]) -> Result<()> {
    decode_with(input, out, cpu_flags())
}

/// [`decode`] with explicit huff0 flags.
fn decode_with(input: &[u8], out: &mut [u8], flags: c_int) -> Result<()> {
    // On the stack (~19 KiB), set up at the first huff0 block: no allocation per call.
    let mut tables: Option<DecodeTables> = None;
    let Some((len, mut rest)) = read_varint(input) else {
        return Err(Error::Corrupt("huffman payload: bad length prefix".into()));
    };
    if len != out.len() as u64 {
        return Err(Error::Corrupt(format!("huffman payload is for {len} bytes, expected {}", out.len())));
    }
    for (index, block) in out.chunks_mut(BLOCK_SIZE).enumerate() {
        let corrupt = |what: String| Error::Corrupt(format!("huffman block {index}: {what}"));
        let Some((header, body)) = rest.split_first_chunk::<HEADER_LEN>() else {
            return Err(corrupt(format!("truncated header ({} bytes left)", rest.len())));
        };
        let header = u32::from_le_bytes(*header);
        let (kind, n) = (header & 3, (header >> 2) as usize);
        let stored = match kind {
            KIND_RAW | KIND_RLE if n != block.len() => {
                return Err(corrupt(format!("length {n}, expected {}", block.len())));
            }
            KIND_RAW => n,
            KIND_RLE => 1,
            KIND_HUF if n == 0 || n >= block.len() => {
                return Err(corrupt(format!("huff0 size {n} for a {}-byte block", block.len())));
            }
            KIND_HUF => n,
            _ => return Err(corrupt(format!("reserved block kind {kind}"))),
        };
        let Some((body, tail)) = body.split_at_checked(stored) else {
            return Err(corrupt(format!("body of {stored} bytes, {} left", body.len())));
        };
        match kind {
            KIND_RAW => block.copy_from_slice(body),
            KIND_RLE => block.fill(body[0]),
            _ => {
                #[allow(clippy::unnecessary_lazy_evaluations, reason = "zeroing 19 KiB once, not per block")]
                let t = tables.get_or_insert_with(|| DecodeTables {
                    dtable: [0; HUF_DTABLE_LEN],
                    workspace: [0; HUF_DECOMPRESS_WORKSPACE_SIZE / 4],
                });
                // DTable header: maxTableLog in every byte that huff0 may read it from
                // (HUF_CREATE_STATIC_DTABLEX2; zstd resets its own table the same way).
                t.dtable[0] = HUF_TABLELOG_MAX * 0x0100_0001;
                // SAFETY: `dtable` has HUF_DTABLE_SIZE(HUF_TABLELOG_MAX) entries with its header
                // initialised for that capacity; `workspace` is HUF_DECOMPRESS_WORKSPACE_SIZE
                // bytes, 4-aligned; `block` is `block.len()` writable bytes and huff0 writes
                // exactly `dstSize` bytes into it; `body` is `body.len()` readable bytes, and
                // huff0 validates every length inside it against that size; the BMI2 flag is
                // only set when the CPU has BMI2. None of the buffers overlap.
                let code = unsafe {
                    HUF_decompress4X_hufOnly_wksp(
                        t.dtable.as_mut_ptr(),
                        block.as_mut_ptr().cast(),
                        block.len(),
                        body.as_ptr().cast(),
                        body.len(),
                        t.workspace.as_mut_ptr().cast(),
                        HUF_DECOMPRESS_WORKSPACE_SIZE,
                        flags,
                    )
                };
                if is_error(code) {
                    return Err(corrupt(format!("huff0: {}", error_name(code))));
                }
                if code != block.len() {
                    return Err(corrupt(format!("huff0 decoded {code} bytes, expected {}", block.len())));
                }
            }
        }
        rest = tail;
    }
    if !rest.is_empty() {
        return Err(Error::Corrupt(format!("huffman payload has {} trailing bytes", rest.len())));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// xorshift64* generator: deterministic test data without extra dependencies.
    struct Rng(u64);

    impl Rng {
        fn new(seed: u64) -> Rng {
            Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
        }
        fn next_u64(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next_u64() % n as u64) as usize
        }
        /// Uniform in (0, 1].
        fn unit(&mut self) -> f64 {
            ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
        }
        /// Standard normal (Box-Muller).
        fn normal(&mut self) -> f64 {
            let (u, v) = (self.unit(), self.unit());
            (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next_u64() as u8).collect()
        }
    }

    /// bf16 values of N(0, 0.02) weights, grouped by the codec: (exponent bytes, sign and
    /// mantissa bytes).
    fn bf16_bytes(n: usize, seed: u64) -> (Vec<u8>, Vec<u8>) {
        let mut rng = Rng::new(seed);
        let elements: Vec<u8> =
            (0..n).flat_map(|_| ((((rng.normal() * 0.02) as f32).to_bits() >> 16) as u16).to_le_bytes()).collect();
        let mut grouped = vec![0u8; elements.len()];
        let grouping = crate::codec::Grouping::for_dtype(Some(crate::dtype::Dtype::Bf16));
        crate::codec::byte_group::split(&elements, None, grouping, &mut grouped).expect("whole elements");
        let (mantissa, exponent) = grouped.split_at(n);
        (exponent.to_vec(), mantissa.to_vec())
    }

    /// Order-0 entropy of `data`, in bytes.
    fn entropy_bytes(data: &[u8]) -> f64 {
        let mut counts = [0u64; 256];
        for &b in data {
            counts[b as usize] += 1;
        }
        let n = data.len() as f64;
        let bits: f64 = counts
            .iter()
            .filter(|&&c| c > 0)
            .map(|&c| {
                let p = c as f64 / n;
                -p * p.log2()
            })
            .sum();
        bits * n / 8.0
    }

    /// Encodes `data` (after a prefix, which must survive), decodes, compares. Returns whether it
    /// was coded and the payload length.
    fn round_trip(data: &[u8]) -> (bool, usize) {
        let mut out = vec![7u8, 8, 9];
        let coded = encode(data, &mut out).unwrap();
        assert_eq!(&out[..3], &[7, 8, 9]);
        let payload = &out[3..];
        if !coded {
            assert!(payload.is_empty(), "out changed although encode returned false");
            return (false, 0);
        }
        assert!(payload.len() < data.len());
        let mut back = vec![0xA5; data.len()];
        decode(payload, &mut back).unwrap();
        assert!(back == data, "round trip mismatch for {} bytes", data.len());
        (true, payload.len())
    }

    fn varint(value: usize) -> Vec<u8> {
        let mut out = Vec::new();
        write_varint(&mut out, value as u64);
        out
    }

    #[test]
    fn varints() {
        for value in [0, 1, 127, 128, 300, 1 << 20, u64::from(u32::MAX), u64::MAX - 1, u64::MAX] {
            let mut out = Vec::new();
            write_varint(&mut out, value);
            out.push(0xEE);
            assert_eq!(read_varint(&out), Some((value, &[0xEE][..])), "{value}");
        }
        assert_eq!(varint(300), [0xAC, 0x02]);
        assert_eq!(read_varint(&[]), None);
        assert_eq!(read_varint(&[0x80]), None); // truncated
        assert_eq!(read_varint(&[0x80, 0x00]), None); // not minimal
        assert_eq!(read_varint(&[0xFF; 9].iter().chain(&[0x02]).copied().collect::<Vec<_>>()), None);
        assert_eq!(read_varint(&[0xFF; 10]), None);
    }

    fn encoded(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        assert!(encode(data, &mut out).unwrap(), "expected {} bytes to compress", data.len());
        out
    }

    #[test]
    fn empty_and_tiny() {
        assert_eq!(round_trip(&[]), (false, 0));
        decode(&[0], &mut []).unwrap();
        assert!(decode(&[], &mut []).is_err());
        assert!(decode(&[0, 0], &mut []).is_err());
        assert_eq!(round_trip(&[42]), (false, 0));
        assert_eq!(round_trip(&[1, 2, 3, 4, 5]), (false, 0));
        // 7 equal bytes: length (1) + header (4) + symbol (1) < 7.
        assert_eq!(round_trip(&[9; 7]), (true, 6));
        assert_eq!(round_trip(&[9; 6]), (false, 0));
    }

    #[test]
    fn one_symbol() {
        for len in [7, 100, 4097, BLOCK_SIZE - 1, BLOCK_SIZE, BLOCK_SIZE + 1, 3 * BLOCK_SIZE + 17] {
            let data = vec![0xC3; len];
            let (coded, size) = round_trip(&data);
            assert!(coded);
            let prefix = varint(len).len();
            assert_eq!(size, prefix + len.div_ceil(BLOCK_SIZE) * (HEADER_LEN + 1), "len {len}");
        }
    }

    #[test]
    fn two_symbols() {
        let mut rng = Rng::new(2);
        for len in [12, 13, 50, 1000, 65_537, BLOCK_SIZE + 3] {
            let data: Vec<u8> = (0..len).map(|_| if rng.below(4) == 0 { b'a' } else { b'b' }).collect();
            let (coded, size) = round_trip(&data);
            assert!(coded || len < 50, "len {len}");
            if len >= 1000 {
                // 1 bit per symbol plus headers.
                assert!(size <= len / 8 + 64 * len.div_ceil(BLOCK_SIZE), "len {len}: {size}");
            }
        }
    }

    #[test]
    fn uniform_random_is_not_compressible() {
        let mut rng = Rng::new(3);
        for len in [100, 4096, BLOCK_SIZE, 2 * BLOCK_SIZE + 5] {
            assert_eq!(round_trip(&rng.bytes(len)), (false, 0), "len {len}");
        }
    }

    #[test]
    fn mixed_blocks_round_trip() {
        // Skewed, then random, then constant, then skewed: huff0, raw, rle, huff0 blocks.
        let (exp, _) = bf16_bytes(BLOCK_SIZE, 4);
        let mut data = exp.clone();
        data.extend(Rng::new(5).bytes(BLOCK_SIZE));
        data.extend(vec![0x7F; BLOCK_SIZE]);
        data.extend(&exp[..1234]);
        let payload = encoded(&data);
        let kinds: Vec<u32> = {
            let mut kinds = Vec::new();
            let mut rest = &payload[varint(data.len()).len()..];
            for block in data.chunks(BLOCK_SIZE) {
                let h = u32::from_le_bytes(rest[..4].try_into().unwrap());
                let stored = match h & 3 {
                    KIND_RAW => block.len(),
                    KIND_RLE => 1,
                    _ => (h >> 2) as usize,
                };
                kinds.push(h & 3);
                rest = &rest[4 + stored..];
            }
            assert!(rest.is_empty());
            kinds
        };
        assert_eq!(kinds, vec![KIND_HUF, KIND_RAW, KIND_RLE, KIND_HUF]);
        round_trip(&data);
    }

    #[test]
    fn exponent_bytes_near_entropy() {
        let (exp, mantissa) = bf16_bytes(1 << 20, 6);
        let bound = entropy_bytes(&exp);
        let bits_per_byte = bound * 8.0 / exp.len() as f64;
        assert!((2.3..3.0).contains(&bits_per_byte), "test data entropy {bits_per_byte}");
        let (coded, size) = round_trip(&exp);
        assert!(coded);
        let ratio = size as f64 / bound;
        assert!(ratio < 1.03, "coded {size} bytes, entropy bound {bound:.0} ({ratio:.4})");
        // The low bytes are close to uniform: either not coded or barely smaller.
        let (coded, size) = round_trip(&mantissa);
        assert!(!coded || size as f64 > 0.95 * mantissa.len() as f64);
    }

    #[test]
    fn lengths_around_block_boundaries() {
        let (exp, _) = bf16_bytes(2 * BLOCK_SIZE + 64, 7);
        for len in [
            11,
            12,
            13,
            14,
            15,
            16,
            17,
            1001,
            1002,
            1003,
            BLOCK_SIZE - 3,
            BLOCK_SIZE - 1,
            BLOCK_SIZE,
            BLOCK_SIZE + 1,
            BLOCK_SIZE + 2,
            BLOCK_SIZE + 11,
            BLOCK_SIZE + 12,
            BLOCK_SIZE + 13,
            2 * BLOCK_SIZE - 1,
            2 * BLOCK_SIZE,
            2 * BLOCK_SIZE + 1,
            2 * BLOCK_SIZE + 63,
        ] {
            let (coded, _) = round_trip(&exp[..len]);
            assert!(coded || len < 1000, "len {len}");
        }
    }

    #[test]
    fn golden_vector() {
        // Pins the payload format and huff0's output. If this fails after a zstd-sys bump, the
        // format changed: old checkpoints may no longer decode. See the module docs.
        let input: Vec<u8> = b"aaaaaaaabbbbccdeaaaaaaaabbbbccdfaaaaaaaabbbbccdeaaaaaaaabbbbccdg".to_vec();
        let payload = encoded(&input);
        let golden: &[u8] = &GOLDEN;
        assert_eq!(payload, golden, "payload {payload:02x?}");
        let mut back = vec![0; input.len()];
        decode(golden, &mut back).unwrap();
        assert_eq!(back, input);
    }

    #[rustfmt::skip]
    const GOLDEN: [u8; 41] = [
        0x40, // LEB128 input length: 64
        0x92, 0x00, 0x00, 0x00, // block header: kind 2 (huff0), n = 36
        0x0b, 0xb0, 0x25, 0xe9, 0xb6, 0x91, 0x2d, 0x33, 0x0c, 0xc3, 0xe8, 0x09,
        0x04, 0x00, 0x05, 0x00, 0x04, 0x00, 0x21, 0x92, 0xaa, 0xff, 0x40, 0x24,
        0x55, 0xff, 0x01, 0x21, 0x92, 0xaa, 0xff, 0x41, 0x24, 0x55, 0xff, 0x01, // huff0: table header, jump table, 4 streams
    ];

    #[test]
    fn code_paths_agree() {
        // huff0 has BMI2, asm, fast-C and fallback loops: same bytes out, same decoded bytes.
        let mut flag_sets = vec![0, HUF_FLAGS_DISABLE_ASM, HUF_FLAGS_DISABLE_FAST];
        if cpu_flags() & HUF_FLAGS_BMI2 != 0 {
            flag_sets.extend([HUF_FLAGS_BMI2, HUF_FLAGS_BMI2 | HUF_FLAGS_DISABLE_ASM]);
        }
        let (exp, _) = bf16_bytes(2 * BLOCK_SIZE + 777, 15);
        let mut rng = Rng::new(16);
        let two: Vec<u8> = (0..5000).map(|_| if rng.below(3) == 0 { 1 } else { 200 }).collect();
        for data in [&exp[..], &exp[..1000], &exp[..200], &two[..]] {
            let reference = encoded(data);
            for &flags in &flag_sets {
                let mut payload = Vec::new();
                assert!(encode_blocks(data, None, &mut payload, flags | ENCODE_FLAGS).unwrap());
                assert!(payload == reference, "flags {flags:#x}, {} bytes", data.len());
                let mut back = vec![0; data.len()];
                decode_with(&reference, &mut back, flags).unwrap();
                assert!(back == data, "flags {flags:#x}, {} bytes", data.len());
                // Damaged payloads: every path must fail cleanly or decode, never misbehave.
                for trial in 0..200 {
                    let mut bad = reference.clone();
                    let at = if trial % 2 == 0 { rng.below(bad.len()) } else { rng.below(bad.len().min(80)) };
                    bad[at] ^= 1 << rng.below(8);
                    let _ = decode_with(&bad, &mut back, flags);
                }
            }
        }
    }

    #[test]
    fn wrong_output_length_is_an_error() {
        let (exp, _) = bf16_bytes(BLOCK_SIZE + 5000, 8);
        let constant = vec![3u8; 5000];
        let mixed: Vec<u8> = exp[..5000].iter().chain(&constant).copied().collect();
        for data in [&exp[..], &exp[..5000], &constant[..], &mixed[..]] {
            let payload = encoded(data);
            for len in [0, 1, data.len() - 1, data.len() + 1, data.len() + 4, data.len() + BLOCK_SIZE] {
                let mut out = vec![0; len];
                assert!(decode(&payload, &mut out).is_err(), "len {len} of {}", data.len());
            }
        }
    }

    #[test]
    fn truncated_payloads_are_errors() {
        let (exp, _) = bf16_bytes(2 * BLOCK_SIZE + 999, 9);
        let mut data = exp;
        data[BLOCK_SIZE..2 * BLOCK_SIZE].fill(1);
        let payload = encoded(&data);
        let mut out = vec![0; data.len()];
        let cuts = (0..payload.len()).filter(|&i| i < 64 || i + 64 > payload.len() || i % 97 == 0);
        for cut in cuts {
            assert!(decode(&payload[..cut], &mut out).is_err(), "cut {cut}");
        }
        let mut longer = payload.clone();
        longer.push(0);
        assert!(decode(&longer, &mut out).is_err());
    }

    #[test]
    fn bit_flips_never_panic() {
        let (exp, _) = bf16_bytes(BLOCK_SIZE + 3000, 10);
        let payload = encoded(&exp);
        let mut rng = Rng::new(11);
        let mut out = vec![0; exp.len()];
        let mut ok = 0;
        for trial in 0..3000 {
            let mut bad = payload.clone();
            // Mostly near the block starts (headers and tables), sometimes anywhere.
            let flips = 1 + rng.below(3);
            for _ in 0..flips {
                let at = if trial % 2 == 0 { rng.below(bad.len()) } else { rng.below(200) };
                bad[at] ^= 1 << rng.below(8);
            }
            if decode(&bad, &mut out).is_ok() {
                ok += 1;
            }
        }
        // Flips in stream data usually still decode (to other bytes); that is fine.
        assert!(ok < 3000);
    }

    #[test]
    fn random_payloads_never_panic() {
        let mut rng = Rng::new(12);
        for _ in 0..3000 {
            let out_len = match rng.below(4) {
                0 => rng.below(20),
                1 => rng.below(5000),
                2 => BLOCK_SIZE,
                _ => rng.below(3 * BLOCK_SIZE),
            };
            let mut out = vec![0; out_len];
            let n = rng.below(600);
            let mut payload = rng.bytes(n);
            // Often a well-formed huff0 header, so huff0 itself sees random bodies.
            if rng.below(4) != 0 && out_len > 0 {
                let body = payload.len().min(out_len.min(BLOCK_SIZE) - 1).max(1);
                let header = ((body as u32) << 2) | KIND_HUF;
                payload.truncate(body);
                payload.splice(0..0, header.to_le_bytes());
            }
            if rng.below(8) != 0 {
                payload.splice(0..0, varint(out_len));
            }
            let _ = decode(&payload, &mut out);
        }
    }

    #[test]
    fn random_bodies_from_real_headers_never_panic() {
        // Real huff0 table headers followed by random stream bytes.
        let (exp, _) = bf16_bytes(4000, 13);
        let payload = encoded(&exp);
        let mut rng = Rng::new(14);
        let mut out = vec![0; exp.len()];
        for _ in 0..2000 {
            let mut bad = payload.clone();
            let from = varint(exp.len()).len() + HEADER_LEN + rng.below(60);
            for b in &mut bad[from..] {
                *b = rng.next_u64() as u8;
            }
            let _ = decode(&bad, &mut out);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn prop_round_trip_generated(
            len in 0usize..(2 * BLOCK_SIZE + 300),
            alphabet in 1usize..=256,
            skew in 0u32..4,
            seed in any::<u64>(),
        ) {
            round_trip(&generated(len, alphabet, skew, seed));
        }
    }

    /// `len` bytes over `alphabet` symbols; skew 0: uniform, higher: more mass on small symbols.
    fn generated(len: usize, alphabet: usize, skew: u32, seed: u64) -> Vec<u8> {
        let mut rng = Rng::new(seed);
        (0..len)
            .map(|_| {
                let mut s = rng.below(alphabet);
                for _ in 0..skew {
                    s = s.min(rng.below(alphabet));
                }
                s as u8
            })
            .collect()
    }

    /// `encode_counted` with the histogram must give exactly `encode`'s bytes (it replays
    /// huff0's own steps with a histogram it did not count).
    fn assert_counted_matches(data: &[u8]) {
        let histogram = crate::codec::select::GroupStats::of(data).histogram;
        let (mut plain, mut counted) = (vec![7u8], vec![7u8]);
        let a = encode(data, &mut plain).unwrap();
        let b = encode_counted(data, Some(&histogram), &mut counted).unwrap();
        assert_eq!(a, b, "{} bytes", data.len());
        assert!(plain == counted, "{} bytes: counted encoding differs", data.len());
    }

    #[test]
    fn counted_encoding_is_byte_identical() {
        let (exp, mant) = bf16_bytes(BLOCK_SIZE + 100, 21);
        let mut rng = Rng::new(22);
        let two: Vec<u8> = (0..5000).map(|_| if rng.below(3) == 0 { 1 } else { 200 }).collect();
        let cases: Vec<&[u8]> = vec![
            &[],
            &[9],
            &[9, 9],
            &[0, 1],
            &exp[..BLOCK_SIZE],
            &exp[..65536],
            &exp[..300],
            &exp[..20],
            &mant[..BLOCK_SIZE],
            &two,
            &exp, // more than one block: the histogram is ignored
        ];
        for data in cases {
            assert_counted_matches(data);
        }
        assert_counted_matches(&[5u8; 1000]);
        assert_counted_matches(&[255u8; BLOCK_SIZE]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn prop_counted_encoding_is_byte_identical(
            len in 0usize..=BLOCK_SIZE,
            alphabet in 1usize..=256,
            skew in 0u32..5,
            seed in any::<u64>(),
        ) {
            let data = generated(len, alphabet, skew, seed);
            assert_counted_matches(&data);
        }
    }

    proptest! {
        #[test]
        fn prop_round_trip_small(data in proptest::collection::vec(any::<u8>(), 0..3000)) {
            round_trip(&data);
        }

        #[test]
        fn prop_round_trip_small_alphabet(data in proptest::collection::vec(0u8..4, 0..3000)) {
            round_trip(&data);
        }

        #[test]
        fn prop_decode_arbitrary(payload in proptest::collection::vec(any::<u8>(), 0..400), len in 0usize..2000) {
            let mut out = vec![0; len];
            let _ = decode(&payload, &mut out);
        }
    }
}
