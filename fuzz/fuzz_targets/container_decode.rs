//! Arbitrary bytes as a container: open and decode must return errors, never panic.
#![no_main]
use ckpt::codec::container::Container;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(c) = Container::open(data) {
        // Bound the work: a valid index may describe a large original.
        if c.original_len() <= 64 << 20 {
            let _ = c.decode_to(&mut std::io::sink());
        }
    }
});
