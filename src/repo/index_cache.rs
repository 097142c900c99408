//! The index as a cache of the store: opened lazily, rebuilt when damaged, fed through a
//! journal while closed ([`crate::index::Journal`]). Nothing here is needed for correctness:
//! every failure only costs speed later.

use super::*;

impl Repo {
    pub(super) fn index_path(&self) -> PathBuf {
        self.dir.join("index")
    }

    /// Opens the index, rebuilding it when needed; `None` when it is in use elsewhere or cannot
    /// be rebuilt (the repository then works from the store alone).
    pub(super) fn open_index(&self) -> Option<Index> {
        let ix = open_or_recreate(&self.index_path()).ok()?;
        if !ix.is_complete() && self.rebuild_into(&ix).is_err() {
            return None;
        }
        self.replay_journal(&ix);
        Some(ix)
    }

    pub(super) fn journal(&self) -> Journal {
        Journal::new(&self.dir.join("index-journal"))
    }

    /// Applies the index journal to `ix`: what writers changed while the index was closed.
    /// Objects and versions are read from the store again (a missing object loses its record).
    pub(super) fn replay_journal(&self, ix: &Index) {
        let journal = self.journal();
        let Ok(entries) = journal.take() else { return };
        for entry in entries {
            // The index is a cache: a failed update only costs speed later.
            let _ = match entry {
                JournalEntry::Object(id) => match self.stored_record(&id) {
                    Ok(record) => ix.put_object(&id, &record).map_err(Error::from),
                    Err(store::Error::Missing { .. }) => ix.remove_object(&id).map_err(Error::from),
                    Err(_) => Ok(()),
                },
                JournalEntry::Version(id) => match self.version(&id) {
                    Ok(v) => ix.put_version(&id, &version_record(&v)).map_err(Error::from),
                    Err(_) => ix.remove_version(&id).map_err(Error::from),
                },
                JournalEntry::Stat { path, len, mtime_ns, ctime_ns, ino, recorded_ns, hash } => {
                    let record = StatRecord { len, mtime_ns, ctime_ns, ino, recorded_ns, hash };
                    ix.put_stat(&path, &record).map_err(Error::from)
                }
            };
        }
        if ix.flush().is_ok() {
            let _ = journal.finish();
        }
    }

    /// The index, opened (and rebuilt if needed) on first call; `None` when another process
    /// holds it or it cannot be rebuilt.
    pub(super) fn index(&self) -> Option<&Index> {
        self.index.get_or_init(|| self.open_index()).as_ref()
    }

    /// The index if this process has opened it; otherwise `entry` is kept for the journal and
    /// `None` returned.
    pub(super) fn open_index_or_journal(&self, entry: impl FnOnce() -> JournalEntry) -> Option<&Index> {
        match self.index.get() {
            Some(Some(ix)) => Some(ix),
            _ => {
                self.unjournaled.lock().unwrap_or_else(|e| e.into_inner()).push(entry());
                None
            }
        }
    }

    pub(super) fn index_object(&self, w: &store::Written) {
        if let Some(ix) = self.open_index_or_journal(|| JournalEntry::Object(w.id)) {
            // The index is a cache: a failed insert only costs speed later.
            let _ = ix.put_object(&w.id, &object_record_of(&w.header, w.stored_len));
        }
    }

    pub(super) fn index_version(&self, id: &VersionId, v: &Version) {
        if let Some(ix) = self.open_index_or_journal(|| JournalEntry::Version(*id)) {
            let _ = ix.put_version(id, &version_record(v));
        }
    }

    /// Rebuilds the index from the object store. Fails with [`index::Error::Locked`] when
    /// another process has the index open.
    pub fn rebuild_index(&mut self) -> Result<usize> {
        let _lock = self.lock()?;
        let ix = match self.index.take().flatten() {
            Some(ix) => ix,
            None => open_or_recreate(&self.index_path())?,
        };
        let result = self.rebuild_into(&ix);
        if result.is_ok() {
            self.replay_journal(&ix);
        }
        self.index = OnceLock::from(Some(ix));
        result
    }

