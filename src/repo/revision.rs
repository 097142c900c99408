//! Revision parsing: `HEAD`, branches, tags, remote-tracking branches, short ids, `~N`.

use super::*;

impl Repo {
    /// Resolves a revision: `HEAD`, a branch, a tag, a full or unique short (at least 4 hex
    /// digits) version id, each optionally followed by `~N` (N first parents back; `~` alone
    /// is `~1`; repeatable).
    pub fn resolve(&self, rev: &str) -> Result<VersionId> {
        let unknown = |reason: String| Error::UnknownRevision { rev: rev.to_string(), reason };
        let (base, steps) = split_ancestry(rev).ok_or_else(|| unknown("bad ~N suffix".into()))?;
        let mut id = self.resolve_base(base).map_err(|e| match e {
            Error::UnknownRevision { reason, .. } => unknown(reason),
            other => other,
        })?;
        let cut = if steps > 0 { self.cut_versions()? } else { Default::default() };
        for n in 0..steps {
            let info = self.version_info(&id)?;
            let parent = *info.parents.first().ok_or_else(|| {
                unknown(format!("{base} has only {n} version{} before it", if n == 1 { "" } else { "s" }))
            })?;
            if cut.is_pruned(&id) {
                return Err(unknown(format!(
                    "past the history `ckpt prune` kept ({} is the oldest version kept there)",
                    id.short(12)
                )));
            }
            if !self.store.contains(&parent) && cut.contains(&id) {
                return Err(unknown(format!(
                    "past the history this partial clone holds ({} is where it is cut; `ckpt checkout` fetches it)",
                    id.short(12)
                )));
            }
            id = parent;
        }
        Ok(id)
    }

    pub(crate) fn resolve_base(&self, base: &str) -> Result<VersionId> {
        let unknown = |reason: String| Error::UnknownRevision { rev: base.to_string(), reason };
        if base == "HEAD" {
            return match self.refs.head()? {
                Head::Detached(id) => Ok(id),
                Head::Branch(b) => self
                    .refs
                    .get(RefKind::Branch, &b)?
                    .ok_or_else(|| unknown(format!("branch {b:?} has no version yet"))),
            };
        }
        // `refs/heads/NAME` and `refs/tags/NAME` name one kind (a branch and a tag of one name,
        // which ckpt no longer creates, are otherwise ambiguous).
        for kind in [RefKind::Branch, RefKind::Tag] {
            if let Some(name) = base.strip_prefix(&format!("refs/{}/", kind.dir())) {
                return self.refs.get(kind, name)?.ok_or_else(|| unknown(format!("no {} named {name:?}", kind.name())));
            }
        }
        if let Some(id) = self.refs.get(RefKind::Branch, base)? {
            if self.refs.get(RefKind::Tag, base)?.is_some_and(|t| t != id) {
                return Err(unknown(format!(
                    "ambiguous: both a branch and a tag are named {base:?}; say refs/heads/{base} or refs/tags/{base}"
                )));
            }
            return Ok(id);
        }
        if let Some((remote, branch)) = base.split_once('/') {
            return self.refs.get_remote(remote, branch)?.ok_or_else(|| {
                unknown(format!("no remote-tracking branch {branch:?} of remote {remote:?} (fetch first)"))
            });
        }
        if let Some(id) = self.refs.get(RefKind::Tag, base)? {
            return Ok(id);
        }
        let is_hex = base.len() >= 4 && base.len() <= 64 && base.bytes().all(|b| b.is_ascii_hexdigit());
        if !is_hex {
            return Err(unknown("not HEAD, a branch, a tag or a version id".into()));
        }
        let prefix = base.to_ascii_lowercase();
        let candidates = self.versions_with_prefix(&prefix)?;
        match candidates.as_slice() {
            [id] => Ok(*id),
            [] => match self.pruned_with_prefix(&prefix)? {
                Some(version) => Err(Error::VersionPruned { version }),
                None => Err(unknown("no version has this id".into())),
            },
            many => Err(unknown(format!(
                "ambiguous: {} versions start with it ({})",
                many.len(),
                many.iter().take(4).map(|i| i.short(12)).collect::<Vec<_>>().join(", ")
            ))),
        }
    }

    /// Version ids in the store starting with `prefix` (lowercase hex, at least 2 digits).
    pub(super) fn versions_with_prefix(&self, prefix: &str) -> Result<Vec<VersionId>> {
        let fan = self.store.object_path(&ObjectId([0; 32]));
        let fan_root = fan.parent().and_then(Path::parent).expect("objects/ab/x");
        let dir = fan_root.join(&prefix[..2]);
        let mut out = Vec::new();
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(source) => return Err(Error::Io { action: "listing", path: dir, source }),
        };
        for entry in entries {
            let entry = entry.map_err(io("listing", &dir))?;
            let name = format!("{}{}", &prefix[..2], entry.file_name().to_string_lossy());
            if !name.starts_with(prefix) {
                continue;
            }
            let Ok(id) = name.parse::<ObjectId>() else { continue };
            if matches!(self.store.header(&id), Ok(h) if h.kind == ObjectKind::Version) {
                out.push(id);
            }
        }
        out.sort();
        Ok(out)
    }
}

/// Splits `rev` into its base and the number of `~` steps.
pub(crate) fn split_ancestry(rev: &str) -> Option<(&str, u64)> {
    let (base, mut rest) = match rev.find('~') {
        Some(i) => (&rev[..i], &rev[i..]),
        None => return Some((rev, 0)),
    };
    let mut steps = 0u64;
    while let Some(after) = rest.strip_prefix('~') {
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        let n = if digits == 0 { 1 } else { after[..digits].parse::<u64>().ok()? };
        steps = steps.checked_add(n)?;
        rest = &after[digits..];
    }
    (rest.is_empty() && !base.is_empty()).then_some((base, steps))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn ancestry_suffixes() {
        assert_eq!(split_ancestry("HEAD"), Some(("HEAD", 0)));
        assert_eq!(split_ancestry("HEAD~"), Some(("HEAD", 1)));
        assert_eq!(split_ancestry("main~3"), Some(("main", 3)));
        assert_eq!(split_ancestry("abcd~2~"), Some(("abcd", 3)));
        assert_eq!(split_ancestry("~2"), None);
        assert_eq!(split_ancestry("HEAD~x"), None);
    }
}
