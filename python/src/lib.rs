//! `ckpt._native`: the Rust side of the Python package. The Python modules (`python/ckpt/`)
//! turn tensors into the layout this module asks for and copy their bytes; everything else
//! (committing, deltas, reading back) is the `ckpt` library.
//!
//! Background commits: [`Repo::commit`] with `background=True` checks everything it can (paths,
//! tags, the files named on disk, opened there and then) and returns a [`CommitHandle`] once the
//! caller has captured the bytes (in sealed memory files); the commit runs on a thread of its own,
//! which never holds the GIL and holds an `Arc` of the repository, so that nothing on the Python
//! side (a `Repo` garbage-collected, a `CommitHandle` dropped) cancels it. The Python package
//! keeps the handles in a registry of its own, waits for them at exit and reports failures (see
//! "How Python commits survive exit and fork" in docs/architecture.md).
//!
//! Fork: a forked child (a `DataLoader` worker) has the parent's memory but none of its threads.
//! Nothing here waits for a thread of another process ([`Job::foreign`]), a repository is opened
//! anew in the child before it is used there ([`Repo::repo`]: the parent's may hold locks taken
//! by a thread the child does not have), and work is given to a rayon pool of the child's own
//! ([`child_pool`]): rayon's global pool, copied from the parent, has no threads in the child.

mod pieces;
mod reader;

use ckpt::remote::{self, Remote};
use ckpt::repo::{
    self, CheckoutOptions, CommitOptions, CommitSource, Head, MemoryFile, OpenedFile, RepoPath, TensorSpec, VersionId,
};
use ckpt::sync;
use ckpt::torch_zip::dcp;
use ckpt::Dtype;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyTimeoutError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyList};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

create_exception!(ckpt, CkptError, PyException, "An error of a ckpt operation; its message is the CLI's.");

/// The message `ckpt` prints for `e` (after `error: `): the error and each cause it does not
/// already quote (as `cli::error_message`).
fn error_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

fn to_py(e: repo::Error) -> PyErr {
    CkptError::new_err(error_text(&e))
}

fn err(text: String) -> PyErr {
    CkptError::new_err(text)
}

// ---- processes: fork and exit ---------------------------------------------------------------

/// The process that loaded this module (whose rayon global pool is its own).
static LOADED_IN: OnceLock<u32> = OnceLock::new();

/// A forked child's rayon pool, by the child's process id. Only touched with the GIL held, so no
/// thread of the parent held its lock when the child was forked (`os.fork` holds the GIL).
static CHILD_POOL: Mutex<Option<(u32, Arc<rayon::ThreadPool>)>> = Mutex::new(None);

/// `None` in the process that loaded the module; in a forked child, a rayon pool of its own (the
/// global pool's threads are the parent's: work given to it would wait forever).
fn child_pool() -> PyResult<Option<Arc<rayon::ThreadPool>>> {
    let pid = std::process::id();
    if LOADED_IN.get() == Some(&pid) {
        return Ok(None);
    }
    let mut slot = CHILD_POOL.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((owner, pool)) = slot.as_ref() {
        if *owner == pid {
            return Ok(Some(pool.clone()));
        }
    }
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("ckpt-{i}"))
        .build()
        .map_err(|e| err(format!("starting the threads of a forked process: {e}")))?;
    let pool = Arc::new(pool);
    // The parent's pool (a grandparent's child) is not dropped: its threads are not here.
    if let Some(old) = slot.replace((pid, pool.clone())) {
        std::mem::forget(old);
    }
    Ok(Some(pool))
}

/// Runs `f` in `pool` (a forked child's), or right here.
fn in_pool<T: Send>(pool: Option<&rayon::ThreadPool>, f: impl FnOnce() -> T + Send) -> T {
    match pool {
        Some(pool) => pool.install(f),
        None => f(),
    }
}

/// Set when a background commit failed and no caller was told (`ckpt` sets it at exit): the
/// process then exits with status 1 (see [`exit_status_hook`]).
static EXIT_FAILED: AtomicBool = AtomicBool::new(false);

/// Run by `Py_FinalizeEx` after everything else (`Py_AtExit`): the interpreter is finalized and
/// the standard streams flushed. A normal exit would return its status to `main`, which calls
/// `exit`; here the status becomes 1. `_exit` after flushing C's streams rather than `exit`, so
/// that an interpreter finalized from within `exit` (an embedding) does not call it twice.
extern "C" fn exit_status_hook() {
    if EXIT_FAILED.load(Ordering::SeqCst) {
        // SAFETY: `fflush(NULL)` flushes every C stream; `_exit` ends the process. Neither
        // touches Python, which is finalized by now.
        #[allow(unsafe_code)]
        unsafe {
            libc::fflush(std::ptr::null_mut());
            libc::_exit(1);
        }
    }
}

/// The globals a DCP `.metadata` pickle may name (`module.name`): the allow-list the Rust reader
/// of `.metadata` uses, which `ckpt.dcp.Reader` unpickles with.
#[pyfunction]
fn dcp_metadata_classes() -> Vec<&'static str> {
    dcp::METADATA_CLASSES.to_vec()
}

/// `name` as a remote layout (`mirror`, `deltas`: [`sync::Layout`]'s own parse); a wrong name is
/// a wrong argument: ValueError.
fn layout_arg(name: &str) -> PyResult<sync::Layout> {
    name.parse().map_err(PyValueError::new_err)
}

/// Checks a remote layout's name as [`RemoteStore::open`] takes it, so that `ckpt.dcp.Writer`
/// refuses a wrong one when it is made, not at its first save (nor ignores it for a
/// repository target).
#[pyfunction]
fn check_layout(name: &str) -> PyResult<()> {
    layout_arg(name).map(drop)
}

/// Checks branch and tag names as a commit does (`repo::check_name`), with no repository at
/// hand: `ckpt.dcp.Writer` refuses an invalid one when it is made, as `Repo.commit` does at its
/// call, not on every rank inside `dcp.save`. The error is the library's (CkptError), as
/// there.
#[pyfunction]
fn check_names(names: Vec<String>) -> PyResult<()> {
    names.iter().try_for_each(|name| repo::check_name(name)).map_err(to_py)
}

/// Makes the process exit with status 1 once the interpreter is finalized (a background commit
/// failed and nobody was told). Returns whether that is in place; if not, the caller exits
/// itself.
#[pyfunction]
fn exit_with_failure() -> bool {
    EXIT_FAILED.store(true, Ordering::SeqCst);
    EXIT_HOOK.get().copied().unwrap_or(false)
}

/// Whether [`exit_status_hook`] is registered.
static EXIT_HOOK: OnceLock<bool> = OnceLock::new();

// ---- background commits -----------------------------------------------------------------------

/// A background commit's outcome, shared by its thread and its handle.
struct Job {
    /// The process whose thread runs it: a forked child has a copy of the job, not the thread.
    pid: u32,
    /// The commit's message and the repository's root, for reports.
    message: String,
    root: PathBuf,
    /// `None` while running; then the version id (hex) or the error message.
    outcome: Mutex<Option<Result<String, String>>>,
    finished: Condvar,
    /// Whether the outcome reached someone: raised by (or returned from) `wait()`, or handed to
    /// a caller that took charge of it (a training callback that logs it).
    reported: AtomicBool,
}

impl Job {
    fn finish(&self, outcome: Result<String, String>) {
        *self.outcome.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
        self.finished.notify_all();
    }

    /// In a forked child, the error that the commit is not this process's (checked before any
    /// lock is taken: a thread of the parent may have held it at the fork).
    fn foreign(&self) -> Option<String> {
        (self.pid != std::process::id()).then(|| {
            format!(
                "the background commit {:?} runs in process {} (this process is a fork of it): it can be \
                 waited for there only",
                self.message, self.pid
            )
        })
    }

