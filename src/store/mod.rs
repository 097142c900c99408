//! The object store: immutable, content-addressed objects under `.ckpt/objects/`.
//!
//! Every object is one file `objects/ab/<62 more hex digits>` named by its [`ObjectId`], the
//! blake3 of its *logical* content (the raw tensor bytes of a blob, the JSON bytes of a manifest
//! or version). The file is a 72-byte [`ObjectHeader`] followed by a codec container
//! (docs/format.md, "Objects"). A blob may be an XOR delta against another blob; reading it
//! follows the chain and decodes chunk by chunk ([`BlobChain`]), so memory stays bounded.
//!
//! Objects appear atomically: written to `.ckpt/tmp/`, fsynced, renamed into place and the
//! directory fsynced, so a crash never leaves a partial object under its final name. A commit
//! hands these steps to syncing threads (`Store::with_background_sync`) and waits for them
//! before anything points to the new objects. Every read
//! checks what it reads and reports damage as [`Error::Corrupt`] naming the object; nothing here
//! panics on bad bytes. The store knows nothing of versions' meaning, refs or the index.

mod blob;
mod header;
mod import;

pub use blob::{
    BlobChain, BlobForm, BlobReader, ChainDecoder, DeltaOutcome, DerivedBlob, DerivedTarget, Feedback, SourceBytes,
};

pub use header::{ObjectHeader, ObjectKind, HEADER_LEN, MAX_CHAIN_DEPTH, OBJECT_FORMAT_VERSION, OBJECT_MAGIC};

use crate::codec::container::{Container, ContainerWriter, FileKind};
use crate::codec::{self, Options};
use crate::mmap::{self, Map};
use crate::object_id::ObjectId;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::SyncSender;
use std::sync::Mutex;

/// Largest manifest or version object a reader decodes into memory (its decoded length,
/// checked from the object's header before decoding). 256 MiB: a manifest of a million
/// segments with tensor names and blob ids is about 200 MB of JSON (docs/format.md, "Caps on
/// untrusted sizes").
pub const MAX_DATA_OBJECT_LEN: u64 = 256 << 20;

/// Most bytes a reader reserves up front for a decoded manifest or version: the length in the
/// header is the object's own claim, so beyond this the buffer grows only as bytes decode.
pub(crate) const PREALLOCATE_DATA_LEN: u64 = 16 << 20;

/// Errors of the object store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file system operation failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done ("reading", "renaming", ...).
        action: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// No object with this id is stored.
    #[error("object {id} is missing from the store")]
    Missing {
        /// The object asked for.
        id: ObjectId,
    },
    /// The object's bytes are damaged or inconsistent.
    #[error("object {id} is corrupt: {reason}")]
    Corrupt {
        /// The damaged object.
        id: ObjectId,
        /// What is wrong.
        reason: String,
    },
    /// The object exists but is of another kind than the caller needs.
    #[error("object {id} is a {found}, expected a {expected}")]
    WrongKind {
        /// The object.
        id: ObjectId,
        /// The kind the caller wanted.
        expected: ObjectKind,
        /// The kind stored.
        found: ObjectKind,
    },
    /// The data being stored changed while it was read (the bytes coded hash differently from
    /// the id, or from the xxh3 the caller took with it: `Feedback::input_xxh3`), typically a
    /// file rewritten during a commit. Nothing is stored.
    #[error("content of object {id} changed while it was being stored")]
    ChangedWhileWriting {
        /// The id computed before encoding.
        id: ObjectId,
    },
    /// Writing an object's decoded content to the caller's output failed.
    #[error("writing the content of object {id}: {source}")]
    Output {
        /// The object being read.
        id: ObjectId,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Encoding failed (bad options or a bug; not bad stored data).
    #[error("encoding object {id}: {source}")]
    Encode {
        /// The object being written.
        id: ObjectId,
        /// The codec's error.
        source: codec::Error,
    },
}

/// Shorthand for store results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn io<'p>(action: &'static str, path: &'p Path) -> impl FnOnce(std::io::Error) -> Error + 'p {
    move |source| Error::Io { action, path: path.to_path_buf(), source }
}

/// What a write produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    /// The object's id.
    pub id: ObjectId,
    /// The header written.
    pub header: ObjectHeader,
    /// Size of the object file.
    pub stored_len: u64,
}

/// An object file mapped into memory with its parsed header.
pub struct RawObject {
    /// The object's id.
    pub id: ObjectId,
    /// Its header.
    pub header: ObjectHeader,
    map: Map,
}

