//! `ckpt report`: bad inputs (an empty repository, one version, tensors that appear, disappear or
//! change shape, NaN and infinity, a name that is markup), and the page in a real browser.

use crate::support::repo_util::{ok, synthetic_checkpoint, TestRepo, SMALL_MODEL};
use ckpt::Dtype;
use serde_json::Value;
use std::path::Path;

/// A safetensors file of f32 tensors (name, values).
fn f32_file(tensors: &[(&str, Vec<f32>)]) -> Vec<u8> {
    let spec: Vec<(String, Dtype, Vec<u64>)> =
        tensors.iter().map(|(n, v)| (n.to_string(), Dtype::F32, vec![v.len() as u64])).collect();
    let mut file = ckpt::safetensors::write_header(&spec, None).unwrap();
    for (_, v) in tensors {
        file.extend(v.iter().flat_map(|x| x.to_le_bytes()));
    }
    file
}

fn ramp(n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|i| (i as f32 * 0.37).sin() * scale + 0.01).collect()
}

fn json(t: &TestRepo, args: &[&str]) -> Value {
    let mut all = vec!["report", "--json"];
    all.extend_from_slice(args);
    serde_json::from_str(&ok(t, &all)).unwrap()
}

/// The cell of (tensor, column) in a `--json` report, if any.
fn cell<'a>(r: &'a Value, tensor: &str, column: usize) -> Option<&'a Value> {
    let row = r["rows"].as_array().unwrap().iter().position(|x| x["tensor"] == tensor)?;
    r["cells"].as_array().unwrap().iter().find(|c| c["row"] == row && c["column"] == column)
}

#[test]
fn an_empty_repository_and_a_single_version_give_a_page() {
    let t = TestRepo::init();
    let r = json(&t, &[]);
    assert_eq!(r["columns"].as_array().unwrap().len(), 0);
    ok(&t, &["report", "-o", "empty.html"]);
    let page = std::fs::read_to_string(t.path("empty.html")).unwrap();
    assert!(page.contains("No versions to show"), "{page}");

    let repo = t.open();
    t.commit_files(&repo, &[("m.safetensors", &synthetic_checkpoint(1, Dtype::Bf16, SMALL_MODEL, 0))], "one");
    let r = json(&t, &[]);
    assert_eq!(r["columns"].as_array().unwrap().len(), 1);
    let cells = r["cells"].as_array().unwrap();
    assert_eq!(cells.len(), SMALL_MODEL.len());
    for c in cells {
        assert_eq!(
            (c["status"].as_str(), &c["rel_change"], &c["frac_changed"]),
            (Some("first"), &Value::Null, &Value::Null)
        );
    }
    let out = ok(&t, &["report"]);
    assert!(out.contains("ckpt-report.html"), "{out}");
    let page = std::fs::read_to_string(t.path("ckpt-report.html")).unwrap();
    assert_eq!(page.matches(" data-rel-change=\"\"").count(), SMALL_MODEL.len());
}

#[test]
fn tensors_that_appear_disappear_or_change_shape_are_gaps() {
    let t = TestRepo::init();
    let repo = t.open();
    let v0 = f32_file(&[("a", ramp(100, 1.0)), ("b", ramp(50, 1.0)), ("c", ramp(40, 1.0))]);
    let v1 = f32_file(&[("a", ramp(100, 1.1)), ("c", ramp(80, 1.0)), ("d", ramp(30, 1.0))]);
    let v2 = f32_file(&[("a", ramp(100, 1.2)), ("b", ramp(50, 2.0)), ("c", ramp(80, 1.5)), ("d", ramp(30, 1.0))]);
    for (i, f) in [v0, v1, v2].iter().enumerate() {
        t.commit_files(&repo, &[("m.safetensors", f)], &format!("v{i}"));
    }
    let r = json(&t, &[]);
    let status = |name: &str, col: usize| cell(&r, name, col).map(|c| c["status"].as_str().unwrap().to_string());
    assert_eq!(status("b", 1), None, "b is gone in v1: no cell");
    assert_eq!(status("b", 2).as_deref(), Some("first"), "b is back in v2, nothing to compare with");
    assert_eq!(status("c", 1).as_deref(), Some("reshaped"));
    assert_eq!(status("c", 2).as_deref(), Some("compared"));
    assert_eq!(status("d", 1).as_deref(), Some("first"));
    assert_eq!(status("d", 2).as_deref(), Some("compared"));
    assert_eq!(cell(&r, "d", 2).unwrap()["rel_change"], 0.0);
    let a = cell(&r, "a", 1).unwrap()["rel_change"].as_f64().unwrap();
    assert!((a - 0.1).abs() < 0.02, "{a}");
}

