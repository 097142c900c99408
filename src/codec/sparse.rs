//! The zero-run transform behind [`Method::Sparse`](super::Method::Sparse): a byte group that is
//! mostly zero becomes a list of tokens, each "skip `zeros` zero bytes, then copy `literals`
//! bytes", and the token stream is then coded as a zstd frame (docs/format.md, "Sparse").
//!
//! Why: late in training most bytes of an XOR delta are zero, and a delta chain of depth d is
//! decoded by XORing d such groups into the base. As plain zstd frames, every one of them
//! expands to the whole group (zstd copies the zero runs byte by byte: half of a deep-chain
//! checkout's time) and is then XORed in whole. As tokens, the frame expands only to the
//! nonzero bytes plus a few bytes per run, and applying a delta touches only those bytes, so a
//! chain level costs in proportion to what changed, not to the tensor's size. zstd still sees
//! the same information (run lengths and literal bytes) and codes it to about the same size.
//!
//! Token format, repeated until the stream ends: `zeros` (LEB128, up to 5 bytes), `literals`
//! (LEB128), then `literals` bytes. Bytes after the last token are zero.

use super::xor_delta::xor_in_place;
use super::{zstd_block, Error, Result};
use std::cell::RefCell;

thread_local! {
    /// Token stream of the group being coded or decoded (at most the group's length).
    static TOKENS: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Appends the [`Method::Sparse`](super::Method::Sparse) payload of `group` to `out`: the token
/// stream's length (u32 LE), then the stream as a zstd frame at `level`, or the stream itself
/// when the frame would not be shorter (a handful of changed bytes: zstd's frame overhead alone
/// is larger). Returns `false` (with `out` as it was) when the payload would not be smaller than
/// the group.
pub fn encode(group: &[u8], level: i32, out: &mut Vec<u8>) -> Result<bool> {
    if u32::try_from(group.len()).is_err() {
        return Ok(false); // run lengths and the stream length are u32 (chunks are ≤ 4 MiB)
    }
    TOKENS.with(|cell| {
        let mut tokens = cell.borrow_mut();
        tokens.clear();
        if !tokenize(group, group.len(), &mut tokens) {
            return Ok(false);
        }
        let start = out.len();
        out.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
        if !zstd_block::encode(&tokens, level, out)? {
            out.extend_from_slice(&tokens);
        }
        if out.len() - start >= group.len() {
            out.truncate(start);
            return Ok(false);
        }
        Ok(true)
    })
}

/// Decodes a [`Method::Sparse`](super::Method::Sparse) payload into `out` (the group), or XORs
/// it into `out` with `xor` ([`apply`]). The recorded stream length is checked against the
/// group's length before anything is allocated. After the length, exactly that many bytes are
/// the stream itself; fewer are a zstd frame of it (the encoder only writes frames that are
/// shorter than the stream).
pub fn decode(stored: &[u8], out: &mut [u8], xor: bool) -> Result<()> {
    let (len, frame) = stored
        .split_first_chunk::<4>()
        .ok_or_else(|| Error::Corrupt("sparse group shorter than its length field".into()))?;
    let len = u32::from_le_bytes(*len) as usize;
    if len >= out.len() {
        return Err(Error::Corrupt(format!("sparse tokens of {len} bytes for a group of {}", out.len())));
    }
    if frame.len() == len {
        return apply(frame, out, xor);
    }
    if frame.len() > len {
        return Err(Error::Corrupt(format!("sparse tokens of {len} bytes stored in {} bytes", frame.len())));
    }
    super::with_thread_buffer(&TOKENS, len, |tokens| {
        zstd_block::decode(frame, tokens)?;
        apply(tokens, out, xor)
    })
}

/// Zero runs shorter than this stay inside a literal run: a token costs at least two bytes,
/// so splitting a literal run at one or two zeros makes the stream longer, not shorter.
pub const MIN_ZERO_RUN: usize = 4;

/// Appends the token stream of `group` to `out`. Returns `false` (with `out` as it was) when the
/// stream would not be shorter than `limit` bytes, i.e. when the group is not sparse enough for
/// the transform to pay.
pub(crate) fn tokenize(group: &[u8], limit: usize, out: &mut Vec<u8>) -> bool {
    let start = out.len();
    let mut at = 0;
    let n = group.len();
    while at < n {
        let zeros = zero_run(&group[at..]);
        let lit_start = at + zeros;
        if lit_start == n {
            break; // trailing zeros are implicit
        }
        // The literal run ends at the next zero run of at least MIN_ZERO_RUN (or the end).
        let mut lit_end = lit_start;
        loop {
            lit_end += nonzero_run(&group[lit_end..]);
            if lit_end == n {
                break;
            }
            let z = zero_run(&group[lit_end..]);
            if z >= MIN_ZERO_RUN || lit_end + z == n {
                break;
            }
            lit_end += z;
        }
        put_varint(out, zeros as u32);
        put_varint(out, (lit_end - lit_start) as u32);
        out.extend_from_slice(&group[lit_start..lit_end]);
        if out.len() - start >= limit {
            out.truncate(start);
            return false;
        }
        at = lit_end;
    }
    if out.len() - start >= limit {
        out.truncate(start);
        return false;
    }
    true
}

/// Applies a token stream to `out`: with `xor`, XORs the literal bytes into `out` at their
/// positions and leaves every other byte as it is (zeros XOR to nothing); without, writes the
/// group (literals at their positions, zero everywhere else). Untrusted input: a stream that
/// reaches past `out` or ends inside a token is an error.
pub fn apply(tokens: &[u8], out: &mut [u8], xor: bool) -> Result<()> {
    let corrupt = |what: &str| Error::Corrupt(format!("sparse tokens: {what}"));
    // Index-based with one-byte fast paths: late-training deltas are millions of tokens of one
    // or two literal bytes each, so the per-token overhead is what this loop costs.
    let mut p = 0usize;
    let mut at = 0usize;
    while p < tokens.len() {
        // Fast path for the tokens of a delta: a run under 128 zeros, then 1 to 8 changed bytes.
        // Both lengths are one byte, and the literals move as one 8-byte word (masked to their
        // count; bytes past them are XORed with zero, or written as zeros that the following
        // tokens overwrite). Anything else, including a token that would reach past either
        // buffer, takes the general path below, which also reports the errors.
        if let Some(&[zeros, literals, ref word @ ..]) = tokens.get(p..p + 10) {
            let pos = at + zeros as usize;
            if zeros < 0x80 && (1..=8).contains(&literals) && pos + 8 <= out.len() {
                let mask = u64::MAX >> (64 - 8 * u32::from(literals));
                let bytes = u64::from_le_bytes(word.try_into().expect("8 bytes")) & mask;
                let value = if xor {
                    u64::from_le_bytes(out[pos..pos + 8].try_into().expect("8 bytes")) ^ bytes
                } else {
                    out[at..pos].fill(0);
                    bytes
                };
                out[pos..pos + 8].copy_from_slice(&value.to_le_bytes());
                at = pos + literals as usize;
                p += 2 + literals as usize;
                continue;
            }
        }
        let zeros = read_varint(tokens, &mut p).ok_or_else(|| corrupt("truncated run length"))?;
        let literals = read_varint(tokens, &mut p).ok_or_else(|| corrupt("truncated run length"))?;
        let (zeros, literals) = (zeros as usize, literals as usize);
        // In u64: the run lengths are untrusted and up to 2^32 each.
        if at as u64 + zeros as u64 + literals as u64 > out.len() as u64 {
            return Err(corrupt("run past the group end"));
        }
        let (lit_start, lit_end) = (at + zeros, at + zeros + literals);
        if (tokens.len() - p) < literals {
            return Err(corrupt("truncated literal run"));
        }
        let bytes = &tokens[p..p + literals];
        p += literals;
        if xor {
            if literals == 1 {
                out[lit_start] ^= bytes[0];
            } else {
                xor_in_place(&mut out[lit_start..lit_end], bytes);
            }
        } else {
            out[at..lit_start].fill(0);
            out[lit_start..lit_end].copy_from_slice(bytes);
        }
        at = lit_end;
    }
    if !xor {
        out[at..].fill(0);
    }
    Ok(())
}

/// Length of the run of zero bytes at the start of `bytes`, eight at a time.
fn zero_run(bytes: &[u8]) -> usize {
    let mut i = 0;
    for word in bytes.chunks_exact(8) {
        let w = u64::from_le_bytes(word.try_into().expect("8 bytes"));
        if w != 0 {
            return i + (w.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    i + bytes[i..].iter().take_while(|&&b| b == 0).count()
}

/// Length of the run of nonzero bytes at the start of `bytes`.
fn nonzero_run(bytes: &[u8]) -> usize {
    bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len())
}

fn put_varint(out: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads one LEB128 value of at most 5 bytes (32 bits) at `*p`, advancing it; `None` if
/// truncated or too long.
#[inline(always)]
fn read_varint(bytes: &[u8], p: &mut usize) -> Option<u32> {
    let &first = bytes.get(*p)?;
    *p += 1;
    if first < 0x80 {
        return Some(u32::from(first));
    }
    let mut v = u64::from(first & 0x7f);
    for i in 1..5 {
        let &b = bytes.get(*p)?;
        *p += 1;
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return u32::try_from(v).ok();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Bytes that are zero except for runs placed by `seed` at density `one_in`.
    fn sparse_bytes(len: usize, seed: u64, one_in: u64) -> Vec<u8> {
        let bytes = crate::test_data::xorshift(seed).take(len);
        bytes.map(|s| if s.is_multiple_of(one_in.max(1)) { (s >> 32) as u8 } else { 0 }).collect()
    }

    proptest! {
        #[test]
        fn tokens_round_trip_plain_and_xor(len in 0usize..5000, seed in any::<u64>(), one_in in 1u64..200,
                                          base_seed in any::<u64>()) {
            let group = sparse_bytes(len, seed, one_in);
            let mut tokens = Vec::new();
            prop_assert!(tokenize(&group, usize::MAX, &mut tokens));
            let mut out = vec![0xAAu8; len];
            apply(&tokens, &mut out, false).unwrap();
            prop_assert_eq!(&out, &group);
            let base = sparse_bytes(len, base_seed, 2);
            let mut acc = base.clone();
            apply(&tokens, &mut acc, true).unwrap();
            let expected: Vec<u8> = base.iter().zip(&group).map(|(a, b)| a ^ b).collect();
            prop_assert_eq!(acc, expected);
        }

        #[test]
        fn garbage_tokens_never_panic(tokens in proptest::collection::vec(any::<u8>(), 0..200), len in 0usize..300) {
            let mut out = vec![0u8; len];
            let _ = apply(&tokens, &mut out, false);
            let _ = apply(&tokens, &mut out, true);
        }
    }

    proptest! {
        #[test]
        fn payload_round_trips_or_is_refused(len in 1usize..20_000, seed in any::<u64>(), one_in in 1u64..300) {
            let group = sparse_bytes(len, seed, one_in);
            let mut payload = vec![9u8];
            if encode(&group, 1, &mut payload).unwrap() {
                prop_assert!(payload.len() - 1 < len);
                let mut out = vec![0x55u8; len];
                decode(&payload[1..], &mut out, false).unwrap();
                prop_assert_eq!(&out, &group);
                let mut acc = vec![0x0Fu8; len];
                decode(&payload[1..], &mut acc, true).unwrap();
                prop_assert!(acc.iter().zip(&group).all(|(a, g)| *a == 0x0F ^ g));
            } else {
                prop_assert_eq!(payload, vec![9u8]);
            }
        }

        #[test]
        fn garbage_payloads_never_panic(stored in proptest::collection::vec(any::<u8>(), 0..300), len in 0usize..5000) {
            let mut out = vec![0u8; len];
            let _ = decode(&stored, &mut out, false);
            let _ = decode(&stored, &mut out, true);
        }
    }

    #[test]
    fn a_few_changed_bytes_store_their_tokens_plainly() {
        let mut group = vec![0u8; 4096];
        group[100] = 7;
        group[3000] = 9;
        let mut payload = Vec::new();
        assert!(encode(&group, 1, &mut payload).unwrap());
        // zeros 100, 1 literal 7, zeros 2899 (LEB128), 1 literal 9.
        let tokens = [100, 1, 7, 0xD3, 0x16, 1, 9];
        assert_eq!(payload[..4], (tokens.len() as u32).to_le_bytes());
        assert_eq!(payload[4..], tokens, "a zstd frame would be longer than the 7 token bytes");
        let mut out = vec![1u8; 4096];
        decode(&payload, &mut out, false).unwrap();
        assert_eq!(out, group);
        let mut longer = payload.clone();
        longer.push(0);
        assert!(decode(&longer, &mut out, false).is_err(), "more stored bytes than tokens");
    }

    #[test]
    fn damaged_payloads_are_errors() {
        let group = sparse_bytes(10_000, 7, 50);
        let mut payload = Vec::new();
        assert!(encode(&group, 1, &mut payload).unwrap());
        let mut out = vec![0u8; group.len()];
        assert!(decode(&payload[..3], &mut out, false).is_err(), "no length field");
        assert!(decode(&payload[..payload.len() - 1], &mut out, false).is_err(), "truncated frame");
        let mut long = payload.clone();
        long[..4].copy_from_slice(&(group.len() as u32).to_le_bytes());
        let err = decode(&long, &mut out, false).unwrap_err().to_string();
        assert!(err.contains("sparse tokens of 10000 bytes for a group of 10000"), "{err}");
        let mut short = vec![0u8; group.len() / 2];
        assert!(decode(&payload, &mut short, false).is_err(), "tokens reach past a shorter group");
    }

    #[test]
    fn the_limit_refuses_dense_groups() {
        let dense: Vec<u8> = (1..=255).collect();
        let mut tokens = vec![7];
        assert!(!tokenize(&dense, dense.len(), &mut tokens));
        assert_eq!(tokens, vec![7], "nothing appended on refusal");
        assert!(tokenize(&[0; 100], 1, &mut tokens), "an all-zero group is the empty stream");
        assert_eq!(tokens, vec![7]);
    }

    #[test]
    fn short_zero_runs_stay_in_literals() {
        let group = [0, 0, 0, 0, 0, 1, 0, 2, 0, 0, 0, 0, 3, 0, 0];
        let mut tokens = Vec::new();
        assert!(tokenize(&group, usize::MAX, &mut tokens));
        assert_eq!(tokens, vec![5, 3, 1, 0, 2, 4, 1, 3]);
    }

    #[test]
    fn bad_streams_are_errors() {
        let mut out = [0u8; 8];
        assert!(apply(&[9, 0], &mut out, false).is_err(), "zero run past the end");
        assert!(apply(&[0, 9], &mut out, false).is_err(), "literal run past the end");
        assert!(apply(&[0, 2, 1], &mut out, false).is_err(), "truncated literals");
        assert!(apply(&[0x80], &mut out, false).is_err(), "truncated varint");
        assert!(apply(&[0xff, 0xff, 0xff, 0xff, 0xff, 0], &mut out, false).is_err(), "overlong varint");
        assert!(apply(&[4, 4, 1, 2, 3, 4], &mut out, false).is_ok());
        assert_eq!(out, [0, 0, 0, 0, 1, 2, 3, 4]);
    }
}
