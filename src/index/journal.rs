//! The index journal: what writers changed while the index was not open, for the next process
//! that opens it to catch up on.
//!
//! Why: opening sled costs a commit 10–15 ms (its page table, metrics and I/O threads) of the
//! ~50 it takes on a 45 MB checkpoint, and the index is only a cache. So a writer that has not
//! opened the index appends one line per change to `.ckpt/index-journal` instead, and whoever
//! opens the index next replays it ([`Journal::take`]) before answering from it. A line says
//! *what* changed, not the new record: an object id is looked up in the store again at replay,
//! so a replay never brings back anything older than the store.
//!
//! Nothing here is fsynced: a journal lost in a crash costs what a missing cache entry costs (the
//! store answers; `status` hashes the file again). Lines that do not parse are skipped, so a
//! line torn by a crash loses only itself. Format: docs/format.md, "Index journal".

use super::{Error, Result, StatRecord};
use crate::object_id::ObjectId;
use std::io::Write;
use std::path::{Path, PathBuf};

/// A journal larger than this is dropped unread: it is only a cache, and reading it must not
/// cost unbounded memory. (One commit of a file of 1000 tensors writes about 80 KB.)
const MAX_JOURNAL_BYTES: u64 = 64 << 20;

/// One change the index has not seen.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Entry {
    /// An object was written, rewritten or deleted: its record is read from the store again.
    Object(ObjectId),
    /// A version was written: its `log` record is read from the store.
    Version(ObjectId),
    /// A working file's identity after a commit or checkout.
    Stat {
        /// Repository path.
        path: String,
        /// File length.
        len: u64,
        /// Modification time, ns since the Unix epoch.
        mtime_ns: i128,
        /// Status-change time, ns since the Unix epoch. Required: a line without it (written
        /// before it was recorded) does not parse and is skipped, so that file is hashed again.
        ctime_ns: i128,
        /// Inode number (required, as `ctime_ns`).
        ino: u64,
        /// When the record was made, ns since the Unix epoch.
        recorded_ns: i128,
        /// blake3 of the file.
        hash: ObjectId,
    },
}

impl Entry {
    /// The stat entry of `path` with `record`.
    pub fn stat(path: &str, record: &StatRecord) -> Entry {
        Entry::Stat {
            path: path.to_string(),
            len: record.len,
            mtime_ns: record.mtime_ns,
            ctime_ns: record.ctime_ns,
            ino: record.ino,
            recorded_ns: record.recorded_ns,
            hash: record.hash,
        }
    }
}

/// The journal file of one index.
#[derive(Clone, Debug)]
pub struct Journal {
    path: PathBuf,
}

impl Journal {
    /// The journal at `path` (`.ckpt/index-journal`).
    pub fn new(path: &Path) -> Journal {
        Journal { path: path.to_path_buf() }
    }

    /// Where a replay moves the journal while it runs: writers that come meanwhile start a new
    /// journal instead of appending to the one being read.
    fn replaying_path(&self) -> PathBuf {
        self.path.with_extension("replaying")
    }

    /// Appends `entries` as one write (lines of JSON). Empty: nothing is written.
    pub fn append(&self, entries: &[Entry]) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        // A leading newline ends a line a crash may have torn, so that it loses only itself.
        let mut text = vec![b'\n'];
        for e in entries {
            serde_json::to_writer(&mut text, e).expect("plain data serializes");
            text.push(b'\n');
        }
        let io = |source| Error::Io { action: "appending to", path: self.path.clone(), source };
        let mut file = std::fs::File::options().create(true).append(true).open(&self.path).map_err(io)?;
        file.write_all(&text).map_err(io)
    }

    /// Takes every entry written so far (a replay left over from a crash first), oldest first.
    /// The caller applies them, then calls [`Journal::finish`]; until then they are kept, so a
    /// replay cut short is done again.
    pub fn take(&self) -> Result<Vec<Entry>> {
        let replaying = self.replaying_path();
        let mut entries = read_entries(&replaying)?;
        match std::fs::rename(&self.path, &replaying) {
            Ok(()) => {
                // The leftover (already read) is replaced by the newer journal; read that too.
                entries.extend(read_entries(&replaying)?);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(Error::Io { action: "renaming", path: self.path.clone(), source }),
        }
        Ok(entries)
    }

    /// Deletes what [`Journal::take`] returned, once applied.
    pub fn finish(&self) -> Result<()> {
        let replaying = self.replaying_path();
        match std::fs::remove_file(&replaying) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(Error::Io { action: "deleting", path: replaying, source }),
        }
    }
}

