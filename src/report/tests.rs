//! The report's numbers against a straightforward computation from the committed bytes.

use super::*;
use crate::repo::{CommitOptions, Config, DeltaPolicy};
use crate::test_data::xorshift;

/// A repository with small chunks (so tensors span several windows of the test build's 64 KiB).
fn repo_in(dir: &std::path::Path, policy: DeltaPolicy) -> Repo {
    Repo::init(dir).unwrap();
    reconfigure(dir, policy, 16 << 10)
}

/// The repository at `dir` with `chunk_size` for new bases from now on.
fn reconfigure(dir: &std::path::Path, policy: DeltaPolicy, chunk_size: usize) -> Repo {
    let config = Config { chunk_size, delta_policy: policy, base_every: 3, ..Config::default() };
    std::fs::write(dir.join(".ckpt/config"), serde_json::to_vec(&config).unwrap()).unwrap();
    Repo::open(dir).unwrap()
}

/// Tensors (name, dtype, shape) of the model: an fp32 matrix of 160 KiB (several windows and
/// chunks), fp16 and bf16 vectors, an int32 counter, a frozen embedding and two small tensors
/// (bundled).
fn model() -> Vec<(String, Dtype, Vec<u64>)> {
    [
        ("encoder.layer.0.w", Dtype::F32, vec![200, 200]),
        ("encoder.layer.0.h", Dtype::F16, vec![9000]),
        ("encoder.layer.0.g", Dtype::Bf16, vec![7000]),
        ("encoder.layer.0.b", Dtype::Bf16, vec![64]),
        ("encoder.layer.0.ln", Dtype::Bf16, vec![32]),
        ("steps", Dtype::I32, vec![3000]),
        ("embed", Dtype::F32, vec![50, 40]),
    ]
    .into_iter()
    .map(|(n, d, s)| (n.to_string(), d, s))
    .collect()
}

/// Values of tensor `t` at `epoch`: fixed random values, plus a drift on every `3 + t`-th
/// element that grows with the epoch; `embed` never changes.
fn values(t: usize, name: &str, n: usize, epoch: u32) -> Vec<f64> {
    let frozen = name == "embed";
    xorshift(7 + t as u64)
        .take(n)
        .enumerate()
        .map(|(i, r)| {
            let base = ((r % 2001) as f64 - 1000.0) / 10_000.0;
            let moves = !frozen && i % (3 + t) == 0;
            if moves {
                base + 0.003 * f64::from(epoch) * (1.0 + (i % 7) as f64)
            } else {
                base
            }
        })
        .collect()
}

fn encode(dtype: Dtype, v: f64) -> Vec<u8> {
    match dtype {
        Dtype::F32 => (v as f32).to_le_bytes().to_vec(),
        Dtype::Bf16 => (((v as f32).to_bits() >> 16) as u16).to_le_bytes().to_vec(),
        Dtype::F16 => {
            let b = (v as f32).to_bits();
            let (sign, exp, man) = ((b >> 16) & 0x8000, ((b >> 23) & 0xff) as i32 - 112, (b >> 13) & 0x3ff);
            let h = if exp <= 0 { sign } else { sign | ((exp as u32) << 10) | man };
            (h as u16).to_le_bytes().to_vec()
        }
        Dtype::I32 => ((v * 10_000.0) as i32).to_le_bytes().to_vec(),
        _ => unreachable!(),
    }
}

/// The checkpoint at `epoch` and each tensor's bytes.
fn checkpoint(epoch: u32) -> (Vec<u8>, Vec<Vec<u8>>) {
    let spec = model();
    let mut file = crate::safetensors::write_header(&spec, None).unwrap();
    let mut tensors = Vec::new();
    for (t, (name, dtype, shape)) in spec.iter().enumerate() {
        let n = shape.iter().product::<u64>() as usize;
        let bytes: Vec<u8> = values(t, name, n, epoch).into_iter().flat_map(|v| encode(*dtype, v)).collect();
        file.extend_from_slice(&bytes);
        tensors.push(bytes);
    }
    (file, tensors)
}