    /// Waits up to `limit` for the job; its outcome, or `None` if it is still running.
    fn wait_for(&self, limit: Duration) -> Option<Result<String, String>> {
        let deadline = Instant::now() + limit;
        let mut outcome = self.outcome.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(o) = outcome.as_ref() {
                return Some(o.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            outcome = self.finished.wait_timeout(outcome, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    fn peek(&self) -> Option<Result<String, String>> {
        self.outcome.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A commit running in the background ([`Repo::commit`] with `background=True`).
#[pyclass(frozen, module = "ckpt._native")]
struct CommitHandle {
    job: Arc<Job>,
}

/// How long one wait lasts before signals (Ctrl-C) are checked.
const WAIT_SLICE: Duration = Duration::from_millis(100);

impl CommitHandle {
    /// The outcome, once the commit has finished within `timeout` seconds (`None`: no limit);
    /// `None` if it has not. Ctrl-C interrupts the wait (`KeyboardInterrupt`).
    fn outcome_within(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Result<String, String>>> {
        if let Some(e) = self.job.foreign() {
            return Err(err(e));
        }
        let limit = match timeout {
            None => None,
            Some(t) if t >= 0.0 => Some(Duration::from_secs_f64(t.min(1e9))),
            Some(t) => return Err(PyValueError::new_err(format!("timeout {t}: expected seconds >= 0"))),
        };
        let deadline = limit.map(|l| Instant::now() + l);
        loop {
            let slice = deadline.map_or(WAIT_SLICE, |d| d.saturating_duration_since(Instant::now()).min(WAIT_SLICE));
            let job = self.job.clone();
            if let Some(outcome) = py.detach(move || job.wait_for(slice)) {
                return Ok(Some(outcome));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
            py.check_signals()?;
        }
    }
}

#[pymethods]
impl CommitHandle {
    /// Waits for the commit (without holding the GIL) up to `timeout` seconds (`None`: as long
    /// as it takes); returns the version id, or raises the commit's error (every time it is
    /// called), or `TimeoutError`.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<String> {
        match self.outcome_within(py, timeout)? {
            Some(outcome) => {
                self.job.reported.store(true, Ordering::SeqCst);
                outcome.map_err(err)
            }
            None => Err(PyTimeoutError::new_err(format!(
                "the background commit {:?} is still running after {} s",
                self.job.message,
                timeout.unwrap_or(0.0)
            ))),
        }
    }

    /// Waits like `wait()`, but neither raises the commit's error nor counts as reporting it:
    /// whether it has finished.
    #[pyo3(signature = (timeout=None))]
    fn join(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        Ok(self.outcome_within(py, timeout)?.is_some())
    }

    /// Whether the commit has finished (successfully or not). In a forked child, `True`: the
    /// commit runs in the parent, never here.
    fn done(&self) -> bool {
        self.job.foreign().is_some() || self.job.peek().is_some()
    }

    /// The commit's error message once it has failed; `None` while it runs, or if it succeeded.
    #[getter]
    fn error(&self) -> Option<String> {
        if self.job.foreign().is_some() {
            return None;
        }
        self.job.peek().and_then(Result::err)
    }

    /// Whether its outcome reached the caller (see `mark_reported`).
    #[getter]
    fn reported(&self) -> bool {
        self.job.reported.load(Ordering::SeqCst)
    }

    /// Records that the outcome was handed to someone who took charge of it (logged by a
    /// training callback): the process then does not exit with status 1 for it.
    fn mark_reported(&self) {
        self.job.reported.store(true, Ordering::SeqCst);
    }

    /// The commit's message.
    #[getter]
    fn message(&self) -> String {
        self.job.message.clone()
    }

    /// The root of the repository it commits to.
    #[getter]
    fn root(&self) -> PathBuf {
        self.job.root.clone()
    }

    /// Whether this process runs the commit (`False` in a forked child).
    #[getter]
    fn ours(&self) -> bool {
        self.job.foreign().is_none()
    }

    fn __repr__(&self) -> String {
        let state = match self.job.foreign().map(|_| None).unwrap_or_else(|| Some(self.job.peek())) {
            None => "in another process".to_string(),
            Some(None) => "running".to_string(),
            Some(Some(Ok(id))) => format!("committed {}", &id[..id.len().min(12)]),
            Some(Some(Err(_))) => "failed".to_string(),
        };
        format!("<ckpt.CommitHandle {:?} {state}>", self.job.message)
    }
}

/// A safetensors file laid out in memory: the header written, each tensor's bytes to be written
/// by the caller (`os.pwrite(fd, buffer, start)`) before it is committed.
#[pyclass(frozen, module = "ckpt._native")]
struct MemoryImage {
    path: String,
    file: Mutex<Option<MemoryFile>>,
    ranges: Vec<(u64, u64)>,
    fd: i32,
}

#[pymethods]
impl MemoryImage {
    /// The memory file's descriptor (valid until the image is committed).
    #[getter]
    fn fd(&self) -> i32 {
        self.fd
    }

    /// `(start, end)` of each tensor's bytes, in the order the tensors were given.
    #[getter]
    fn ranges(&self) -> Vec<(u64, u64)> {
        self.ranges.clone()
    }

    /// The file's total length.
    #[getter]
    fn len(&self) -> u64 {
        self.file.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map_or(0, MemoryFile::len)
    }

    /// The path it is committed under.
    #[getter]
    fn path(&self) -> String {
        self.path.clone()
    }
}

/// A save in flight announced in the repository (`Repo.begin_save`): gc keeps what it writes
/// until `end()` (or until it is dropped).
#[pyclass(frozen, module = "ckpt._native")]
struct SaveRecord(Mutex<Option<repo::SaveRecord>>);

#[pymethods]
impl SaveRecord {
    /// Ends the save: the record is deleted. Calling it again does nothing.
    fn end(&self, py: Python<'_>) {
        let record = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        // Joins the record's thread, which may be touching the file: without the GIL.
        py.detach(move || drop(record));
    }
}

/// An open repository.
#[pyclass(frozen, module = "ckpt._native")]
struct Repo {
    /// The repository and the process it was opened in (see [`Repo::repo`]). Only locked with
    /// the GIL held, and never across a release of it.
    inner: Mutex<(u32, Arc<repo::Repo>)>,
    root: PathBuf,
    /// The last background commit, while its memory may still be read.
    last: Mutex<Option<Arc<Job>>>,
    /// With `reuse_buffers`: the memory of the last capture of each path, written over by the
    /// next one (`MemoryFile::keep_for_reuse`).
    spares: Mutex<Option<HashMap<String, MemoryFile>>>,
}

impl Repo {
    fn new(inner: repo::Repo) -> Repo {
        let root = inner.root().to_path_buf();
        Repo {
            inner: Mutex::new((std::process::id(), Arc::new(inner))),
            root,
            last: Mutex::new(None),
            spares: Mutex::new(None),
        }
    }

    /// The repository, opened anew in a forked child: the parent's may hold locks (its index,
    /// its caches) taken by a thread the child does not have. The parent's copy is leaked in the
    /// child, not dropped (dropping flushes them, under those locks), and so is the memory kept
    /// for reuse: it is shared with the parent, whose commits may be reading it.
    fn repo(&self) -> PyResult<Arc<repo::Repo>> {
        let pid = std::process::id();
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if inner.0 != pid {
            let fresh = Arc::new(repo::Repo::open(&self.root).map_err(to_py)?);
            std::mem::forget(std::mem::replace(&mut inner.1, fresh));
            inner.0 = pid;
            if let Some(spares) = self.spares.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
                std::mem::forget(std::mem::take(spares));
            }
            std::mem::forget(self.last.lock().unwrap_or_else(|p| p.into_inner()).take());
        }
        Ok(inner.1.clone())
    }

    /// Whether a commit may still read memory it was given.
    fn commit_running(&self) -> bool {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.as_ref().is_some_and(|job| job.foreign().is_none() && job.peek().is_none())
    }

    /// Runs `f` on the repository without the GIL (in a forked child's pool in a child).
    fn run<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&repo::Repo) -> repo::Result<T> + Send) -> PyResult<T> {
        let repo = self.repo()?;
        let pool = child_pool()?;
        py.detach(move || in_pool(pool.as_deref(), || f(&repo))).map_err(to_py)
    }
}

/// A file of a version as `Repo.files` returns it: path, format, length, file hash, manifest.
type FileRow = (String, String, u64, String, String);

/// A tensor as `Repo.read_tensors` returns it: name, dtype, shape, bytes.
type TensorRow<'py> = (String, String, Vec<u64>, Bound<'py, PyByteArray>);

/// The files to commit, as the Python side passes them: `(path, source)` where `source` is a
/// [`MemoryImage`] or a path on disk (`str`), checked and captured now: each path is valid and
/// named once, each file on disk is opened (and read later from this descriptor, whatever
/// happens to its name). Nothing is taken from an image before all of them are checked.
fn sources(list: &Bound<'_, PyList>) -> PyResult<Vec<CommitSource>> {
    let mut checked = Vec::with_capacity(list.len());
    let mut seen = HashSet::new();
    for item in list.iter() {
        let (path, source): (String, Bound<'_, PyAny>) = item.extract()?;
        let parsed = RepoPath::parse(&path).map_err(|reason| err(format!("{path}: {reason}")))?;
        if !seen.insert(parsed.as_str().to_string()) {
            return Err(err(format!("{path}: named twice in one commit")));
        }
        let disk = if source.cast::<MemoryImage>().is_ok() {
            None
        } else {
            let disk: PathBuf = source.extract().map_err(|_| {
                PyTypeError::new_err(format!(
                    "{path}: expected a path on disk or a tensor image, got {}",
                    type_name(&source)
                ))
            })?;
            Some(OpenedFile::open(&disk).map_err(to_py)?)
        };
        checked.push((path, source, disk));
    }
    let mut out = Vec::with_capacity(checked.len());
    for (path, source, disk) in checked {
        if let Some(file) = disk {
            out.push(CommitSource::Opened { path, file });
            continue;
        }
        let image = source.cast::<MemoryImage>()?;
        let file = image.get().file.lock().unwrap_or_else(|p| p.into_inner()).take();
        let file = file.ok_or_else(|| err(format!("{path}: this tensor image was committed already")))?;
        out.push(CommitSource::Memory { path, file });
    }
    Ok(out)
}

fn type_name(value: &Bound<'_, PyAny>) -> String {
    value.get_type().name().map_or_else(|_| "?".to_string(), |n| n.to_string())
}

/// Checks `tags` for a commit before anything is written: valid names, each given once, none
/// that exists (as a tag, or as a branch it would shadow).
fn check_tags(repo: &repo::Repo, tags: &[String]) -> repo::Result<Result<(), String>> {
    let mut seen = HashSet::new();
    for t in tags {
        repo::check_name(t)?;
        if !seen.insert(t.as_str()) {
            return Ok(Err(format!("tag {t:?} is given twice")));
        }
    }
    let existing = repo.tags()?;
    let branches = repo.branches()?;
    for t in tags {
        if existing.iter().any(|(name, _)| name == t) {
            return Ok(Err(format!("tag {t:?} already exists")));
        }
        if branches.iter().any(|b| &b.name == t) {
            return Ok(Err(format!("tag {t:?}: a branch of that name exists")));
        }
    }
    Ok(Ok(()))
}

/// Commits and tags; the body of both a foreground and a background commit. The tags are
/// checked again first (another process may have made one since the call).
fn commit_and_tag(
    repo: &repo::Repo,
    sources: Vec<CommitSource>,
    message: &str,
    tags: &[String],
    exact: bool,
) -> Result<VersionId, String> {
    let text = |e: repo::Error| error_text(&e);
    check_tags(repo, tags).map_err(text)??;
    // Compaction inline (the library default): under the `reverse` policy the parent becomes
    // deltas before this returns, on this (background) thread, and the next commit waits for it.
    let id = repo.commit_sources(sources, message, exact, &CommitOptions::default()).map_err(text)?;
    for t in tags {
        repo.tag(t, Some(&id.to_hex()))
            .map_err(|e| format!("version {} was committed, but tagging it failed: {}", id.to_hex(), text(e)))?;
    }
    Ok(id)
}

#[pymethods]
impl Repo {
    /// Creates a repository in `path` (created if missing).
    #[staticmethod]
    fn init(py: Python<'_>, path: PathBuf) -> PyResult<Repo> {
        py.detach(|| repo::Repo::init(&path)).map(Repo::new).map_err(to_py)
    }

    /// Opens the repository holding `path` (this directory or a parent, as the CLI finds it).
    #[staticmethod]
    fn discover(py: Python<'_>, path: PathBuf) -> PyResult<Repo> {
        py.detach(|| repo::Repo::discover(&path)).map(Repo::new).map_err(to_py)
    }

    /// Keep each capture's memory for the next capture of the same path (`True`), or free it
    /// once committed (`False`, the default). Keeping it makes the next capture about 3x faster
    /// (no page allocation) at the cost of holding one checkpoint's bytes between commits.
    fn set_reuse_buffers(&self, reuse: bool) {
        let mut spares = self.spares.lock().unwrap_or_else(|p| p.into_inner());
        match (reuse, spares.is_some()) {
            (true, false) => *spares = Some(HashMap::new()),
            (false, _) => *spares = None,
            _ => {}
        }
    }

    /// The working tree's root.
    #[getter]
    fn root(&self) -> PathBuf {
        self.root.clone()
    }

    /// Lays out a safetensors file of `tensors` (`(name, dtype, shape)`, dtype a safetensors
    /// name such as `"F32"`) and `metadata` in memory, as `safetensors`' `save_file` would write
    /// it; the caller writes each tensor's bytes at its range.
    #[pyo3(signature = (path, tensors, metadata=None))]
    fn prepare(
        &self,
        path: String,
        tensors: Vec<(String, String, Vec<u64>)>,
        metadata: Option<BTreeMap<String, String>>,
    ) -> PyResult<MemoryImage> {
        // In a forked child: forgets the parent's kept memory before anything is written into it.
        self.repo()?;
        let specs = tensors
            .into_iter()
            .map(|(name, dtype, shape)| {
                // A wrong argument, not a failed operation: ValueError, as Python's own functions.
                let dtype = Dtype::from_safetensors_name(&dtype).ok_or_else(|| {
                    PyValueError::new_err(format!("{path}: tensor {name:?}: dtype {dtype} is not supported"))
                })?;
                Ok(TensorSpec { name, dtype, shape })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let running = self.commit_running();
        let mut spares = self.spares.lock().unwrap_or_else(|p| p.into_inner());
        // Memory of an earlier capture is written over only once no commit can read it.
        let reuse = spares.as_mut().filter(|_| !running).and_then(|s| s.remove(&path));
        let mut image = repo::safetensors_image_in(&path, &specs, metadata.as_ref(), reuse).map_err(to_py)?;
        if let Some(spares) = spares.as_mut() {
            let kept = image.file.keep_for_reuse().map_err(|e| err(format!("{path}: keeping the memory: {e}")))?;
            spares.insert(path.clone(), kept);
        }
        let fd = image.file.raw_fd();
        let ranges = image.ranges.iter().map(|r| (r.start, r.end)).collect();
        Ok(MemoryImage { path, file: Mutex::new(Some(image.file)), ranges, fd })
    }

    /// A memory file holding `data` as it is, to commit under `path`.
    fn prepare_bytes(&self, path: String, data: &[u8]) -> PyResult<MemoryImage> {
        let io = |e: std::io::Error| err(format!("{path}: creating a memory file: {e}"));
        let file = MemoryFile::new(&path, data.len() as u64).map_err(io)?;
        file.write_at(0, data).map_err(io)?;
        let fd = file.raw_fd();
        Ok(MemoryImage { path, file: Mutex::new(Some(file)), ranges: Vec::new(), fd })
    }

    /// Checks `tags` as a commit would before writing anything: valid names, each once, none
    /// that exists as a tag or a branch.
    fn check_tags(&self, py: Python<'_>, tags: Vec<String>) -> PyResult<()> {
        self.run(py, move |repo| check_tags(repo, &tags))?.map_err(err)
    }

    /// Commits `files` (a list of `(path, MemoryImage | disk path)`) with `message`, then tags
    /// the version with each of `tags`. With `exact`, the version holds only these files.
    /// Everything is checked first (paths, tags; files on disk are opened now, and read from
    /// there): an error is raised before anything is written. With `background`, returns a
    /// [`CommitHandle`] at once and commits on another thread. The caller waits for an earlier
    /// background commit of the repository first (the Python package does).
    #[pyo3(signature = (files, message, tags=Vec::new(), exact=false, background=false))]
    fn commit<'py>(
        &self,
        py: Python<'py>,
        files: &Bound<'py, PyList>,
        message: String,
        tags: Vec<String>,
        exact: bool,
        background: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let repo = self.repo()?;
        let pool = child_pool()?;
        {
            let (repo, tags) = (repo.clone(), tags.clone());
            py.detach(move || check_tags(&repo, &tags)).map_err(to_py)?.map_err(err)?;
        }
        let sources = sources(files)?;
        if !background {
            let id = py
                .detach(move || in_pool(pool.as_deref(), || commit_and_tag(&repo, sources, &message, &tags, exact)))
                .map_err(err)?;
            return Ok(id.to_hex().into_pyobject(py)?.into_any());
        }
        let job = Arc::new(Job {
            pid: std::process::id(),
            message: message.clone(),
            root: self.root.clone(),
            outcome: Mutex::new(None),
            finished: Condvar::new(),
            reported: AtomicBool::new(false),
        });
        let done = job.clone();
        std::thread::Builder::new()
            .name("ckpt-commit".into())
            .spawn(move || {
                // A panic must still finish the job: a waiter would otherwise wait forever.
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    in_pool(pool.as_deref(), || commit_and_tag(&repo, sources, &message, &tags, exact))
                }));
                done.finish(match outcome {
                    Ok(Ok(id)) => Ok(id.to_hex()),
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err("the commit thread panicked (a bug in ckpt); nothing was committed".into()),
                });
            })
            .map_err(|e| err(format!("starting the commit thread: {e}")))?;
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(job.clone());
        Ok(Bound::new(py, CommitHandle { job })?.into_any())
    }

    /// The current branch and the version it points at (`None`: none yet). A detached `HEAD`
    /// is an error: a distributed save moves a branch.
    fn current_branch(&self, py: Python<'_>) -> PyResult<(String, Option<String>)> {
        let (name, tip) = self
            .run(py, |repo| match repo.head()? {
                Head::Branch(name) => {
                    let tip = repo.branch_tip(&name)?;
                    Ok(Ok((name, tip)))
                }
                Head::Detached(id) => Ok(Err(id)),
            })?
            .map_err(|id| err(format!("HEAD is detached at {}: name the branch to save to", id.to_hex())))?;
        Ok((name, tip.map(|t| t.to_hex())))
    }

    /// Announces a save whose objects are stored before anything names them (a
    /// `ckpt.dcp.Writer` save): gc keeps them, whatever its grace period, until the returned
    /// record's `end()` (docs/format.md, "Saves in flight").
    fn begin_save(&self, py: Python<'_>, what: &str) -> PyResult<SaveRecord> {
        let what = what.to_string();
        let record = self.run(py, move |repo| repo.begin_save(&what))?;
        Ok(SaveRecord(Mutex::new(Some(record))))
    }

    /// The version branch `name` points at (`None`: no such branch or no version yet).
    fn branch_tip(&self, py: Python<'_>, name: &str) -> PyResult<Option<String>> {
        let name = name.to_string();
        Ok(self.run(py, move |repo| repo.branch_tip(&name))?.map(|t| t.to_hex()))
    }

    /// Stores the file at `disk` as the content of `path` (objects only: no version, no ref,
    /// no writer lock), delta-coded against the same items in version `previous` where the
    /// repository's delta policy allows. A `.distcp` file is cut into the `items` its writer
    /// wrote into it ([`WrittenItem`]), named as `.metadata` would name them. Returns
    /// `(path, manifest, file hash, length)` for [`Repo::commit_stored`].
    /// `pieces`: a [`pieces::PieceSink`] that took tensors of this file while it was written
    /// (holes in the file at `disk`).
    #[pyo3(signature = (disk, path, previous=None, items=None, pieces=None))]
    fn store_objects(
        &self,
        py: Python<'_>,
        disk: PathBuf,
        path: String,
        previous: Option<String>,
        items: Option<Vec<WrittenItem>>,
        pieces: Option<Py<pieces::PieceSink>>,
    ) -> PyResult<(String, String, String, u64)> {
        let (rp, previous, items) = stored_file_args(&path, previous, items)?;
        let pieces = pieces.map(|p| p.get().pieces.clone());
        let entry = self.run(py, move |repo| {
            repo.store_objects(&disk, &rp, previous.as_ref(), items.as_deref(), pieces.as_deref())
        })?;
        Ok(stored_entry(entry))
    }

    /// A sink for the tensors of a save's files ([`pieces::PieceSink`]), with `hints`
    /// `(storage, tensor length in bytes, torch dtype name, chunk)` of the tensors about to be
    /// written (`chunk`: the whole tensor's size, the chunk's offsets and sizes, or `None`);
    /// `None` when
    /// the repository's delta policy is not `reverse` (only `reverse` codes a save's tensors
    /// after it, in its compaction; the others code them against the previous version's in
    /// `store_objects`, from the file).
    #[allow(clippy::type_complexity, reason = "the tuples Python hands over")]
    fn piece_sink(
        &self,
        hints: Vec<(Bound<'_, PyAny>, usize, String, Option<(Vec<u64>, Vec<u64>, Vec<u64>)>)>,
    ) -> PyResult<Option<pieces::PieceSink>> {
        let repo = self.repo()?;
        if repo.config().delta_policy != repo::DeltaPolicy::Reverse {
            return Ok(None);
        }
        Ok(Some(pieces::PieceSink::new(repo, hints)?))
    }

    /// Writes one version of `files` (`(path, manifest, file hash, length)` as
    /// [`Repo::store_objects`] returned them) on top of `expected` and moves `branch` to it,
    /// unless the branch has moved since (an error; nothing written); then tags it with `tags`
    /// (checked before anything is written).
    #[pyo3(signature = (branch, expected, files, message, tags=Vec::new()))]
    fn commit_stored(
        &self,
        py: Python<'_>,
        branch: String,
        expected: Option<String>,
        files: Vec<(String, String, String, u64)>,
        message: String,
        tags: Vec<String>,
    ) -> PyResult<String> {
        let expected = expected.map(|e| parse_id(&e)).transpose()?;
        let files = files.into_iter().map(entry_of_stored).collect::<PyResult<Vec<_>>>()?;
        self.run(py, move |repo| {
            if let Err(reason) = check_tags(repo, &tags)? {
                return Ok(Err(reason));
            }
            let id = repo.commit_stored(&branch, expected, files, &message, &CommitOptions::default())?;
            for t in &tags {
                if let Err(e) = repo.tag(t, Some(&id.to_hex())) {
                    return Ok(Err(format!(
                        "version {} was committed, but tagging it failed: {}",
                        id.to_hex(),
                        error_text(&e)
                    )));
                }
            }
            Ok(Ok(id.to_hex()))
        })?
        .map_err(err)
    }

    /// When versions left pending by `commit_stored` become deltas: `"background"`,
    /// `"inline"` or `"manual"` (the `CKPT_COMPACT` environment variable, else the config's
    /// `compact`, as for `ckpt commit`).
    fn compaction_mode(&self) -> PyResult<String> {
        let repo = self.repo()?;
        let mode = repo::Compaction::from_env_or(repo.config().compact).map_err(err)?;
        Ok(match mode {
            repo::Compaction::Background => "background",
            repo::Compaction::Inline => "inline",
            repo::Compaction::Manual => "manual",
        }
        .to_string())
    }

    /// Whether versions wait for their parent's blobs to become deltas (`ckpt compact`).
    fn has_pending_deltas(&self) -> PyResult<bool> {
        Ok(self.repo()?.has_pending_deltas())
    }

    /// Codes what the saves of pending versions stored uncoded and rewrites their parents as
    /// deltas (`ckpt compact`); with `yield_to_writers`, stops between two blobs when a commit
    /// waits for the writer lock (what a background compaction does). Returns `(versions,
    /// blobs rewritten, bytes before, bytes after, versions still pending, blobs coded)`.
    #[pyo3(signature = (yield_to_writers=false))]
    fn compact(&self, py: Python<'_>, yield_to_writers: bool) -> PyResult<(usize, usize, u64, u64, usize, usize)> {
        let options = repo::CompactOptions { yield_to_writers };
        let r = self.run(py, move |repo| repo.compact(&options))?;
        Ok((r.versions, r.rewritten, r.bytes_before, r.bytes_after, r.pending, r.coded))
    }

    /// Keeps the newest `keep_last` versions of `branches` (default: the current one) and
    /// drops the rest of their history, then frees the space (`ckpt prune`); `grace_seconds`
    /// as `ckpt gc --prune` (default: the config's). Returns the report as `ckpt prune
    /// --json` prints it (a JSON string).
    #[pyo3(signature = (keep_last, branches=Vec::new(), dry_run=false, grace_seconds=None))]
    fn prune_json(
        &self,
        py: Python<'_>,
        keep_last: usize,
        branches: Vec<String>,
        dry_run: bool,
        grace_seconds: Option<f64>,
    ) -> PyResult<String> {
        let grace = match grace_seconds {
            Some(s) => Some(
                std::time::Duration::try_from_secs_f64(s)
                    .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("grace_seconds {s}: {e}")))?,
            ),
            None => None,
        };
        let options = repo::PruneOptions { branches, dry_run, gc: grace.map(|grace| repo::GcOptions { grace }) };
        let report = self.run(py, move |repo| repo.prune(keep_last, &options))?;
        Ok(serde_json::to_string(&report).expect("plain data serializes"))
    }

    /// The full id of the version `rev` names.
    fn resolve(&self, py: Python<'_>, rev: &str) -> PyResult<String> {
        let rev = rev.to_string();
        self.run(py, move |repo| repo.resolve(&rev).map(|id| id.to_hex()))
    }

    /// The history from `rev`, newest first, as `ckpt log --json` prints it (a JSON string).
    #[pyo3(signature = (rev="HEAD"))]
    fn log_json(&self, py: Python<'_>, rev: &str) -> PyResult<String> {
        let rev = rev.to_string();
        self.run(py, move |repo| log_json(repo, &rev))
    }

    /// `ckpt report` of `range` (`REV` or `FROM..TO`): with `html`, the page; otherwise one
    /// JSON object per (tensor, version) cell (file, tensor, version, relative change, fraction
    /// changed, stored bytes...), as a JSON list.
    #[pyo3(signature = (range="HEAD", tensor=None, max_versions=None, html=false))]
    fn report_text(
        &self,
        py: Python<'_>,
        range: &str,
        tensor: Option<String>,
        max_versions: Option<usize>,
        html: bool,
    ) -> PyResult<String> {
        let range = range.to_string();
        let options = ckpt::report::Options {
            tensor: tensor.as_deref().map(repo::TensorFilter::new),
            max_versions,
            ..ckpt::report::Options::default()
        };
        let repo = self.repo()?;
        let pool = child_pool()?;
        let made = py.detach(move || in_pool(pool.as_deref(), || ckpt::report::report(&repo, &range, &options)));
        let r = made.map_err(|e| match e {
            ckpt::report::Error::Repo(e) => to_py(e),
            other => err(other.to_string()),
        })?;
        Ok(if html {
            ckpt::report::html::render(&r)
        } else {
            serde_json::Value::Array(ckpt::report::flat_cells(&r)).to_string()
        })
    }

    /// The files of version `rev`: `(path, format, length, file hash, manifest id)`, format
    /// `"safetensors"`, `"torch"` or `"bytes"`.
    #[pyo3(signature = (rev="HEAD"))]
    fn files(&self, py: Python<'_>, rev: &str) -> PyResult<Vec<FileRow>> {
        let rev = rev.to_string();
        self.run(py, move |repo| {
            let version = repo.resolve(&rev).and_then(|id| repo.version(&id))?;
            version
                .files
                .iter()
                .map(|f| {
                    let manifest = repo.manifest(&f.manifest)?;
                    let kind = match manifest.kind {
                        repo::FileFormat::Safetensors => "safetensors",
                        repo::FileFormat::Torch => "torch",
                        repo::FileFormat::Distcp => "distcp",
                        _ => "bytes",
                    };
                    Ok((f.path.clone(), kind.to_string(), f.len, f.hash.to_hex(), f.manifest.to_hex()))
                })
                .collect()
        })
    }

    /// The tensors of `path` in `rev` whose names are in `names` (all if `None`), read from the
    /// store: a list of `(name, dtype, shape, bytearray)`.
    #[pyo3(signature = (rev, path, names=None))]
    fn read_tensors<'py>(
        &self,
        py: Python<'py>,
        rev: &str,
        path: &str,
        names: Option<Vec<String>>,
    ) -> PyResult<Vec<TensorRow<'py>>> {
        let repo = self.repo()?;
        let pool = child_pool()?;
        let mut reader = repo.tensor_reader(rev, path).map_err(to_py)?;
        let all: Vec<(String, String, Vec<u64>)> =
            reader.tensors().iter().map(|t| (t.name.clone(), t.dtype.clone(), t.shape.clone())).collect();
        let mut wanted: Vec<usize> = (0..all.len()).collect();
        if let Some(names) = names {
            let index: HashMap<&str, usize> = all.iter().enumerate().map(|(i, t)| (t.0.as_str(), i)).collect();
            wanted = names
                .iter()
                .map(|n| index.get(n.as_str()).copied().ok_or_else(|| err(format!("{path}: no tensor named {n:?}"))))
                .collect::<PyResult<_>>()?;
        }
        let mut out = Vec::with_capacity(wanted.len());
        for i in wanted {
            let len = reader.len_of(i).unwrap_or(0) as usize;
            let mut failure = None;
            let buf = PyByteArray::new_with(py, len, |buf| {
                if let Err(e) = in_pool(pool.as_deref(), || reader.read_into(i, buf)) {
                    failure = Some(e);
                }
                Ok(())
            })?;
            if let Some(e) = failure {
                return Err(to_py(e));
            }
            let (name, dtype, shape) = all[i].clone();
            out.push((name, dtype, shape, buf));
        }
        Ok(out)
    }

    /// The bytes of the (small) file `path` in `rev`, at most `limit` bytes.
    #[pyo3(signature = (rev, path, limit=1 << 30))]
    fn read_file<'py>(&self, py: Python<'py>, rev: &str, path: &str, limit: u64) -> PyResult<Bound<'py, PyBytes>> {
        let (rev, path) = (rev.to_string(), path.to_string());
        let bytes = self.run(py, move |repo| repo.read_file_bytes(&rev, &path, limit))?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Writes the files of `rev` (all, or `files`) under `output` (default: the working tree,
    /// which refuses to overwrite changes the repository does not hold unless `force`). Returns
    /// the paths written.
    #[pyo3(signature = (rev="HEAD", output=None, files=None, force=false))]
    fn checkout(
        &self,
        py: Python<'_>,
        rev: &str,
        output: Option<PathBuf>,
        files: Option<Vec<PathBuf>>,
        force: bool,
    ) -> PyResult<Vec<String>> {
        let rev = rev.to_string();
        let options = CheckoutOptions { files, output, tensor: None, force };
        let summary = self.run(py, move |repo| repo.checkout_with(&rev, &options))?;
        Ok(summary.files)
    }

    /// Tags `rev` (default `HEAD`) as `name`.
    #[pyo3(signature = (name, rev=None))]
    fn tag(&self, py: Python<'_>, name: &str, rev: Option<&str>) -> PyResult<String> {
        let (name, rev) = (name.to_string(), rev.map(str::to_string));
        self.run(py, move |repo| repo.tag(&name, rev.as_deref()).map(|id| id.to_hex()))
    }

    /// Every tag and its version id.
    fn tags(&self, py: Python<'_>) -> PyResult<Vec<(String, String)>> {
        let tags = self.run(py, |repo| repo.tags())?;
        Ok(tags.into_iter().map(|(n, id)| (n, id.to_hex())).collect())
    }

    /// A reader of byte ranges of the file `path` in version `rev`, straight from the store
    /// (`ckpt.dcp.Reader`: only the ranges asked for are decoded).
    fn open_file(&self, py: Python<'_>, rev: &str, path: &str) -> PyResult<StoredFile> {
        let (rev, path) = (rev.to_string(), path.to_string());
        let repo = self.repo()?;
        let reader = self.run(py, move |repo| {
            let id = repo.resolve(&rev)?;
            let version = repo.version(&id)?;
            let entry =
                version.file(&path).ok_or_else(|| repo::Error::NotInVersion { path: path.clone(), version: id })?;
            sync::StoredFileReader::open(repo, &entry.manifest).map_err(|e| match e {
                sync::Error::Repo(e) => e,
                e => repo::Error::InvalidPath { path: path.clone().into(), reason: error_text(&e) },
            })
        })?;
        Ok(StoredFile { repo, reader: Mutex::new(reader) })
    }
}

