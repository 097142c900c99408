//! Arbitrary bytes as a container: open and decode must return errors, never panic. Each input
//! is tried as it is, and with the checksums a fuzzer cannot forge repaired
//! (`ckpt_fuzz::repair_container`), so that mutations reach the index and chunk decoders.
#![no_main]
use ckpt::codec::container::Container;

/// Largest original decoded, so one run stays fast (a valid index may describe a large one).
const MAX_DECODE: u64 = 64 << 20;

/// Largest original also decoded against a reference (an XOR delta container needs one).
const MAX_DELTA_DECODE: u64 = 1 << 20;

fn check(data: &[u8]) {
    let Ok(c) = Container::open(data) else { return };
    if c.original_len() > MAX_DECODE {
        return;
    }
    if c.decode_to(&mut std::io::sink()).is_err() && c.original_len() <= MAX_DELTA_DECODE {
        let reference = vec![0x5au8; c.original_len() as usize];
        let _ = c.decode_to_with_reference(Some(&reference), &mut std::io::sink());
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    check(data);
    let mut repaired = data.to_vec();
    if ckpt_fuzz::repair_container(&mut repaired).is_some() && repaired != data {
        check(&repaired);
    }
});
