//! `ckpt._native`: the Rust side of the Python package. The Python modules (`python/ckpt/`)
//! turn tensors into the layout this module asks for and copy their bytes; everything else
//! (committing, deltas, reading back) is the `ckpt` library.
//!
//! Background commits: [`Repo::commit`] with `background=True` returns a [`CommitHandle`] once
//! the caller has captured the bytes (in sealed memory files) and runs the commit on a thread of
//! its own, which never holds the GIL. Every other call on the repository (a commit included)
//! first waits for it, and raises its error unless [`CommitHandle::wait`] already did: an error
//! is never lost.

use ckpt::repo::{self, CheckoutOptions, CommitOptions, CommitSource, Head, MemoryFile, TensorSpec, VersionId};
use ckpt::Dtype;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyList};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};

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

/// A background commit's outcome, shared by its thread, its handle and the repository.
#[derive(Default)]
struct Job {
    /// `None` while running; then the version id (hex) or the error message.
    outcome: Mutex<Option<Result<String, String>>>,
    finished: Condvar,
    /// Whether the error (if any) reached Python already, through `wait()`.
    delivered: Mutex<bool>,
}

impl Job {
    fn finish(&self, outcome: Result<String, String>) {
        *self.outcome.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
        self.finished.notify_all();
    }

    /// Blocks until the job has finished; returns its outcome.
    fn wait(&self) -> Result<String, String> {
        let mut outcome = self.outcome.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(o) = outcome.as_ref() {
                return o.clone();
            }
            outcome = self.finished.wait(outcome).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// A commit running in the background ([`Repo::commit`] with `background=True`).
#[pyclass(frozen, module = "ckpt._native")]
struct CommitHandle {
    job: Arc<Job>,
}

#[pymethods]
impl CommitHandle {
    /// Waits for the commit (without holding the GIL); returns the version id, or raises the
    /// commit's error (every time it is called).
    fn wait(&self, py: Python<'_>) -> PyResult<String> {
        let job = self.job.clone();
        let outcome = py.detach(move || job.wait());
        *self.job.delivered.lock().unwrap_or_else(|p| p.into_inner()) = true;
        outcome.map_err(err)
    }

    /// Whether the commit has finished (successfully or not).
    fn done(&self) -> bool {
        self.job.outcome.lock().unwrap_or_else(|p| p.into_inner()).is_some()
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

/// An open repository.
#[pyclass(frozen, module = "ckpt._native")]
struct Repo {
    inner: Arc<repo::Repo>,
    /// The last background commit, until its outcome has been seen.
    pending: Mutex<Option<Arc<Job>>>,
    /// With `reuse_buffers`: the memory of the last capture of each path, written over by the
    /// next one (`MemoryFile::keep_for_reuse`).
    spares: Mutex<Option<HashMap<String, MemoryFile>>>,
}

impl Repo {
    fn new(inner: repo::Repo) -> Repo {
        Repo { inner: Arc::new(inner), pending: Mutex::new(None), spares: Mutex::new(None) }
    }

    /// Whether a commit may still read memory it was given.
    fn commit_running(&self) -> bool {
        let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.as_ref().is_some_and(|job| job.outcome.lock().unwrap_or_else(|p| p.into_inner()).is_none())
    }

    /// Waits for the pending background commit, if any; raises its error unless `wait()` did.
    fn settle(&self, py: Python<'_>) -> PyResult<()> {
        let job = self.pending.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(job) = job else { return Ok(()) };
        let waited = job.clone();
        let outcome = py.detach(move || waited.wait());
        *self.pending.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let mut delivered = job.delivered.lock().unwrap_or_else(|p| p.into_inner());
        match outcome {
            Err(e) if !*delivered => {
                *delivered = true;
                Err(err(format!("the previous background commit failed: {e}")))
            }
            _ => Ok(()),
        }
    }
}

/// A file of a version as `Repo.files` returns it: path, format, length, file hash, manifest.
type FileRow = (String, String, u64, String, String);

/// A tensor as `Repo.read_tensors` returns it: name, dtype, shape, bytes.
type TensorRow<'py> = (String, String, Vec<u64>, Bound<'py, PyByteArray>);

/// A file to commit, as the Python side passes it: `(path, source)` where `source` is a
/// [`MemoryImage`] or a path on disk (`str`).
fn sources(list: &Bound<'_, PyList>) -> PyResult<Vec<CommitSource>> {
    let mut out = Vec::with_capacity(list.len());
    for item in list.iter() {
        let (path, source): (String, Bound<'_, PyAny>) = item.extract()?;
        if let Ok(image) = source.cast::<MemoryImage>() {
            let file = image.get().file.lock().unwrap_or_else(|p| p.into_inner()).take();
            let file = file.ok_or_else(|| err(format!("{path}: this tensor image was committed already")))?;
            out.push(CommitSource::Memory { path, file });
        } else {
            let disk: PathBuf = source.extract()?;
            out.push(CommitSource::DiskAs { path, disk });
        }
    }
    Ok(out)
}

/// Commits and tags; the body of both a foreground and a background commit.
fn commit_and_tag(
    repo: &repo::Repo,
    sources: Vec<CommitSource>,
    message: &str,
    tags: &[String],
    exact: bool,
) -> repo::Result<VersionId> {
    // Compaction inline (the library default): under the `reverse` policy the parent becomes
    // deltas before this returns, on this (background) thread, and the next commit waits for it.
    let id = repo.commit_sources(sources, message, exact, &CommitOptions::default())?;
    for t in tags {
        repo.tag(t, Some(&id.to_hex()))?;
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
        self.inner.root().to_path_buf()
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
        let specs = tensors
            .into_iter()
            .map(|(name, dtype, shape)| {
                let dtype = Dtype::from_safetensors_name(&dtype)
                    .ok_or_else(|| err(format!("{path}: tensor {name:?}: dtype {dtype} is not supported")))?;
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

    /// Commits `files` (a list of `(path, MemoryImage | disk path)`) with `message`, then tags
    /// the version with each of `tags`. With `exact`, the version holds only these files. With
    /// `background`, returns a [`CommitHandle`] at once and commits on another thread.
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
        self.settle(py)?;
        // Tag names are checked first, so that a bad one fails before anything is committed.
        let existing = self.inner.tags().map_err(to_py)?;
        for t in &tags {
            repo::check_name(t).map_err(to_py)?;
            if existing.iter().any(|(name, _)| name == t) {
                return Err(err(format!("tag {t:?} already exists")));
            }
        }
        let sources = sources(files)?;
        if !background {
            let repo = self.inner.clone();
            let id = py.detach(move || commit_and_tag(&repo, sources, &message, &tags, exact)).map_err(to_py)?;
            return Ok(id.to_hex().into_pyobject(py)?.into_any());
        }
        let job = Arc::new(Job::default());
        let (repo, done) = (self.inner.clone(), job.clone());
        std::thread::Builder::new()
            .name("ckpt-commit".into())
            .spawn(move || {
                // A panic must still finish the job: a waiter would otherwise wait forever.
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    commit_and_tag(&repo, sources, &message, &tags, exact)
                }));
                done.finish(match outcome {
                    Ok(Ok(id)) => Ok(id.to_hex()),
                    Ok(Err(e)) => Err(error_text(&e)),
                    Err(_) => Err("the commit thread panicked (a bug in ckpt); nothing was committed".into()),
                });
            })
            .map_err(|e| err(format!("starting the commit thread: {e}")))?;
        *self.pending.lock().unwrap_or_else(|p| p.into_inner()) = Some(job.clone());
        Ok(Bound::new(py, CommitHandle { job })?.into_any())
    }

    /// Waits for a background commit, if one runs; raises its error unless its handle's
    /// `wait()` already did.
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        self.settle(py)
    }

    /// The full id of the version `rev` names.
    fn resolve(&self, py: Python<'_>, rev: &str) -> PyResult<String> {
        self.settle(py)?;
        self.inner.resolve(rev).map(|id| id.to_hex()).map_err(to_py)
    }

    /// The history from `rev`, newest first, as `ckpt log --json` prints it (a JSON string).
    #[pyo3(signature = (rev="HEAD"))]
    fn log_json(&self, py: Python<'_>, rev: &str) -> PyResult<String> {
        self.settle(py)?;
        let repo = self.inner.clone();
        let rev = rev.to_string();
        py.detach(move || log_json(&repo, &rev)).map_err(to_py)
    }

    /// The files of version `rev`: `(path, format, length, file hash, manifest id)`, format
    /// `"safetensors"`, `"torch"` or `"bytes"`.
    #[pyo3(signature = (rev="HEAD"))]
    fn files(&self, py: Python<'_>, rev: &str) -> PyResult<Vec<FileRow>> {
        self.settle(py)?;
        let version = self.inner.resolve(rev).and_then(|id| self.inner.version(&id)).map_err(to_py)?;
        version
            .files
            .iter()
            .map(|f| {
                let manifest = self.inner.manifest(&f.manifest).map_err(to_py)?;
                let kind = match manifest.kind {
                    repo::FileFormat::Safetensors => "safetensors",
                    repo::FileFormat::Torch => "torch",
                    _ => "bytes",
                };
                Ok((f.path.clone(), kind.to_string(), f.len, f.hash.to_hex(), f.manifest.to_hex()))
            })
            .collect()
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
        self.settle(py)?;
        let mut reader = self.inner.tensor_reader(rev, path).map_err(to_py)?;
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
                if let Err(e) = reader.read_into(i, buf) {
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
        self.settle(py)?;
        let bytes = self.inner.read_file_bytes(rev, path, limit).map_err(to_py)?;
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
        self.settle(py)?;
        let repo = self.inner.clone();
        let rev = rev.to_string();
        let options = CheckoutOptions { files, output, tensor: None, force };
        let summary = py.detach(move || repo.checkout_with(&rev, &options)).map_err(to_py)?;
        Ok(summary.files)
    }

    /// Tags `rev` (default `HEAD`) as `name`.
    #[pyo3(signature = (name, rev=None))]
    fn tag(&self, py: Python<'_>, name: &str, rev: Option<&str>) -> PyResult<String> {
        self.settle(py)?;
        self.inner.tag(name, rev).map(|id| id.to_hex()).map_err(to_py)
    }

    /// Every tag and its version id.
    fn tags(&self, py: Python<'_>) -> PyResult<Vec<(String, String)>> {
        self.settle(py)?;
        let tags = self.inner.tags().map_err(to_py)?;
        Ok(tags.into_iter().map(|(n, id)| (n, id.to_hex())).collect())
    }
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
    m.add("CkptError", m.py().get_type::<CkptError>())?;
    m.add_class::<Repo>()?;
    m.add_class::<CommitHandle>()?;
    m.add_class::<MemoryImage>()?;
    Ok(())
}
