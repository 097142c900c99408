//! Objects received from elsewhere (a remote): written to a temp file by the caller, checked
//! against their id with the same code that reads and verifies stored objects, and only then
//! moved into place through the store's atomic write path. A bad object is never stored.

use super::{Error, ObjectHeader, ObjectKind, RawObject, Result, Store, Written, HEADER_LEN};
use crate::object_id::ObjectId;
use std::io::Read;

impl Store {
    /// A new temp file in the store's `tmp/` for an object being received.
    pub fn receive_file(&self) -> Result<tempfile::NamedTempFile> {
        self.temp_file()
    }

    /// The header of a received object (the first bytes of its temp file), checked.
    pub(crate) fn received_header(&self, id: &ObjectId, tmp: &tempfile::NamedTempFile) -> Result<ObjectHeader> {
        let mut buf = Vec::with_capacity(HEADER_LEN);
        let mut file = tmp.reopen().map_err(super::io("reading", tmp.path()))?;
        (&mut file).take(HEADER_LEN as u64).read_to_end(&mut buf).map_err(super::io("reading", tmp.path()))?;
        ObjectHeader::decode(*id, &buf)
    }

    /// Checks the received object in `tmp` against `id` and stores it. The whole object is
    /// decoded and hashed (`Store::check_received`); on any error `tmp` is deleted and nothing
    /// is stored.
    pub fn import(&self, id: &ObjectId, kind: Option<ObjectKind>, tmp: tempfile::NamedTempFile) -> Result<Written> {
        let stored_len = tmp.as_file().metadata().map_err(super::io("reading", tmp.path()))?.len();
        let header = self.check_received(id, kind, &tmp)?;
        self.persist(tmp, id)?;
        Ok(Written { id: *id, header, stored_len })
    }

    /// Checks the received object in `tmp` against `id` without storing it: the whole object
    /// decoded and hashed, a blob through its delta chain, whose references must be in the
    /// store (their content, whatever form they have here), a manifest or version as data.
    /// With `kind`, the object must be of that kind. Also what a push uses to tell whether a
    /// remote's copy of an object is intact.
    pub(crate) fn check_received(
        &self,
        id: &ObjectId,
        kind: Option<ObjectKind>,
        tmp: &tempfile::NamedTempFile,
    ) -> Result<ObjectHeader> {
        let file = tmp.reopen().map_err(super::io("reading", tmp.path()))?;
        let map = crate::mmap::map(&file).map_err(super::io("reading", tmp.path()))?;
        let header = ObjectHeader::decode(*id, &map)?;
        if let Some(kind) = kind.filter(|k| *k != header.kind) {
            return Err(Error::WrongKind { id: *id, expected: kind, found: header.kind });
        }
        let raw = RawObject { id: *id, header, map };
        match header.kind {
            ObjectKind::Blob => {
                self.open_chain_from(Some(raw), id)?.copy_to(&mut std::io::sink())?;
            }
            _ => {
                header.check_data_len(id)?;
                raw.container()?
                    .decode_to(&mut std::io::sink())
                    .map_err(|e| Error::Corrupt { id: *id, reason: e.to_string() })?;
            }
        }
        Ok(header)
    }

    /// The content of a received manifest or version (checked like [`Store::read_data`]:
    /// kind, size, container, hash), without storing it.
    pub fn read_received(&self, id: &ObjectId, kind: ObjectKind, tmp: &tempfile::NamedTempFile) -> Result<Vec<u8>> {
        let file = tmp.reopen().map_err(super::io("reading", tmp.path()))?;
        let map = crate::mmap::map(&file).map_err(super::io("reading", tmp.path()))?;
        let header = ObjectHeader::decode(*id, &map)?;
        if header.kind != kind {
            return Err(Error::WrongKind { id: *id, expected: kind, found: header.kind });
        }
        header.check_data_len(id)?;
        let raw = RawObject { id: *id, header, map };
        let container = raw.container()?;
        let mut out = Vec::with_capacity(header.raw_len.min(super::PREALLOCATE_DATA_LEN) as usize);
        container.decode_to(&mut out).map_err(|e| Error::Corrupt { id: *id, reason: e.to_string() })?;
        Ok(out)
    }
}