impl RawObject {
    /// Drops the object's mapped pages from the resident set (`mmap::Map::release`).
    pub(crate) fn release_pages(&self) {
        self.map.release(0..self.map.len());
    }

    /// The whole object file.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// The codec container after the header, opened and checked (header, index, footer).
    pub fn container(&self) -> Result<Container<'_>> {
        let c = Container::open(&self.map[HEADER_LEN..])
            .map_err(|e| Error::Corrupt { id: self.id, reason: e.to_string() })?;
        if c.segments().iter().any(|s| s.link.is_some()) {
            // Objects are read chunk by chunk across their chains: every chunk has a payload.
            return Err(Error::Corrupt { id: self.id, reason: "a container with reference segments".into() });
        }
        if c.original_len() != self.header.raw_len {
            return Err(Error::Corrupt {
                id: self.id,
                reason: format!("header says {} bytes, container holds {}", self.header.raw_len, c.original_len()),
            });
        }
        if ObjectId(*c.original_hash().as_bytes()) != self.id {
            return Err(Error::Corrupt {
                id: self.id,
                reason: format!("the file holds object {}", c.original_hash().to_hex()),
            });
        }
        Ok(c)
    }
}

/// The object store of one repository.
#[derive(Clone, Debug)]
pub struct Store {
    objects: PathBuf,
    tmp: PathBuf,
    /// Inside [`Store::with_background_sync`]: where written objects go to be made durable by
    /// the syncing threads. `None`: each write makes its object durable before it returns.
    background: Option<SyncSender<PendingObject>>,
}

/// An object fully written to its temp file, waiting for a syncing thread to make it durable
/// and move it into place.
#[derive(Debug)]
struct PendingObject {
    tmp: TempObject,
    id: ObjectId,
}

/// An object's temp file: still open after its write, or closed ([`UnsyncedBlob`], kept
/// without holding a descriptor while a save goes on).
#[derive(Debug)]
enum TempObject {
    Open(tempfile::NamedTempFile),
    Closed(tempfile::TempPath),
}

/// A blob written to a temp file in `tmp/`, not yet durable nor under its name: what
/// [`Store::write_blob_uncoded`] leaves for `Store::persist_unsynced`. Dropped, its temp file
/// is deleted.
#[derive(Debug)]
pub struct UnsyncedBlob {
    tmp: tempfile::TempPath,
    /// The object as it will be stored.
    pub written: Written,
}

impl UnsyncedBlob {
    /// The blob's content, decoded from its temp file and checked against its id.
    pub fn content(&self) -> Result<Vec<u8>> {
        let id = self.written.id;
        let bytes = std::fs::read(&self.tmp).map_err(io("reading", &self.tmp))?;
        let corrupt = |reason: String| Error::Corrupt { id, reason };
        let container = Container::open(bytes.get(HEADER_LEN..).unwrap_or_default())
            .map_err(|e| corrupt(format!("its temp file {}: {e}", self.tmp.display())))?;
        let mut out = vec![0; self.written.header.raw_len as usize];
        let hash = container.decode_into(&mut out).map_err(|e| corrupt(e.to_string()))?;
        if ObjectId(*hash.as_bytes()) != id {
            return Err(corrupt(format!("its temp file {} does not hash to it", self.tmp.display())));
        }
        Ok(out)
    }
}

/// Threads that fsync and rename objects in [`Store::with_background_sync`]. Several, because a
/// file system merges fsyncs that wait at the same time into one journal commit.
const SYNC_THREADS: usize = 4;

/// Objects waiting for a syncing thread at most; a writer blocks beyond (each holds a file open).
const SYNC_QUEUE: usize = 64;

impl Store {
    /// Creates `objects/` and `tmp/` under `dir` (the `.ckpt` directory) if needed and opens
    /// the store.
    pub fn init(dir: &Path) -> Result<Store> {
        let store = Store::at(dir);
        for d in [&store.objects, &store.tmp] {
            std::fs::create_dir_all(d).map_err(io("creating", d))?;
        }
        Ok(store)
    }

    /// Opens the store under `dir`, checking that `objects/` exists.
    pub fn open(dir: &Path) -> Result<Store> {
        let store = Store::at(dir);
        std::fs::metadata(&store.objects).map_err(io("opening the object store", &store.objects))?;
        std::fs::create_dir_all(&store.tmp).map_err(io("creating", &store.tmp))?;
        Ok(store)
    }

    fn at(dir: &Path) -> Store {
        Store { objects: dir.join("objects"), tmp: dir.join("tmp"), background: None }
    }

