"""Reading one tensor of a remote checkpoint without a repository (issue 42), on S3 served by
`s3s-fs` on loopback: `ckpt.safe_open(...).get_tensor(name)` against a plain GET of the same
object (curl with SigV4), and `get_slice(name)[a:b]` of an eighth of the rows. Medians of
`--runs` cold reads (a fresh cache each), compared in the same run; the bytes a slice fetched
are summed from its partial copies' range lists.

    python benches/remote_read.py [--mib 64] [--runs 5]

Needs `s3s-fs` (cargo install s3s-fs --version 0.14.1 --features binary), `curl` 7.75+, the
`ckpt` CLI (CKPT_BIN, else target/release/ckpt, else target/debug/ckpt) and the Python package
(`pip install ./python`).
"""

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

import ckpt

ROOT = Path(__file__).resolve().parent.parent
KEY, SECRET, BUCKET, PREFIX = "bench-key", "bench-secret", "bench", "run1"


def binary() -> str:
    for p in (os.environ.get("CKPT_BIN"), ROOT / "target/release/ckpt", ROOT / "target/debug/ckpt"):
        if p and os.access(p, os.X_OK):
            return str(p)
    raise SystemExit("no ckpt binary: cargo build --release, or set CKPT_BIN")


def start_s3(root: Path):
    server = shutil.which("s3s-fs") or str(Path.home() / ".cargo/bin/s3s-fs")
    (root / BUCKET).mkdir(parents=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [server, "--host", "127.0.0.1", "--port", str(port), "--access-key", KEY, "--secret-key", SECRET, str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(400):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("s3s-fs did not start")


def median_time(f, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64, help="size of the tensor read (MiB of f32)")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ckpt-remote-read-"))
    proc, port = start_s3(work / "s3")
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ACCESS_KEY_ID": KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "us-east-1",
    }
    os.environ.update(env)
    os.environ["CKPT_CACHE_DIR"] = str(work / "caches")
    url = f"s3://{BUCKET}/{PREFIX}"
    try:
        rows = args.mib * 256
        rng = np.random.default_rng(0)
        # Trained-weight-like values: normal, rounded to bf16 precision (compressible exponents).
        big = (rng.standard_normal((rows, 1024), dtype=np.float32) * 0.02).view(np.uint32) & 0xFFFF0000
        tensors = {"big": big.view(np.float32), "small": np.ones(4096, np.float32)}
        repo = ckpt.Repo.init(work / "repo")
        repo.commit({"model.safetensors": tensors}, "bench")
        for cmd in (["remote", "add", "origin", url], ["push"]):
            subprocess.run([binary(), *cmd], cwd=work / "repo", check=True, capture_output=True)
        objects = sorted((work / "s3" / BUCKET / PREFIX / "objects").glob("*/*"), key=lambda p: p.stat().st_size)
        blob = objects[-1]
        key = f"{BUCKET}/{PREFIX}/objects/{blob.parent.name}/{blob.name}"
        stored = blob.stat().st_size

        def plain_get():
            subprocess.run(
                [
                    "curl", "-sf", "-o", "/dev/null", "--aws-sigv4", "aws:amz:us-east-1:s3", "--user", f"{KEY}:{SECRET}",
                    "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", f"{endpoint}/{key}",
                ],
                check=True,
            )

        def get_tensor():
            with ckpt.safe_open(url, "model.safetensors", framework="np", cache=False) as f:
                t0 = time.perf_counter()
                got = f.get_tensor("big")
                get_tensor.seconds = time.perf_counter() - t0
            assert got.shape == (rows, 1024)

        slice_bytes = []

        def get_slice():
            cache = Path(tempfile.mkdtemp(dir=work))
            with ckpt.safe_open(url, "model.safetensors", framework="np", cache=cache) as f:
                t0 = time.perf_counter()
                part = f.get_slice("big")[rows // 2 : rows // 2 + rows // 8]
                get_slice.seconds = time.perf_counter() - t0
            assert part.shape == (rows // 8, 1024)
            have = 0
            for listing in (cache / "partial").glob("*.have"):
                for line in listing.read_text().split("\n"):
                    if line:
                        a, b = map(int, line.split())
                        have += b - a
            slice_bytes.append(have)
            shutil.rmtree(cache)

        get_time = median_time(plain_get, args.runs)
        tensor_times, slice_times = [], []
        for _ in range(args.runs):
            get_tensor()
            tensor_times.append(get_tensor.seconds)
            get_slice()
            slice_times.append(get_slice.seconds)
        tensor_time, slice_time = statistics.median(tensor_times), statistics.median(slice_times)
        print(f"tensor: {args.mib} MiB f32, stored blob {stored / 2**20:.1f} MiB, {args.runs} runs, medians")
        print(f"plain GET of the blob (curl):        {get_time * 1000:8.1f} ms  {stored / get_time / 2**20:7.0f} MiB/s")
        print(f"safe_open(...).get_tensor (cold):    {tensor_time * 1000:8.1f} ms  ratio {tensor_time / get_time:.2f}x")
        share = stored / 8
        print(
            f"get_slice(...)[1/8 of rows] (cold):  {slice_time * 1000:8.1f} ms  "
            f"fetched {statistics.median(slice_bytes) / 2**20:.2f} MiB = {statistics.median(slice_bytes) / share:.3f}x its share"
        )
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
