//! A small tmpfs, to fill a file system on purpose.

use std::path::Path;

/// A tmpfs of `size` at a new directory, unmounted and removed on drop; `None` (with a note)
/// where mounting is not allowed (a failure with `CKPT_REQUIRE_TMPFS=1`, which CI sets: it runs
/// as root).
pub struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    pub fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output();
        let failure = match out {
            Ok(out) if out.status.success() => return Some(Tmpfs(dir)),
            Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_string(),
            Err(e) => format!("running mount: {e}"),
        };
        super::skip(
            &format!("cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {failure}"),
            "CKPT_REQUIRE_TMPFS",
        );
        None
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// Fills the file system with `filler` until at most `leave` bytes are free.
    pub fn fill(&self, filler: &Path, leave: u64) {
        use std::io::Write;
        let mut f = std::fs::File::create(filler).unwrap();
        let block = vec![0xA5u8; 64 << 10];
        while f.write_all(&block).is_ok() {}
        let len = f.metadata().unwrap().len();
        f.set_len(len.saturating_sub(leave)).unwrap();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(self.0.path()).status();
    }
}
