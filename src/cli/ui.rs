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

/// Progress of library operations ([`ckpt::repo::Progress`]) shown as one bar at a time.
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

impl ckpt::repo::Progress for BarProgress {
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
    fn note(&self, line: &str) {
        // Above the bar, if one is shown; on stderr whether or not it is (a wait is no
        // progress that `--quiet` or a pipe should hide).
        let shown = self.bar.lock().ok().and_then(|slot| slot.as_ref().filter(|b| !b.is_hidden()).cloned());
        match shown {
            Some(bar) => bar.suspend(|| eprintln!("{}", printable(line))),
            None => eprintln!("{}", printable(line)),
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
/// `CKPT_LOCK_TIMEOUT` ([`lock_timeout_from_env`]).
pub fn open_repo(ui: &Ui, dir: &Path) -> Result<ckpt::repo::Repo> {
    let mut repo = ckpt::repo::Repo::discover(dir)?;
    repo.set_progress(std::sync::Arc::new(BarProgress::new(ui)));
    if let Some(timeout) = lock_timeout_from_env()? {
        repo.set_lock_timeout(timeout);
    }
    Ok(repo)
}

/// The writer-lock timeout `CKPT_LOCK_TIMEOUT` asks for (`None` when unset; the library's
/// default is 60 s), parsed by the library's one parser ([`ckpt::repo::parse_lock_timeout`]:
/// negative numbers and NaN are refused, a value too large for a `Duration` waits forever).
pub fn lock_timeout_from_env() -> Result<Option<std::time::Duration>> {
    ckpt::repo::lock_timeout_from_env().map_err(|value| {
        anyhow::anyhow!("CKPT_LOCK_TIMEOUT={value:?}: expected a number of seconds, 0 or more, such as 60 or 0.5")
    })
}

/// A repository-provided string (a file path, a tensor or ref name, a message line: any of which
/// can come from a remote) made safe to print on one terminal line: control characters (C0,
/// DEL, C1, including newline, tab and escape) and the Unicode bidirectional overrides, which
/// can recolour, move the cursor, rewrite the window title or reorder what is shown, are
/// written as visible escapes (`\x1b`, `\n`, `\u{202e}`), in the spirit of git's
/// `core.quotePath`; in a string so escaped, a backslash is doubled, so that escapes cannot be
/// forged. A string with nothing to escape is printed as it is. JSON output escapes them
/// itself and is left exact.
pub fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    escape_controls(s, false)
}

/// A library error whose message lists repository paths (a `checkout` or `switch` refusal),
/// made [`printable`] as `status` prints the same paths: a file name holding a newline cannot
/// then pass for a line of its own (the CLI's error line keeps newlines, for multi-line causes).
pub fn one_line(e: ckpt::repo::Error) -> anyhow::Error {
    anyhow::Error::msg(printable(&e.to_string()).into_owned())
}

/// [`printable`] for text shown over several lines (a commit message): newlines and tabs stay.
pub fn printable_text(s: &str) -> std::borrow::Cow<'_, str> {
    escape_controls(s, true)
}

fn escape_controls(s: &str, multiline: bool) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| {
        (c.is_control() && !(multiline && matches!(c, '\n' | '\t')))
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    let needs = |c: char| unsafe_char(c) || c == '\\';
    if !s.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' if !multiline => out.push_str("\\n"),
            '\t' if !multiline => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if needs(c) && (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if needs(c) => out.push_str(&format!("\\u{{{:04x}}}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Prints `value` as pretty JSON on stdout (the `--json` output of every command).
pub fn print_json(value: &impl serde::Serialize) -> Result<()> {
    outln!("{}", serde_json::to_string_pretty(value)?)?;
    Ok(())
}

/// Transfers in flight: network-bound, so four per worker thread (`-j`).
pub fn transfers() -> usize {
    4 * rayon::current_num_threads()
}

/// Names each ref a fetch or push moved, with where it was (stderr).
pub fn print_updated(updated: &[ckpt::sync::RefUpdate]) {
    for u in updated {
        let from = u.old.map_or_else(|| "(new)".to_string(), |o| o.short(12));
        eprintln!("{} {}: {} -> {}", u.kind, u.name, from, u.new.short(12));
    }
}

/// The remote a command names, or the repository's default one.
pub fn remote_or_default(repo: &ckpt::repo::Repo, remote: Option<String>) -> Result<String> {
    Ok(match remote {
        Some(r) => r,
        None => ckpt::sync::default_remote(repo)?,
    })
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

/// Writes an output file: `write` fills it, and what `path` names decides how (the rules of
/// `gzip`, `zstd -o` and `cp`, with atomic replacement where a file is replaced):
///
/// - nothing, or a regular file: a temporary file next to it is filled and renamed over it only
///   when `write` succeeds (an existing file's permissions are kept). On failure nothing is
///   left behind.
/// - a symbolic link: the same, applied to the file the link leads to (a dangling link's target
///   is created); the link itself stays. Renaming over the link would replace it by a file.
/// - a character device or a named pipe (`/dev/null`, `/dev/stdout`, `mkfifo`): the bytes are
///   streamed into it, as `zstd -o /dev/null` does. It cannot be replaced (as root, renaming
///   over `/dev/null` replaced the device with a file), and a failure cannot be undone there. A
///   named pipe with no reader is refused at once rather than waited on.
/// - a directory, a block device or a socket: refused, naming it.
pub fn write_atomically<T>(path: &Path, write: impl FnOnce(&mut WriteBehind) -> Result<T>) -> Result<T> {
    use std::os::unix::fs::FileTypeExt;
    let target = output_target(path)?;
    let existing = match std::fs::metadata(&target) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let kind = existing.as_ref().map(|m| m.file_type());
    match kind {
        None => {}
        Some(t) if t.is_file() => {}
        Some(t) if t.is_char_device() || t.is_fifo() => return write_into(path, t.is_fifo(), write),
        Some(t) => {
            let what = if t.is_dir() {
                "a directory"
            } else if t.is_block_device() {
                "a block device"
            } else if t.is_socket() {
                "a socket"
            } else {
                "not a regular file"
            };
            anyhow::bail!("{}: is {what}; not writing there (name a file)", path.display());
        }
    }
    let dir = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    // Mode 0666 minus the umask, like any created file (tempfile's default is 0600); an existing
    // file's mode is kept.
    let mode = existing.as_ref().map_or(0o666, |m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777);
    let tmp = tempfile::Builder::new()
        .prefix(".ckpt-tmp-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))
        .tempfile_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    let value = write_behind(tmp.as_file(), path, write)?;
    tmp.persist(&target).with_context(|| format!("renaming the temporary file to {}", target.display()))?;
    Ok(value)
}

/// The path an output named `path` really goes to: `path` itself unless it is a symbolic link,
/// else the file at the end of the chain of links (which need not exist). Links the kernel
/// resolves by itself (`/dev/stdout`, `/proc/self/fd/N`, whose targets such as `pipe:[123]` are
/// no paths) are left to it: they lead to a pipe or device, which is opened through `path`.
fn output_target(path: &Path) -> Result<std::path::PathBuf> {
    let mut current = path.to_path_buf();
    for _ in 0..40 {
        let meta = match std::fs::symlink_metadata(&current) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(current),
            Err(e) => return Err(e).with_context(|| format!("reading {}", current.display())),
        };
        if !meta.file_type().is_symlink() {
            return Ok(current);
        }
        // An existing target: the kernel's resolution (also right for /proc's magic links).
        match std::fs::metadata(&current) {
            Ok(m) if m.is_file() => {
                return std::fs::canonicalize(&current).with_context(|| format!("resolving {}", current.display()))
            }
            Ok(_) => return Ok(current),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("reading {}", current.display())),
        }
        let link = std::fs::read_link(&current).with_context(|| format!("reading the link {}", current.display()))?;
        current = match current.parent() {
            Some(parent) if link.is_relative() => parent.join(link),
            _ => link,
        };
    }
    anyhow::bail!("{}: too many levels of symbolic links", path.display())
}

/// Streams the output into the character device or named pipe at `path`. A pipe is first opened
/// without blocking: with no reader that fails at once (`ENXIO`) instead of waiting forever.
fn write_into<T>(path: &Path, fifo: bool, write: impl FnOnce(&mut WriteBehind) -> Result<T>) -> Result<T> {
    use std::os::unix::fs::OpenOptionsExt;
    let _probe = if fifo {
        match std::fs::File::options().write(true).custom_flags(libc::O_NONBLOCK).open(path) {
            Ok(f) => Some(f),
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                anyhow::bail!("{}: is a named pipe that no process is reading; nothing was written", path.display())
            }
            Err(e) => return Err(e).with_context(|| format!("opening {}", path.display())),
        }
    } else {
        None
    };
    // With the probe holding the pipe open as a writer and a reader present, this open does not
    // wait; it is a plain blocking descriptor for the writes.
    let file =
        std::fs::File::options().write(true).open(path).with_context(|| format!("opening {}", path.display()))?;
    write_behind(&file, path, write)
}

/// Bytes per buffer of a [`WriteBehind`], and how many it fills ahead of its writing thread.
const WRITE_BEHIND_BUFFER: usize = 1 << 20;
const WRITE_BEHIND_BUFFERS: usize = 3;

/// The output of [`write_atomically`]: a buffered writer whose full buffers are written to the
/// file by a thread of its own, so the write system calls (the kernel's copy into the page
/// cache: a tenth of `ckpt compress`'s time in perf) overlap the coding instead of following
/// it. With `-j 1` the codec still runs on one thread; this one only waits on the kernel, as
/// the `zstd` command line's asynchronous I/O does.
pub struct WriteBehind {
    buf: Vec<u8>,
    /// Full buffers to the writing thread; `None` once it stopped (its error is reported by
    /// [`write_behind`]).
    full: Option<std::sync::mpsc::SyncSender<Vec<u8>>>,
    /// Buffers it has written, for reuse (fresh ones would fault their pages in again).
    empty: std::sync::mpsc::Receiver<Vec<u8>>,
    /// Buffers allocated so far.
    allocated: usize,
}

impl WriteBehind {
    /// Hands the current buffer to the writing thread and takes an empty one.
    fn send(&mut self) -> std::io::Result<()> {
        let stopped = || std::io::Error::other("the output's writing thread stopped");
        let next = match self.empty.try_recv() {
            Ok(b) => b,
            Err(_) if self.allocated < WRITE_BEHIND_BUFFERS => {
                self.allocated += 1;
                Vec::with_capacity(WRITE_BEHIND_BUFFER)
            }
            Err(_) => self.empty.recv().map_err(|_| stopped())?,
        };
        let full = std::mem::replace(&mut self.buf, next);
        self.buf.clear();
        self.full.as_ref().ok_or_else(stopped)?.send(full).map_err(|_| stopped())
    }
}

impl std::io::Write for WriteBehind {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = data.len().min(WRITE_BEHIND_BUFFER - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == WRITE_BEHIND_BUFFER {
            self.send()?;
        }
        Ok(n)
    }

    /// Hands over what is buffered; the bytes reach the file when [`write_behind`] ends.
    fn flush(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            self.send()?;
        }
        Ok(())
    }
}

/// Runs `write` with a [`WriteBehind`] over `file` (named `path` in errors) and waits until
/// every byte is written. An error of the writing thread comes first: the producer's own
/// error is then only its consequence ("stopped").
fn write_behind<T>(file: &std::fs::File, path: &Path, write: impl FnOnce(&mut WriteBehind) -> Result<T>) -> Result<T> {
    use std::io::Write;
    std::thread::scope(|scope| {
        let (full_tx, full_rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(WRITE_BEHIND_BUFFERS);
        // Bounded, so its slots are allocated here: at most WRITE_BEHIND_BUFFERS buffers exist,
        // so returning one never blocks, and the writing thread allocates nothing (a thread's
        // first allocation takes a fresh mimalloc page: a 2 MiB huge page zeroed, in perf).
        let (empty_tx, empty_rx) = std::sync::mpsc::sync_channel(WRITE_BEHIND_BUFFERS);
        let writer = scope.spawn(move || -> std::io::Result<()> {
            let mut file = file;
            for buf in full_rx {
                file.write_all(&buf)?;
                // The producer may be done and gone: then the buffer is simply freed.
                let _ = empty_tx.send(buf);
            }
            Ok(())
        });
        let mut w = WriteBehind {
            buf: Vec::with_capacity(WRITE_BEHIND_BUFFER),
            full: Some(full_tx),
            empty: empty_rx,
            allocated: 1,
        };
        let value = write(&mut w).and_then(|v| Ok(w.flush().map(|()| v)?));
        // Closing the channel ends the writing thread's loop once the last buffer is written.
        drop(w);
        match writer.join() {
            Ok(Ok(())) => value,
            Ok(Err(e)) => Err(e).with_context(|| format!("writing {}", path.display())),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// An input file mapped read-only ([`ckpt::MappedFile`]), guarded against it shrinking
/// meanwhile: call [`InputFile::check_unchanged`] once everything is read, before trusting what
/// was read.
pub struct InputFile {
    map: ckpt::MappedFile,
    path: std::path::PathBuf,
}

impl std::ops::Deref for InputFile {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map
    }
}

impl InputFile {
    /// Fails if the file changed (shrank, or was rewritten) since it was mapped: what was read
    /// may then be a mix of two versions, or zeros where the file ended.
    pub fn check_unchanged(&self) -> Result<()> {
        anyhow::ensure!(
            !self.map.changed(),
            "{} changed while it was being read; nothing was written (try again once it is complete)",
            self.path.display()
        );
        Ok(())
    }
}

/// Maps a whole input file read-only; refuses anything but a regular file (a named pipe would
/// block) without waiting.
pub fn map_file(path: &Path) -> Result<InputFile> {
    Ok(InputFile { map: ckpt::MappedFile::open(path)?, path: path.to_path_buf() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_print_as_visible_escapes() {
        assert_eq!(printable("plain/path.safetensors"), "plain/path.safetensors");
        assert_eq!(printable("a\\b"), "a\\b", "a backslash alone is kept as is");
        assert_eq!(printable("\x1b]0;pwned\x07x"), "\\x1b]0;pwned\\x07x");
        assert_eq!(printable("two\nlines\ttab"), "two\\nlines\\ttab");
        assert_eq!(printable("\u{9b}31m \u{202e}cod.exe \\x1b"), "\\u{009b}31m \\u{202e}cod.exe \\\\x1b");
        assert_eq!(printable_text("line 1\n\tline 2\r\x1b[2J"), "line 1\n\tline 2\\r\\x1b[2J");
        assert_eq!(printable("é ünicode ✓"), "é ünicode ✓");
    }
}