// ---- distributed checkpoints on a remote (ckpt.dcp) --------------------------------------------

fn sync_err(e: sync::Error) -> PyErr {
    CkptError::new_err(error_text(&e))
}

/// Byte ranges of one stored file ([`sync::StoredFileReader`]), from a repository or a remote's
/// cache.
#[pyclass(frozen, module = "ckpt._native")]
struct StoredFile {
    repo: Arc<repo::Repo>,
    reader: Mutex<sync::StoredFileReader>,
}

#[pymethods]
impl StoredFile {
    /// The file's length.
    #[getter]
    fn len(&self) -> u64 {
        self.reader().len()
    }

    /// The `length` bytes at `offset`, decoded and verified (only the segments they cover),
    /// straight into the `bytes` returned.
    fn read<'py>(&self, py: Python<'py>, offset: u64, length: u64) -> PyResult<Bound<'py, PyBytes>> {
        // Detached: another thread may hold the reader, decoding.
        let len = py.detach(|| self.checked_len(offset, length))?;
        // Nothing else can see the new `bytes` before it is returned: it is filled detached.
        PyBytes::new_with(py, len, |buf| py.detach(|| self.read_into(offset, buf)).map_err(sync_err))
    }

    /// The tensor stored in bytes `offset..offset + length` (a DCP item) if it has the torch
    /// dtype `torch_dtype` (`float32`, ...): `(where its bytes start in the file, its shape)`,
    /// its bytes being its elements in row-major order ([`sync::StoredFileReader::tensor_in`]);
    /// else `None`.
    fn tensor_in(&self, offset: u64, length: u64, torch_dtype: &str) -> Option<(u64, Vec<u64>)> {
        let (start, dtype, shape) = self.reader().tensor_in(offset, length)?;
        (dcp::dtype_of_torch(torch_dtype) == Some(dtype)).then_some((start, shape))
    }

    /// Decodes the `length` bytes at `offset` (verified, as [`StoredFile::read`]) straight into
    /// `out`, a writable buffer of exactly `length` bytes (a CPU tensor's memory, as a NumPy
    /// `uint8` array sharing it), which the caller must not touch until this returns.
    fn read_into_buffer(&self, py: Python<'_>, offset: u64, length: u64, out: &Bound<'_, PyAny>) -> PyResult<()> {
        let len = py.detach(|| self.checked_len(offset, length))?;
        // Released when dropped, at the end, with the GIL held.
        let mut held = pieces::HeldBuffer::writable(out)
            .ok_or_else(|| PyTypeError::new_err("read_into_buffer needs a writable contiguous buffer"))?;
        let buf = held.bytes_mut();
        if buf.len() != len {
            return Err(PyValueError::new_err(format!("a buffer of {} bytes for {len}", buf.len())));
        }
        py.detach(|| self.read_into(offset, buf)).map_err(sync_err)
    }
}