/// The entries of the journal file at `path`; none if it is missing or too large.
fn read_entries(path: &Path) -> Result<Vec<Entry>> {
    let io = |source| Error::Io { action: "reading", path: path.to_path_buf(), source };
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(e)),
    };
    if file.metadata().map_err(io)?.len() > MAX_JOURNAL_BYTES {
        return Ok(Vec::new());
    }
    let mut text = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(file, MAX_JOURNAL_BYTES), &mut text).map_err(io)?;
    Ok(text.split(|&b| b == b'\n').filter_map(|line| serde_json::from_slice(line).ok()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(path: &str, n: u8) -> Entry {
        let record = StatRecord {
            len: n as u64,
            mtime_ns: -(n as i128),
            ctime_ns: n as i128 * 3,
            ino: u64::MAX - n as u64,
            recorded_ns: 1 << 100,
            hash: ObjectId([n; 32]),
        };
        Entry::stat(path, &record)
    }

    #[test]
    fn entries_round_trip_in_order_and_a_replay_is_taken_once() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::new(&dir.path().join("index-journal"));
        assert_eq!(journal.take().unwrap(), vec![]);
        let first = vec![Entry::Object(ObjectId([1; 32])), Entry::Version(ObjectId([2; 32])), stat("a/b.bin", 3)];
        journal.append(&first).unwrap();
        journal.append(&[stat("c", 4)]).unwrap();
        journal.append(&[]).unwrap();
        let mut all = first.clone();
        all.push(stat("c", 4));
        assert_eq!(journal.take().unwrap(), all);
        journal.finish().unwrap();
        assert_eq!(journal.take().unwrap(), vec![]);
    }

    #[test]
    fn an_unfinished_replay_is_taken_again_before_newer_entries() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::new(&dir.path().join("index-journal"));
        journal.append(&[stat("old", 1)]).unwrap();
        assert_eq!(journal.take().unwrap(), vec![stat("old", 1)]);
        // No finish (the replaying process died); a writer appends meanwhile.
        journal.append(&[stat("new", 2)]).unwrap();
        assert_eq!(journal.take().unwrap(), vec![stat("old", 1), stat("new", 2)]);
        journal.finish().unwrap();
        assert_eq!(journal.take().unwrap(), vec![]);
    }

    #[test]
    fn torn_and_foreign_lines_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index-journal");
        let journal = Journal::new(&path);
        journal.append(&[stat("kept", 1)]).unwrap();
        let mut f = std::fs::File::options().append(true).open(&path).unwrap();
        f.write_all(b"{\"object\":\"zz\"}\nnot json\n\xff\xfe\n").unwrap();
        // A stat line of the earlier layout (no ctime_ns, no ino): skipped, not trusted.
        let old = format!(
            "{{\"stat\":{{\"path\":\"old\",\"len\":1,\"mtime_ns\":1,\"recorded_ns\":9,\"hash\":\"{}\"}}}}\n",
            ObjectId([7; 32])
        );
        f.write_all(old.as_bytes()).unwrap();
        f.write_all(b"{\"stat\":{\"path\":\"torn\",\"len\":").unwrap();
        journal.append(&[stat("after", 2)]).unwrap();
        // The torn line loses only itself: the next append starts on a line of its own.
        assert_eq!(journal.take().unwrap(), vec![stat("kept", 1), stat("after", 2)]);
    }

    #[test]
    fn an_oversized_journal_is_dropped_unread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index-journal");
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(MAX_JOURNAL_BYTES + 1).unwrap();
        let journal = Journal::new(&path);
        assert_eq!(journal.take().unwrap(), vec![]);
        journal.finish().unwrap();
        assert!(!path.exists() && !journal.replaying_path().exists());
    }
}
