//! The integration test binary: one module per area.

mod codec_cli;
mod util;
