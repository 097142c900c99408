//! The `ckpt` binary: parse arguments, run the command, map the outcome to an exit code.
//! Everything else lives in the library (`ckpt::cli`).

fn main() -> std::process::ExitCode {
    ckpt::cli::main()
}
