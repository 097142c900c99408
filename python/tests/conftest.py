import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "torch"


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
