//! `verify`: re-hashes every object (blobs through their delta chains), checks every root (the
//! refs and records `gc` keeps: [`Repo::roots`]), checks that what each reachable version names
//! is of the right kind and length (a parent is a version, a file's manifest a manifest, a
//! segment's blob a blob of the segment's length), and names the versions reachable from the
//! roots that a damaged, mislabelled or missing object affects, each with the root it was
//! reached from.

use super::model::{Manifest, Version};
use super::{Repo, Result, VersionId};
use crate::object_id::ObjectId;
use crate::store::ObjectKind;
use std::collections::{BTreeMap, HashSet};

/// An object that failed verification.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BadObject {
    /// The object.
    pub id: ObjectId,
    /// What is wrong.
    pub problem: String,
}

/// A reachable version that cannot be checked out intact.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BadVersion {
    /// The version.
    pub id: VersionId,
    /// The root (ref or record, [`Repo::roots`]) through which verify reached it first.
    pub reached_from: String,
    /// The damaged or missing objects it needs.
    pub objects: Vec<ObjectId>,
}

/// Result of [`Repo::verify`].
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct VerifyReport {
    /// Objects checked.
    pub objects_checked: usize,
    /// Bytes of object files checked.
    pub bytes_checked: u64,
    /// Versions reachable from the roots.
    pub versions_checked: usize,
    /// Objects that are damaged (or, when needed by a version, missing).
    pub bad_objects: Vec<BadObject>,
    /// Versions affected by bad objects.
    pub bad_versions: Vec<BadVersion>,
    /// Refs that cannot be read or point to no valid version.
    pub bad_refs: Vec<String>,
}

impl VerifyReport {
    /// Whether everything checked out.
    pub fn is_ok(&self) -> bool {
        self.bad_objects.is_empty() && self.bad_versions.is_empty() && self.bad_refs.is_empty()
    }
}

impl Repo {
    /// Checks every object and ref; reports rather than fails on damage (errors are for
    /// failures to run at all, such as an unreadable objects directory).
    ///
    /// Runs beside writers without holding them up: a commit, gc or compaction running
    /// meanwhile can make a healthy repository look damaged to a reader that takes no lock (an
    /// object gc deletes after it was listed, a ref moved to a version written after the
    /// listing, a blob rewritten as a reverse delta mid-check). So when this first pass finds
    /// anything, it is confirmed under the shared side of the writer lock, which waits for the
    /// running writer (up to the lock timeout) and keeps others out: the objects found bad are
    /// checked again and the refs and versions are walked again over a fresh listing. Only what
    /// is still wrong then is reported.
    pub fn verify(&self) -> Result<VerifyReport> {
        let first = self.verify_pass(None)?;
        if first.is_ok() {
            return Ok(first);
        }
        let Some(_lock) = self.confirming_lock()? else { return Ok(first) };
        let suspects: HashSet<ObjectId> = first.bad_objects.iter().map(|o| o.id).collect();
        let confirmed = self.verify_pass(Some(&suspects))?;
        Ok(VerifyReport { objects_checked: first.objects_checked, bytes_checked: first.bytes_checked, ..confirmed })
    }

