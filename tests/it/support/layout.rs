//! What a remote's store holds, read from its files on disk (a directory remote, or the
//! directory `s3s-fs` keeps a bucket in): each object's header and size, to check which blobs
//! are whole and which are deltas (the remote layouts, docs/format.md "Remotes").

use ckpt::repo::Repo;
use ckpt::store::{ObjectHeader, HEADER_LEN};
use ckpt::ObjectId;
use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

/// One object on the remote: its header and its size there.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RemoteObject {
    pub(crate) header: ObjectHeader,
    pub(crate) size: u64,
}

/// Every object under `objects` (`ab/<62 hex>` files), by id.
pub(crate) fn remote_objects(objects: &Path) -> HashMap<ObjectId, RemoteObject> {
    let mut out = HashMap::new();
    let Ok(fans) = std::fs::read_dir(objects) else { return out };
    for fan in fans.flatten() {
        let fan_name = fan.file_name().to_string_lossy().into_owned();
        if fan_name.len() != 2 || !fan.path().is_dir() {
            continue;
        }
        for entry in std::fs::read_dir(fan.path()).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(id) = format!("{fan_name}{name}").parse::<ObjectId>() else { continue };
            let mut head = Vec::new();
            let mut file = std::fs::File::open(entry.path()).unwrap();
            (&mut file).take(HEADER_LEN as u64).read_to_end(&mut head).unwrap();
            let header = ObjectHeader::decode(id, &head).unwrap();
            out.insert(id, RemoteObject { header, size: file.metadata().unwrap().len() });
        }
    }
    out
}

/// The blobs of version `rev` of the repository in `dir`.
pub(crate) fn version_blobs(dir: &Path, rev: &str) -> Vec<ObjectId> {
    let repo = Repo::open(dir).unwrap();
    let v = repo.version(&repo.resolve(rev).unwrap()).unwrap();
    let mut blobs: Vec<ObjectId> =
        v.files.iter().flat_map(|f| repo.manifest(&f.manifest).unwrap().blobs().collect::<Vec<_>>()).collect();
    blobs.sort();
    blobs.dedup();
    blobs
}

/// The objects version `rev` names directly: its version object, manifests and blobs.
pub(crate) fn version_objects(dir: &Path, rev: &str) -> Vec<ObjectId> {
    let repo = Repo::open(dir).unwrap();
    let id = repo.resolve(rev).unwrap();
    let v = repo.version(&id).unwrap();
    let mut out = vec![id];
    out.extend(v.files.iter().map(|f| f.manifest));
    out.extend(version_blobs(dir, rev));
    out.sort();
    out.dedup();
    out
}
