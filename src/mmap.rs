//! Read-only memory maps of files: the one place ckpt uses `unsafe`.
//!
//! Inputs (checkpoints being committed) and stored objects are mapped instead of read, so a
//! multi-gigabyte file never needs a heap copy. Empty files cannot be mapped, so they come back
//! as an empty [`Map`].

use std::fs::File;
use std::ops::Deref;

/// A read-only view of a whole file: a memory map, or nothing for an empty file.
pub struct Map(Option<memmap2::Mmap>);

impl Deref for Map {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.0.as_deref().unwrap_or(&[])
    }
}

impl Map {
    /// Tells the kernel this process is done with `range` for now, so its pages leave the
    /// process's resident set (they stay in the page cache and are read again if touched).
    /// Committing a multi-GB checkpoint would otherwise keep every page of it resident.
    /// Best effort: errors are ignored.
    pub fn release(&self, range: std::ops::Range<usize>) {
        let Some(map) = &self.0 else { return };
        let page = 4096;
        let start = range.start.min(map.len()) / page * page;
        let end = range.end.min(map.len());
        if end <= start {
            return;
        }
        // SAFETY: the mapping is a read-only MAP_SHARED map of a regular file (memmap2's
        // `Mmap::map`). MADV_DONTNEED on such a mapping only drops page-table entries; a later
        // access faults the file's pages in again with the same content, so no reference into
        // the map observes freed or changed memory. The range is within the map.
        #[allow(unsafe_code)]
        let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start) };
    }
}

impl AsRef<[u8]> for Map {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

/// Maps `file` read-only.
pub fn map(file: &File) -> std::io::Result<Map> {
    if file.metadata()?.len() == 0 {
        return Ok(Map(None));
    }
    // SAFETY: the map is read-only and ckpt never writes to a file it has mapped (objects are
    // immutable once renamed into place; inputs are only read). Another process truncating or
    // rewriting the file while it is mapped can change what we read (or, for truncation, raise
    // SIGBUS), the usual caveat of every mmap-based reader; it cannot make the slice dangle.
    // Everything read through a map is hash-verified before it is trusted.
    #[allow(unsafe_code)]
    let map = unsafe { memmap2::Mmap::map(file)? };
    Ok(Map(Some(map)))
}
