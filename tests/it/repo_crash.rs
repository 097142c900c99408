//! kill -9 of `ckpt commit`, `ckpt compact` and `ckpt gc` at random moments. After every kill
//! the repository opens, verifies, checks out every version committed before bit-exactly, and
//! takes new commits. `CKPT_CRASH_TRIALS=N` runs N trials of each kind instead of the default.

use crate::support::repo_util::{
    ckpt_command, stderr, synthetic_checkpoint, Files, Rng, TestRepo, TRAINING_MODEL, TRAINING_OPTIM,
};
use ckpt::repo::{CommitOptions, Config, DeltaPolicy, Repo, VersionId};
use ckpt::store::Feedback;
use ckpt::{Dtype, ObjectId};
use std::process::Stdio;
use std::time::{Duration, Instant};

fn files_for(epoch: u32) -> Files {
    vec![
        ("model.safetensors".to_string(), synthetic_checkpoint(21, Dtype::Bf16, TRAINING_MODEL, epoch)),
        ("optim.safetensors".to_string(), synthetic_checkpoint(22, Dtype::F32, TRAINING_OPTIM, epoch)),
        ("step.txt".to_string(), format!("step {}\n", epoch * 1000).into_bytes()),
    ]
}

fn spawn(t: &TestRepo, args: &[&str]) -> std::process::Child {
    ckpt_command(t.root(), args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("spawn ckpt")
}

/// Starts `args`, kills it with SIGKILL after a random part (0 to 1.2) of `typical`, and returns
/// how long it ran and whether it had finished by then.
fn kill_during(t: &TestRepo, args: &[&str], typical: Duration, rng: &mut Rng) -> (Duration, bool) {
    let mut child = spawn(t, args);
    let delay = typical.mul_f64(rng.unit() * 1.2);
    std::thread::sleep(delay);
    let _ = child.kill();
    (delay, child.wait().unwrap().success())
}

/// Runs `args` to completion and returns how long it took.
fn timed(t: &TestRepo, args: &[&str]) -> Duration {
    let start = Instant::now();
    let o = ckpt_command(t.root(), args).output().unwrap();
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    start.elapsed()
}

/// The checks after every kill.
fn check(t: &TestRepo, history: &mut Vec<(VersionId, Files)>, pending: Option<&Files>, what: &str) {
    let repo = Repo::open(t.root()).unwrap_or_else(|e| panic!("{what}: repository does not open: {e}"));
    let head = repo.resolve("HEAD").unwrap();
    if head != history.last().unwrap().0 {
        // The killed commit completed: it must be the expected child of the previous head.
        let files = pending.unwrap_or_else(|| panic!("{what}: HEAD moved without a commit"));
        assert_eq!(repo.version_info(&head).unwrap().parents, vec![history.last().unwrap().0], "{what}");
        history.push((head, files.clone()));
    }
    let report = repo.verify().unwrap();
    assert!(report.is_ok(), "{what}: verify failed: {report:?}");
    for (id, files) in history.iter() {
        let out = tempfile::tempdir().unwrap();
        repo.checkout(&id.to_hex(), None, Some(out.path()), None)
            .unwrap_or_else(|e| panic!("{what}: checkout {id}: {e}"));
        for (name, bytes) in files {
            assert_eq!(&std::fs::read(out.path().join(name)).unwrap(), bytes, "{what}: {name} of {id}");
        }
    }
}

#[test]
fn kill_9_during_commit_compact_and_gc() {
    let trials: u32 = std::env::var("CKPT_CRASH_TRIALS").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let (commit_trials, compact_trials, gc_trials) = if trials > 0 { (trials, trials, trials) } else { (30, 16, 16) };
    let config = Config { base_every: 4, chunk_size: 16 << 10, ..Config::default() };
    // Set-up commits with reverse deltas, the slower kind, so that kill times span both kinds.
    let t = TestRepo::with_config(&Config { delta_policy: DeltaPolicy::Reverse, ..config.clone() });
    let mut history: Vec<(VersionId, Files)> = Vec::new();
    let mut epoch = 0;
    let mut commit_time = Duration::ZERO;
    for _ in 0..2 {
        let files = files_for(epoch);
        t.write_files(&files);
        commit_time = commit_time
            .max(timed(&t, &["commit", "-m", "setup", "model.safetensors", "optim.safetensors", "step.txt"]));
        history.push((Repo::open(t.root()).unwrap().resolve("HEAD").unwrap(), files));
        epoch += 1;
    }
    let gc_time = timed(&t, &["gc", "--prune=now"]).max(Duration::from_millis(5));
    let mut rng = Rng::new(42);
    let started = Instant::now();
    let mut completed = 0;

    for trial in 0..commit_trials {
        // Every other trial commits with reverse deltas, which also rewrite the parent's blobs.
        let delta_policy = if trial % 2 == 0 { DeltaPolicy::Reverse } else { DeltaPolicy::Previous };
        t.write(".ckpt/config", &serde_json::to_vec(&Config { delta_policy, ..config.clone() }).unwrap());
        let files = files_for(epoch);
        t.write_files(&files);
        let message = format!("trial {trial}");
        let args = ["commit", "-m", &message, "model.safetensors", "optim.safetensors", "step.txt"];
        let (delay, finished) = kill_during(&t, &args, commit_time, &mut rng);
        completed += finished as u32;
        let before = history.len();
        check(&t, &mut history, Some(&files), &format!("commit trial {trial} (killed after {delay:?})"));
        if history.len() > before {
            epoch += 1;
        }
        if trial % 10 == 9 {
            // A new commit through the library works.
            let files = files_for(epoch);
            t.write_files(&files);
            let repo = Repo::open(t.root()).unwrap();
            let id = repo
                .commit(
                    &["model.safetensors", "optim.safetensors", "step.txt"],
                    "after kills",
                    &CommitOptions::default(),
                )
                .unwrap();
            history.push((id, files));
            epoch += 1;
        }
    }

    // Compactions: a commit that leaves its deltas pending, then `ckpt compact` killed.
    let deferred = CommitOptions { defer_deltas: true, ..CommitOptions::default() };
    t.write(
        ".ckpt/config",
        &serde_json::to_vec(&Config { delta_policy: DeltaPolicy::Reverse, ..config.clone() }).unwrap(),
    );
    let mut compact_time = Duration::from_millis(5);
    for trial in 0..compact_trials {
        let files = files_for(epoch);
        t.write_files(&files);
        let id = Repo::open(t.root())
            .unwrap()
            .commit(&["model.safetensors", "optim.safetensors", "step.txt"], "deferred", &deferred)
            .unwrap();
        history.push((id, files));
        epoch += 1;
        assert!(Repo::open(t.root()).unwrap().has_pending_deltas());
        if trial == 0 {
            // The first one runs to the end, to time the rest.
            compact_time = timed(&t, &["compact"]).max(compact_time);
            check(&t, &mut history, None, "first compaction");
            continue;
        }
        let (delay, finished) = kill_during(&t, &["compact"], compact_time, &mut rng);
        completed += finished as u32;
        check(&t, &mut history, None, &format!("compact trial {trial} (killed after {delay:?})"));
    }

    for trial in 0..gc_trials {
        // Garbage for gc to find: unreferenced blobs, as an interrupted commit leaves them.
        {
            let repo = Repo::open(t.root()).unwrap();
            for g in 0..8u64 {
                let bytes = crate::support::util::noise(trial as u64 * 100 + g, 20_000 + g as usize * 4096);
                let id = ObjectId::hash(&bytes);
                repo.store().write_blob(id, &bytes, None, &repo.config().codec_options(), &Feedback::NONE).unwrap();
            }
        }
        let (delay, finished) = kill_during(&t, &["gc", "--prune=now"], gc_time, &mut rng);
        completed += finished as u32;
        check(&t, &mut history, None, &format!("gc trial {trial} (killed after {delay:?})"));
    }

    // Finally: a commit and a complete gc work, and everything still checks out.
    let files = files_for(epoch);
    t.write_files(&files);
    let o = t.ckpt(&["commit", "-m", "final", "model.safetensors", "optim.safetensors", "step.txt"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = t.ckpt(&["gc", "--prune=now"]);
    assert!(o.status.success(), "{}", stderr(&o));
    check(&t, &mut history, Some(&files), "final");
    assert!(std::fs::read_dir(t.path(".ckpt/tmp")).unwrap().next().is_none(), "gc removed temp files");
    assert!(!Repo::open(t.root()).unwrap().has_pending_deltas(), "gc finished the pending deltas");
    eprintln!(
        "{} kill trials in {:?}; {completed} finished before the kill; {} versions",
        commit_trials + compact_trials + gc_trials,
        started.elapsed(),
        history.len()
    );
}
