//! The `ckpt` binary: parse arguments, run the command, map the outcome to an exit code.
//! Everything else lives in the library (`ckpt::cli`).

// mimalloc instead of the system allocator: the codec allocates many chunk-sized buffers, which
// glibc serves with mmap/munmap, paying page faults per chunk (measured in docs/BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    ckpt::cli::main()
}