    /// The shared side of the writer lock, under which what a first look found damaged is
    /// checked again (a writer running meanwhile can make a healthy object look damaged to a
    /// reader that takes no lock). `None` where the lock file cannot be opened for writing (a
    /// read-only copy of a repository): no writer can run there either, so the first look stands.
    fn confirming_lock(&self) -> Result<Option<super::lock::ReaderLock>> {
        match super::lock::ReaderLock::acquire(&self.dir.join("lock"), self.lock_timeout) {
            Ok(lock) => Ok(Some(lock)),
            Err(super::Error::Io { source, .. })
                if source.kind() == std::io::ErrorKind::PermissionDenied
                    || source.raw_os_error() == Some(libc::EROFS) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The objects of `ids` that are damaged or missing here, each with its problem: re-hashed
    /// as [`Self::verify`] re-hashes them (blobs a delta chain at a time, so that each object
    /// is decoded about once), and what that finds checked again under the shared side of the
    /// writer lock, as there. What a push checks before anything it sends goes up
    /// (`crate::sync`), so that it never spreads a damaged object to a remote.
    pub(crate) fn damaged(&self, ids: &[ObjectId]) -> Result<Vec<BadObject>> {
        let mut bad = BTreeMap::new();
        self.verify_objects(ids, &mut VerifyReport::default(), &mut bad);
        if bad.is_empty() {
            return Ok(Vec::new());
        }
        let Some(_lock) = self.confirming_lock()? else {
            return Ok(bad.into_iter().map(|(id, problem)| BadObject { id, problem }).collect());
        };
        let suspects: Vec<ObjectId> = bad.into_keys().collect();
        let mut confirmed = BTreeMap::new();
        self.verify_objects(&suspects, &mut VerifyReport::default(), &mut confirmed);
        Ok(confirmed.into_iter().map(|(id, problem)| BadObject { id, problem }).collect())
    }

    /// One pass of [`Self::verify`]: every object re-hashed (`suspects: None`), or only the
    /// listed ones; then the roots ([`Repo::roots`], the set `gc` keeps) and every version they
    /// reach, with what each version names checked for its kind and length.
    fn verify_pass(&self, suspects: Option<&HashSet<ObjectId>>) -> Result<VerifyReport> {
        let mut report = VerifyReport::default();
        // Roots before the listing: a version a ref names was written before the ref moved, so
        // it is in the listing unless gc deleted it since (which the locked pass sorts out).
        let mut roots = Vec::new();
        for root in self.roots() {
            match root {
                Ok(root) => roots.push(root),
                Err(e) => report.bad_refs.push(e.to_string()),
            }
        }
        let ids = self.store.list()?;
        let mut bad: BTreeMap<ObjectId, String> = BTreeMap::new();
        match suspects {
            None => self.verify_objects(&ids, &mut report, &mut bad),
            Some(suspects) => {
                for id in ids.iter().filter(|id| suspects.contains(id)) {
                    if let Err(problem) = self.verify_object(id) {
                        bad.insert(*id, problem);
                    }
                }
            }
        }
        let present: HashSet<ObjectId> = ids.into_iter().collect();
        for root in roots.iter().rev() {
            if !present.contains(&root.id) || self.store_kind(&root.id) != Some(ObjectKind::Version) {
                report.bad_refs.push(format!("{} points to {}, which is not a stored version", root.name, root.id));
            }
        }
        let (cut, mut walk) = (self.cut_versions()?, Reached::default());
        for root in roots {
            self.reach_versions(root, &cut, &present, &mut walk, &mut bad);
        }
        walk.report_needs(&present, &mut bad, &mut report);
        report.bad_objects = bad.into_iter().map(|(id, problem)| BadObject { id, problem }).collect();
        Ok(report)
    }

    /// The kind the header of object `id` gives, `None` when it cannot be read.
    fn store_kind(&self, id: &ObjectId) -> Option<ObjectKind> {
        self.store.header(id).ok().map(|h| h.kind)
    }

    /// Walks the versions `root` reaches that no earlier root reached (a partial clone's or a
    /// prune's history ends at its cut versions: partial.rs), checking what each names: its
    /// parents are versions, its files' manifests are manifests of the file's length and hash
    /// whose blobs have the lengths they list. Unlike [`super::graph::walk`] it reports what it
    /// cannot read and goes on: a version that cannot be read ends its line.
    fn reach_versions(
        &self,
        root: super::Root,
        cut: &super::partial::HistoryCuts,
        present: &HashSet<ObjectId>,
        walk: &mut Reached,
        bad: &mut BTreeMap<ObjectId, String>,
    ) {
        let mut stack = vec![root.id];
        while let Some(id) = stack.pop() {
            if walk.reached.contains_key(&id) {
                continue;
            }
            walk.reached.insert(id, root.name.clone());
            walk.order.push(id);
            let Ok(version) = self.version(&id) else { continue };
            let parents = self.parents_here(cut, &id, &version.parents);
            let mut problems = Vec::new();
            // Pushed in order: the last parent is walked first.
            for p in &parents {
                match self.store_kind(p) {
                    Some(ObjectKind::Version) | None => stack.push(*p),
                    Some(kind) => problems.push(format!("its parent {p} is a {kind}, not a version")),
                }
            }
            for f in &version.files {
                match self.store_kind(&f.manifest) {
                    Some(ObjectKind::Manifest) => {}
                    None => continue,
                    Some(kind) => {
                        problems.push(format!("file {:?}: {} is a {kind}, not a manifest", f.path, f.manifest));
                        continue;
                    }
                }
                let summary = walk.manifests.entry(f.manifest).or_insert_with(|| {
                    // An unreadable manifest was found bad (or missing) by the object check.
                    let read = self.manifest(&f.manifest).ok();
                    if let Some(Err(problem)) = read.as_ref().map(|m| self.check_manifest_blobs(m)) {
                        bad.entry(f.manifest).or_insert(problem);
                    }
                    read.map(|m| (m.len, m.hash, m.blobs().collect()))
                });
                if summary.as_ref().is_some_and(|(len, hash, _)| (*len, *hash) != (f.len, f.hash)) {
                    problems.push(format!(
                        "file {:?}: its length or hash differs from its manifest {}'s",
                        f.path, f.manifest
                    ));
                }
            }
            walk.files.insert(id, version.files.iter().map(|f| f.manifest).collect());
            if !problems.is_empty() {
                bad.entry(id).or_insert_with(|| problems.join("; "));
            }
            // Missing parents are named below, by the version that needs them.
            for p in parents.iter().filter(|p| !present.contains(p)) {
                let reason = format!("missing (the parent of version {id}, reached from {})", root.name);
                walk.missing.entry(*p).or_insert(reason);
            }
        }
    }

    /// Checks that every blob `manifest` names (that is stored) is a blob of the length the
    /// manifest gives it: a segment's length, a bundle's length. A fetched manifest is checked
    /// against its id and parsed, but its lengths are only claims about other objects.
    fn check_manifest_blobs(&self, manifest: &Manifest) -> std::result::Result<(), String> {
        let named = manifest
            .segments
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.blob.map(|b| (format!("segment {i}"), b, s.len)))
            .chain(manifest.bundles.iter().enumerate().map(|(i, b)| (format!("bundle {i}"), b.blob, b.len)));
        for (what, blob, len) in named {
            let Ok(header) = self.store.header(&blob) else { continue };
            if header.kind != ObjectKind::Blob {
                return Err(format!("{what} names {blob}, a {}, not a blob", header.kind));
            }
            if header.raw_len != len {
                return Err(format!("{what} is {len} bytes, but its blob {blob} holds {} bytes", header.raw_len));
            }
        }
        Ok(())
    }

    /// Re-hashes every object of `ids` (blobs a delta chain at a time), counting them in
    /// `report` and naming the damaged ones in `bad`.
    fn verify_objects(&self, ids: &[ObjectId], report: &mut VerifyReport, bad: &mut BTreeMap<ObjectId, String>) {
        let sizes: Vec<u64> = ids.iter().map(|id| self.store.stored_len(id).unwrap_or(0)).collect();
        let total: u64 = sizes.iter().sum();
        self.progress.start("verify", total);
        let mut done = 0;
        // Blobs are checked a delta chain at a time (below); everything else one by one.
        let mut blobs: BTreeMap<ObjectId, Option<ObjectId>> = BTreeMap::new();
        let mut size_of: BTreeMap<ObjectId, u64> = BTreeMap::new();
        for (id, size) in ids.iter().zip(&sizes) {
            size_of.insert(*id, *size);
            if let Ok(header) = self.store.header(id) {
                if header.kind == ObjectKind::Blob {
                    // A derived blob's reference (another dtype) is verified on a path of its own.
                    blobs.insert(*id, header.reference.filter(|_| header.conversion.is_none()));
                    continue;
                }
            }
            if let Err(problem) = self.verify_object(id) {
                bad.insert(*id, problem);
            }
            done += size;
            report.objects_checked += 1;
            self.progress.set(done);
        }
        for path in blob_paths(&blobs) {
            let target = path[0];
            let together = self.store.open_blob(&target).and_then(|chain| chain.verify_members(path.len()));
            if together.is_err() {
                // Something on this chain is damaged: check each member on its own, which names
                // every affected object with its own error.
                for id in &path {
                    if let Err(problem) = self.verify_object(id) {
                        bad.insert(*id, problem);
                    }
                }
            }
            for id in &path {
                done += size_of.get(id).copied().unwrap_or(0);
                report.objects_checked += 1;
            }
            self.progress.set(done);
        }
        report.bytes_checked = total;
        self.progress.finish();
    }

    fn verify_object(&self, id: &ObjectId) -> std::result::Result<(), String> {
        let header = self.store.verify(id).map_err(|e| e.to_string())?;
        match header.kind {
            ObjectKind::Version => {
                let bytes = self.store.read_data(id, ObjectKind::Version).map_err(|e| e.to_string())?;
                Version::parse(*id, &bytes).map_err(|e| e.to_string())?;
            }
            ObjectKind::Manifest => {
                let bytes = self.store.read_data(id, ObjectKind::Manifest).map_err(|e| e.to_string())?;
                let manifest = Manifest::parse(*id, &bytes).map_err(|e| e.to_string())?;
                // With bundles the file hash is checked from their bytes (parsing could not).
                // A bundle that cannot be read is reported as itself (or as missing), not here.
                if !manifest.bundles.is_empty() {
                    if let Ok(hash) = super::bundle::file_hash_of(self, &manifest) {
                        if hash != manifest.hash {
                            return Err("file hash does not match the bundled tensors".into());
                        }
                    }
                }
            }
            ObjectKind::Blob => {}
        }
        Ok(())
    }
}

/// What [`Repo::verify`] found walking the versions the roots reach.
#[derive(Default)]
struct Reached {
    /// Each version reached, with the first root that reached it.
    reached: BTreeMap<VersionId, String>,
    /// The versions in the order reached.
    order: Vec<VersionId>,
    /// Each readable version's manifests.
    files: BTreeMap<VersionId, Vec<ObjectId>>,
    /// Per manifest read: its length, file hash and blobs (`None`: unreadable).
    manifests: BTreeMap<ObjectId, Option<(u64, ObjectId, Vec<ObjectId>)>>,
    /// Objects needed and not stored, each with who needs it.
    missing: BTreeMap<ObjectId, String>,
}

impl Reached {
    /// Names the versions reached that need a damaged or missing object (every structural
    /// problem is known by now, whichever version reached a shared manifest first), and adds
    /// the missing objects to `bad`.
    fn report_needs(
        mut self,
        present: &HashSet<ObjectId>,
        bad: &mut BTreeMap<ObjectId, String>,
        report: &mut VerifyReport,
    ) {
        for id in &self.order {
            report.versions_checked += 1;
            let root = &self.reached[id];
            let mut needs = Vec::new();
            let mut check = |oid: &ObjectId| {
                if bad.contains_key(oid) {
                    needs.push(*oid);
                } else if !present.contains(oid) {
                    let reason = format!("missing (needed by version {id}, reached from {root})");
                    self.missing.entry(*oid).or_insert(reason);
                    needs.push(*oid);
                }
            };
            check(id);
            for m in self.files.get(id).into_iter().flatten() {
                check(m);
                self.manifests.get(m).into_iter().flatten().flat_map(|(_, _, blobs)| blobs).for_each(&mut check);
            }
            if !needs.is_empty() {
                needs.sort();
                needs.dedup();
                report.bad_versions.push(BadVersion { id: *id, reached_from: root.clone(), objects: needs });
            }
        }
        bad.extend(self.missing);
    }
}

/// Splits blobs (id → the blob it is a delta against) into runs along delta chains, each run
/// newest first: a run starts at a blob no other blob refers to (or at a blob left over) and
/// follows references down until a blob that another run already covers, the standalone base,
/// or a reference that is not a stored blob. Every blob is in exactly one run, so verifying
/// each run with one pass over its chain decodes every object about once instead of once per
/// version above it.
fn blob_paths(blobs: &BTreeMap<ObjectId, Option<ObjectId>>) -> Vec<Vec<ObjectId>> {
    let referenced: HashSet<ObjectId> = blobs.values().flatten().copied().collect();
    let tips = blobs.keys().filter(|id| !referenced.contains(*id));
    // Blobs on a cycle of references (only in a damaged store) have no tip above them; they are
    // started from once the tips are done. `covered` ends every walk, cycles included.
    let mut covered: HashSet<ObjectId> = HashSet::new();
    let mut paths = Vec::new();
    for &start in tips.chain(blobs.keys()) {
        let mut path = Vec::new();
        let mut next = Some(start);
        while let Some(id) = next {
            if !blobs.contains_key(&id) || !covered.insert(id) {
                break;
            }
            path.push(id);
            next = blobs[&id];
        }
        if !path.is_empty() {
            paths.push(path);
        }
    }
    paths
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> ObjectId {
        ObjectId::hash(&[n])
    }

    #[test]
    fn blob_paths_cover_every_blob_once_along_chains() {
        // 0 <- 1 <- 2 <- 3 and a fork 1 <- 4 <- 5; 6 standalone; 7 refers to a missing 99;
        // 8 <-> 9 a reference cycle (a damaged store).
        let mut blobs = BTreeMap::new();
        blobs.insert(id(0), None);
        for (child, parent) in [(1, 0), (2, 1), (3, 2), (4, 1), (5, 4), (7, 99), (8, 9), (9, 8)] {
            blobs.insert(id(child), Some(id(parent)));
        }
        blobs.insert(id(6), None);
        let paths = blob_paths(&blobs);
        let mut seen: Vec<ObjectId> = paths.iter().flatten().copied().collect();
        seen.sort();
        let mut all: Vec<ObjectId> = blobs.keys().copied().collect();
        all.sort();
        assert_eq!(seen, all, "every blob exactly once: {paths:?}");
        for path in &paths {
            // Each run follows references: member i + 1 is what member i is a delta against.
            for pair in path.windows(2) {
                assert_eq!(blobs[&pair[0]], Some(pair[1]));
            }
        }
        // Runs start at blobs nothing refers to, apart from the cycle.
        let starts: HashSet<ObjectId> = paths.iter().map(|p| p[0]).collect();
        for tip in [3, 5, 6, 7] {
            assert!(starts.contains(&id(tip)), "run from {tip}");
        }
        let longest = paths.iter().map(Vec::len).max().unwrap();
        assert_eq!(longest, 4, "3, 2, 1, 0 or 5, 4, 1, 0 as one run: {paths:?}");
    }
}
