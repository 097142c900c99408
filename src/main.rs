//! The `ckpt` binary: parse arguments, run the command, map the outcome to an exit code.
//! The command line (`cli`: clap parsing, one file per command, output helpers) is this
//! binary's own module tree; everything it runs lives in the library (`ckpt`).

mod cli;

// mimalloc instead of the system allocator: the codec allocates many chunk-sized buffers, which
// glibc serves with mmap/munmap, paying page faults per chunk (measured in docs/BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` of mimalloc's `mi_option_t` (mimalloc.h, v2 and v3 alike); the Rust
/// bindings leave it out of their constants.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

fn main() -> std::process::ExitCode {
    // By default mimalloc returns freed memory to the OS after 10 ms, and the next chunk buffer
    // faults it back in, zeroed by the kernel (2 MiB at a time with transparent huge pages).
    // perf of a 45 MB commit: a third of the time in `clear_page_erms`. A ckpt process is short
    // and its peak is bounded by the codec windows, so keeping freed pages costs nothing.
    // SAFETY: sets an integer option before any thread is started; -1 means "never purge".
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    cli::main()
}
