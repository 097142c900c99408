"""`Repo.report` and `Repo.report_html`: the numbers of `ckpt report` against numpy, and the page."""

import html

import numpy as np

import ckpt


def model(epoch):
    rng = np.random.default_rng(7)
    w = rng.standard_normal((64, 48)).astype(np.float32)
    w[::3] += 0.01 * epoch
    return {
        "layer.0.weight": w,
        "layer.0.bias": np.full(48, 0.5 + 0.1 * epoch, np.float32),
        "<script>x</script>": np.arange(16, dtype=np.int32) + (epoch > 1),
    }


def test_report_gives_a_dict_per_tensor_and_version_matching_numpy(repo):
    states = [model(e) for e in range(3)]
    for e, state in enumerate(states):
        repo.commit({"m.safetensors": state}, f"epoch {e}", background=False)
    cells = repo.report()
    assert len(cells) == 3 * 3
    ids = [v["id"] for v in reversed(repo.log())]
    by = {(c["tensor"], c["version"]): c for c in cells}
    for name in states[0]:
        first = by[(name, ids[0])]
        assert (first["status"], first["rel_change"], first["frac_changed"]) == ("first", None, None)
        for v in (1, 2):
            c = by[(name, ids[v])]
            old, new = states[v - 1][name], states[v][name]
            assert c["status"] == "compared" and c["file"] == "m.safetensors"
            assert c["frac_changed"] == np.count_nonzero(old != new) / old.size
            if old.dtype == np.float32:
                o, n = old.astype(np.float64), new.astype(np.float64)
                want = np.linalg.norm(n - o) / np.linalg.norm(o)
                assert abs(c["rel_change"] - want) <= 1e-9 * want
            else:
                assert c["rel_change"] is None
    assert by[("<script>x</script>", ids[1])]["frac_changed"] == 0.0
    assert sorted(c["tensor"] for c in repo.report(tensor="layer.0.*", max_versions=1)) == ["layer.0.bias", "layer.0.weight"]


def test_report_html_shows_inline_in_a_notebook(repo, tmp_path):
    for e in range(2):
        repo.commit({"m.safetensors": model(e)}, f"epoch {e}", background=False)
    page = repo.report_html()
    assert isinstance(page, ckpt.ReportPage)
    text = str(page)
    assert text.startswith("<!DOCTYPE html>") and "default-src 'none'" in text
    assert "<script>x</script>" not in text and "&lt;script&gt;x&lt;/script&gt;" in text
    shown = page._repr_html_()
    assert shown.startswith('<iframe sandbox="allow-scripts"') and html.unescape(shown.split('srcdoc="')[1]).startswith(
        "<!DOCTYPE html>"
    )
    page.save(tmp_path / "r.html")
    assert (tmp_path / "r.html").read_text(encoding="utf-8") == text