#[test]
fn nan_and_infinity_get_their_own_colour_and_markup_in_names_is_escaped() {
    let t = TestRepo::init();
    let repo = t.open();
    let evil = "<script>alert(\"x\")</script>.w";
    let mut bad = ramp(64, 1.0);
    bad[3] = f32::NAN;
    bad[9] = f32::INFINITY;
    t.commit_files(
        &repo,
        &[("m.safetensors", &f32_file(&[(evil, ramp(64, 1.0)), ("ok", ramp(64, 1.0))]))],
        "<b>v0</b>",
    );
    t.commit_files(&repo, &[("m.safetensors", &f32_file(&[(evil, bad), ("ok", ramp(64, 1.5))]))], "v1 & more");
    let r = json(&t, &[]);
    let c = cell(&r, evil, 1).unwrap();
    assert_eq!(c["non_finite"], 2);
    assert_eq!(c["frac_changed"].as_f64(), Some(2.0 / 64.0));
    ok(&t, &["report", "-o", "r.html"]);
    let page = std::fs::read_to_string(t.path("r.html")).unwrap();
    assert!(!page.contains("<script>alert"), "a name made it into the markup unescaped");
    assert!(!page.contains("<b>v0"));
    assert!(page.contains("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;.w"));
    assert!(page.contains(" data-non-finite=\"2\""), "NaN/Inf cell");
    assert!(page.contains("fill=\"#ff00c8\" data-file=\"m.safetensors\" data-tensor=\"&lt;script&gt;"));
}

/// The browser to drive, if installed (`CKPT_REQUIRE_CHROMIUM=1` makes its absence a failure).
fn chromium() -> Option<&'static str> {
    let found = ["/usr/bin/chromium", "/usr/bin/chromium-browser"].into_iter().find(|p| Path::new(p).exists());
    if found.is_none() {
        crate::support::skip("no chromium in /usr/bin", "CKPT_REQUIRE_CHROMIUM");
    }
    found
}

