//! Read-only memory maps of files: the one place ckpt uses `unsafe`.
//!
//! Inputs (checkpoints being committed) and stored objects are mapped instead of read, so a
//! multi-gigabyte file never needs a heap copy. Empty files cannot be mapped, so they come back
//! as an empty [`Map`].
//!
//! **Inputs that shrink.** Reading a page of a mapping that lies past the end of its file raises
//! SIGBUS, which kills the process. A training loop that rewrites its checkpoint in place
//! (`open(O_TRUNC)`, then write) while `ckpt commit`, `status` or `compress` reads it does exactly
//! that. Maps of inputs ([`map_input`]) are therefore *guarded*: their address ranges are
//! registered, and a SIGBUS handler installed on first use maps anonymous zero pages over the
//! rest of a guarded map from the faulting page on, marks the map truncated
//! ([`Map::truncated`]) and returns, so the read continues (with zeros). The caller checks the
//! mark, and the file's size and mtime ([`FileStamp`]), once it has read everything and fails
//! with "changed while being read" instead of storing what it saw. A SIGBUS anywhere else goes to
//! the handler that was there before (or kills the process as it would have).
//!
//! Why a handler rather than reading inputs with `pread`: the commit pipeline, the codec and the
//! hashing read inputs as one `&[u8]` (hash, split into stripes, code in place without a copy;
//! docs/architecture.md, "Memory"); replacing that with buffered reads would add a copy of every
//! byte and touch every stage. Why by hand: no crate on crates.io does this (memmap2 documents
//! SIGBUS as the caller's problem; the `signal-hook` family forbids handlers that do anything but
//! set flags, and its `register_sigaction` would still leave the fault-and-resume logic to us).
//! Stored objects are not guarded: they are immutable and ckpt never truncates them.

use std::fs::File;
use std::ops::Deref;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

/// A read-only view of a whole file: a memory map, or nothing for an empty file.
pub struct Map {
    map: Option<memmap2::Mmap>,
    /// The guard slot of a map made by [`map_input`].
    guard: Option<&'static Slot>,
}

impl Deref for Map {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

impl Map {
    /// Tells the kernel this process is done with `range` for now, so its pages leave the
    /// process's resident set (they stay in the page cache and are read again if touched).
    /// Committing a multi-GB checkpoint would otherwise keep every page of it resident.
    /// Best effort: errors are ignored.
    pub fn release(&self, range: std::ops::Range<usize>) {
        let Some(map) = &self.map else { return };
        let page = 4096;
        let start = range.start.min(map.len()) / page * page;
        let end = range.end.min(map.len());
        if end <= start {
            return;
        }
        // SAFETY: the mapping is a read-only MAP_SHARED map of a regular file (memmap2's
        // `Mmap::map`). MADV_DONTNEED on such a mapping only drops page-table entries; a later
        // access faults the file's pages in again with the same content, so no reference into
        // the map observes freed or changed memory. (Pages the SIGBUS handler replaced are
        // private anonymous ones: dropping them makes them read as zeros again, as before.) The
        // range is within the map.
        #[allow(unsafe_code)]
        let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start) };
    }

    /// Whether a read of this map went past the end of its file (the file shrank after it was
    /// mapped) and read zeros instead. Only maps made by [`map_input`] can tell; a file that
    /// shrank within its last page, or changed without shrinking, is caught by [`FileStamp`].
    pub fn truncated(&self) -> bool {
        self.guard.is_some_and(|slot| slot.truncated.load(Ordering::Acquire))
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // Unregistered before memmap2 unmaps the range (the fields drop after this body): no
        // thread can read the map any more (we have it by `&mut`), and a later map at the same
        // addresses must not be mistaken for this one.
        if let Some(slot) = self.guard.take() {
            slot.len.store(0, Ordering::Release);
            slot.truncated.store(false, Ordering::Release);
            slot.start.store(0, Ordering::Release);
        }
    }
}

