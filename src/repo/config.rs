//! `.ckpt/config`: a JSON object of settings; missing keys take their defaults.

use super::{Error, Result};
use crate::codec::Options;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// What a tensor is delta-coded against: ZipNN's two policies (`Previous`, `Base`), skip-deltas,
/// and reverse deltas (the default: docs/architecture.md, "Delta policy", has the measurements).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeltaPolicy {
    /// The same tensor in the parent version; chains grow until a full base is due.
    Previous,
    /// The same tensor in the last full-base version: every delta has depth 1.
    Base,
    /// Skip-deltas (as in Subversion): the version `s` versions after the base (`since_base`)
    /// deltas against the one `s` with its lowest set bit cleared (1, 2, 4, 8 → base; 3 → 2;
    /// 5, 6 → 4; 7 → 6), so a tensor that changes every version has chains no deeper than the
    /// number of one bits of `s`: at most 4 under `base_every = 20`, where `previous` reaches
    /// 19. (A tensor unchanged since an earlier version keeps that version's blob and depth, so
    /// the hard bound stays `base_every - 1`.) Deltas span more epochs, so the store is larger
    /// than with `previous` (docs/BENCHMARKS.md, "Delta chain depth").
    Skip,
    /// Reverse deltas (as RCS keeps its trunk): every commit stores the new version whole, then
    /// rewrites the parent's blobs of the same tensors as XOR deltas against the new ones. The
    /// newest version is never a delta, so checking it out (resuming training, deploying) costs
    /// the same at any history length, and a commit never decodes a chain: it codes each
    /// changed tensor twice (whole, and the delta against the parent's standalone blob), at any
    /// depth. Older versions sit deeper the older they are, up to the next pinned version: a
    /// version with `since_base == 0` that has a parent keeps its blobs whole. The store holds
    /// the same deltas as with `previous` (XOR is symmetric), with the whole copy at the newest
    /// end instead of the oldest.
    Reverse,
}

/// When `ckpt commit` rewrites the parent's blobs as deltas under the `reverse` policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compaction {
    /// In a background process started after the commit (`ckpt compact --background`): the
    /// commit returns after one coding pass. A writer that arrives meanwhile makes it stop
    /// between two rewrites; the next commit's compaction finishes the work.
    Background,
    /// Before the commit returns (two coding passes).
    Inline,
    /// Only when asked: `ckpt compact` or `ckpt gc` (for a schedule of one's own, and for
    /// benchmarks that time the two halves apart).
    Manual,
}

impl Compaction {
    /// The setting in force: the `CKPT_COMPACT` environment variable (`background`, `inline`
    /// or `manual`) if set, else `configured`.
    pub fn from_env_or(configured: Compaction) -> std::result::Result<Compaction, String> {
        match std::env::var("CKPT_COMPACT") {
            Ok(v) => serde_json::from_value(serde_json::Value::String(v.clone()))
                .map_err(|_| format!("CKPT_COMPACT={v:?}: expected \"background\", \"inline\" or \"manual\"")),
            Err(_) => Ok(configured),
        }
    }
}

/// The largest `base_every` allowed. Chains reach `base_every` deltas deep (the `reverse`
/// policy: from the root version to the first kept base; the other policies stop at
/// `base_every - 1`), and a reader follows at most [`crate::store::MAX_CHAIN_DEPTH`] deltas: a
/// larger setting would let the writer produce history the reader refuses.
pub const MAX_BASE_EVERY: u32 = crate::store::MAX_CHAIN_DEPTH;

/// Repository settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Every `base_every`-th version stores full bases (with `Reverse`: keeps them), and no
    /// delta chain is deeper than `base_every - 1` (`base_every` with `Reverse`, whose chains
    /// run forward to the next kept base). 1 disables deltas. The default, 20, is measured
    /// (docs/BENCHMARKS.md, "base interval"): a full base costs as much as 5-40 late-training
    /// deltas, while each chain level adds only the decoding of one delta to a checkout (git
    /// allows 50, its `pack.depth`).
    pub base_every: u32,
    /// What deltas are taken against.
    pub delta_policy: DeltaPolicy,
    /// Codec chunk size in bytes for new standalone blobs (deltas use their reference's).
    pub chunk_size: usize,
    /// zstd level for groups coded with zstd.
    pub zstd_level: i32,
    /// `default` or `max` ([`crate::codec::Level`]): `max` tries rANS with context on every
    /// byte group (smaller, slower to commit).
    pub compression_level: crate::codec::Level,
    /// When `ckpt commit` turns the parent's blobs into deltas (`reverse` policy). The library's
    /// [`super::Repo::commit`] does it inline unless told otherwise
    /// ([`super::CommitOptions::defer_deltas`]).
    pub compact: Compaction,
    /// How long `gc` keeps an object that nothing references, counted from when it was written
    /// or last reused (its file's mtime), in seconds: the objects of a save still in flight
    /// (the ranks of `ckpt.dcp.Writer` store theirs before any version names them; so does a
    /// `git add` before git writes its index) are unreferenced until it ends. `ckpt gc
    /// --prune=now` overrides it for one run. Default: one hour (git keeps such objects two
    /// weeks; a checkpoint's garbage is too large for that, and a save lasts minutes).
    pub gc_grace_seconds: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            base_every: 20,
            delta_policy: DeltaPolicy::Reverse,
            chunk_size: Options::default().chunk_size,
            zstd_level: Options::default().zstd_level,
            compression_level: crate::codec::Level::Default,
            compact: Compaction::Background,
            gc_grace_seconds: 3600,
        }
    }
}

impl Config {
    /// Reads and checks the config file.
    pub fn load(path: &Path) -> Result<Config> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            action: "reading the config",
            path: path.to_path_buf(),
            source,
        })?;
        let config: Config = serde_json::from_slice(&bytes)
            .map_err(|e| Error::Config { path: path.to_path_buf(), reason: e.to_string() })?;
        config.check().map_err(|reason| Error::Config { path: path.to_path_buf(), reason })?;
        Ok(config)
    }

    /// Pretty JSON for the config file.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("plain data serializes") + "\n"
    }

    /// Checks the values.
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.base_every == 0 {
            return Err("base_every must be at least 1".into());
        }
        if self.base_every > MAX_BASE_EVERY {
            return Err(format!(
                "base_every {} is over {MAX_BASE_EVERY}: delta chains reach base_every deep (with \"reverse\"), \
                 and readers refuse chains deeper than {MAX_BASE_EVERY}",
                self.base_every
            ));
        }
        crate::codec::chunk::checked_chunk_size(&self.codec_options()).map_err(|e| e.to_string())?;
        if !(1..=22).contains(&self.zstd_level) {
            return Err(format!("zstd_level {} is not in 1..=22", self.zstd_level));
        }
        Ok(())
    }

    /// Codec options for new objects.
    pub fn codec_options(&self) -> Options {
        Options {
            chunk_size: self.chunk_size,
            zstd_level: self.zstd_level,
            level: self.compression_level,
            ..Options::default()
        }
    }
}