impl StoredFile {
    fn reader(&self) -> std::sync::MutexGuard<'_, sync::StoredFileReader> {
        self.reader.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `length` as a buffer length if the range lies in the file; else Python's error, before
    /// anything is allocated for it (the range comes from `.metadata`: untrusted).
    fn checked_len(&self, offset: u64, length: u64) -> PyResult<usize> {
        let len = self.reader().len();
        match offset.checked_add(length) {
            Some(end) if end <= len => {
                usize::try_from(length).map_err(|_| PyValueError::new_err(format!("{length} bytes")))
            }
            _ => Err(CkptError::new_err(format!("bytes {offset}+{length}: past the end of a file of {len} bytes"))),
        }
    }

    fn read_into(&self, offset: u64, out: &mut [u8]) -> sync::Result<()> {
        self.reader().read_into(&self.repo, offset, out)
    }
}

/// Items of stored files read ahead of their consumer ([`sync::ReadAhead`]) on a thread of its
/// own, each decoded straight into the `bytes` it is taken as: `ckpt.dcp.Reader` decodes the
/// next items of its load plan while DCP loads the current one. At most `max_items` items and
/// `max_bytes` bytes are held ahead; larger items are read when taken.
#[pyclass(frozen, module = "ckpt._native")]
struct ReadAhead {
    inner: Mutex<Option<sync::ReadAhead<Py<PyBytes>, PyErr>>>,
}