/// The straightforward figures: every element as f64, both norms, their ratio.
pub(super) fn expected(dtype: Dtype, old: &[u8], new: &[u8]) -> (Option<f64>, f64) {
    let w = dtype.size();
    let (mut diff, mut prev, mut changed, mut n) = (0.0f64, 0.0f64, 0usize, 0usize);
    for (a, b) in old.chunks_exact(w).zip(new.chunks_exact(w)) {
        n += 1;
        changed += usize::from(a != b);
        if let (Some(x), Some(y)) = (crate::repo::to_f64(dtype, a), crate::repo::to_f64(dtype, b)) {
            diff += (y - x) * (y - x);
            prev += x * x;
        }
    }
    (is_float(dtype).then(|| (diff / prev).sqrt()), changed as f64 / n as f64)
}

fn commit_epochs(repo: &Repo, epochs: std::ops::Range<u32>) -> Vec<Vec<Vec<u8>>> {
    let mut all = Vec::new();
    for e in epochs {
        let (file, tensors) = checkpoint(e);
        std::fs::write(repo.root().join("m.safetensors"), file).unwrap();
        std::fs::write(repo.root().join("notes.txt"), format!("epoch {e}")).unwrap();
        repo.commit(&["m.safetensors", "notes.txt"], &format!("epoch {e}"), &CommitOptions::default()).unwrap();
        all.push(tensors);
    }
    all
}

fn cell<'a>(r: &'a Report, tensor: &str, column: usize) -> &'a Cell {
    let row = r.rows.iter().position(|x| x.tensor == tensor).unwrap();
    r.cells.iter().find(|c| c.row == row && c.column == column).unwrap()
}

#[test]
fn figures_match_the_straightforward_computation_for_every_tensor_and_version() {
    for policy in [DeltaPolicy::Reverse, DeltaPolicy::Previous] {
        let dir = tempfile::tempdir().unwrap();
        let repo = repo_in(dir.path(), policy);
        let mut epochs = commit_epochs(&repo, 0..2);
        // Bases with chunks larger than a window: a run reads windows that cut chunks.
        let repo = reconfigure(dir.path(), policy, 128 << 10);
        epochs.extend(commit_epochs(&repo, 2..4));
        let r = report(&repo, "HEAD", &Options::default()).unwrap();
        assert_eq!(r.columns.len(), 4);
        assert_eq!(r.rows.len(), model().len());
        assert_eq!(r.cells.len(), 4 * model().len(), "one cell per (tensor, version)");
        assert!(r.binning.is_none());
        for (t, (name, dtype, shape)) in model().iter().enumerate() {
            let first = cell(&r, name, 0);
            assert_eq!((first.status, first.rel_change, first.frac_changed), (Status::First, None, None));
            assert_eq!(first.shape, *shape);
            for v in 1..4 {
                let c = cell(&r, name, v);
                let (rel, frac) = expected(*dtype, &epochs[v - 1][t], &epochs[v][t]);
                assert_eq!(c.status, Status::Compared);
                assert_eq!(c.frac_changed, Some(frac), "{policy:?} {name} v{v}");
                match (c.rel_change, rel) {
                    (Some(got), Some(want)) => {
                        assert!((got - want).abs() <= 1e-12 * want.max(1e-300), "{policy:?} {name} v{v}: {got} {want}")
                    }
                    (got, want) => assert_eq!(got, want, "{policy:?} {name} v{v}"),
                }
                if name == "embed" {
                    assert_eq!((c.rel_change, c.frac_changed, c.stored_bytes), (Some(0.0), Some(0.0), 0));
                }
            }
        }
        // Every cell's stored bytes and each file's share add up to the columns' totals.
        assert!(r.cells.iter().any(|c| c.stored_bytes > 0));
        let m = repo.manifest(&repo.version(&repo.head_version().unwrap().unwrap()).unwrap().files[0].manifest);
        assert_eq!(m.unwrap().bundles.len(), 1, "the small tensors are bundled");
        let _ = flat_cells(&r);
    }
}