/// Runs headless chromium on `page` with `args`; its stdout.
fn run_chromium(browser: &str, profile: &Path, args: &[&str], page: &Path) -> Vec<u8> {
    let out = std::process::Command::new(browser)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("run chromium");
    assert!(out.status.success(), "chromium: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// The attributes of every `<rect ...>` tag of `dom` that has `data-tensor` (names unescaped).
fn cells_in(dom: &str) -> Vec<std::collections::HashMap<String, String>> {
    let unescape = |s: &str| {
        s.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&#39;", "'").replace("&amp;", "&")
    };
    let mut out = Vec::new();
    for tag in dom.split("<rect ").skip(1) {
        let tag = &tag[..tag.find('>').unwrap()];
        let mut attrs = std::collections::HashMap::new();
        let mut rest = tag;
        while let Some(eq) = rest.find("=\"") {
            let name = rest[..eq].trim().to_string();
            let end = rest[eq + 2..].find('"').unwrap();
            attrs.insert(name, unescape(&rest[eq + 2..eq + 2 + end]));
            rest = &rest[eq + 3 + end..];
        }
        if attrs.contains_key("data-tensor") && attrs.contains_key("data-version") {
            out.push(attrs);
        }
    }
    out
}

#[test]
fn a_real_browser_draws_one_cell_per_tensor_and_version_fetches_nothing_and_paints() {
    let Some(browser) = chromium() else { return };
    let t = TestRepo::init();
    let repo = t.open();
    for epoch in 0..3 {
        let model = synthetic_checkpoint(5, Dtype::Bf16, SMALL_MODEL, epoch);
        t.commit_files(&repo, &[("m.safetensors", &model), ("notes.txt", format!("{epoch}").as_bytes())], "epoch");
    }
    ok(&t, &["report", "-o", "r.html"]);
    let r = json(&t, &[]);
    let page_path = t.path("r.html");
    let page = std::fs::read_to_string(&page_path).unwrap();
    // Nothing to fetch: no URL in the markup, no src or href, and a policy forbidding requests.
    assert!(!page.contains("http://") && !page.contains("https://"));
    assert!(!page.contains(" src=") && !page.contains(" href="));
    let profile = tempfile::tempdir().unwrap();
    let dom = String::from_utf8(run_chromium(browser, profile.path(), &["--dump-dom"], &page_path)).unwrap();
    assert!(dom.contains("default-src 'none'"), "the policy is in the DOM");

    let cells = cells_in(&dom);
    let expected = r["cells"].as_array().unwrap();
    assert_eq!(cells.len(), SMALL_MODEL.len() * 3);
    assert_eq!(cells.len(), expected.len());
    for c in expected {
        let row = &r["rows"][c["row"].as_u64().unwrap() as usize];
        let col = &r["columns"][c["column"].as_u64().unwrap() as usize];
        let found: Vec<_> =
            cells.iter().filter(|a| a["data-tensor"] == row["tensor"] && a["data-version"] == col["short"]).collect();
        assert_eq!(found.len(), 1, "{row} {col}");
        let a = found[0];
        assert_eq!(a["data-file"], "m.safetensors");
        for (attr, key) in [("data-rel-change", "rel_change"), ("data-frac-changed", "frac_changed")] {
            match c[key].as_f64() {
                None => assert_eq!(a[attr], "", "{attr} of a first version"),
                Some(want) => {
                    let got: f64 = a[attr].parse().unwrap();
                    assert!((got - want).abs() <= 1e-5 * want.abs(), "{attr}: {got} vs {want}");
                }
            }
        }
    }
    assert_eq!(dom.matches("class=\"store-bar\"").count(), 3);

    // A screenshot that is not blank: far larger than one of an empty page.
    let blank = t.path("blank.html");
    std::fs::write(&blank, "<!DOCTYPE html><html><body></body></html>").unwrap();
    let size = |page: &Path, name: &str| {
        let png = t.path(name);
        let shot = format!("--screenshot={}", png.display());
        run_chromium(browser, profile.path(), &[&shot, "--window-size=1200,900"], page);
        std::fs::metadata(&png).unwrap().len()
    };
    let (ours, empty) = (size(&page_path, "r.png"), size(&blank, "blank.png"));
    assert!(ours > 4 * empty, "screenshot of {ours} bytes against {empty} for a blank page");
}

#[test]
fn git_report_has_a_column_per_commit_that_changed_weight_files() {
    use crate::support::git::{model, GitEnv};
    let env = GitEnv::new();
    let dir = env.repo("r");
    env.git(&dir, &["add", ".gitattributes"]);
    env.git(&dir, &["commit", "-qm", "attributes"]);
    let mut commits = Vec::new();
    for epoch in 0..3 {
        std::fs::write(dir.join("model.safetensors"), model(epoch)).unwrap();
        env.git(&dir, &["add", "model.safetensors"]);
        env.git(&dir, &["commit", "-qm", &format!("epoch {epoch}")]);
        commits.push(env.git(&dir, &["rev-parse", "HEAD"]).trim().to_string());
        // A commit that touches no weight file: no column.
        std::fs::write(dir.join("README"), format!("{epoch}")).unwrap();
        env.git(&dir, &["add", "README"]);
        env.git(&dir, &["commit", "-qm", "docs"]);
    }
    let r: Value = serde_json::from_str(&env.ckpt(&dir, &["git", "report", "--json"])).unwrap();
    let ids: Vec<&str> = r["columns"].as_array().unwrap().iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids, commits.iter().map(String::as_str).collect::<Vec<_>>());
    let cells = r["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 2 * 3);
    let moved = cells.iter().filter(|c| c["column"] == 2 && c["status"] == "compared").count();
    assert_eq!(moved, 2);
    assert!(cells.iter().any(|c| c["rel_change"].as_f64().is_some_and(|x| x > 0.0)));

    // git's FROM..TO: the commits after FROM, compared with it.
    let range = format!("{}..HEAD", commits[0]);
    let r: Value = serde_json::from_str(&env.ckpt(&dir, &["git", "report", "--json", &range])).unwrap();
    assert_eq!(r["columns"].as_array().unwrap().len(), 2);
    assert!(r["cells"].as_array().unwrap().iter().all(|c| c["status"] == "compared"));
    assert_eq!(
        (r["comparison"]["from"].as_str(), r["comparison"]["to"].as_str()),
        (Some(&*commits[0]), Some(&*commits[2]))
    );
    env.ckpt(&dir, &["git", "report", "-o", "git-report.html"]);
    let page = std::fs::read_to_string(dir.join("git-report.html")).unwrap();
    assert_eq!(page.matches(" data-tensor=").count(), 6);
}
