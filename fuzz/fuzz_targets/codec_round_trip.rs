//! encode -> decode must give back the input, for every layout and with or without a reference.
#![no_main]
use ckpt::codec::chunk::{Data, Reference, SkipState};
use ckpt::codec::{decode_chunk, encode_chunk, Layout, Options};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    let width = [1usize, 2, 4, 8][(selector & 3) as usize];
    let layout = Layout { width, extract_exponent: width > 1 && selector & 4 != 0 };
    let delta = selector & 8 != 0;
    let half = (rest.len() / 2).min(1 << 20) / width * width;
    let (input, reference) = (&rest[..half], &rest[half..2 * half]);
    let reference = delta.then_some(reference);
    let options = Options::default();
    let mut payload = Vec::new();
    let header = encode_chunk(
        Data::Bytes(input),
        reference.map(Reference::Bytes),
        layout,
        &options,
        &mut SkipState::default(),
        &mut payload,
    )
    .expect("valid input encodes");
    let mut out = vec![0u8; input.len()];
    decode_chunk(&payload, &header, layout, reference, &mut out).expect("own output decodes");
    assert_eq!(out, input);
});
