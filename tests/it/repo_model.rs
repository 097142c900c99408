//! Model-based test: random sequences of commit / rm / checkout / tag / gc against an in-memory
//! model of the expected history (a list of versions, each a map path → bytes, and the tags).

use crate::support::repo_util::{read_tree, synthetic_checkpoint, TestRepo};
use ckpt::repo::{CommitOptions, Config, DeltaPolicy, Error, Repo};
use ckpt::Dtype;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

const FILES: [&str; 3] = ["m.safetensors", "sub/o.safetensors", "notes.bin"];

#[derive(Clone, Debug)]
enum Op {
    /// Write and commit these (file index, content seed) pairs.
    Commit(Vec<(usize, u8)>),
    /// `rm` file index.
    Rm(usize),
    /// Check out HEAD~n into a fresh directory.
    Checkout(usize),
    /// Tag HEAD~n.
    Tag(usize),
    Gc,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop::collection::vec((0..FILES.len(), 0u8..4), 0..3).prop_map(Op::Commit),
        1 => (0..FILES.len()).prop_map(Op::Rm),
        2 => (0usize..4).prop_map(Op::Checkout),
        1 => (0usize..3).prop_map(Op::Tag),
        1 => Just(Op::Gc),
    ]
}

/// Content of file `f` for `seed`: drifting weights, so deltas, dedup (same seed twice) and
/// standalone blobs all occur.
fn content(f: usize, seed: u8) -> Vec<u8> {
    match f {
        0 => synthetic_checkpoint(1, Dtype::Bf16, &[("a", &[40, 24]), ("b", &[24])], seed as u32),
        // Small tensors around a larger one: a bundle whose members the large tensor separates.
        1 => synthetic_checkpoint(
            2,
            Dtype::F32,
            &[("x", &[30, 20]), ("big", &[40, 40]), ("n1", &[20]), ("n2", &[20])],
            seed as u32,
        ),
        _ => format!("notes {seed}\n").repeat(50).into_bytes(),
    }
}

type Snapshot = BTreeMap<String, Vec<u8>>;

struct Model {
    versions: Vec<Snapshot>,
    pending_rm: BTreeSet<String>,
    tags: BTreeMap<String, usize>,
}

fn run(ops: Vec<Op>, delta_policy: DeltaPolicy) -> Result<(), TestCaseError> {
    let t = TestRepo::with_config(&Config { base_every: 3, chunk_size: 4096, delta_policy, ..Config::default() });
    let repo = Repo::open(t.root()).unwrap();
    let mut m = Model { versions: Vec::new(), pending_rm: BTreeSet::new(), tags: BTreeMap::new() };
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Commit(files) => {
                let mut next: Snapshot = m.versions.last().cloned().unwrap_or_default();
                for p in &m.pending_rm {
                    next.remove(p);
                }
                let mut paths = Vec::new();
                for (f, seed) in &files {
                    let bytes = content(*f, *seed);
                    t.write(FILES[*f], &bytes);
                    next.insert(FILES[*f].to_string(), bytes);
                    paths.push(FILES[*f]);
                }
                let result = repo.commit(&paths, &format!("step {step}"), &CommitOptions::default());
                if files.is_empty() && m.pending_rm.is_empty() {
                    prop_assert!(matches!(result, Err(Error::NothingToCommit)), "{result:?}");
                } else {
                    prop_assert!(result.is_ok(), "commit: {result:?}");
                    m.versions.push(next);
                    m.pending_rm.clear();
                }
            }
            Op::Rm(f) => {
                let tracked = m.versions.last().is_some_and(|v| v.contains_key(FILES[f]));
                let result = repo.rm(&[t.path(FILES[f])]);
                prop_assert_eq!(result.is_ok(), tracked, "rm {}: {:?}", FILES[f], result);
                if tracked {
                    m.pending_rm.insert(FILES[f].to_string());
                }
            }
            Op::Checkout(back) => {
                let out = tempfile::tempdir().unwrap();
                let result = repo.checkout(&format!("HEAD~{back}"), None, Some(out.path()), None);
                if back < m.versions.len() {
                    prop_assert!(result.is_ok(), "checkout: {result:?}");
                    let expected: Vec<(String, Vec<u8>)> =
                        m.versions[m.versions.len() - 1 - back].clone().into_iter().collect();
                    prop_assert_eq!(read_tree(out.path()), expected);
                } else {
                    prop_assert!(result.is_err());
                }
            }
            Op::Tag(back) => {
                let name = format!("t{step}");
                let result = repo.tag(&name, Some(&format!("HEAD~{back}")));
                if back < m.versions.len() {
                    prop_assert!(result.is_ok(), "tag: {result:?}");
                    m.tags.insert(name, m.versions.len() - 1 - back);
                } else {
                    prop_assert!(result.is_err());
                }
            }
            Op::Gc => {
                let result = repo.gc_with(&ckpt::repo::GcOptions::now());
                prop_assert!(result.is_ok(), "gc: {result:?}");
            }
        }
        prop_assert_eq!(repo.log("HEAD").unwrap().len(), m.versions.len());
    }
    // Every version and tag, after everything.
    let ids: Vec<_> = repo.log("HEAD").unwrap().into_iter().rev().map(|v| v.id).collect();
    for (i, snapshot) in m.versions.iter().enumerate() {
        let out = tempfile::tempdir().unwrap();
        repo.checkout(&ids[i].to_hex(), None, Some(out.path()), None).unwrap();
        prop_assert_eq!(read_tree(out.path()), snapshot.clone().into_iter().collect::<Vec<_>>());
    }
    for (name, i) in &m.tags {
        prop_assert_eq!(repo.resolve(name).unwrap(), ids[*i]);
    }
    repo.gc_with(&ckpt::repo::GcOptions::now()).unwrap();
    let report = repo.verify().unwrap();
    prop_assert!(report.is_ok(), "verify: {:?}", report);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, max_shrink_iters: 200, ..ProptestConfig::default() })]

    #[test]
    fn random_histories_match_the_model(
        ops in prop::collection::vec(op(), 1..16),
        delta_policy in prop_oneof![Just(DeltaPolicy::Previous), Just(DeltaPolicy::Reverse)],
    ) {
        run(ops, delta_policy)?;
    }
}
