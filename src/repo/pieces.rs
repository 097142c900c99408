//! Tensors handed over while a save writes its file: stored as they come, uncoded, so that the
//! file itself never holds them.
//!
//! `ckpt.dcp.Writer` used to let DCP write each rank's file into memory and then store it: every
//! byte written twice (once into the file, once into objects), plus the coding, all before the
//! save returned. That cannot reach a save time near stock DCP's (one write of every byte). Now
//! the stream DCP writes into hands each tensor's storage bytes (one `write` of the tensor's own
//! memory, as `torch.save` makes it) to [`Repo::store_piece`], which writes them as a blob
//! whose byte groups are stored raw ([`crate::store::Store::write_blob_uncoded`]: one pass,
//! no method selection) and leaves a hole in the file. [`Repo::store_objects`] then cuts the
//! file as always (its framing bytes are all there) and takes each piece whose range and dtype
//! are a tensor segment of the cut as that segment's blob; the version's compaction codes the
//! uncoded blobs later, off the save's clock, as it already rewrites the parent's blobs under
//! `reverse` (`Repo::compact`).
//!
//! A piece that does not line up with a segment of the cut (a guess of dtype that was wrong, an
//! archive the cut does not read) is written back into the file, which is then cut and stored
//! as if no piece had been taken: slower, never different.

use super::{Error, Repo, Result};
use crate::object_id::ObjectId;
use crate::store::UnsyncedBlob;
use crate::Dtype;
use std::ops::Range;
use std::sync::Mutex;

/// Writes shorter than this are left in the file: a piece costs a temp file and an object.
pub const PIECE_MIN: usize = 64 << 10;

/// The pieces a save's streams handed over, by file, until [`Repo::store_objects`] takes them.
#[derive(Debug, Default)]
pub struct Pieces {
    taken: Mutex<Vec<Piece>>,
}

/// One tensor's bytes, stored from the stream.
#[derive(Debug)]
pub(super) struct Piece {
    /// The file (its repository path) and where in it the bytes lie.
    file: String,
    pub(super) range: Range<u64>,
    pub(super) dtype: Dtype,
    pub(super) id: ObjectId,
    /// The blob's temp file, or `None` when the store held that id already.
    pub(super) blob: Option<UnsyncedBlob>,
}

impl Pieces {
    /// No pieces yet.
    pub fn new() -> Pieces {
        Pieces::default()
    }