impl ReadAhead {
    fn stop(py: Python<'_>, inner: Option<sync::ReadAhead<Py<PyBytes>, PyErr>>) {
        // Detached: the worker may be waiting to attach (to allocate an item's `bytes`) while
        // this waits for it to end.
        py.detach(move || drop(inner));
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if inner.is_some() {
            Python::attach(|py| ReadAhead::stop(py, inner));
        }
    }
}

#[pymethods]
impl ReadAhead {
    /// Reads `items` (`(stored file, offset, length)`, in the order they will be asked for).
    #[new]
    fn new(items: Vec<(Py<StoredFile>, u64, u64)>, max_items: usize, max_bytes: u64) -> PyResult<Self> {
        let lens = items.iter().map(|(_, _, len)| *len).collect();
        let limits = sync::ReadAheadLimits { max_items, max_bytes };
        let inner = sync::ReadAhead::start(lens, limits, move |i| {
            let (file, offset, length) = items.get(i).ok_or_else(|| CkptError::new_err(format!("no item {i}")))?;
            let (file, offset, length) = (file.get(), *offset, *length);
            let len = file.checked_len(offset, length)?;
            Python::attach(|py| {
                // Nothing else can see the new `bytes` before it is returned: filled detached.
                let bytes =
                    PyBytes::new_with(py, len, |buf| py.detach(|| file.read_into(offset, buf)).map_err(sync_err))?;
                Ok(bytes.unbind())
            })
        })
        .map_err(|e| CkptError::new_err(format!("cannot start reading ahead: {e}")))?;
        Ok(ReadAhead { inner: Mutex::new(Some(inner)) })
    }