impl AsRef<[u8]> for Map {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

/// Maps `file` read-only, unguarded: for stored objects, which nothing truncates.
pub fn map(file: &File) -> std::io::Result<Map> {
    if file.metadata()?.len() == 0 {
        return Ok(Map { map: None, guard: None });
    }
    // SAFETY: the map is read-only and ckpt never writes to a file it has mapped (objects are
    // immutable once renamed into place; inputs are only read). Another process rewriting the
    // file while it is mapped can change what we read; truncation would raise SIGBUS, which is
    // why inputs are mapped with `map_input`. It cannot make the slice dangle. Everything read
    // through a map is hash-verified before it is trusted.
    #[allow(unsafe_code)]
    let map = unsafe { memmap2::Mmap::map(file)? };
    Ok(Map { map: Some(map), guard: None })
}

/// Maps an input file (a checkpoint being committed, hashed or compressed) read-only, guarded
/// against the file shrinking meanwhile: a read past its new end gives zeros and sets
/// [`Map::truncated`] instead of killing the process with SIGBUS.
pub(crate) fn map_input(file: &File) -> std::io::Result<Map> {
    let mut map = map(file)?;
    if let Some(m) = &map.map {
        install_handler()?;
        map.guard = Some(register(m.as_ptr() as usize, m.len()));
    }
    Ok(map)
}

/// Opens `path` for reading if it is a regular file (following symlinks), and fails with an
/// error of kind `InvalidInput` saying what it is otherwise. A named pipe is opened without
/// waiting for a writer (`O_NONBLOCK`), so it is refused instead of blocking forever; the type is
/// checked on the open descriptor, so a file swapped for a pipe after a first look cannot block
/// either. (`O_NONBLOCK` does not change reads of regular files.)
pub(crate) fn open_regular(path: &Path) -> std::io::Result<File> {
    open_regular_file(path, true)
}

/// [`open_regular`], except that a symbolic link is refused too (`O_NOFOLLOW`): for a tree whose
/// every entry must be a file of its own, such as a directory remote, where a link could stand
/// for `/dev/zero` or a file outside it.
pub(crate) fn open_regular_no_follow(path: &Path) -> std::io::Result<File> {
    open_regular_file(path, false)
}

fn open_regular_file(path: &Path, follow: bool) -> std::io::Result<File> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let what = |t: std::fs::FileType| {
        if t.is_fifo() {
            "a named pipe, a FIFO"
        } else if t.is_socket() {
            "a socket"
        } else if t.is_block_device() || t.is_char_device() {
            "a device"
        } else if t.is_dir() {
            "a directory"
        } else if t.is_symlink() {
            "a symbolic link"
        } else {
            "not a regular file"
        }
    };
    let refuse = |t| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("not a regular file ({})", what(t)));
    // First by name: a socket cannot be opened at all, and this names it.
    let meta = if follow { std::fs::metadata(path)? } else { std::fs::symlink_metadata(path)? };
    if !meta.is_file() {
        return Err(refuse(meta.file_type()));
    }
    let flags = if follow { libc::O_NONBLOCK } else { libc::O_NONBLOCK | libc::O_NOFOLLOW };
    let file = match File::options().read(true).custom_flags(flags).open(path) {
        // Swapped for a link since the first look.
        Err(e) if !follow && e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(refuse(std::fs::symlink_metadata(path)?.file_type()))
        }
        r => r?,
    };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(refuse(meta.file_type()));
    }
    Ok(file)
}