    /// Runs `f` with a view of the store whose object writes return before the object is
    /// durable: each object is still fsynced, renamed into place and its directory fsynced, the
    /// same steps as [`Store::write_data`] and the blob writes take on their own, but by
    /// `SYNC_THREADS` (4) threads while `f` goes on coding the next objects. On this project's
    /// test VM that took a 104-tensor commit from ~140–165 to ~100 ms (docs/BENCHMARKS.md).
    ///
    /// An object written through the view becomes visible under its name (to
    /// [`Store::contains`], [`Store::raw`], ...) only once synced: nothing may read an object
    /// it wrote inside `f`, and nothing may point to it (a version, a ref) before this returns.
    /// Returns once every object written inside is durable: `f`'s error if it failed, else the
    /// first sync error, else `f`'s value. `f` must not keep a clone of the view (the syncing
    /// threads end when the last one is dropped).
    pub(crate) fn with_background_sync<T, E: From<Error>>(
        &self,
        f: impl FnOnce(&Store) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        let (sender, receiver) = std::sync::mpsc::sync_channel::<PendingObject>(SYNC_QUEUE);
        let receiver = Mutex::new(receiver);
        let first_error: Mutex<Option<Error>> = Mutex::new(None);
        let result = std::thread::scope(|scope| {
            for _ in 0..SYNC_THREADS {
                scope.spawn(|| loop {
                    // The lock is held while waiting, so one thread waits and the others queue
                    // on the lock; it is released as soon as an object arrives.
                    let next = receiver.lock().unwrap_or_else(|e| e.into_inner()).recv();
                    let Ok(pending) = next else { break };
                    if let Err(e) = self.persist_temp(pending.tmp, &pending.id) {
                        first_error.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e);
                    }
                });
            }
            let view = Store { background: Some(sender), ..self.clone() };
            f(&view)
            // `view` and with it the last sender is dropped here, so the threads drain the
            // queue and end, and the scope joins them.
        });
        let sync_error = first_error.into_inner().unwrap_or_else(|e| e.into_inner());
        match (result, sync_error) {
            (Err(e), _) => Err(e),
            (Ok(_), Some(e)) => Err(e.into()),
            (Ok(value), None) => Ok(value),
        }
    }

    /// Where the object `id` lives.
    pub fn object_path(&self, id: &ObjectId) -> PathBuf {
        let hex = id.to_hex();
        self.objects.join(&hex[..2]).join(&hex[2..])
    }

    /// Whether an object file named `id` exists (its content is not checked).
    pub fn contains(&self, id: &ObjectId) -> bool {
        self.object_path(id).is_file()
    }

    /// Whether an object file named `id` exists; if it does, its modification time is set to
    /// now. A writer that finds the object it was about to write calls this instead of
    /// [`Store::contains`]: `gc` keeps unreferenced objects for a grace period counted from
    /// their mtime, so an object an in-flight save reuses (perhaps garbage of a failed earlier
    /// save) must look as young as the objects it writes (git "freshens" loose objects the same
    /// way). Renewing the time is best effort: an object whose time cannot be set is still there.
    pub fn contains_fresh(&self, id: &ObjectId) -> bool {
        let path = self.object_path(id);
        match File::open(&path) {
            Ok(f) => {
                let _ = f.set_modified(std::time::SystemTime::now());
                f.metadata().is_ok_and(|m| m.is_file())
            }
            Err(_) => false,
        }
    }

    /// How long ago object `id` was written (or last reused: [`Store::contains_fresh`]); zero
    /// for a time in the future.
    pub fn age(&self, id: &ObjectId) -> Result<std::time::Duration> {
        Ok(self.modified(id)?.elapsed().unwrap_or_default())
    }

    /// When object `id` was written (or last reused: [`Store::contains_fresh`]).
    pub fn modified(&self, id: &ObjectId) -> Result<std::time::SystemTime> {
        let path = self.object_path(id);
        match std::fs::metadata(&path).and_then(|m| m.modified()) {
            Ok(t) => Ok(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::Missing { id: *id }),
            Err(e) => Err(Error::Io { action: "reading the time of", path, source: e }),
        }
    }

    /// Size of the object file.
    pub fn stored_len(&self, id: &ObjectId) -> Result<u64> {
        let path = self.object_path(id);
        match std::fs::metadata(&path) {
            Ok(m) => Ok(m.len()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::Missing { id: *id }),
            Err(e) => Err(Error::Io { action: "reading", path, source: e }),
        }
    }

    /// Maps the object file and parses its header.
    pub fn raw(&self, id: &ObjectId) -> Result<RawObject> {
        let path = self.object_path(id);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Error::Missing { id: *id }),
            Err(e) => return Err(Error::Io { action: "opening", path, source: e }),
        };
        let map = mmap::map(&file).map_err(io("reading", &path))?;
        let header = ObjectHeader::decode(*id, &map)?;
        Ok(RawObject { id: *id, header, map })
    }

    /// Object `id` read from `path`, a copy outside the store that may hold only some of its
    /// bytes (a remote reader's partial copy: header, chunk index and the chunk payloads it
    /// fetched, the rest a hole): mapped, its header decoded. Containers opened on it check
    /// their index and footer as any; a payload that is not there fails its checksum.
    pub fn raw_at(id: &ObjectId, path: &Path) -> Result<RawObject> {
        let file = File::open(path).map_err(io("opening", path))?;
        let map = mmap::map(&file).map_err(io("reading", path))?;
        let header = ObjectHeader::decode(*id, &map)?;
        Ok(RawObject { id: *id, header, map })
    }

    /// Reads only the header of object `id`.
    pub fn header(&self, id: &ObjectId) -> Result<ObjectHeader> {
        use std::io::Read;
        let path = self.object_path(id);
        let mut file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Error::Missing { id: *id }),
            Err(e) => return Err(Error::Io { action: "opening", path, source: e }),
        };
        let mut buf = Vec::with_capacity(HEADER_LEN);
        (&mut file).take(HEADER_LEN as u64).read_to_end(&mut buf).map_err(io("reading", &path))?;
        ObjectHeader::decode(*id, &buf)
    }

    /// Stores `bytes` as a manifest or version (or an opaque blob) object, coded as plain
    /// bytes. An object already stored under the same id is replaced by an equivalent one.
    pub fn write_data(&self, kind: ObjectKind, bytes: &[u8], options: &Options) -> Result<Written> {
        let id = ObjectId::hash(bytes);
        let raw_len = bytes.len() as u64;
        let header = ObjectHeader { kind, dtype: None, reference: None, depth: 0, conversion: None, raw_len };
        let written = self.write_object(id, header, None, |out| {
            let encode = |e| Error::Encode { id, source: e };
            let mut w =
                ContainerWriter::new(out, FileKind::Bytes, bytes.len() as u64, options.clone()).map_err(encode)?;
            w.segment(bytes, None).map_err(encode)?;
            Ok(w.finish().map_err(encode)?.1)
        })?;
        Ok(written.expect("no size limit"))
    }

    /// Reads a manifest or version object (checking its kind), verified against its id.
    pub fn read_data(&self, id: &ObjectId, kind: ObjectKind) -> Result<Vec<u8>> {
        let raw = self.raw(id)?;
        if raw.header.kind != kind {
            return Err(Error::WrongKind { id: *id, expected: kind, found: raw.header.kind });
        }
        raw.header.check_data_len(id)?;
        let container = raw.container()?;
        let mut out = Vec::with_capacity(raw.header.raw_len.min(PREALLOCATE_DATA_LEN) as usize);
        container.decode_to(&mut out).map_err(|e| Error::Corrupt { id: *id, reason: e.to_string() })?;
        Ok(out)
    }

    /// Writes an object atomically: `encode` streams the container to a temp file, which is
    /// fsynced and renamed to the object's path; then the directory is fsynced. `encode` returns
    /// the blake3 of what it encoded, which must equal `id`. With `limit`, an object file of at
    /// least `limit` bytes is discarded instead and `None` returned.
    fn write_object(
        &self,
        id: ObjectId,
        header: ObjectHeader,
        limit: Option<u64>,
        encode: impl FnOnce(&mut dyn Write) -> Result<blake3::Hash>,
    ) -> Result<Option<Written>> {
        let Some((tmp, stored_len)) = self.write_temp_object(id, header, limit, encode)? else {
            return Ok(None);
        };
        self.make_durable(TempObject::Open(tmp), id)?;
        Ok(Some(Written { id, header, stored_len }))
    }

    /// Makes `blob` ([`Store::write_blob_uncoded`]) durable and moves it under its name, as
    /// any object write does: by the syncing threads inside [`Store::with_background_sync`],
    /// else before returning. An object of that id already in place is replaced by it (same
    /// content).
    pub(crate) fn persist_unsynced(&self, blob: UnsyncedBlob) -> Result<Written> {
        let UnsyncedBlob { tmp, written } = blob;
        self.make_durable(TempObject::Closed(tmp), written.id)?;
        Ok(written)
    }

    /// Hands the written temp object `id` to the syncing threads of a
    /// [`Store::with_background_sync`] view, or else makes it durable and moves it into place.
    fn make_durable(&self, tmp: TempObject, id: ObjectId) -> Result<()> {
        match &self.background {
            // The receivers live until every view is dropped, so a send fails only if all the
            // syncing threads died, which `persist` (returning errors, not panicking) rules out.
            Some(queue) => queue.send(PendingObject { tmp, id }).expect("the syncing threads outlive every view"),
            None => self.persist_temp(tmp, &id)?,
        }
        Ok(())
    }

    /// Writes object `id` (its header, then what `encode` writes, which must hash to `id`) to a
    /// temp file in `tmp/`, not stored; `None` if it takes `limit` bytes or more. Returns the
    /// temp file and its length.
    pub(super) fn write_temp_object(
        &self,
        id: ObjectId,
        header: ObjectHeader,
        limit: Option<u64>,
        encode: impl FnOnce(&mut dyn Write) -> Result<blake3::Hash>,
    ) -> Result<Option<(tempfile::NamedTempFile, u64)>> {
        let (tmp, stored_len, hash) = self.write_temp_hashed(header, encode)?;
        if ObjectId(*hash.as_bytes()) != id {
            return Err(Error::ChangedWhileWriting { id });
        }
        if limit.is_some_and(|l| stored_len >= l) {
            return Ok(None);
        }
        Ok(Some((tmp, stored_len)))
    }

    /// Writes an object (`header`, then what `encode` writes) to a temp file in `tmp/`; returns
    /// it with its length and the content hash `encode` returned (its id).
    pub(super) fn write_temp_hashed(
        &self,
        header: ObjectHeader,
        encode: impl FnOnce(&mut dyn Write) -> Result<blake3::Hash>,
    ) -> Result<(tempfile::NamedTempFile, u64, blake3::Hash)> {
        let tmp = self.temp_file()?;
        let mut w = BufWriter::with_capacity(1 << 20, EarlyWriteback::new(tmp.as_file()));
        w.write_all(&header.encode()).map_err(io("writing", tmp.path()))?;
        // The codec reports a failed write of its output as its own error; name the temp
        // file and keep the OS cause (a full disk must not read as a coding problem).
        let hash = encode(&mut w).map_err(|e| match e {
            Error::Encode { source: codec::Error::Io { source, .. }, .. } => {
                Error::Io { action: "writing", path: tmp.path().to_path_buf(), source }
            }
            other => other,
        })?;
        w.flush().map_err(io("writing", tmp.path()))?;
        drop(w);
        let stored_len = tmp.as_file().metadata().map_err(io("writing", tmp.path()))?.len();
        Ok((tmp, stored_len, hash))
    }

    pub(crate) fn temp_file(&self) -> Result<tempfile::NamedTempFile> {
        tempfile::Builder::new().prefix("obj-").tempfile_in(&self.tmp).map_err(io("creating a file in", &self.tmp))
    }

    /// fsync, rename into place, fsync the directory (and the fan-out directory's parent when
    /// the fan-out directory is new).
    fn persist(&self, tmp: tempfile::NamedTempFile, id: &ObjectId) -> Result<()> {
        self.persist_temp(TempObject::Open(tmp), id)
    }

    /// [`Self::persist`] of an open or closed temp file.
    fn persist_temp(&self, tmp: TempObject, id: &ObjectId) -> Result<()> {
        let path = self.object_path(id);
        let dir = path.parent().expect("objects/ab/...");
        let make_dir = || -> Result<()> {
            if !dir.is_dir() {
                std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
                sync_dir(&self.objects)?;
            }
            Ok(())
        };
        let renamed = |e: std::io::Error| Error::Io { action: "renaming an object to", path: path.clone(), source: e };
        match tmp {
            TempObject::Open(tmp) => {
                tmp.as_file().sync_all().map_err(io("syncing", tmp.path()))?;
                make_dir()?;
                tmp.persist(&path).map_err(|e| renamed(e.error))?;
            }
            TempObject::Closed(tmp) => {
                File::open(&tmp).and_then(|f| f.sync_all()).map_err(io("syncing", &tmp))?;
                make_dir()?;
                tmp.persist(&path).map_err(|e| renamed(e.error))?;
            }
        }
        sync_dir(dir)
    }

    /// Every object id in the store, sorted. Files that are not named like objects are skipped.
    pub fn list(&self) -> Result<Vec<ObjectId>> {
        let mut ids = Vec::new();
        for fan in std::fs::read_dir(&self.objects).map_err(io("listing", &self.objects))? {
            let fan = fan.map_err(io("listing", &self.objects))?;
            let prefix = fan.file_name();
            let Some(prefix) = prefix.to_str().filter(|p| p.len() == 2) else { continue };
            if !fan.path().is_dir() {
                continue;
            }
            for entry in std::fs::read_dir(fan.path()).map_err(io("listing", &fan.path()))? {
                let entry = entry.map_err(io("listing", &fan.path()))?;
                let name = entry.file_name();
                let Some(rest) = name.to_str().filter(|n| n.len() == 62) else { continue };
                if let Ok(id) = format!("{prefix}{rest}").parse::<ObjectId>() {
                    if id.to_hex() == format!("{prefix}{rest}") {
                        ids.push(id);
                    }
                }
            }
        }
        ids.sort();
        Ok(ids)
    }

    /// Deletes object `id` (missing is fine).
    pub fn remove(&self, id: &ObjectId) -> Result<()> {
        let path = self.object_path(id);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::Io { action: "deleting", path, source: e }),
        }
    }

    /// Deletes leftover temp files (from interrupted writes) untouched for at least `older_than`.
    /// Callers hold the repository's writer lock, which keeps out every writer but those that
    /// store objects without it (the ranks of a distributed save): a temp file younger than
    /// `older_than` may be one of theirs, still being written. Returns how many were deleted.
    pub(crate) fn clean_tmp(&self, older_than: std::time::Duration) -> Result<usize> {
        let mut n = 0;
        for entry in std::fs::read_dir(&self.tmp).map_err(io("listing", &self.tmp))? {
            let entry = entry.map_err(io("listing", &self.tmp))?;
            let path = entry.path();
            let age = entry.metadata().and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
            if path.is_file() && age.is_some_and(|a| a >= older_than) {
                std::fs::remove_file(&path).map_err(io("deleting", &path))?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Fully checks object `id`: header, container, decoding (following a delta chain) and the
    /// hash of the result, which must be `id`.
    pub fn verify(&self, id: &ObjectId) -> Result<ObjectHeader> {
        let raw = self.raw(id)?;
        match raw.header.kind {
            ObjectKind::Blob => {
                let chain = self.open_blob(id)?;
                chain.copy_to(&mut std::io::sink())?;
            }
            kind => {
                self.read_data(id, kind)?;
            }
        }
        Ok(raw.header)
    }
}

/// fsyncs a directory so a rename inside it is durable.
fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io("syncing", dir))
}