    /// How many pieces wait for their file to be stored.
    pub fn len(&self) -> usize {
        self.taken.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether none wait.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes the pieces of `file` out, sorted by offset.
    pub(super) fn take_file(&self, file: &str) -> Vec<Piece> {
        let mut taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        let (mine, rest): (Vec<Piece>, Vec<Piece>) =
            std::mem::take(&mut *taken).into_iter().partition(|p| p.file == file);
        *taken = rest;
        let mut mine = mine;
        mine.sort_by_key(|p| p.range.start);
        mine
    }
}

impl Repo {
    /// Stores `data`, the bytes at `offset` of the file `file` a save is writing, as an
    /// uncoded blob of `dtype` (a guess the cut of the file checks in
    /// [`Repo::store_objects`]), and records it in `pieces`. The blob stays a temp file until
    /// its file is stored; a save that fails first leaves only temp files, which gc deletes.
    pub fn store_piece(&self, pieces: &Pieces, file: &str, offset: u64, data: &[u8], dtype: Dtype) -> Result<()> {
        let end = offset.checked_add(data.len() as u64).ok_or_else(|| Error::InvalidPath {
            path: file.into(),
            reason: format!("a write at {offset} of {} bytes ends past 2^64", data.len()),
        })?;
        let blob = self.store.write_blob_uncoded(data, Some(dtype), self.config.chunk_size)?;
        let id = blob.written.id;
        // Already stored (an unchanged tensor): the temp file goes (and the object's age is
        // renewed, so gc keeps it for this save).
        let blob = (!self.store.contains_fresh(&id)).then_some(blob);
        let piece = Piece { file: file.to_string(), range: offset..end, dtype, id, blob };
        pieces.taken.lock().unwrap_or_else(|e| e.into_inner()).push(piece);
        Ok(())
    }
}

/// The pieces' ranges with their ids, if every piece is a tensor segment of `segments` (the
/// input's tensor segments in file order, [`super::cut::Input::tensor_ranges`]) of the same
/// dtype; `None` if any is not.
pub(super) fn known_segments(
    pieces: &[Piece],
    segments: &[(Range<u64>, Dtype)],
) -> Option<Vec<(Range<u64>, ObjectId)>> {
    pieces
        .iter()
        .map(|p| {
            let at = segments.binary_search_by_key(&p.range.start, |(r, _)| r.start).ok()?;
            let (range, dtype) = &segments[at];
            (*range == p.range && *dtype == p.dtype).then(|| (p.range.clone(), p.id))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repo::{CommitOptions, CompactOptions, Config, DeltaPolicy, RepoPath};
    use std::path::Path;

    /// A safetensors file of two tensors large enough to be pieces (F32 and BF16, values of a
    /// weight's magnitude) and one small one; returns it with the two large tensors' ranges.
    fn checkpoint(seed: u64) -> (Vec<u8>, Vec<(Range<u64>, Dtype)>) {
        let tensors = vec![
            ("a".to_string(), Dtype::F32, vec![128, 256]),
            ("b".to_string(), Dtype::Bf16, vec![256, 256]),
            ("c".to_string(), Dtype::F32, vec![16]),
        ];
        let mut bytes = crate::safetensors::write_header(&tensors, None).unwrap();
        let start = bytes.len() as u64;
        let mut noise = crate::test_data::xorshift(seed);
        let mut weight = || (noise.next().unwrap() % 2001) as f32 / 1000.0 - 1.0;
        for _ in 0..128 * 256 {
            bytes.extend_from_slice(&(weight() * 0.02).to_le_bytes());
        }
        for _ in 0..256 * 256 {
            bytes.extend_from_slice(&(weight() * 0.02).to_le_bytes()[2..]);
        }
        for _ in 0..16 {
            bytes.extend_from_slice(&weight().to_le_bytes());
        }
        let a = start..start + 128 * 256 * 4;
        let b = a.end..a.end + 256 * 256 * 2;
        (bytes, vec![(a, Dtype::F32), (b, Dtype::Bf16)])
    }

    fn repo_with(dir: &Path, policy: DeltaPolicy) -> Repo {
        Repo::init(dir).unwrap();
        let config = Config { delta_policy: policy, ..Config::default() };
        std::fs::write(dir.join(".ckpt/config"), config.to_json()).unwrap();
        Repo::open(dir).unwrap()
    }

    /// Writes `bytes` to `spool` as a save's stream does: `pieces` (ranges, with the dtype
    /// guessed) go to `Repo::store_piece` and stay holes in the file.
    fn write_with_pieces(repo: &Repo, spool: &Path, bytes: &[u8], pieces: &[(Range<u64>, Dtype)]) -> Pieces {
        use std::os::unix::fs::FileExt;
        let sink = Pieces::new();
        let file = std::fs::File::create(spool).unwrap();
        file.set_len(bytes.len() as u64).unwrap();
        let mut at = 0;
        for (range, dtype) in pieces {
            file.write_all_at(&bytes[at as usize..range.start as usize], at).unwrap();
            let data = &bytes[range.start as usize..range.end as usize];
            repo.store_piece(&sink, "m.safetensors", range.start, data, *dtype).unwrap();
            at = range.end;
        }
        file.write_all_at(&bytes[at as usize..], at).unwrap();
        sink
    }

    fn path() -> RepoPath {
        RepoPath::parse("m.safetensors").unwrap()
    }

    #[test]
    fn pieces_store_a_file_as_its_whole_bytes_do_and_compaction_codes_them() {
        let dir = tempfile::tempdir().unwrap();
        let (bytes, ranges) = checkpoint(1);
        // The same file stored whole, for the entry it must give.
        let whole = repo_with(&dir.path().join("whole"), DeltaPolicy::Reverse);
        let spool = dir.path().join("spool");
        std::fs::write(&spool, &bytes).unwrap();
        let expected = whole.store_objects(&spool, &path(), None, None, None).unwrap();

        let repo = repo_with(&dir.path().join("repo"), DeltaPolicy::Reverse);
        let sink = write_with_pieces(&repo, &spool, &bytes, &ranges);
        assert_eq!(sink.len(), 2);
        let entry = repo.store_objects(&spool, &path(), None, None, Some(&sink)).unwrap();
        assert_eq!(entry, expected, "the same manifest as the whole file's");
        assert!(sink.is_empty());
        // The file kept its holes: the pieces were not written back.
        assert!(std::fs::read(&spool).unwrap()[ranges[0].0.start as usize..][..4096].iter().all(|&b| b == 0));

        let manifest = repo.manifest(&entry.manifest).unwrap();
        let piece_blobs: Vec<ObjectId> =
            manifest.segments.iter().filter(|s| s.len >= PIECE_MIN as u64).filter_map(|s| s.blob).collect();
        assert_eq!(piece_blobs.len(), 2);
        let uncoded = |id: &ObjectId| repo.store().open_blob(id).unwrap().is_uncoded().unwrap();
        let sizes = |repo: &Repo| -> u64 { piece_blobs.iter().map(|id| repo.store().stored_len(id).unwrap()).sum() };
        assert!(piece_blobs.iter().all(uncoded));
        let uncoded_size = sizes(&repo);

        let v = repo.commit_stored("main", None, vec![entry], "save", &CommitOptions::default()).unwrap();
        assert_eq!(repo.read_file_bytes(&v.to_hex(), "m.safetensors", 1 << 30).unwrap(), bytes);
        let report = repo.compact(&CompactOptions::default()).unwrap();
        assert_eq!((report.versions, report.coded), (1, 2));
        assert!(!piece_blobs.iter().any(uncoded));
        assert_eq!(sizes(&repo), sizes(&whole), "coded as a commit codes them");
        assert!(sizes(&repo) < uncoded_size * 9 / 10, "{} of {uncoded_size}", sizes(&repo));
        assert_eq!(repo.read_file_bytes(&v.to_hex(), "m.safetensors", 1 << 30).unwrap(), bytes);
        assert!(repo.verify().unwrap().is_ok());
        // Nothing left to code: a second compaction has nothing pending.
        assert_eq!(repo.compact(&CompactOptions::default()).unwrap().versions, 0);
    }

    #[test]
    fn a_piece_the_cut_does_not_confirm_is_written_back_and_the_file_stored_as_usual() {
        let dir = tempfile::tempdir().unwrap();
        let (bytes, ranges) = checkpoint(2);
        let spool = dir.path().join("spool");
        std::fs::write(&spool, &bytes).unwrap();
        let whole = repo_with(&dir.path().join("whole"), DeltaPolicy::Reverse);
        let expected = whole.store_objects(&spool, &path(), None, None, None).unwrap();
        let header_len = ranges[0].0.start;
        let wrong_guesses = [
            // The BF16 tensor guessed as F32.
            vec![ranges[0].clone(), (ranges[1].0.clone(), Dtype::F32)],
            // A range that is not a tensor of the cut: the F32 tensor and the header before it.
            vec![(0..ranges[0].0.end, Dtype::U8)],
            // Half a tensor.
            vec![(ranges[1].0.start..ranges[1].0.start + (PIECE_MIN as u64), Dtype::Bf16)],
        ];
        assert!(header_len > 0);
        for (n, pieces) in wrong_guesses.iter().enumerate() {
            let repo = repo_with(&dir.path().join(format!("repo{n}")), DeltaPolicy::Reverse);
            let sink = write_with_pieces(&repo, &spool, &bytes, pieces);
            let entry = repo.store_objects(&spool, &path(), None, None, Some(&sink)).unwrap();
            assert_eq!(entry, expected, "guess {n}");
            assert_eq!(std::fs::read(&spool).unwrap(), bytes, "guess {n}: the file is whole again");
            // Each tensor's blob is of the cut's dtype (not the guess's), and coded.
            let manifest = repo.manifest(&entry.manifest).unwrap();
            for s in manifest.segments.iter().filter(|s| s.len >= PIECE_MIN as u64) {
                let blob = repo.store().open_blob(&s.blob.unwrap()).unwrap();
                assert_eq!(blob.dtype(), s.tensor.as_ref().and_then(|t| t.dtype()), "guess {n}");
                assert!(!blob.is_uncoded().unwrap(), "guess {n}");
            }
            let v = repo.commit_stored("main", None, vec![entry], "save", &CommitOptions::default()).unwrap();
            assert_eq!(repo.read_file_bytes(&v.to_hex(), "m.safetensors", 1 << 30).unwrap(), bytes);
            assert!(repo.verify().unwrap().is_ok());
        }
    }

    #[test]
    fn under_a_policy_that_codes_at_the_save_pieces_are_written_back() {
        // `previous` delta-codes against the previous version in `store_objects`, and no
        // compaction follows the save: nothing may stay uncoded.
        let dir = tempfile::tempdir().unwrap();
        let repo = repo_with(&dir.path().join("repo"), DeltaPolicy::Previous);
        let spool = dir.path().join("spool");
        let mut tip = None;
        for seed in [3, 4] {
            let (bytes, ranges) = checkpoint(seed);
            let sink = write_with_pieces(&repo, &spool, &bytes, &ranges);
            let entry = repo.store_objects(&spool, &path(), tip.as_ref(), None, Some(&sink)).unwrap();
            let manifest = repo.manifest(&entry.manifest).unwrap();
            for s in manifest.segments.iter().filter(|s| s.len >= PIECE_MIN as u64) {
                let blob = repo.store().open_blob(&s.blob.unwrap()).unwrap();
                assert!(!blob.is_uncoded().unwrap());
            }
            tip = Some(repo.commit_stored("main", tip, vec![entry], "save", &CommitOptions::default()).unwrap());
            assert_eq!(repo.read_file_bytes("HEAD", "m.safetensors", 1 << 30).unwrap(), bytes);
        }
        assert!(!repo.has_pending_deltas());
    }
}
