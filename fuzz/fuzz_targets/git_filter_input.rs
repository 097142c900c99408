//! Untrusted input of the git filter: a pointer file, and bytes on the protocol pipe. Neither
//! may panic; a pointer that parses must write back to the same bytes.
#![no_main]
use ckpt::git_filter::pointer::Pointer;
use ckpt::git_filter::process::{serve, Command, Filter, FilterError};
use std::io::{Read, Write};

/// Copies content through, as a smudge of a non-pointer does.
struct PassThrough;

impl Filter for PassThrough {
    fn filter(&mut self, _: Command, _: &str, input: &mut dyn Read, output: &mut dyn Write) -> Result<(), FilterError> {
        std::io::copy(input, output).map(|_| ()).map_err(Into::into)
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(p) = Pointer::parse(data) {
        assert_eq!(p.to_bytes(), data);
    }
    let mut out = Vec::new();
    let _ = serve(data, &mut out, &mut PassThrough, &mut |_| {});
});