/// What the file's metadata said when it was opened: compared with the metadata once reading is
/// done, to tell that the file changed meanwhile (a rewrite that keeps the size changes the
/// mtime).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStamp {
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileStamp {
    /// The stamp of `meta`.
    pub fn of(meta: &std::fs::Metadata) -> FileStamp {
        use std::os::unix::fs::MetadataExt;
        FileStamp {
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// Whether `file` (the same open file) and `map` (its map) show a change since this stamp
    /// was taken: a read past the end, or other size or times now. An error reading the
    /// metadata counts as a change.
    pub fn changed(&self, file: &File, map: &Map) -> bool {
        map.truncated() || file.metadata().map_or(true, |m| FileStamp::of(&m) != *self)
    }
}

/// A file mapped read-only for reading as one `&[u8]` (dereferences to its bytes), guarded
/// against it shrinking meanwhile: a read past its new end gives zeros instead of killing the
/// process. Call [`MappedFile::changed`] once everything is read, before trusting what was read.
pub struct MappedFile {
    map: Map,
    file: File,
    stamp: FileStamp,
}

/// Why [`MappedFile::open`] failed.
#[derive(Debug, thiserror::Error)]
pub enum MappedFileError {
    /// The file cannot be opened, or is not a regular file (a named pipe would block).
    #[error("opening {}", path.display())]
    Open {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Its metadata cannot be read, or it cannot be mapped.
    #[error("reading {}", path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

impl MappedFile {
    /// Maps the whole file at `path`; refuses anything but a regular file without waiting.
    pub fn open(path: &Path) -> Result<MappedFile, MappedFileError> {
        let file = open_regular(path).map_err(|source| MappedFileError::Open { path: path.to_path_buf(), source })?;
        let read = |source| MappedFileError::Read { path: path.to_path_buf(), source };
        let meta = file.metadata().map_err(read)?;
        let map = map_input(&file).map_err(read)?;
        Ok(MappedFile { map, file, stamp: FileStamp::of(&meta) })
    }

    /// Whether the file changed (shrank, or was rewritten) since it was mapped: what was read
    /// may then be a mix of two versions, or zeros where the file ended.
    pub fn changed(&self) -> bool {
        self.stamp.changed(&self.file, &self.map)
    }
}

impl Deref for MappedFile {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map
    }
}

// ---- The guard: registered ranges and the SIGBUS handler ----

/// One registered map: `start == 0` means free. `len` is set after `start` and cleared first, so
/// the handler never sees a half-registered range as covering an address.
struct Slot {
    start: AtomicUsize,
    len: AtomicUsize,
    truncated: AtomicBool,
}

/// Slots are handed out from a list of blocks that only grows (blocks are leaked), so the handler
/// can walk it without locks or allocation while other threads register maps.
const SLOTS_PER_BLOCK: usize = 64;

struct Block {
    slots: [Slot; SLOTS_PER_BLOCK],
    next: AtomicPtr<Block>,
}

static BLOCKS: AtomicPtr<Block> = AtomicPtr::new(std::ptr::null_mut());

/// The blocks of the registry, newest first.
fn blocks() -> impl Iterator<Item = &'static Block> {
    let mut next = BLOCKS.load(Ordering::Acquire);
    std::iter::from_fn(move || {
        // SAFETY: every pointer in the list comes from `Box::leak` in `register` and is never
        // freed, so it stays valid for the life of the process; blocks are published with
        // Release after they are fully initialized.
        #[allow(unsafe_code)]
        let block = unsafe { next.as_ref()? };
        next = block.next.load(Ordering::Acquire);
        Some(block)
    })
}

/// Registers `len` bytes at `start` (non-zero) and returns its slot.
fn register(start: usize, len: usize) -> &'static Slot {
    loop {
        for block in blocks() {
            for slot in &block.slots {
                if slot.start.compare_exchange(0, start, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                    slot.truncated.store(false, Ordering::Release);
                    slot.len.store(len, Ordering::Release);
                    return slot;
                }
            }
        }
        // Every slot taken: one more block (maps live as long as an operation, so the registry
        // stays as large as the most files one operation maps at once).
        let block: &'static Block = Box::leak(Box::new(Block {
            slots: std::array::from_fn(|_| Slot {
                start: AtomicUsize::new(0),
                len: AtomicUsize::new(0),
                truncated: AtomicBool::new(false),
            }),
            next: AtomicPtr::new(BLOCKS.load(Ordering::Acquire)),
        }));
        let ptr = block as *const Block as *mut Block;
        let mut head = block.next.load(Ordering::Relaxed);
        while let Err(now) = BLOCKS.compare_exchange(head, ptr, Ordering::AcqRel, Ordering::Acquire) {
            head = now;
            block.next.store(head, Ordering::Release);
        }
    }
}

/// The registered slot whose range holds `addr`.
fn slot_of(addr: usize) -> Option<&'static Slot> {
    blocks().flat_map(|b| b.slots.iter()).find(|s| {
        let start = s.start.load(Ordering::Acquire);
        let len = s.len.load(Ordering::Acquire);
        start != 0 && addr >= start && addr - start < len
    })
}

/// The page size, read once when the handler is installed.
static PAGE: AtomicUsize = AtomicUsize::new(4096);

/// The SIGBUS action in place before ours, called for faults outside guarded maps.
static PREVIOUS: std::sync::OnceLock<libc::sigaction> = std::sync::OnceLock::new();

/// Installs the SIGBUS handler once per process.
fn install_handler() -> std::io::Result<()> {
    static INSTALLED: std::sync::OnceLock<Result<(), i32>> = std::sync::OnceLock::new();
    let result = INSTALLED.get_or_init(|| {
        #[allow(unsafe_code)]
        // SAFETY: sysconf and sigaction are called with valid arguments: a zeroed sigaction is a
        // valid value to fill in, `sa_mask` is initialized by sigemptyset, and the handler has
        // the signature SA_SIGINFO requires. The previous action is saved before ours can run.
        unsafe {
            let page = libc::sysconf(libc::_SC_PAGESIZE);
            if page > 0 {
                PAGE.store(page as usize, Ordering::Relaxed);
            }
            let mut previous: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) != 0 {
                return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
            }
            let _ = PREVIOUS.set(previous);
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as *const () as usize;
            // SA_ONSTACK: run on the thread's alternate stack when it has one (Rust's threads do).
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
            }
        }
        Ok(())
    });
    (*result).map_err(std::io::Error::from_raw_os_error)
}