#[test]
fn stored_sizes_add_up_to_ckpt_logs() {
    let dir = tempfile::tempdir().unwrap();
    let repo = repo_in(dir.path(), DeltaPolicy::Reverse);
    commit_epochs(&repo, 0..5);
    let history = repo.log("HEAD").unwrap();
    let now = repo.sizes_now(&history);
    let r = report(&repo, "HEAD", &Options::default()).unwrap();
    let mut cumulative = 0;
    for (col, (info, &size)) in r.columns.iter().zip(history.iter().zip(&now).rev()) {
        assert_eq!(col.id, info.id.to_hex());
        assert_eq!(col.stored_bytes, size, "{}", col.short);
        assert_eq!(col.raw_bytes, info.raw_bytes);
        let files: u64 = col.files.iter().map(|f| f.stored_bytes).sum();
        assert_eq!(files + col.metadata_bytes, col.stored_bytes);
        cumulative += size;
        assert_eq!(col.cumulative_stored, cumulative);
    }
    // A range keeps the sizes of the whole history (objects counted where they first appear).
    // FROM..TO as git reads it: the versions after FROM.
    let ranged = report(&repo, &format!("{}..HEAD", history[2].id), &Options::default()).unwrap();
    assert_eq!(ranged.columns.len(), 2);
    assert_eq!(ranged.columns[0].stored_bytes, now[1]);
    assert_eq!(ranged.columns[1].cumulative_stored, cumulative);
}

#[test]
fn the_index_caches_figures_so_only_new_columns_are_computed() {
    let dir = tempfile::tempdir().unwrap();
    let repo = repo_in(dir.path(), DeltaPolicy::Reverse);
    commit_epochs(&repo, 0..3);
    let first = report(&repo, "HEAD", &Options::default()).unwrap();
    // Two columns compared, seven tensors each (the frozen one too: for its NaN count).
    assert_eq!((first.computed, first.cached), (14, 0));
    let again = report(&repo, "HEAD", &Options::default()).unwrap();
    assert_eq!((again.computed, again.cached), (0, 14));
    assert_eq!(again.cells, first.cells);
    commit_epochs(&repo, 3..4);
    let next = report(&repo, "HEAD", &Options::default()).unwrap();
    // The six changing tensors' new pairs; the frozen one's pair is the same contents as before.
    assert_eq!((next.computed, next.cached), (6, 15));
}

#[test]
fn a_range_compares_its_ends_and_filters_and_limits_apply() {
    let dir = tempfile::tempdir().unwrap();
    let repo = repo_in(dir.path(), DeltaPolicy::Reverse);
    let epochs = commit_epochs(&repo, 0..4);
    let log = repo.log("HEAD").unwrap();
    let r = report(&repo, &format!("{}..{}", log[3].id, log[0].id), &Options::default()).unwrap();
    let cmp = r.comparison.as_ref().unwrap();
    assert_eq!((cmp.from.as_str(), cmp.to.as_str()), (log[3].id.to_hex().as_str(), log[0].id.to_hex().as_str()));
    let w = cmp.bars.iter().find(|b| b.tensor == "encoder.layer.0.w").unwrap();
    let (rel, frac) = expected(Dtype::F32, &epochs[0][0], &epochs[3][0]);
    assert!((w.rel_change.unwrap() - rel.unwrap()).abs() <= 1e-12 * rel.unwrap());
    assert_eq!(w.frac_changed, Some(frac));

    // The first shown column compares with the version before it, even when not shown.
    let options = Options { max_versions: Some(2), tensor: Some(TensorFilter::new("encoder.*")), ..Options::default() };
    let r = report(&repo, "HEAD", &options).unwrap();
    assert_eq!(r.columns.len(), 2);
    assert_eq!(r.rows.len(), 5);
    assert_eq!(cell(&r, "encoder.layer.0.w", 0).status, Status::Compared);
    assert!(r.comparison.is_none());
    let bad = report(&repo, &format!("{}..{}", log[0].id, log[3].id), &Options::default());
    assert!(matches!(bad, Err(Error::NotAnAncestor { .. })));
}

