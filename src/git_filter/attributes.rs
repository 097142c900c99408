//! `.gitattributes` lines for ckpt: `PATTERN filter=ckpt diff=ckpt merge=binary -text`. Editing
//! keeps every other line byte for byte; only lines whose pattern is named and that set
//! `filter=ckpt` are added or removed.
//!
//! `merge=binary`: a pointer is text, so git's default merge would write conflict markers into
//! it and the working file would become a broken pointer; as binary, a conflicting weight file
//! keeps our version in the working tree, git names the conflict, and `git checkout --ours` /
//! `--theirs` pick a side.

use super::{Error, Result};
use std::path::Path;

/// The attributes ckpt gives a tracked pattern.
pub(crate) const ATTRIBUTES: &str = "filter=ckpt diff=ckpt merge=binary -text";

/// Checks that `pattern` can be written as one `.gitattributes` pattern.
pub(crate) fn check_pattern(pattern: &str) -> Result<()> {
    let bad = |reason| Err(Error::Pattern { pattern: pattern.to_string(), reason });
    if pattern.is_empty() {
        return bad("empty");
    }
    if pattern.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return bad("contains whitespace or a control character (gitattributes patterns end at a space)");
    }
    if pattern.starts_with('#') || pattern.starts_with('!') {
        return bad("starts with # (a comment) or ! (negative patterns are not allowed in .gitattributes)");
    }
    Ok(())
}

/// The pattern of `line` if it sets `filter=ckpt`.
fn tracked_pattern(line: &str) -> Option<&str> {
    let mut fields = line.split_whitespace();
    let pattern = fields.next().filter(|p| !p.starts_with('#'))?;
    fields.any(|f| f == "filter=ckpt").then_some(pattern)
}

/// Patterns of `text` that set `filter=ckpt`, in file order.
pub fn tracked(text: &str) -> Vec<String> {
    text.lines().filter_map(tracked_pattern).map(str::to_string).collect()
}

/// `text` with a ckpt line appended for each of `patterns` not tracked yet; returns the new
/// text and the patterns added.
pub fn track(text: &str, patterns: &[String]) -> Result<(String, Vec<String>)> {
    let mut out = text.to_string();
    let mut have = tracked(text);
    let mut added = Vec::new();
    for p in patterns {
        check_pattern(p)?;
        if have.contains(p) {
            continue;
        }
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(&format!("{p} {ATTRIBUTES}\n"));
        have.push(p.clone());
        added.push(p.clone());
    }
    Ok((out, added))
}

/// `text` without the ckpt lines of `patterns`; returns the new text and the patterns removed.
pub fn untrack(text: &str, patterns: &[String]) -> (String, Vec<String>) {
    let mut out = String::with_capacity(text.len());
    let mut removed = Vec::new();
    for line in text.split_inclusive('\n') {
        match tracked_pattern(line) {
            Some(p) if patterns.iter().any(|q| q == p) => removed.push(p.to_string()),
            _ => out.push_str(line),
        }
    }
    (out, removed)
}

/// Reads `path` (empty if missing).
pub fn read(path: &Path) -> Result<String> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(source) => Err(Error::Io { action: "reading", path: path.to_path_buf(), source }),
    }
}

/// Replaces `path` with `text` (temporary file + rename: never half written).
pub fn write(path: &Path, text: &str) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let io = |action| move |source| Error::Io { action, path: path.to_path_buf(), source };
    let tmp = tempfile::NamedTempFile::new_in(dir).map_err(io("creating a file beside"))?;
    std::fs::write(tmp.path(), text).map_err(io("writing"))?;
    tmp.persist(path).map_err(|e| Error::Io { action: "renaming to", path: path.to_path_buf(), source: e.error })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn track_appends_once_and_keeps_the_rest() {
        let text = "# weights\n*.bin binary\n*.pt filter=ckpt diff=ckpt -text\nno-newline";
        let (out, added) = track(text, &s(&["*.pt", "*.safetensors", "*.safetensors"])).unwrap();
        assert_eq!(added, s(&["*.safetensors"]));
        assert_eq!(out, format!("{text}\n*.safetensors {ATTRIBUTES}\n"));
        assert_eq!(tracked(&out), s(&["*.pt", "*.safetensors"]));
        let (again, added) = track(&out, &s(&["*.safetensors"])).unwrap();
        assert!(added.is_empty());
        assert_eq!(again, out);
    }

    #[test]
    fn untrack_removes_only_ckpt_lines_of_the_patterns() {
        let text =
            "*.pt filter=ckpt diff=ckpt -text\r\n*.pt binary\n# *.pt filter=ckpt\nmodel/*.safetensors filter=ckpt\n";
        let (out, removed) = untrack(text, &s(&["*.pt", "other"]));
        assert_eq!(removed, s(&["*.pt"]));
        assert_eq!(out, "*.pt binary\n# *.pt filter=ckpt\nmodel/*.safetensors filter=ckpt\n");
    }

    #[test]
    fn bad_patterns_are_refused() {
        for p in ["", "a b", "#x", "!x", "a\nb"] {
            assert!(track("", &s(&[p])).is_err(), "{p:?}");
        }
    }
}