    /// Item `index`, waiting for it while it is being read; `None` when it was not read ahead
    /// (the caller reads it). An item whose read failed raises its error.
    fn take(&self, py: Python<'_>, index: usize) -> PyResult<Option<Py<PyBytes>>> {
        let taken = py.detach(|| {
            let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            inner.as_ref().and_then(|r| r.take(index))
        });
        taken.transpose()
    }

    /// Stops the worker (after the item it is reading) and drops what it holds.
    fn close(&self, py: Python<'_>) {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
        ReadAhead::stop(py, inner);
    }
}

/// A remote (`s3://…`, `gs://…`, `az://…`, `file://…`) that the ranks of a distributed save write to and read from
/// without a repository, each through a cache of its own (a repository used as an object
/// store only, [`sync::RankCache`]): [`sync::store_file_to_remote`], [`sync::commit_to_remote`].
#[pyclass(frozen, module = "ckpt._native")]
struct RemoteStore {
    remote: Arc<Counted>,
    /// `None` once closed.
    cache: Mutex<Option<Arc<sync::RankCache>>>,
    layout: sync::Layout,
    /// Transfers in flight at once.
    transfers: usize,
    /// Mirror recodes of files stored with `defer_recodes`, for [`RemoteStore::finish_recodes`].
    pending: Mutex<Vec<sync::PendingRecodes>>,
    /// When [`RemoteStore::branch_tip`] read each (branch, tag): the commit that compares
    /// against that tag moves the branch only within [`ckpt::sync::WRITE_DEADLINE`] of it.
    tips_read: Mutex<HashMap<(String, Option<String>), sync::Moment>>,
}

impl RemoteStore {
    fn cache(&self) -> PyResult<Arc<sync::RankCache>> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner()).clone();
        cache.ok_or_else(|| err(format!("{}: this RemoteStore is closed", self.remote.url())))
    }

    fn run<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&dyn Remote, &repo::Repo) -> sync::Result<T> + Send,
    ) -> PyResult<T> {
        let (remote, cache) = (self.remote.clone(), self.cache()?.repo());
        py.detach(move || f(remote.as_ref(), &cache)).map_err(sync_err)
    }

    /// [`RemoteStore::run`], once more on a rebuilt cache if a kept cache's objects turned out
    /// damaged ([`sync::RankCache::with_rebuild`]); the work that codes and verifies, so it
    /// runs in a forked child's own rayon pool there ([`child_pool`]).
    fn run_retrying<T: Send>(
        &self,
        py: Python<'_>,
        f: impl Fn(&dyn Remote, &repo::Repo) -> sync::Result<T> + Send + Sync,
    ) -> PyResult<T> {
        let (remote, cache, pool) = (self.remote.clone(), self.cache()?, child_pool()?);
        py.detach(move || in_pool(pool.as_deref(), || cache.with_rebuild(|repo| f(remote.as_ref(), repo))))
            .map_err(sync_err)
    }
}

/// The text that tells one remote from another for its kept caches: its URL (without
/// credentials) and where it is served: for S3 and GCS the endpoint or emulator (two servers
/// may serve the same bucket name), for Azure the storage account (a container's name is
/// unique within its account only) and the endpoint or emulator.
fn remote_identity(url: &str, endpoint: Option<&str>) -> String {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let at = |vars: &[&str]| endpoint.map(str::to_string).or_else(|| vars.iter().find_map(|v| var(v)));
    let place = if url.starts_with("s3://") {
        at(&["AWS_ENDPOINT_URL", "AWS_ENDPOINT"])
    } else if url.starts_with("gs://") {
        at(&["STORAGE_EMULATOR_HOST"])
    } else if url.starts_with("az://") || url.starts_with("azure://") {
        let emulator = var("AZURE_STORAGE_USE_EMULATOR").map(|_| "AZURITE_BLOB_STORAGE_URL");
        let server = at(&[emulator.unwrap_or("AZURE_STORAGE_ENDPOINT")]);
        let account = var("AZURE_STORAGE_ACCOUNT_NAME").or_else(|| emulator.map(|_| "azurite".to_string()));
        Some(format!("{} {}", account.unwrap_or_default(), server.unwrap_or_default()))
    } else {
        None
    };
    match place {
        Some(place) => format!("{url} {place}"),
        None => url.to_string(),
    }
}

#[pymethods]
impl RemoteStore {
    /// Opens the remote at `url` (`s3://bucket/prefix`, with the `AWS_*` environment and these
    /// settings; `gs://bucket/prefix` or `az://container/prefix`, with Google's or Azure's; `file:///dir`, created if missing, for a writer), uploading in `layout`
    /// (`"mirror"` or `"deltas"`), with its cache in `cache` (a directory, created if missing,
    /// used as it is); else, given `rank`, the kept cache of that rank for this remote under
    /// `$CKPT_CACHE_DIR` (else `$XDG_CACHE_HOME/ckpt` or `~/.cache/ckpt`), or a temporary one
    /// if another process uses it ([`RemoteStore::cache_fallback`] says why); else a temporary
    /// one. A temporary cache is deleted by [`RemoteStore::close`].
    #[staticmethod]
    #[pyo3(signature = (url, cache=None, layout="mirror", endpoint=None, region=None, allow_http=false, create=false, rank=None))]
    #[allow(clippy::too_many_arguments)]
    fn open(
        py: Python<'_>,
        url: String,
        cache: Option<PathBuf>,
        layout: &str,
        endpoint: Option<String>,
        region: Option<String>,
        allow_http: bool,
        create: bool,
        rank: Option<u32>,
    ) -> PyResult<RemoteStore> {
        let layout = layout_arg(layout)?;
        let (remote, cache) = py
            .detach(move || {
                let identity = remote_identity(&url, endpoint.as_deref());
                let s3 = remote::S3Options { endpoint, region, allow_http };
                let remote: Box<dyn Remote> = if create && !remote::is_object_store(&url) {
                    Box::new(remote::local::DirRemote::create(&url).map_err(|e| error_text(&e))?)
                } else {
                    remote::open(&url, &s3).map_err(|e| error_text(&e))?
                };
                // The identity names the remote as opened (without credentials).
                let identity = identity.replacen(&url, remote.url(), 1);
                let cache = match (cache, rank, sync::default_cache_root()) {
                    (Some(dir), _, _) => sync::RankCache::at(&dir),
                    (None, Some(rank), Some(root)) => sync::RankCache::kept(&root, &identity, rank),
                    (None, Some(_), None) => {
                        let why = format!("no cache directory (set {})", sync::CACHE_DIR_VAR);
                        sync::RankCache::temporary_because(Some(why))
                    }
                    (None, None, _) => sync::RankCache::temporary(),
                };
                Ok::<_, String>((remote, cache.map_err(|e| error_text(&e))?))
            })
            .map_err(err)?;
        let remote = Arc::new(Counted { inner: remote, counts: Default::default() });
        let pending = Mutex::new(Vec::new());
        Ok(RemoteStore {
            remote,
            cache: Mutex::new(Some(Arc::new(cache))),
            layout,
            transfers: 8,
            pending,
            tips_read: Mutex::new(HashMap::new()),
        })
    }

