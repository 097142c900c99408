//! `PieceSink`: the tensors a `ckpt.dcp.Writer` rank hands over while DCP writes its file
//! (`ckpt::repo::Pieces`), read straight from the memory `torch.save` passes to the stream's
//! `write`, without a copy.

use ckpt::repo::{self, Pieces};
use ckpt::torch_zip::dcp;
use ckpt::Dtype;
use pyo3::prelude::*;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

/// `Py_buffer` (PEP 3118). Declared by hand with the two functions below because PyO3's
/// `PyBuffer` needs the limited API of Python 3.11, and this wheel is abi3 from 3.9: the struct
/// and both functions have had this layout and these signatures in every CPython 3 (and are in
/// the stable ABI from 3.11), so the one wheel keeps working everywhere.
#[repr(C)]
struct RawBuffer {
    buf: *mut c_void,
    obj: *mut pyo3::ffi::PyObject,
    len: isize,
    itemsize: isize,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut isize,
    strides: *mut isize,
    suboffsets: *mut isize,
    internal: *mut c_void,
}

extern "C" {
    fn PyObject_GetBuffer(obj: *mut pyo3::ffi::PyObject, view: *mut RawBuffer, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut RawBuffer);
}

/// `PyBUF_SIMPLE`: one C-contiguous run of bytes, or an error.
const PYBUF_SIMPLE: c_int = 0;
/// `PyBUF_WRITABLE`: as `PyBUF_SIMPLE`, and writable, or an error.
const PYBUF_WRITABLE: c_int = 1;

/// A Python object's exported bytes, held (the exporter keeps them alive and in place) until
/// dropped, which must happen with the GIL held.
pub(crate) struct HeldBuffer(RawBuffer);

impl HeldBuffer {
    /// The contiguous bytes of `obj`, or `None` if it exports none (the Python error cleared).
    fn of(obj: &Bound<'_, PyAny>) -> Option<HeldBuffer> {
        Self::with_flags(obj, PYBUF_SIMPLE)
    }

    /// The contiguous bytes of `obj` for writing, or `None` if it exports no writable ones
    /// (the Python error cleared).
    pub(crate) fn writable(obj: &Bound<'_, PyAny>) -> Option<HeldBuffer> {
        Self::with_flags(obj, PYBUF_WRITABLE)
    }

    fn with_flags(obj: &Bound<'_, PyAny>, flags: c_int) -> Option<HeldBuffer> {
        let mut view = std::mem::MaybeUninit::<RawBuffer>::zeroed();
        // SAFETY: `obj` is a live object (the GIL is held); on success `view` is filled in and
        // owned by the returned value, which releases it.
        let got = unsafe { PyObject_GetBuffer(obj.as_ptr(), view.as_mut_ptr(), flags) };
        if got != 0 {
            // Not a buffer, or not contiguous: the caller writes it the ordinary way.
            let _ = PyErr::take(obj.py());
            return None;
        }
        // SAFETY: filled in by the successful call above.
        Some(HeldBuffer(unsafe { view.assume_init() }))
    }

    fn addr(&self) -> usize {
        self.0.buf as usize
    }

    fn len(&self) -> usize {
        self.0.len.max(0) as usize
    }

    /// The bytes, for writing: only for a buffer got with [`HeldBuffer::writable`], which
    /// nothing else reads or writes while it is held (the caller's promise, as for any
    /// writable buffer handed to native code).
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        if self.len() == 0 || self.0.readonly != 0 {
            return &mut [];
        }
        // SAFETY: the exporter keeps `len` writable bytes at `buf` alive and in place until
        // released, which happens only when `self` is dropped; `&mut self` is the only handle.
        unsafe { std::slice::from_raw_parts_mut(self.0.buf as *mut u8, self.len()) }
    }

    fn bytes(&self) -> &[u8] {
        if self.len() == 0 {
            return &[];
        }
        // SAFETY: the exporter keeps `len` bytes at `buf` alive and in place until released,
        // which happens only when `self` is dropped.
        unsafe { std::slice::from_raw_parts(self.0.buf as *const u8, self.len()) }
    }
}

impl Drop for HeldBuffer {
    fn drop(&mut self) {
        // SAFETY: acquired by `PyObject_GetBuffer`, released once; dropped with the GIL held.
        unsafe { PyBuffer_Release(&mut self.0) }
    }
}

// Read (never written) by the thread that holds the GIL's place while `take` waits for it.
unsafe impl Send for HeldBuffer {}
unsafe impl Sync for HeldBuffer {}