    /// Fills `ix` from the store; returns the number of objects indexed. Damaged objects are
    /// skipped (verify reports them).
    pub(super) fn rebuild_into(&self, ix: &Index) -> Result<usize> {
        ix.begin_rebuild()?;
        let ids = self.store.list()?;
        let mut n = 0;
        for id in &ids {
            let Ok(record) = self.stored_record(id) else { continue };
            ix.put_object(id, &record)?;
            if record.kind == ObjectKind::Version as u8 {
                if let Ok(v) = self.version(id) {
                    ix.put_version(id, &version_record(&v))?;
                }
            }
            n += 1;
        }
        ix.finish_rebuild()?;
        Ok(n)
    }

    /// The index's record of an object, or the store's header if the index lacks it.
    pub fn object_record(&self, id: &ObjectId) -> Result<ObjectRecord> {
        if let Some(Ok(Some(r))) = self.index().map(|ix| ix.object(id)) {
            return Ok(r);
        }
        Ok(self.stored_record(id)?)
    }

    /// The record of object `id` read from the store.
    fn stored_record(&self, id: &ObjectId) -> std::result::Result<ObjectRecord, store::Error> {
        Ok(object_record_of(&self.store.header(id)?, self.store.stored_len(id)?))
    }

    /// Records a working file's identity for `status`.
    pub(super) fn index_stat(&self, path: &str, record: &StatRecord) {
        if let Some(ix) = self.open_index_or_journal(|| JournalEntry::stat(path, record)) {
            let _ = ix.put_stat(path, record);
        }
    }

    /// Flushes the index if it was opened, and appends what was kept for the journal.
    pub(crate) fn flush_index(&self) {
        if let Some(Some(ix)) = self.index.get() {
            let _ = ix.flush();
        }
        self.append_journal();
    }

    /// Appends the index changes kept for the journal (a cache: failures are ignored).
    pub(super) fn append_journal(&self) {
        let entries = std::mem::take(&mut *self.unjournaled.lock().unwrap_or_else(|e| e.into_inner()));
        let _ = self.journal().append(&entries);
    }
}

/// Opens the index at `path`, deleting and recreating a damaged database (not one in use
/// elsewhere: [`index::Error::Locked`]). Tried a few times: the threads of sled's failed open
/// may still be winding down and writing into the directory while it is deleted (seen once in
/// CI, under load, as a missing index).
fn open_or_recreate(path: &Path) -> std::result::Result<Index, index::Error> {
    match Index::open(path) {
        Err(locked @ index::Error::Locked { .. }) => Err(locked),
        Err(_) => {
            let mut attempt = 0;
            loop {
                std::thread::sleep(std::time::Duration::from_millis(50 * attempt));
                match Index::destroy(path).and_then(|()| Index::open(path)) {
                    Err(_) if attempt < 2 => attempt += 1,
                    reopened => return reopened,
                }
            }
        }
        opened => opened,
    }
}

/// The index record of an object with header `h` and file size `stored_len`.
pub(super) fn object_record_of(h: &store::ObjectHeader, stored_len: u64) -> ObjectRecord {
    ObjectRecord {
        kind: h.kind as u8,
        dtype: h.dtype.map_or(0, crate::Dtype::code),
        depth: h.depth,
        raw_len: h.raw_len,
        stored_len,
        reference: h.reference,
    }
}

pub(super) fn version_record(v: &Version) -> VersionRecord {
    VersionRecord {
        parents: v.parents.clone(),
        time: v.time,
        message: v.message.clone(),
        files: v.files.iter().map(|f| f.path.clone()).collect(),
        raw_bytes: v.raw_bytes,
        stored_bytes: v.stored_bytes,
    }
}