    /// The remote's URL (without credentials).
    #[getter]
    fn url(&self) -> String {
        self.remote.url().to_string()
    }

    /// The cache's repository directory (`None` once closed).
    #[getter]
    fn cache_dir(&self) -> Option<PathBuf> {
        self.cache().ok().map(|c| c.dir())
    }

    /// Whether the cache is a kept one (locked by this process, pruned on close).
    #[getter]
    fn cache_kept(&self) -> bool {
        self.cache().is_ok_and(|c| c.is_kept())
    }

    /// Why a kept cache was asked for but a temporary one is used (`None` if it was not).
    #[getter]
    fn cache_fallback(&self) -> Option<String> {
        self.cache().ok().and_then(|c| c.fallback().map(str::to_string))
    }

    /// What this store moved so far: `downloads` and `downloaded_bytes` (a download stopped
    /// after an object's header counts, with the bytes that came), `uploads` and
    /// `uploaded_bytes` (new objects), `replaces` and `replaced_bytes` (a mirror layout's
    /// recodes), and `requests` (all kinds).
    fn traffic(&self) -> BTreeMap<&'static str, u64> {
        let c = &self.remote.counts;
        let get = |i: usize| c[i].load(Ordering::Relaxed);
        BTreeMap::from([
            ("downloads", get(0)),
            ("downloaded_bytes", get(1)),
            ("uploads", get(2)),
            ("uploaded_bytes", get(3)),
            ("replaces", get(4)),
            ("replaced_bytes", get(5)),
            ("requests", self.remote.requests()),
        ])
    }

    /// Where branch `name` is on the remote: `(version or None, tag or None)`, the tag being
    /// what [`RemoteStore::commit`] compares against.
    fn branch_tip(&self, py: Python<'_>, name: &str) -> PyResult<(Option<String>, Option<String>)> {
        let branch = name.to_string();
        let tip = self.run(py, move |remote, _| sync::remote_branch_tip(remote, &branch))?;
        if let Some(read_at) = tip.read_at {
            let mut read = self.tips_read.lock().unwrap_or_else(|e| e.into_inner());
            read.insert((name.to_string(), tip.tag.clone()), read_at);
        }
        Ok((tip.version.map(|v| v.to_hex()), tip.tag))
    }

    /// Refuses `tags` that are invalid, given twice, or exist on the remote.
    fn check_tags(&self, py: Python<'_>, tags: Vec<String>) -> PyResult<()> {
        let problem = self.run(py, move |remote, _| {
            let mut seen = HashSet::new();
            for t in &tags {
                repo::check_name(t)?;
                if !seen.insert(t.clone()) {
                    return Ok(Some(format!("tag {t:?} is given twice")));
                }
                if remote.get_small(&format!("refs/tags/{t}"))?.is_some() {
                    return Ok(Some(format!("tag {t:?} already exists on {}", remote.url())));
                }
            }
            Ok(None)
        })?;
        problem.map_or(Ok(()), |p| Err(err(p)))
    }

    /// The full id of the version `rev` names on the remote (`HEAD`, a branch, a tag, an id).
    fn resolve(&self, py: Python<'_>, rev: &str) -> PyResult<String> {
        let rev = rev.to_string();
        Ok(self.run(py, move |remote, _| sync::resolve_remote(remote, &rev))?.to_hex())
    }

    /// Stores the file at `disk` as `path` in the cache and uploads it
    /// ([`sync::store_file_to_remote`]), coded against the same items in version `previous`
    /// (a `.distcp` file cut into its writer's `items`, as [`Repo::store_objects`] cuts it).
    /// Returns `(path, manifest, file hash, length, stored bytes)` for [`RemoteStore::commit`],
    /// the last being what the upload created on the remote. With `defer_recodes` the mirror
    /// layout's recodes of the previous version's blobs are left for
    /// [`RemoteStore::finish_recodes`] ([`sync::upload_file_to_remote`]): the file is complete
    /// on the remote either way.
    #[pyo3(signature = (disk, path, previous=None, items=None, defer_recodes=false))]
    #[allow(clippy::too_many_arguments)]
    fn store_objects(
        &self,
        py: Python<'_>,
        disk: PathBuf,
        path: String,
        previous: Option<String>,
        items: Option<Vec<WrittenItem>>,
        defer_recodes: bool,
    ) -> PyResult<(String, String, String, u64, u64)> {
        let (rp, previous, items) = stored_file_args(&path, previous, items)?;
        let (layout, transfers) = (self.layout, self.transfers);
        let mut stored = self.run_retrying(py, move |remote, cache| {
            let store = if defer_recodes { sync::upload_file_to_remote } else { sync::store_file_to_remote };
            let written = items.as_deref();
            store(
                cache,
                remote,
                &sync::FileUpload { disk: &disk, path: &rp, previous: previous.as_ref(), written, layout, transfers },
            )
        })?;
        if let Some(recodes) = stored.recodes.take() {
            self.pending.lock().unwrap_or_else(|e| e.into_inner()).push(recodes);
        }
        self.cache()?.note_file(&stored.entry.path, stored.entry.manifest);
        let (path, manifest, hash, len) = stored_entry(stored.entry);
        Ok((path, manifest, hash, len, stored.stored_bytes))
    }

    /// Writes one version of `files` on the remote and moves `branch` there by
    /// compare-and-swap against `(expected, tag)` as [`RemoteStore::branch_tip`] returned
    /// them, then creates `tags` ([`sync::commit_to_remote`]). `stored_bytes`: what the
    /// uploads of `files` created, the version's figure. Returns the version id.
    #[pyo3(signature = (branch, expected, tag, files, message, tags=Vec::new(), stored_bytes=0))]
    #[allow(clippy::too_many_arguments)]
    fn commit(
        &self,
        py: Python<'_>,
        branch: String,
        expected: Option<String>,
        tag: Option<String>,
        files: Vec<(String, String, String, u64)>,
        message: String,
        tags: Vec<String>,
        stored_bytes: u64,
    ) -> PyResult<String> {
        let version = expected.map(|e| parse_id(&e)).transpose()?;
        let read_at =
            self.tips_read.lock().unwrap_or_else(|e| e.into_inner()).get(&(branch.clone(), tag.clone())).copied();
        let tip = sync::RemoteTip { version, tag, read_at };
        let files = files.into_iter().map(entry_of_stored).collect::<PyResult<Vec<_>>>()?;
        let id = self.run(py, move |remote, cache| {
            let options = CommitOptions::default();
            let commit = sync::RemoteCommit {
                branch: &branch,
                tip: &tip,
                files,
                stored_bytes,
                message: &message,
                tags: &tags,
                options: &options,
            };
            sync::commit_to_remote(cache, remote, commit)
        })?;
        Ok(id.to_hex())
    }

    /// A reader of byte ranges of `path` in `version` (a full id), after downloading that
    /// file's objects into the cache (only that file's). A file a kept cache held already is
    /// first verified (each blob decoded and checked against its id): if it does not verify,
    /// the cache is rebuilt and the file downloaded.
    fn open_file(&self, py: Python<'_>, version: &str, path: &str) -> PyResult<StoredFile> {
        let (id, path) = (parse_id(version)?, path.to_string());
        let cache = self.cache()?;
        let kept = cache.is_kept();
        let noted = path.clone();
        let (manifest, reader) = self.run_retrying(py, move |remote, cache| {
            let held = kept
                && sync::fetch_version(cache, remote, &id)?
                    .file(&path)
                    .is_some_and(|f| cache.store().contains(&f.manifest));
            let entry = sync::fetch_stored_file(cache, remote, &id, &path)?;
            if held {
                use rayon::prelude::*;
                let blobs: Vec<ckpt::ObjectId> = cache.manifest(&entry.manifest)?.blobs().collect();
                blobs.par_iter().try_for_each(|b| cache.store().verify(b).map(|_| ()))?;
            }
            Ok((entry.manifest, sync::StoredFileReader::open(cache, &entry.manifest)?))
        })?;
        cache.note_file(&noted, manifest);
        Ok(StoredFile { repo: cache.repo(), reader: Mutex::new(reader) })
    }

    /// Blobs that recodes left by `store_objects(..., defer_recodes=True)` will recode.
    fn pending_recodes(&self) -> usize {
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|p| p.len()).sum()
    }

    /// Does the recodes `store_objects(..., defer_recodes=True)` left ([`sync::finish_recodes`]),
    /// without the GIL: the previous version's blobs become XOR deltas against the new ones on
    /// the remote. Returns the objects replaced. Raises if one fails (the rest stay undone,
    /// their journals noted in the cache: the next save through it deletes them).
    fn finish_recodes(&self, py: Python<'_>) -> PyResult<u64> {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        if pending.is_empty() {
            return Ok(0);
        }
        let transfers = self.transfers;
        let (objects, _) =
            self.run(py, move |remote, cache| sync::finish_recodes(cache, remote, pending, transfers))?;
        Ok(objects)
    }

    /// After a successful save or load: a kept cache deletes everything but the newest file of
    /// each path it stored or read ([`sync::RankCache::prune`]); then, with or without `prune`,
    /// the cache is released (a kept one unlocked, a temporary one deleted). Later calls fail.
    #[pyo3(signature = (prune=false))]
    fn close(&self, py: Python<'_>, prune: bool) -> PyResult<()> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(cache) = cache else { return Ok(()) };
        py.detach(move || if prune { cache.prune().map(|_| ()) } else { Ok(()) }).map_err(sync_err)
    }
}