/// Bytes of an object written between two writeback requests.
const WRITEBACK_STEP: u64 = 8 << 20;

/// Writes an object's temp file and asks the kernel to start writing it back to disk every
/// [`WRITEBACK_STEP`] bytes (`sync_file_range(SYNC_FILE_RANGE_WRITE)`, asynchronous). Without
/// it the whole object is still dirty when `persist` fsyncs it, and the commit waits for all of
/// it with its cores idle; with it the fsync finds only the tail left. The requests are hints:
/// errors are ignored here, and the fsync still reports any real one.
struct EarlyWriteback<'a> {
    file: &'a File,
    written: u64,
    requested: u64,
}

impl<'a> EarlyWriteback<'a> {
    fn new(file: &'a File) -> Self {
        EarlyWriteback { file, written: 0, requested: 0 }
    }
}

impl EarlyWriteback<'_> {
    /// Asks the kernel to start writing back what was written since the last request.
    fn request_writeback(&mut self) {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            let (offset, len) = (self.requested as libc::off64_t, (self.written - self.requested) as libc::off64_t);
            // SAFETY: a plain syscall on an open descriptor owned by `self.file`, with no
            // pointers; it only schedules writeback of already-written pages.
            #[allow(unsafe_code)]
            unsafe {
                libc::sync_file_range(self.file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE);
            }
        }
        self.requested = self.written;
    }
}

impl Write for EarlyWriteback<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written += n as u64;
        if self.written - self.requested >= WRITEBACK_STEP {
            self.request_writeback();
        }
        Ok(n)
    }

    /// Called once the object is written: the tail's writeback starts too, so an fsync that
    /// comes later (a piece of a save is synced only when its file is stored) finds it done.
    fn flush(&mut self) -> std::io::Result<()> {
        if self.written > self.requested {
            self.request_writeback();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
