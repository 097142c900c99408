//! `RemoteReader`: a read-only handle on a remote without a repository (`ckpt.open`,
//! `ckpt.safe_open`), over [`ckpt::sync::RemoteReader`]. Blocking work runs without the GIL.

use crate::{child_pool, err, in_pool, parse_id, sync_err};
use ckpt::remote::S3Options;
use ckpt::repo::RefKind;
use ckpt::sync::{self, ReaderCache};
use pyo3::prelude::*;
use pyo3::types::PyByteArray;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// One version as `log` gives it: id, parents, time, message, file paths, raw and stored bytes.
type LogRow = (String, Vec<String>, i64, String, Vec<String>, u64, u64);

/// A read-only handle on a remote ([`sync::RemoteReader`]).
#[pyclass(frozen, module = "ckpt._native")]
pub(crate) struct RemoteReader {
    inner: Mutex<Option<Arc<sync::RemoteReader>>>,
}

impl RemoteReader {
    fn reader(&self) -> PyResult<Arc<sync::RemoteReader>> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.clone().ok_or_else(|| err("this remote handle is closed".into()))
    }

    /// Runs `f` on the reader without the GIL (in a forked child's pool there).
    fn run<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&sync::RemoteReader) -> sync::Result<T> + Send,
    ) -> PyResult<T> {
        let (reader, pool) = (self.reader()?, child_pool()?);
        py.detach(move || in_pool(pool.as_deref(), || f(&reader))).map_err(sync_err)
    }
}

#[pymethods]
impl RemoteReader {
    /// Opens the remote at `url` for reading, through the kept cache of this remote
    /// (`cache=None`), a temporary one (`temporary`), or the directory `cache`.
    #[staticmethod]
    #[pyo3(signature = (url, cache=None, temporary=false, endpoint=None, region=None, allow_http=false))]
    fn open(
        py: Python<'_>,
        url: String,
        cache: Option<PathBuf>,
        temporary: bool,
        endpoint: Option<String>,
        region: Option<String>,
        allow_http: bool,
    ) -> PyResult<RemoteReader> {
        let where_ = match (cache, temporary) {
            (Some(dir), _) => ReaderCache::At(dir),
            (None, true) => ReaderCache::Temporary,
            (None, false) => ReaderCache::Kept,
        };
        let s3 = S3Options { endpoint, region, allow_http };
        let reader = py.detach(move || sync::RemoteReader::open(&url, &s3, where_)).map_err(sync_err)?;
        Ok(RemoteReader { inner: Mutex::new(Some(Arc::new(reader))) })
    }

    /// The remote's URL (without credentials).
    #[getter]
    fn url(&self) -> PyResult<String> {
        Ok(self.reader()?.remote().url().to_string())
    }

    /// The cache's directory.
    #[getter]
    fn cache_dir(&self) -> PyResult<PathBuf> {
        Ok(self.reader()?.cache().dir())
    }

    /// Requests sent to the remote so far.
    fn requests(&self) -> PyResult<u64> {
        Ok(self.reader()?.remote().requests())
    }

    /// The full id of the version `rev` names on the remote.
    fn resolve(&self, py: Python<'_>, rev: String) -> PyResult<String> {
        Ok(self.run(py, move |r| r.resolve(&rev))?.to_hex())
    }

    /// Branches and tags: `(kind, name, id)`, kind `"branch"` or `"tag"`.
    fn refs(&self, py: Python<'_>) -> PyResult<Vec<(String, String, String)>> {
        let refs = self.run(py, |r| r.refs())?;
        let kind = |k: RefKind| if k == RefKind::Branch { "branch" } else { "tag" }.to_string();
        Ok(refs.into_iter().map(|(k, n, id)| (kind(k), n, id.to_hex())).collect())
    }