/// The SIGBUS handler. Only async-signal-safe work: atomic loads and stores over the registry,
/// and the mmap, sigaction and raise system calls.
extern "C" fn on_sigbus(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler; si_addr is the
    // faulting address for SIGBUS.
    #[allow(unsafe_code)]
    let addr = unsafe { (*info).si_addr() } as usize;
    if let Some(slot) = slot_of(addr) {
        let page = PAGE.load(Ordering::Relaxed);
        let from = addr & !(page - 1);
        let end = (slot.start.load(Ordering::Acquire) + slot.len.load(Ordering::Acquire)).next_multiple_of(page);
        // SAFETY: [from, end) lies inside a live read-only mapping of ours (the slot is
        // registered for as long as the memmap2 map exists, and `from` is at or after its
        // page-aligned start). MAP_FIXED replaces those pages with private zero pages: the
        // faulting read then completes with zeros, and every reference into the map stays
        // valid (same addresses, still readable). memmap2 unmaps the whole range later, these
        // pages included. mmap is a plain system call on Linux, safe in a signal handler.
        #[allow(unsafe_code)]
        let mapped = unsafe {
            libc::mmap(
                from as *mut libc::c_void,
                end - from,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if mapped != libc::MAP_FAILED {
            slot.truncated.store(true, Ordering::Release);
            return;
        }
    }
    // Not ours: what would have happened without us.
    // SAFETY: the previous action was saved by sigaction itself; calling its handler with the
    // arguments we were given is what the kernel would have done. Restoring the default action
    // and raising again ends the process with SIGBUS as before (the signal is blocked while we
    // run, and delivered when we return; a fault re-executes and faults again).
    #[allow(unsafe_code)]
    unsafe {
        if let Some(previous) = PREVIOUS.get() {
            let handler = previous.sa_sigaction;
            if handler != libc::SIG_DFL && handler != libc::SIG_IGN {
                if previous.sa_flags & libc::SA_SIGINFO != 0 {
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                        std::mem::transmute(handler);
                    f(signal, info, context);
                } else {
                    let f: extern "C" fn(libc::c_int) = std::mem::transmute(handler);
                    f(signal);
                }
                return;
            }
        }
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(libc::SIGBUS, &default, std::ptr::null_mut());
        libc::raise(signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_guarded_map_of_a_file_that_shrinks_reads_zeros_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 5 * 4096]).unwrap();
        let file = open_regular(&path).unwrap();
        let stamp = FileStamp::of(&file.metadata().unwrap());
        let map = map_input(&file).unwrap();
        assert_eq!(map[3 * 4096], 7);
        assert!(!map.truncated() && !stamp.changed(&file, &map));
        // Truncated by another writer (same inode), as a training loop's O_TRUNC does.
        std::fs::File::options().write(true).open(&path).unwrap().set_len(4096).unwrap();
        let sum: u64 = map.iter().map(|&b| b as u64).sum();
        assert_eq!(sum, 7 * 4096, "the first page is still the file's; the rest reads as zeros");
        assert!(map.truncated() && stamp.changed(&file, &map));
        drop(map);
        // A new map at possibly the same addresses starts clean.
        std::fs::File::options().append(true).open(&path).unwrap().write_all(&[1; 4096]).unwrap();
        let map = map_input(&file).unwrap();
        assert_eq!(map.len(), 2 * 4096);
        assert!(!map.truncated());
    }

    #[test]
    fn many_guarded_maps_at_once_get_slots_of_their_own() {
        let dir = tempfile::tempdir().unwrap();
        let maps: Vec<(File, Map)> = (0..3 * SLOTS_PER_BLOCK)
            .map(|i| {
                let path = dir.path().join(format!("f{i}"));
                std::fs::write(&path, vec![1u8; 8192]).unwrap();
                let file = open_regular(&path).unwrap();
                let map = map_input(&file).unwrap();
                (file, map)
            })
            .collect();
        let victim = dir.path().join(format!("f{}", SLOTS_PER_BLOCK + 5));
        std::fs::File::options().write(true).open(&victim).unwrap().set_len(0).unwrap();
        for (i, (_, map)) in maps.iter().enumerate() {
            assert_eq!(map.iter().map(|&b| b as usize).sum::<usize>(), if i == SLOTS_PER_BLOCK + 5 { 0 } else { 8192 });
            assert_eq!(map.truncated(), i == SLOTS_PER_BLOCK + 5);
        }
    }

    #[test]
    fn non_regular_files_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        #[allow(unsafe_code)]
        let made = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
        assert_eq!(made, 0);
        let err = open_regular(&fifo).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("named pipe"), "{err}");
        assert!(open_regular(Path::new("/dev/null")).unwrap_err().to_string().contains("device"));
        assert!(open_regular(dir.path()).unwrap_err().to_string().contains("directory"));

        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(open_regular(&link).is_ok(), "a link to a file is followed");
        assert!(open_regular_no_follow(&file).is_ok());
        let err = open_regular_no_follow(&link).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert!(open_regular_no_follow(&fifo).unwrap_err().to_string().contains("named pipe"));
    }
}