/// 200 versions × 2,000 tensors with long names: binned to fit 5 MB, and the page says so.
#[test]
fn a_large_report_is_binned_to_fit_its_budget() {
    let columns: Vec<Column> = (0..200)
        .map(|i| Column {
            id: format!("{i:064x}"),
            short: format!("{i:012x}"),
            time: i,
            date: crate::repo::format_time(i),
            message: format!("epoch {i}"),
            tags: vec![],
            files: vec![FileSize { path: "model.safetensors".into(), raw_bytes: 1 << 30, stored_bytes: 1 << 28 }],
            raw_bytes: 1 << 30,
            stored_bytes: 1 << 28,
            metadata_bytes: 0,
            cumulative_raw: (i as u64 + 1) << 30,
            cumulative_stored: (i as u64 + 1) << 28,
        })
        .collect();
    let rows: Vec<Row> = (0..2000)
        .map(|t| Row {
            file: "model.safetensors".into(),
            tensor: format!("model.encoder.layers.{}.self_attention.proj_{}.weight", t / 8, t % 8),
            group: format!("model.encoder.layers.{}.self_attention", t / 8),
            tensors: 1,
        })
        .collect();
    let mut cells = Vec::new();
    for row in 0..2000 {
        for column in 0..200 {
            cells.push(Cell {
                row,
                column,
                dtype: "BF16".into(),
                shape: vec![4096, 4096],
                status: if column == 0 { Status::First } else { Status::Compared },
                rel_change: (column > 0).then(|| 1e-4 * (1.0 + (row * column % 97) as f64)),
                frac_changed: (column > 0).then_some(0.97),
                non_finite: 0,
                stored_bytes: 123_456,
            });
        }
    }
    let report = Report {
        title: "HEAD".into(),
        heat_columns: (0..200).collect(),
        columns,
        rows,
        cells,
        comparison: None,
        binning: None,
        computed: 0,
        cached: 0,
    };
    assert!(binning::estimate(&report) > 50_000_000);
    let fitted = binning::fit(report, HTML_BUDGET);
    let page = html::render(&fitted);
    // The figure docs/BENCHMARKS.md quotes (`cargo test --lib a_large_report -- --nocapture`).
    println!("200 versions x 2,000 tensors: {} bytes of HTML, {:?}", page.len(), fitted.binning);
    assert!(page.len() as u64 <= HTML_BUDGET, "{} bytes", page.len());
    assert!(page.len() as u64 >= binning::estimate(&fitted) / 2, "the estimate is far off: {}", page.len());
    let b = fitted.binning.as_ref().unwrap();
    assert!(b.tensors_per_row > 1, "{b:?}");
    assert!(page.contains("Binned to keep this page light"));
    let drawn = fitted.rows.len() * fitted.heat_columns.len();
    assert_eq!(fitted.cells.len(), drawn);
}

#[test]
fn names_are_escaped_and_the_page_names_no_url() {
    assert_eq!(
        html::escape("<script>alert('x')</script>&\""),
        "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"
    );
    let dir = tempfile::tempdir().unwrap();
    let repo = repo_in(dir.path(), DeltaPolicy::Reverse);
    commit_epochs(&repo, 0..2);
    let r = report(&repo, "HEAD", &Options::default()).unwrap();
    let page = html::render(&r);
    assert!(!page.contains("http:") && !page.contains("https:"));
    assert!(page.contains(html::CSP));
    assert_eq!(page.matches(" data-tensor=").count(), r.cells.len());
    assert_eq!(page.matches("class=\"store-bar\"").count(), 2);
}

/// A frozen tensor holding NaN and Inf is still flagged in every column, next to one that moves.
#[test]
fn non_finite_values_in_a_frozen_tensor_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let repo = repo_in(dir.path(), DeltaPolicy::Reverse);
    let spec = vec![("frozen".to_string(), Dtype::F32, vec![4096]), ("moving".to_string(), Dtype::F32, vec![4096])];
    for epoch in 0..3u32 {
        let mut file = crate::safetensors::write_header(&spec, None).unwrap();
        for i in 0..4096u32 {
            let v = match i {
                5 => f32::NAN,
                9 => f32::INFINITY,
                _ => i as f32 / 4096.0,
            };
            file.extend_from_slice(&v.to_le_bytes());
        }
        for i in 0..4096u32 {
            file.extend_from_slice(&(i as f32 + epoch as f32).to_le_bytes());
        }
        std::fs::write(dir.path().join("m.safetensors"), file).unwrap();
        repo.commit(&["m.safetensors"], &format!("epoch {epoch}"), &CommitOptions::default()).unwrap();
    }
    let r = report(&repo, "HEAD", &Options::default()).unwrap();
    for column in 1..3 {
        let frozen = cell(&r, "frozen", column);
        assert_eq!((frozen.non_finite, frozen.rel_change, frozen.frac_changed), (2, Some(0.0), Some(0.0)));
        assert_eq!(cell(&r, "moving", column).non_finite, 0);
    }
}