    /// The history from `rev` along first parents, newest first (at most `max` versions).
    #[pyo3(signature = (rev, max=None))]
    fn log(&self, py: Python<'_>, rev: String, max: Option<usize>) -> PyResult<Vec<LogRow>> {
        let versions = self.run(py, move |r| r.log(&rev, max))?;
        Ok(versions
            .into_iter()
            .map(|(id, v)| {
                let parents = v.parents.iter().map(|p| p.to_hex()).collect();
                let files = v.files.iter().map(|f| f.path.clone()).collect();
                (id.to_hex(), parents, v.time, v.message, files, v.raw_bytes, v.stored_bytes)
            })
            .collect())
    }

    /// The files of `version` (a full id): `(path, len, hash)`.
    fn files(&self, py: Python<'_>, version: &str) -> PyResult<Vec<(String, u64, String)>> {
        let id = parse_id(version)?;
        let v = self.run(py, move |r| r.version(&id))?;
        Ok(v.files.into_iter().map(|f| (f.path, f.len, f.hash.to_hex())).collect())
    }

    /// Whether `path` of `version` holds tensors (a safetensors or torch file), its manifest
    /// downloaded.
    fn holds_tensors(&self, py: Python<'_>, version: &str, path: String) -> PyResult<bool> {
        let id = parse_id(version)?;
        let manifest = self.run(py, move |r| r.file(&id, &path).map(|(_, m)| m))?;
        Ok(manifest.segments.iter().any(|s| s.tensor.is_some()))
    }

    /// The tensors of `path` in `version`: `(name, dtype, shape)`, in file order.
    fn tensors(&self, py: Python<'_>, version: &str, path: String) -> PyResult<Vec<(String, String, Vec<u64>)>> {
        let id = parse_id(version)?;
        let tensors = self.run(py, move |r| r.tensors(&id, &path))?;
        Ok(tensors.into_iter().map(|t| (t.name, t.dtype, t.shape)).collect())
    }

    /// The `__metadata__` of the safetensors file `path` in `version`.
    fn metadata(&self, py: Python<'_>, version: &str, path: String) -> PyResult<Option<BTreeMap<String, String>>> {
        let id = parse_id(version)?;
        self.run(py, move |r| r.metadata(&id, &path))
    }

    /// Rows `start..stop` (all when both are `None`) of tensor `name` of `path` in `version`:
    /// `(dtype, shape, bytearray)`. Only what they need is downloaded.
    #[pyo3(signature = (version, path, name, start=None, stop=None))]
    fn read<'py>(
        &self,
        py: Python<'py>,
        version: &str,
        path: String,
        name: String,
        start: Option<u64>,
        stop: Option<u64>,
    ) -> PyResult<(String, Vec<u64>, Bound<'py, PyByteArray>)> {
        let id = parse_id(version)?;
        let reader = self.reader()?;
        let t = self.run(py, move |r| r.tensor(&id, &path, &name))?;
        let rows = start.unwrap_or(0)..stop.unwrap_or(t.rows());
        let (fetch_t, fetch_rows) = (t.clone(), rows.clone());
        let len = self.run(py, move |r| r.fetch_rows(&fetch_t, fetch_rows))?;
        let len = usize::try_from(len).map_err(|_| err(format!("{}: too large for this machine", t.info.name)))?;
        let pool = child_pool()?;
        let mut failure = None;
        let buf = PyByteArray::new_with(py, len, |buf| {
            let read = py.detach(|| in_pool(pool.as_deref(), || reader.read_rows_into(&t, rows.clone(), buf)));
            failure = read.err();
            Ok(())
        })?;
        if let Some(e) = failure {
            return Err(sync_err(e));
        }
        let mut shape = t.info.shape.clone();
        if let Some(first) = shape.first_mut() {
            *first = rows.end - rows.start;
        }
        Ok((t.info.dtype.clone(), shape, buf))
    }

    /// Releases the cache (with `prune`, a kept cache keeps only the newest file of each path
    /// read whole and deletes every other object). Later calls fail.
    #[pyo3(signature = (prune=false))]
    fn close(&self, py: Python<'_>, prune: bool) -> PyResult<()> {
        let taken = self.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(reader) = taken else { return Ok(()) };
        let Ok(reader) = Arc::try_unwrap(reader) else { return Ok(()) };
        py.detach(move || reader.close(prune)).map_err(sync_err)
    }
}
