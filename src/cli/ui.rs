//! Output helpers shared by commands: progress bars on stderr (hidden when stderr is not a
//! terminal or with `--quiet`), the rayon pool for `-j`, and atomic output files.

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::path::Path;

/// Per-invocation output settings.
pub struct Ui {
    show_progress: bool,
}

impl Ui {
    /// `quiet` hides progress; so does a stderr that is not a terminal.
    pub fn new(quiet: bool) -> Ui {
        Ui { show_progress: !quiet && std::io::stderr().is_terminal() }
    }

    /// A byte-count progress bar on stderr (hidden unless wanted).
    pub fn bytes_bar(&self, total: u64, message: &str) -> ProgressBar {
        if !self.show_progress {
            return ProgressBar::hidden();
        }
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}")
                .expect("static template")
                .progress_chars("=> "),
        );
        bar.set_message(message.to_string());
        bar
    }
}

/// Progress of library operations ([`crate::repo::Progress`]) shown as one bar at a time.
pub struct BarProgress {
    show: bool,
    bar: std::sync::Mutex<Option<ProgressBar>>,
}

impl BarProgress {
    /// Bars on stderr when `ui` shows progress; nothing otherwise.
    pub fn new(ui: &Ui) -> BarProgress {
        BarProgress { show: ui.show_progress, bar: std::sync::Mutex::new(None) }
    }
}

impl crate::repo::Progress for BarProgress {
    fn start(&self, label: &str, total: u64) {
        let bar = if !self.show {
            ProgressBar::hidden()
        } else if label == "gc" {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} objects")
                    .expect("static template")
                    .progress_chars("=> "),
            );
            bar.set_message(label.to_string());
            bar
        } else {
            Ui { show_progress: true }.bytes_bar(total, label)
        };
        if let Ok(mut slot) = self.bar.lock() {
            if let Some(old) = slot.replace(bar) {
                old.finish_and_clear();
            }
        }
    }
    fn set(&self, done: u64) {
        if let Ok(slot) = self.bar.lock() {
            if let Some(bar) = slot.as_ref() {
                bar.set_position(done);
            }
        }
    }
    fn finish(&self) {
        if let Ok(mut slot) = self.bar.lock() {
            if let Some(bar) = slot.take() {
                bar.finish_and_clear();
            }
        }
    }
}

/// Opens the repository containing `dir`, with progress bars and the writer-lock timeout from
/// `CKPT_LOCK_TIMEOUT` (seconds; default 60).
pub fn open_repo(ui: &Ui, dir: &Path) -> Result<crate::repo::Repo> {
    let mut repo = crate::repo::Repo::discover(dir)?;
    repo.set_progress(std::sync::Arc::new(BarProgress::new(ui)));
    if let Ok(text) = std::env::var("CKPT_LOCK_TIMEOUT") {
        let secs: f64 = text
            .trim()
            .parse()
            .ok()
            .filter(|s: &f64| s.is_finite() && *s >= 0.0)
            .with_context(|| format!("CKPT_LOCK_TIMEOUT={text:?}: expected a number of seconds"))?;
        repo.set_lock_timeout(std::time::Duration::from_secs_f64(secs));
    }
    Ok(repo)
}

/// Human-readable byte count (binary units).
pub fn bytes(n: u64) -> String {
    indicatif::HumanBytes(n).to_string()
}

/// Threads per core beyond which `-j` is capped: more only adds memory (each worker keeps its
/// coding buffers) and scheduling, and a huge count would exhaust the process's threads.
const MAX_JOBS_PER_CORE: usize = 4;

/// A rayon pool with `jobs` threads (all cores when `None`), at most `MAX_JOBS_PER_CORE` (4) per
/// core (with a note on stderr when capped).
pub fn thread_pool(jobs: Option<usize>) -> Result<rayon::ThreadPool> {
    let mut builder = rayon::ThreadPoolBuilder::new();
    if let Some(n) = jobs {
        anyhow::ensure!(n > 0, "-j must be at least 1");
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        let max = cores.saturating_mul(MAX_JOBS_PER_CORE);
        if n > max {
            eprintln!("ckpt: -j {n} is more than {MAX_JOBS_PER_CORE} threads per core; using {max} ({cores} cores)");
        }
        builder = builder.num_threads(n.min(max));
    }
    builder.build().context("starting worker threads")
}

/// True if the error chain holds a broken pipe (stdout closed by `head` etc.).
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    use std::io::ErrorKind::BrokenPipe;
    e.chain().any(|c| {
        // serde_json wraps the writer's io::Error without exposing it as a source: `log
        // --json | head` failed with "Broken pipe" and exit 1 before this asked it.
        c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == BrokenPipe)
            || c.downcast_ref::<serde_json::Error>().is_some_and(|j| j.io_error_kind() == Some(BrokenPipe))
    })
}

/// Writes an output file atomically: `write` fills a temporary file next to `path`, which is
/// renamed over `path` only when `write` succeeds. On failure nothing is left behind.
pub fn write_atomically<T>(
    path: &Path,
    write: impl FnOnce(&mut std::io::BufWriter<&std::fs::File>) -> Result<T>,
) -> Result<T> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    // Mode 0666 minus the umask, like any created file (tempfile's default is 0600).
    let tmp = tempfile::Builder::new()
        .prefix(".ckpt-tmp-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666))
        .tempfile_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    let value = {
        let mut w = std::io::BufWriter::with_capacity(1 << 20, tmp.as_file());
        let value = write(&mut w)?;
        std::io::Write::flush(&mut w).with_context(|| format!("writing {}", path.display()))?;
        value
    };
    tmp.persist(path).with_context(|| format!("renaming the temporary file to {}", path.display()))?;
    Ok(value)
}

/// An input file mapped read-only (see [`crate::mmap`]), guarded against it shrinking
/// meanwhile: call [`InputFile::check_unchanged`] once everything is read, before trusting what
/// was read.
pub struct InputFile {
    map: crate::mmap::Map,
    file: std::fs::File,
    stamp: crate::mmap::FileStamp,
    path: std::path::PathBuf,
}

impl std::ops::Deref for InputFile {
    type Target = crate::mmap::Map;
    fn deref(&self) -> &crate::mmap::Map {
        &self.map
    }
}

impl InputFile {
    /// Fails if the file changed (shrank, or was rewritten) since it was mapped: what was read
    /// may then be a mix of two versions, or zeros where the file ended.
    pub fn check_unchanged(&self) -> Result<()> {
        anyhow::ensure!(
            !self.stamp.changed(&self.file, &self.map),
            "{} changed while it was being read; nothing was written (try again once it is complete)",
            self.path.display()
        );
        Ok(())
    }
}

/// Maps a whole input file read-only; refuses anything but a regular file (a named pipe would
/// block) without waiting.
pub fn map_file(path: &Path) -> Result<InputFile> {
    let file = crate::mmap::open_regular(path).with_context(|| format!("opening {}", path.display()))?;
    let meta = file.metadata().with_context(|| format!("reading {}", path.display()))?;
    let map = crate::mmap::map_input(&file).with_context(|| format!("reading {}", path.display()))?;
    Ok(InputFile { map, file, stamp: crate::mmap::FileStamp::of(&meta), path: path.to_path_buf() })
}