/// The tensors one `ckpt.dcp.Writer` rank's streams hand over during `write_data`, stored as
/// they come ([`repo::Repo::store_piece`]) and taken by `Repo.store_objects(..., pieces=)`.
///
/// `take` stores a write that is exactly one of the `hints` (storages DCP is about to write),
/// or a copy of one (by its length), before it returns, while `torch.save` waits in that `write` (so the memory is the tensor's,
/// alive and unchanged). Stored on a thread of its own instead (holding the hinted storages),
/// overlapping DCP's next item, a 64 MiB save at one rank on the 2-vCPU test VM took 0.105-0.123
/// s against 0.124-0.129 s here, for more CPU, which several ranks per core do not have: not
/// worth a reference to every storage and raw pointers across threads.
#[pyclass(frozen, module = "ckpt._native")]
pub(crate) struct PieceSink {
    pub(crate) repo: Arc<repo::Repo>,
    pub(crate) pieces: Arc<Pieces>,
    /// Hinted storages by (address, length): their dtype and cells.
    by_place: HashMap<(usize, usize), Hint>,
    /// Hinted tensors by length: their dtype and cells, `None` where two tensors of that length
    /// differ in either. For a write of a copy DCP made (a tensor on a GPU, or a view of a
    /// larger storage, is copied before `torch.save`), whose address no hint knows.
    by_len: HashMap<usize, Option<Hint>>,
}

/// What a write of a hinted tensor is taken to be.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Hint {
    dtype: Dtype,
    /// Where the file's cut will divide the tensor into cells ([`dcp::cell_cuts`]): byte
    /// offsets inside it, each cell stored as a piece of its own.
    cuts: Vec<u64>,
}

impl PieceSink {
    /// `hints`: `(storage, tensor length in bytes, torch dtype name, chunk)` of each tensor
    /// DCP is about to write, `chunk` being `(whole tensor's size, chunk offsets, chunk sizes)`
    /// when the tensor is a chunk of a tensor (for its cells, [`dcp::cell_cuts`]); each storage's
    /// address and length are asked of it here. A guess taken from them is checked against the
    /// file's cut when the file is stored.
    #[allow(clippy::type_complexity, reason = "the tuples Python hands over")]
    pub(crate) fn new(
        repo: Arc<repo::Repo>,
        hints: Vec<(Bound<'_, PyAny>, usize, String, Option<(Vec<u64>, Vec<u64>, Vec<u64>)>)>,
    ) -> PyResult<PieceSink> {
        let mut by_place = HashMap::new();
        let mut by_len: HashMap<usize, Option<Hint>> = HashMap::new();
        for (storage, tensor_len, dtype, chunk) in hints {
            let Some(dtype) = dcp::dtype_of_torch(&dtype) else { continue };
            let cuts = match chunk {
                Some((size, offsets, sizes)) => dcp::cell_cuts(&size, &offsets, &sizes, dtype.size() as u64),
                None => Vec::new(),
            };
            // Cuts past the tensor's length are no cuts of it (`cell_cuts` gives increasing ones).
            let fits = cuts.first().is_none_or(|&c| c > 0)
                && cuts.windows(2).all(|w| w[0] < w[1])
                && cuts.last().is_none_or(|&c| c < tensor_len as u64);
            let cuts = if fits { cuts } else { Vec::new() };
            let hint = Hint { dtype, cuts };
            let addr: usize = storage.call_method0("data_ptr")?.extract()?;
            let len: usize = storage.call_method0("nbytes")?.extract()?;
            if len >= repo::PIECE_MIN && addr != 0 {
                by_place.insert((addr, len), hint.clone());
            }
            if tensor_len >= repo::PIECE_MIN {
                let known = by_len.entry(tensor_len).or_insert(Some(hint.clone()));
                if known.as_ref() != Some(&hint) {
                    *known = None;
                }
            }
        }
        Ok(PieceSink { repo, pieces: Arc::new(Pieces::new()), by_place, by_len })
    }

    /// What a `write` of `len` bytes at `addr` is taken to be, if anything.
    fn guess(&self, addr: usize, len: usize) -> Option<&Hint> {
        self.by_place.get(&(addr, len)).or_else(|| self.by_len.get(&len).and_then(Option::as_ref))
    }
}

#[pymethods]
impl PieceSink {
    /// Stores `data` (any contiguous buffer), written at `offset` of `file`, as a piece if it
    /// is exactly one of the hinted storages, or as long as hinted tensors of one dtype;
    /// returns whether it did (`False`: the caller writes it into the file). Runs without the
    /// GIL, reading `data` in place.
    fn take(&self, py: Python<'_>, data: &Bound<'_, PyAny>, file: &str, offset: u64) -> PyResult<bool> {
        let Some(held) = HeldBuffer::of(data) else { return Ok(false) };
        let Some(hint) = self.guess(held.addr(), held.len()) else { return Ok(false) };
        let (repo, pieces) = (self.repo.clone(), self.pieces.clone());
        let pool = crate::child_pool()?;
        let stored = py.detach(|| {
            crate::in_pool(pool.as_deref(), || {
                // One piece per cell: the file's cut stores each cell as a segment of its own.
                let bytes = held.bytes();
                let ends = hint.cuts.iter().map(|&c| c as usize).filter(|&c| c < bytes.len()).chain([bytes.len()]);
                let mut at = 0;
                for end in ends {
                    repo.store_piece(&pieces, file, offset + at as u64, &bytes[at..end], hint.dtype)?;
                    at = end;
                }
                Ok::<(), repo::Error>(())
            })
        });
        drop(held);
        stored.map_err(crate::to_py)?;
        Ok(true)
    }

    /// How many pieces are stored and wait for their file to be stored.
    fn __len__(&self) -> usize {
        self.pieces.len()
    }
}
