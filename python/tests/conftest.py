import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "torch"

# CI sets CKPT_REQUIRE_NO_SKIP=1: a test that skips there (torch, transformers or s3s-fs missing, no
# ckpt binary built) guards nothing, so the run fails instead of reporting it skipped and passing.
REQUIRE_NO_SKIP = os.environ.get("CKPT_REQUIRE_NO_SKIP") == "1"
_skipped = []


def _note_skip(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        _skipped.append(report)


# A module that skips as a whole (`pytest.importorskip("torch")`) skips while it is collected, a
# test while it runs: both reports are counted.
pytest_collectreport = _note_skip
pytest_runtest_logreport = _note_skip


def pytest_terminal_summary(terminalreporter):
    if REQUIRE_NO_SKIP and _skipped:
        terminalreporter.write_line(
            f"CKPT_REQUIRE_NO_SKIP=1: {len(_skipped)} skipped, which fails the run:", red=True)
        for report in _skipped:
            reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            reason = reason.removeprefix("Skipped: ")
            terminalreporter.write_line(f"  {report.nodeid}: {reason}", red=True)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    if REQUIRE_NO_SKIP and _skipped and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def no_background_failure_left_unreported():
    """Each test settles its background commits: a failure nobody was told about would make the
    test process exit with status 1 (as it makes any Python process)."""
    yield
    import ckpt

    ckpt.wait()


@pytest.fixture
def repo(tmp_path):
    import ckpt

    return ckpt.Repo.init(tmp_path / "repo")


@pytest.fixture
def fixtures():
    assert FIXTURES.is_dir(), f"torch fixtures missing at {FIXTURES}"
    return FIXTURES


def ckpt_binary():
    """The CLI built by `cargo test` / `cargo build` (for comparing error messages), if any."""
    for p in (os.environ.get("CKPT_BIN"), ROOT / "target" / "debug" / "ckpt", ROOT / "target" / "release" / "ckpt"):
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            return str(p)
    return None


def ckpt_cli():
    """[`ckpt_binary`], or `$CARGO_TARGET_DIR/debug/ckpt`; skips the test when neither is built."""
    found = ckpt_binary()
    target = os.environ.get("CARGO_TARGET_DIR")
    if found is None and target and os.access(os.path.join(target, "debug", "ckpt"), os.X_OK):
        found = os.path.join(target, "debug", "ckpt")
    if found is None:
        pytest.skip("the ckpt binary is not built (cargo build; or set CKPT_BIN)")
    return found
