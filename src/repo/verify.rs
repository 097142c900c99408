//! `verify`: re-hashes every object (blobs through their delta chains), checks every ref, and
//! names the versions reachable from refs that a damaged or missing object affects.

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
    /// Versions reachable from refs.
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
    pub fn verify(&self) -> Result<VerifyReport> {
        let ids = self.store.list()?;
        let sizes: Vec<u64> = ids.iter().map(|id| self.store.stored_len(id).unwrap_or(0)).collect();
        let total: u64 = sizes.iter().sum();
        let mut report = VerifyReport::default();
        let mut bad: BTreeMap<ObjectId, String> = BTreeMap::new();
        self.progress.start("verify", total);
        let mut done = 0;
        for (id, size) in ids.iter().zip(&sizes) {
            if let Err(problem) = self.verify_object(id) {
                bad.insert(*id, problem);
            }
            done += size;
            report.objects_checked += 1;
            self.progress.set(done);
        }
        report.bytes_checked = total;
        self.progress.finish();

        // Refs, then every version they reach.
        let present: HashSet<ObjectId> = ids.iter().copied().collect();
        let mut roots = Vec::new();
        for kind in [super::RefKind::Branch, super::RefKind::Tag] {
            match self.refs.list(kind) {
                Ok(list) => roots.extend(list.into_iter().map(|(name, id)| (format!("{} {name}", kind.name()), id))),
                Err(e) => report.bad_refs.push(e.to_string()),
            }
        }
        match self.refs.head() {
            Ok(super::Head::Detached(id)) => roots.push(("HEAD".to_string(), id)),
            Ok(super::Head::Branch(_)) => {}
            Err(e) => report.bad_refs.push(e.to_string()),
        }
        let mut stack = Vec::new();
        for (name, id) in roots {
            if !present.contains(&id) || !matches!(self.store.header(&id), Ok(h) if h.kind == ObjectKind::Version) {
                report.bad_refs.push(format!("{name} points to {id}, which is not a stored version"));
            }
            stack.push(id);
        }
        let mut seen = HashSet::new();
        let mut missing: BTreeMap<ObjectId, String> = BTreeMap::new();
        while let Some(id) = stack.pop() {
            if !seen.insert(id) {
                continue;
            }
            report.versions_checked += 1;
            let mut needs = Vec::new();
            let mut check = |oid: ObjectId, missing: &mut BTreeMap<ObjectId, String>| {
                if bad.contains_key(&oid) {
                    needs.push(oid);
                } else if !present.contains(&oid) {
                    missing.insert(oid, format!("missing (needed by version {id})"));
                    needs.push(oid);
                }
            };
            check(id, &mut missing);
            if let Ok(version) = self.version(&id) {
                stack.extend(version.parents.iter().copied());
                for file in &version.files {
                    check(file.manifest, &mut missing);
                    if let Ok(manifest) = self.manifest(&file.manifest) {
                        for s in &manifest.segments {
                            check(s.blob, &mut missing);
                        }
                    }
                }
            }
            if !needs.is_empty() {
                needs.sort();
                needs.dedup();
                report.bad_versions.push(BadVersion { id, objects: needs });
            }
        }
        bad.extend(missing);
        report.bad_objects = bad.into_iter().map(|(id, problem)| BadObject { id, problem }).collect();
        Ok(report)
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
                Manifest::parse(*id, &bytes).map_err(|e| e.to_string())?;
            }
            ObjectKind::Blob => {}
        }
        Ok(())
    }
}
