//! Records of saves in flight (docs/format.md, "Saves in flight"): a writer that stores objects
//! without the writer lock and names them only at its end (the ranks of a `ckpt.dcp.Writer`
//! save, on one machine or many sharing the repository's file system) announces the save in
//! `.ckpt/saves/<32 hex>` and keeps the record's mtime fresh from a thread while it runs. gc keeps
//! every unreferenced object written since the oldest live save began, whatever its grace period
//! (`--prune=now` included) and however long the save takes; without a record only the grace
//! period protected a save, so a save longer than it, or a `gc --prune=now` during one, lost it.
//!
//! A record is live while its mtime is younger than [`SAVE_LAPSE`]: a killed save's record
//! stops changing, and the next gc after that deletes it. The record's start is the writer's
//! clock, the objects' mtimes are each writer's machine's (or the file server's), so gc keeps
//! from [`SAVE_SLACK`] before the start.

use super::error::io;
use super::{Repo, Result};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The directory of the records, in `.ckpt/`.
pub const SAVES_DIR: &str = "saves";

/// How often a live save rewrites its record's mtime.
const SAVE_BEAT: Duration = Duration::from_secs(30);

/// A record whose mtime is this old is a dead save's (its process was killed): gc ignores and
/// deletes it. Well over the 30 s between renewals, so that a stalled machine or a slow file server does not
/// make a live save look dead.
pub const SAVE_LAPSE: Duration = Duration::from_secs(600);

/// How long before a live save's start gc keeps unreferenced objects: room for the clocks of
/// the machines writing to the repository to differ.
const SAVE_SLACK: Duration = Duration::from_secs(600);

/// Records read at most (a directory of more is someone else's doing: the rest are ignored).
const MAX_SAVE_RECORDS: usize = 4096;

/// Bytes of a record read at most.
const MAX_RECORD_LEN: u64 = 4096;

/// A record's content: one line of JSON.
#[derive(serde::Serialize, serde::Deserialize)]
struct RecordText {
    /// When the save began: seconds since the Unix epoch, on the writer's clock.
    started: u64,
    /// The writer's process id (for people reading the record).
    pid: u32,
    /// What is being saved (for people reading the record).
    what: String,
}

/// A live save's record: kept fresh by a thread until [`SaveRecord::end`] or drop, which stop
/// the thread and delete the record. A forked child's copy does nothing when dropped (the
/// thread and the save are the parent's).
pub struct SaveRecord {
    path: PathBuf,
    owner: u32,
    stop: Arc<(Mutex<bool>, Condvar)>,
    beat: Option<std::thread::JoinHandle<()>>,
}

impl SaveRecord {
    /// Ends the save: the record is deleted (gc then treats what the save wrote by its age).
    pub fn end(self) {}

    /// The record's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SaveRecord {
    fn drop(&mut self) {
        if std::process::id() != self.owner {
            return;
        }
        let (stopped, wake) = &*self.stop;
        *stopped.lock().unwrap_or_else(|e| e.into_inner()) = true;
        wake.notify_all();
        if let Some(beat) = self.beat.take() {
            let _ = beat.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What gc learns from the records: the earliest moment it must keep unreferenced objects from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct SavesInFlight {
    /// Live records.
    pub(super) live: usize,
    /// Keep unreferenced objects modified at or after this (`None`: no live save).
    pub(super) keep_since: Option<SystemTime>,
}

impl Repo {
    fn saves_dir(&self) -> PathBuf {
        self.dir.join(SAVES_DIR)
    }

    /// Announces a save that stores objects before anything names them (`what` says which, for
    /// people reading the record): until the returned record ends, gc keeps what it writes.
    pub fn begin_save(&self, what: &str) -> Result<SaveRecord> {
        let dir = self.saves_dir();
        std::fs::create_dir_all(&dir).map_err(io("creating", &dir))?;
        let started = SystemTime::now();
        let seed = format!("{started:?} {} {:?} {what}", std::process::id(), std::thread::current().id());
        let hex = crate::object_id::ObjectId::hash(seed.as_bytes()).to_hex();
        let path = dir.join(format!("{}.json", &hex[..32]));
        let text = RecordText {
            started: started.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            pid: std::process::id(),
            what: what.to_string(),
        };
        let mut line = serde_json::to_vec(&text).expect("a record serializes");
        line.push(b'\n');
        // Written in place (create-new): a reader that finds it empty or torn treats it as
        // started long ago (keeps more), and its mtime is fresh either way.
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, &line))
            .map_err(io("writing", &path))?;
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let beat = {
            let (stop, beat_path) = (stop.clone(), path.clone());
            std::thread::Builder::new()
                .name("ckpt-save-record".into())
                .spawn(move || {
                    let (stopped, wake) = &*stop;
                    let mut done = stopped.lock().unwrap_or_else(|e| e.into_inner());
                    while !*done {
                        done = wake.wait_timeout(done, SAVE_BEAT).unwrap_or_else(|e| e.into_inner()).0;
                        if !*done {
                            // A failed touch is retried at the next beat; ten missed in a row
                            // and gc takes the save for dead, as for a killed one.
                            let _ = std::fs::File::options()
                                .write(true)
                                .open(&beat_path)
                                .and_then(|f| f.set_modified(SystemTime::now()));
                        }
                    }
                })
                .map_err(io("starting a thread for", &path))?
        };
        Ok(SaveRecord { path, owner: std::process::id(), stop, beat: Some(beat) })
    }

    /// Reads the save records: the live ones say from when gc keeps unreferenced objects; dead
    /// ones are deleted when `delete_dead` (gc, under the writer lock). Unreadable entries are
    /// skipped; a live record that does not parse counts as started a day before its mtime.
    pub(super) fn saves_in_flight(&self, delete_dead: bool) -> SavesInFlight {
        let mut found = SavesInFlight::default();
        let Ok(entries) = std::fs::read_dir(self.saves_dir()) else { return found };
        let now = SystemTime::now();
        for entry in entries.flatten().take(MAX_SAVE_RECORDS) {
            // Only records as writers name them (not an editor's or NFS's temp files).
            let name = entry.file_name();
            let is_record = name
                .to_str()
                .and_then(|n| n.strip_suffix(".json"))
                .is_some_and(|stem| stem.len() == 32 && stem.bytes().all(|b| b.is_ascii_hexdigit()));
            if !is_record || !entry.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            let path = entry.path();
            let Ok(modified) = entry.metadata().and_then(|m| m.modified()) else { continue };
            if now.duration_since(modified).is_ok_and(|age| age >= SAVE_LAPSE) {
                if delete_dead {
                    let _ = std::fs::remove_file(&path);
                }
                continue;
            }
            let started = read_start(&path).unwrap_or_else(|| modified - Duration::from_secs(86400));
            let since = started.checked_sub(SAVE_SLACK).unwrap_or(UNIX_EPOCH);
            found.live += 1;
            found.keep_since = Some(found.keep_since.map_or(since, |k| k.min(since)));
        }
        found
    }
}

/// A record's start, if it parses.
fn read_start(path: &Path) -> Option<SystemTime> {
    let mut bytes = Vec::new();
    let file = std::fs::File::open(path).ok()?;
    std::io::Read::read_to_end(&mut std::io::Read::take(file, MAX_RECORD_LEN), &mut bytes).ok()?;
    let text: RecordText = serde_json::from_slice(&bytes).ok()?;
    UNIX_EPOCH.checked_add(Duration::from_secs(text.started))
}
