//! Chunks of a remote blob without the whole blob: partial copies of a remote's objects in a
//! reader's cache, filled by ranged reads ([`Remote::read_range`]) with what a request needs
//! and decoded with the store's own container and chain code ([`Store::open_blob_with`]).
//!
//! A partial copy is a file of the object's size on the remote (`<dir>/<id hex>`, sparse: what
//! was not fetched is a hole) beside a list of the byte ranges it holds (`<id hex>.have`, one
//! `START END` line per range, appended after the bytes are written). It holds the object's
//! header, its container's header, its chunk index and footer, and the payloads of the chunks
//! fetched so far: the container opens as any (its index and footer checksummed, its recorded
//! hash compared with the object's id, so another valid blob in its place is refused), and each
//! payload decoded is checked against the checksum the index records. A hole is never decoded:
//! chunks are fetched before they are read. A later read of the same chunks sends nothing.
//!
//! It must not decide which blobs or chunks a request needs: that is `reader.rs`.

use super::{Error, Result};
use crate::codec::container::{self, Container, FOOTER_LEN};
use crate::object_id::ObjectId;
use crate::remote::{self, Remote};
use crate::store::{ObjectHeader, ObjectKind, RawObject, Store, HEADER_LEN};
use std::io::Write;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Bytes of an object's end read with its footer in one request, in the hope that its chunk
/// index lies inside (an index takes 18 bytes a chunk for bf16: 220 chunks fit).
const TAIL_GUESS: u64 = 4 << 10;

/// The bytes of an object's header and its container's fixed header.
const HEAD_LEN: u64 = (HEADER_LEN + container::HEADER_LEN) as u64;

/// Partial copies of a remote's objects in one directory.
#[derive(Debug)]
pub(super) struct PartialCopies {
    dir: PathBuf,
}

fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |source| Error::Io { action, path: path.to_path_buf(), source }
}

impl PartialCopies {
    /// The partial copies in `dir` (created when the first is made).
    pub(super) fn new(dir: PathBuf) -> PartialCopies {
        PartialCopies { dir }
    }

    fn path(&self, id: &ObjectId) -> PathBuf {
        self.dir.join(id.to_hex())
    }

    fn have_path(&self, id: &ObjectId) -> PathBuf {
        self.dir.join(format!("{}.have", id.to_hex()))
    }

    /// The ranges the copy of `id` holds (none if there is no copy, or its list does not
    /// parse: then it is started again).
    fn have(&self, id: &ObjectId) -> Vec<Range<u64>> {
        let Ok(text) = std::fs::read_to_string(self.have_path(id)) else { return Vec::new() };
        let parse = |line: &str| -> Option<Range<u64>> {
            let (a, b) = line.split_once(' ')?;
            let (a, b) = (a.parse().ok()?, b.parse().ok()?);
            (a <= b).then_some(a..b)
        };
        text.lines().map(parse).collect::<Option<Vec<_>>>().unwrap_or_default()
    }

    /// Deletes the copy of `id` (it is damaged, or the whole object is stored now).
    pub(super) fn forget(&self, id: &ObjectId) {
        let _ = std::fs::remove_file(self.have_path(id));
        let _ = std::fs::remove_file(self.path(id));
    }

    /// The copy of `id` as the store's code reads objects.
    pub(super) fn raw(&self, id: &ObjectId) -> crate::store::Result<RawObject> {
        Store::raw_at(id, &self.path(id))
    }

    /// The header of remote blob `id`, with its copy started if there is none: the object's
    /// and its container's headers, then its chunk index and footer (two or three ranged
    /// reads). The object's size on the remote must be what its header allows, and `raw_len`,
    /// when given, the blob's length (its manifest's word): a blob of another length is refused
    /// before its index is read.
    pub(super) fn start(&self, remote: &dyn Remote, id: &ObjectId, raw_len: Option<u64>) -> Result<ObjectHeader> {
        let have = self.have(id);
        if have.iter().any(|r| r.start == 0 && r.end >= HEAD_LEN) {
            let header = self.raw(id)?.header;
            check_blob(id, &header, raw_len)?;
            return Ok(header);
        }
        let key = remote::object_key(id);
        let (head, size) = remote.read_head(&key, HEAD_LEN)?;
        let header = ObjectHeader::decode(*id, &head)?;
        check_blob(id, &header, raw_len)?;
        let corrupt = |reason: String| Error::from(crate::store::Error::Corrupt { id: *id, reason });
        if size > header.max_stored_len() || size < HEAD_LEN + FOOTER_LEN as u64 || (head.len() as u64) < HEAD_LEN {
            return Err(corrupt(format!("{size} bytes on {}, not what its header allows", remote.url())));
        }
        let tail_start = size.saturating_sub(TAIL_GUESS).max(HEAD_LEN);
        let mut tail = read_range(remote, &key, tail_start..size)?;
        let footer = tail.get(tail.len().saturating_sub(FOOTER_LEN)..).unwrap_or_default();
        let index = Container::tail_range(footer, size - HEADER_LEN as u64).map_err(|e| corrupt(e.to_string()))?;
        let index_start = index.start + HEADER_LEN as u64;
        // The index of a blob of `raw_len` bytes is never longer than `max_len` allows.
        if size - index_start > container::max_len(header.raw_len).saturating_sub(header.raw_len) {
            return Err(corrupt(format!("a chunk index of {} bytes", size - index_start)));
        }
        if index_start < tail_start {
            let mut before = read_range(remote, &key, index_start..tail_start)?;
            before.append(&mut tail);
            tail = before;
        }
        std::fs::create_dir_all(&self.dir).map_err(io("creating", &self.dir))?;
        self.forget(id);
        let path = self.path(id);
        let file = std::fs::File::create(&path).map_err(io("creating", &path))?;
        file.set_len(size).map_err(io("writing", &path))?;
        let tail_from = index_start.min(tail_start);
        self.put(id, &file, 0, &head)?;
        self.put(id, &file, tail_from, &tail)?;
        Ok(header)
    }

