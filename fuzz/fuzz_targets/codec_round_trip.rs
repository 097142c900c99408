//! encode -> decode must give back the input, for every grouping, with or without a reference, at
//! the default and the max level (rANS contexts from other groups and from the reference; a
//! delta is also decoded as a chain member, into its reference's groups).
//!
//! Input: a selector byte (width bits 0-1, exponent bit 2, delta bit 3, max level bit 4), then
//! the input and the reference, each half of the rest.
#![no_main]
use ckpt::codec::chunk::{decode_chunk_groups, Data, Reference, SkipState};
use ckpt::codec::{byte_group, decode_chunk, encode_chunk, Grouping, Level, Options};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    let width = [1usize, 2, 4, 8][(selector & 3) as usize];
    let grouping = Grouping { width, extract_exponent: width > 1 && selector & 4 != 0 };
    let delta = selector & 8 != 0;
    let half = (rest.len() / 2).min(1 << 20) / width * width;
    let (input, reference) = (&rest[..half], &rest[half..2 * half]);
    let reference = delta.then_some(reference);
    let level = if selector & 16 != 0 { Level::Max } else { Level::Default };
    let options = Options { level, ..Options::default() };
    let mut payload = Vec::new();
    let header = encode_chunk(
        Data::Bytes(input),
        reference.map(Reference::Bytes),
        grouping,
        &options,
        &mut SkipState::default(),
        &mut payload,
    )
    .expect("valid input encodes");
    let mut out = vec![0u8; input.len()];
    decode_chunk(&payload, &header, grouping, reference, &mut out).expect("own output decodes");
    assert_eq!(out, input);
    if let Some(reference) = reference {
        let mut grouped = vec![0u8; input.len()];
        byte_group::split(reference, None, grouping, &mut grouped).expect("whole elements");
        decode_chunk_groups(&payload, &header, grouping, &mut grouped, true).expect("own output decodes in a chain");
        let n = input.len() / width;
        let groups: Vec<&[u8]> = (0..width).map(|g| &grouped[g * n..(g + 1) * n]).collect();
        byte_group::regroup(&groups, None, grouping, &mut out).expect("whole elements");
        assert_eq!(out, input);
    }
});