/// A remote that counts what moves ([`RemoteStore::traffic`]): downloads and their bytes,
/// uploads and their bytes, replacements and their bytes.
struct Counted {
    inner: Box<dyn Remote>,
    counts: [std::sync::atomic::AtomicU64; 6],
}

impl Counted {
    fn count(&self, what: usize, bytes: u64) {
        self.counts[what].fetch_add(1, Ordering::Relaxed);
        self.counts[what + 1].fetch_add(bytes, Ordering::Relaxed);
    }
}

/// A `Write` that counts the bytes through it.
struct CountingWrite<'a> {
    out: &'a mut dyn std::io::Write,
    bytes: &'a std::sync::atomic::AtomicU64,
}

impl std::io::Write for CountingWrite<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

impl Remote for Counted {
    fn url(&self) -> &str {
        self.inner.url()
    }
    fn list(&self, prefix: &str) -> remote::Result<Vec<String>> {
        self.inner.list(prefix)
    }
    fn list_modified(&self, prefix: &str) -> remote::Result<Vec<remote::Listed>> {
        self.inner.list_modified(prefix)
    }
    fn modified(&self, key: &str) -> remote::Result<Option<std::time::SystemTime>> {
        self.inner.modified(key)
    }
    fn exists(&self, key: &str) -> remote::Result<bool> {
        self.inner.exists(key)
    }
    fn get_small(&self, key: &str) -> remote::Result<Option<remote::Small>> {
        self.inner.get_small(key)
    }
    fn put_small(&self, key: &str, bytes: &[u8], expect: &remote::Expect) -> remote::Result<()> {
        self.inner.put_small(key, bytes, expect)
    }
    fn upload(
        &self,
        key: &str,
        file: &std::fs::File,
        path: &std::path::Path,
        len: u64,
        mode: remote::UploadMode,
    ) -> remote::Result<remote::Uploaded> {
        let uploaded = self.inner.upload(key, file, path, len, mode)?;
        if uploaded != remote::Uploaded::Existed {
            self.count(2, len);
        }
        Ok(uploaded)
    }
    fn replace(&self, key: &str, file: &std::fs::File, path: &std::path::Path, len: u64) -> remote::Result<()> {
        self.inner.replace(key, file, path, len)?;
        self.count(4, len);
        Ok(())
    }
    fn delete(&self, key: &str) -> remote::Result<()> {
        self.inner.delete(key)
    }
    fn read_head(&self, key: &str, len: u64) -> remote::Result<(Vec<u8>, u64)> {
        self.inner.read_head(key, len)
    }
    fn download(&self, key: &str, out: &mut dyn std::io::Write, limit: u64) -> remote::Result<u64> {
        self.counts[0].fetch_add(1, Ordering::Relaxed);
        self.inner.download(key, &mut CountingWrite { out, bytes: &self.counts[1] }, limit)
    }
    fn requests(&self) -> u64 {
        self.inner.requests()
    }
}

/// An object or version id given as hex by the Python side.
/// One item a DCP rank wrote into its file, as `ckpt.dcp.Writer` reports it from DCP's write
/// results: `(offset, length, fqn, chunk, transformed)`, `chunk` being `None` for a bytes item
/// or `(torch dtype name, tensor size, chunk offsets, chunk sizes)` for a tensor chunk, and
/// `transformed` whether a storage extension transformed its bytes. Untrusted: a report that
/// does not fit the file only changes how it is cut (`torch_zip::dcp::cut_by_written_items`).
type WrittenItem = (u64, u64, String, Option<(String, Vec<u64>, Vec<u64>, Vec<u64>)>, bool);

/// The arguments of a `store_objects` (local or remote): the file's path in the version, the
/// version whose same items it is coded against, and the items its writer reports.
#[allow(clippy::type_complexity)]
fn stored_file_args(
    path: &str,
    previous: Option<String>,
    items: Option<Vec<WrittenItem>>,
) -> PyResult<(RepoPath, Option<VersionId>, Option<Vec<dcp::Item>>)> {
    let rp = RepoPath::parse(path).map_err(|reason| PyValueError::new_err(format!("{path}: {reason}")))?;
    let file = path.rsplit('/').next().unwrap_or_default().to_string();
    let items = items.map(|items| {
        items
            .into_iter()
            .map(|(offset, length, fqn, chunk, transformed)| dcp::Item {
                kind: match chunk {
                    None => dcp::ItemKind::Bytes,
                    Some((torch_dtype, size, offsets, sizes)) => dcp::ItemKind::Tensor {
                        dtype: dcp::dtype_of_torch(&torch_dtype),
                        torch_dtype,
                        size,
                        offsets,
                        sizes,
                    },
                },
                fqn,
                file: file.clone(),
                range: offset..offset.saturating_add(length),
                transformed,
            })
            .collect()
    });
    Ok((rp, previous.map(|p| parse_id(&p)).transpose()?, items))
}

/// A stored file as Python gets it: `(path, manifest, file hash, length)`.
fn stored_entry(entry: repo::FileEntry) -> (String, String, String, u64) {
    (entry.path, entry.manifest.to_hex(), entry.hash.to_hex(), entry.len)
}

/// [`stored_entry`] back, as `commit` gets it from the ranks.
fn entry_of_stored((path, manifest, hash, len): (String, String, String, u64)) -> PyResult<repo::FileEntry> {
    Ok(repo::FileEntry { path, manifest: parse_id(&manifest)?, hash: parse_id(&hash)?, len })
}

fn parse_id(hex: &str) -> PyResult<VersionId> {
    hex.parse().map_err(|_| PyValueError::new_err(format!("{hex:?} is not an object id")))
}

/// `ckpt log --json` of `rev` (the CLI's fields, the CLI's order).
fn log_json(repo: &repo::Repo, rev: &str) -> repo::Result<String> {
    let versions = repo.log(rev)?;
    let sizes = repo.sizes_now(&versions);
    let mut refs: HashMap<VersionId, Vec<String>> = HashMap::new();
    if let Head::Detached(id) = repo.head()? {
        refs.entry(id).or_default().push("HEAD".into());
    }
    for b in repo.branches()? {
        let names = refs.entry(b.id).or_default();
        if b.current {
            names.insert(0, format!("HEAD -> {}", b.name));
        } else {
            names.push(b.name);
        }
    }
    for (name, id) in repo.tags()? {
        refs.entry(id).or_default().push(format!("tag: {name}"));
    }
    let list: Vec<serde_json::Value> = versions
        .iter()
        .zip(&sizes)
        .map(|(v, &now)| {
            serde_json::json!({
                "id": v.id.to_hex(),
                "parents": v.parents.iter().map(|p| p.to_hex()).collect::<Vec<_>>(),
                "date": repo::format_time(v.time),
                "time": v.time,
                "message": v.message,
                "files": v.files,
                "raw_bytes": v.raw_bytes,
                "stored_bytes": v.stored_bytes,
                "stored_now_bytes": now,
                "refs": refs.get(&v.id).cloned().unwrap_or_default(),
            })
        })
        .collect();
    Ok(serde_json::Value::Array(list).to_string())
}

/// The module `ckpt._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    LOADED_IN.get_or_init(std::process::id);
    EXIT_HOOK.get_or_init(|| {
        // SAFETY: registers a function without arguments that calls no Python API; called with
        // the GIL held, as `Py_AtExit` requires.
        #[allow(unsafe_code)]
        let registered = unsafe { pyo3::ffi::Py_AtExit(Some(exit_status_hook)) };
        registered == 0
    });
    m.add_function(wrap_pyfunction!(exit_with_failure, m)?)?;
    m.add_function(wrap_pyfunction!(dcp_metadata_classes, m)?)?;
    m.add_function(wrap_pyfunction!(check_layout, m)?)?;
    m.add_function(wrap_pyfunction!(check_names, m)?)?;
    m.add("CkptError", m.py().get_type::<CkptError>())?;
    m.add("PIECE_MIN", repo::PIECE_MIN)?;
    m.add_class::<Repo>()?;
    m.add_class::<CommitHandle>()?;
    m.add_class::<MemoryImage>()?;
    m.add_class::<SaveRecord>()?;
    m.add_class::<StoredFile>()?;
    m.add_class::<ReadAhead>()?;
    m.add_class::<RemoteStore>()?;
    m.add_class::<pieces::PieceSink>()?;
    m.add_class::<reader::RemoteReader>()?;
    Ok(())
}