    /// Writes `bytes` at `at` in the copy of `id` (its open file `file`), then notes the range.
    fn put(&self, id: &ObjectId, file: &std::fs::File, at: u64, bytes: &[u8]) -> Result<()> {
        let path = self.path(id);
        file.write_all_at(bytes, at).map_err(io("writing", &path))?;
        let have = self.have_path(id);
        let mut list =
            std::fs::OpenOptions::new().create(true).append(true).open(&have).map_err(io("writing", &have))?;
        writeln!(list, "{} {}", at, at + bytes.len() as u64).map_err(io("writing", &have))
    }

    /// The container of the copy of `id` (started), its chunk size and chunk count.
    pub(super) fn layout(&self, id: &ObjectId) -> Result<(usize, usize)> {
        let raw = self.raw(id)?;
        let c = raw.container()?;
        Ok((c.chunk_size(), c.chunk_count()))
    }

    /// Fetches the payloads of chunks `chunks` of the copy of `id` (started) that it lacks:
    /// one ranged read of what is missing. Returns the bytes fetched.
    pub(super) fn fill(&self, remote: &dyn Remote, id: &ObjectId, chunks: Range<usize>) -> Result<u64> {
        let raw = self.raw(id)?;
        let c = raw.container()?;
        let corrupt = |reason: String| Error::from(crate::store::Error::Corrupt { id: *id, reason });
        let payload = c.payload_range(chunks.clone()).ok_or_else(|| corrupt(format!("no chunks {chunks:?}")))?;
        let want = payload.start + HEADER_LEN as u64..payload.end + HEADER_LEN as u64;
        drop(raw);
        let mut fetched = 0;
        for gap in missing(&self.have(id), want) {
            let bytes = read_range(remote, &remote::object_key(id), gap.clone())?;
            let path = self.path(id);
            let file = std::fs::OpenOptions::new().write(true).open(&path).map_err(io("opening", &path))?;
            self.put(id, &file, gap.start, &bytes)?;
            fetched += bytes.len() as u64;
        }
        Ok(fetched)
    }
}

/// Bytes `range` of `key` on `remote`, exactly: the remote's answer is checked here too, so
/// that a wrapper or proxy that answers with more or fewer bytes is refused as the remote's
/// own check refuses a server's.
fn read_range(remote: &dyn Remote, key: &str, range: Range<u64>) -> Result<Vec<u8>> {
    let bytes = remote.read_range(key, range.clone())?;
    Ok(remote::checked_range(remote.url(), key, &range, bytes, false)?)
}

/// Refuses as the header of blob `id` anything but a blob header of `raw_len` bytes.
fn check_blob(id: &ObjectId, header: &ObjectHeader, raw_len: Option<u64>) -> Result<()> {
    if header.kind != ObjectKind::Blob {
        return Err(crate::store::Error::WrongKind { id: *id, expected: ObjectKind::Blob, found: header.kind }.into());
    }
    match raw_len {
        Some(len) if len != header.raw_len => Err(crate::store::Error::Corrupt {
            id: *id,
            reason: format!("a blob of {} bytes where its manifest says {len}", header.raw_len),
        }
        .into()),
        _ => Ok(()),
    }
}

/// The parts of `want` that no range of `have` covers, in order.
fn missing(have: &[Range<u64>], want: Range<u64>) -> Vec<Range<u64>> {
    let mut sorted: Vec<&Range<u64>> = have.iter().filter(|r| r.end > want.start && r.start < want.end).collect();
    sorted.sort_by_key(|r| r.start);
    let mut gaps = Vec::new();
    let mut at = want.start;
    for r in sorted {
        if r.start > at {
            gaps.push(at..r.start.min(want.end));
        }
        at = at.max(r.end);
    }
    if at < want.end {
        gaps.push(at..want.end);
    }
    gaps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_parts_of_a_range() {
        assert_eq!(missing(&[], 5..10), vec![5..10]);
        assert_eq!(missing(&[0..6, 8..9], 5..10), vec![6..8, 9..10]);
        assert_eq!(missing(&[0..20, 30..40], 5..10), Vec::<Range<u64>>::new());
        assert_eq!(missing(&[7..8, 2..3], 0..10), vec![0..2, 3..7, 8..10]);
    }
}
