#!/usr/bin/env python3
"""Standalone-file compression benchmark: ckpt vs ZipNN vs zstd -3.

For every file and for threads in (1, all cores) this measures, R times each
(median reported), interleaved per repetition so machine noise hits all tools
alike:

  * ckpt    `ckpt -q -j T compress FILE -o TMP.ckz`, `ckpt -q -j T decompress`
            (subprocess, wall time; includes process start and file I/O)
  * ZipNN   in-process byte API, method="HUFFMAN", threads=T (in memory: no
            file I/O, no process start)
  * zstd -3 CLI `zstd -3 -T<T> -q -f`, `zstd -d -q -f` (subprocess, wall time)

Every round trip is checked (sha256 of the decompressed file / bytes against
the original). Throughput is MB/s of ORIGINAL size, MB = 1e6 bytes.

Run with the corpus venv (needs zipnn 0.5.4 and numpy):
  $CKPT_CORPUS/venv/bin/python benches/compare.py --ckpt target/release/ckpt FILE...
or simply benches/compare.sh. Exit status is non-zero if any round trip failed.
"""
import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import warnings

CORPUS = os.environ.get("CKPT_CORPUS") or os.path.join(os.path.expanduser("~"), ".cache", "ckpt-corpus")

# safetensors float dtypes -> ZipNN bytearray_dtype
ZIPNN_DTYPE = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
FLOAT_DTYPES = {"F64", "F32", "BF16", "F16", "F8_E4M3", "F8_E5M2"}


# ---------------------------------------------------------------- helpers

def dominant_dtype(path):
    """Dominant dtype (by payload bytes) of a safetensors file; floats preferred."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    by_dtype = {}
    for v in header.values():
        b, e = v["data_offsets"]
        by_dtype[v["dtype"]] = by_dtype.get(v["dtype"], 0) + (e - b)
    floats = {k: v for k, v in by_dtype.items() if k in FLOAT_DTYPES}
    pool = floats or by_dtype
    return max(pool, key=pool.get) if pool else "?"


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 22)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def fs_type(path):
    """Filesystem type of `path` from /proc/mounts (longest mount-point prefix)."""
    path = os.path.realpath(path)
    best, typ = "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1].replace("\\040", " ")
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, typ = mnt, parts[2]
    except OSError:
        pass
    return typ


def pick_tmpdir(requested, files):
    """A scratch directory on a real disk (not tmpfs), preferably the corpus disk."""
    candidates = [requested] if requested else [os.path.join(CORPUS, "work"),
                                                os.path.dirname(os.path.abspath(files[0])),
                                                tempfile.gettempdir()]
    for c in candidates:
        if c and os.path.isdir(c) and os.access(c, os.W_OK):
            if requested or fs_type(c) not in ("tmpfs", "ramfs"):
                return tempfile.mkdtemp(prefix="ckpt-compare-", dir=c)
    return tempfile.mkdtemp(prefix="ckpt-compare-")


def run_timed(args):
    """Run a command; return (wall seconds, error string or None)."""
    t = time.perf_counter()
    r = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        return None, f"{' '.join(args)} -> exit {r.returncode}: {r.stderr.decode(errors='replace').strip()[-500:]}"
    return dt, None


def rm(*paths):
    for p in paths:
        try:
            os.remove(p)
        except FileNotFoundError:
            pass


# ---------------------------------------------------------------- tools
# Each returns one measurement: dict(size, comp_s, decomp_s, ok, error)

def bench_cli(comp_cmd, decomp_cmd, packed, unpacked, ref_sha):
    m = dict(size=None, comp_s=None, decomp_s=None, ok=False, error=None)
    try:
        m["comp_s"], m["error"] = run_timed(comp_cmd)
        if m["error"]:
            return m
        m["size"] = os.path.getsize(packed)
        m["decomp_s"], m["error"] = run_timed(decomp_cmd)
        if m["error"]:
            return m
        m["ok"] = sha256_file(unpacked) == ref_sha
        if not m["ok"]:
            m["error"] = "decompressed output differs from the input"
        return m
    finally:
        rm(packed, unpacked)


def bench_ckpt(ckpt, path, threads, tmp, ref_sha):
    packed, unpacked = os.path.join(tmp, "out.ckz"), os.path.join(tmp, "out.ckpt.back")
    return bench_cli([ckpt, "-q", "-j", str(threads), "compress", path, "-o", packed],
                     [ckpt, "-q", "-j", str(threads), "decompress", packed, "-o", unpacked],
                     packed, unpacked, ref_sha)


def bench_ckpt_mem(probe, path, threads, repeat=1):
    """ckpt's codec timed in-process (bytes in memory -> container -> bytes, hash-verified),
    like ZipNN's byte API: no process start, no file I/O in the timed region. With repeat > 1,
    the median of that many in-process runs into the same buffers ("warm": page faults of
    fresh buffers, which are very slow and erratic on the project's VM, paid only once)."""
    m = dict(size=None, comp_s=None, decomp_s=None, ok=False, error=None)
    env = dict(os.environ, CKPT_BENCH_REPEAT=str(repeat))
    r = subprocess.run([probe, path, str(threads)], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        m["error"] = f"codec_throughput exit {r.returncode}: {r.stderr.strip()[-300:]}"
        return m
    out = json.loads(r.stdout)
    m.update(size=out["size"], comp_s=out["comp_s"], decomp_s=out["decomp_s"], ok=out["ok"])
    if not m["ok"]:
        m["error"] = "in-memory round trip differs"
    return m


def bench_zstd(path, threads, tmp, ref_sha):
    packed, unpacked = os.path.join(tmp, "out.zst"), os.path.join(tmp, "out.zstd.back")
    return bench_cli(["zstd", "-3", f"-T{threads}", "-q", "-f", path, "-o", packed],
                     ["zstd", "-d", "-q", "-f", packed, "-o", unpacked],
                     packed, unpacked, ref_sha)


def bench_zipnn(ZipNN, data, zdtype, threads):
    m = dict(size=None, comp_s=None, decomp_s=None, ok=False, error=None)
    try:
        # PITFALL (zipnn 0.5.4): for fp32/bf16 the byte API reorders bits IN PLACE in the
        # caller's buffer, so every run compresses a fresh (untimed) copy and the round trip
        # is checked against the pristine `data`.
        inp = bytearray(data)
        z = ZipNN(method="HUFFMAN", input_format="byte", bytearray_dtype=zdtype, threads=threads)
        t = time.perf_counter()
        comp = z.compress(inp)
        m["comp_s"] = time.perf_counter() - t
        del inp
        comp = bytes(comp)
        m["size"] = len(comp)
        z = ZipNN(method="HUFFMAN", input_format="byte", bytearray_dtype=zdtype, threads=threads)
        t = time.perf_counter()
        out = z.decompress(comp)
        m["decomp_s"] = time.perf_counter() - t
        m["ok"] = len(out) == len(data) and out == data
        if not m["ok"]:
            m["error"] = "decompressed bytes differ from the input"
    except Exception as e:  # noqa: BLE001 - report and keep benchmarking
        m["error"] = f"zipnn: {type(e).__name__}: {e}"
    return m


# ---------------------------------------------------------------- report

def fmt(x, spec):
    return "n/a" if x is None else format(x, spec)


def summarize(meas, nbytes):
    """Median throughputs and size over the runs of one (file, threads, tool)."""
    mb = nbytes / 1e6
    sizes = [m["size"] for m in meas if m["size"] is not None]
    ct = median([m["comp_s"] for m in meas])
    dt = median([m["decomp_s"] for m in meas])
    return dict(
        size=sizes[0] if sizes else None,
        sizes_consistent=len(set(sizes)) <= 1,
        pct=100.0 * sizes[0] / nbytes if sizes else None,
        comp_s_median=ct, decomp_s_median=dt,
        comp_MBps=mb / ct if ct else None,
        decomp_MBps=mb / dt if dt else None,
        ok=bool(meas) and all(m["ok"] for m in meas),
        errors=sorted({m["error"] for m in meas if m["error"]}),
    )


def ratio(a, b):
    return a / b if a is not None and b else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="safetensors files to benchmark")
    ap.add_argument("--ckpt", default="target/release/ckpt", help="ckpt binary (default: %(default)s)")
    ap.add_argument("--runs", type=int, default=5, help="repetitions per measurement, median reported (default 5)")
    ap.add_argument("--threads", default=None,
                    help="comma-separated thread counts (default: 1 and os.cpu_count())")
    ap.add_argument("--tmpdir", default=None,
                    help="where the scratch dir goes (default: $CKPT_CORPUS/work, on a real disk)")
    ap.add_argument("--json", metavar="OUT", help="write all raw timings to OUT")
    args = ap.parse_args()

    if args.runs < 1:
        ap.error("--runs must be >= 1")
    ncpu = os.cpu_count() or 1
    threads = [int(t) for t in args.threads.split(",")] if args.threads else sorted({1, ncpu})
    ckpt = os.path.abspath(args.ckpt)
    if not os.access(ckpt, os.X_OK):
        sys.exit(f"ckpt binary not found or not executable: {ckpt}")
    if shutil.which("zstd") is None:
        sys.exit("zstd CLI not found in PATH")
    for f in args.files:
        if not os.path.isfile(f):
            sys.exit(f"no such file: {f}")

    with warnings.catch_warnings():  # torch (imported by zipnn) warns about torch.jit.script
        warnings.simplefilter("ignore")
        from zipnn import ZipNN
        try:
            from importlib.metadata import version
            zipnn_version = version("zipnn")
        except Exception:  # noqa: BLE001
            zipnn_version = "?"

    tmp = pick_tmpdir(args.tmpdir, args.files)
    zstd_version = subprocess.run(["zstd", "--version"], capture_output=True, text=True).stdout.strip()
    ckpt_version = subprocess.run([ckpt, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"# ckpt: {ckpt} ({ckpt_version}); zipnn {zipnn_version} (HUFFMAN, byte API, in-memory); {zstd_version}",
          flush=True)
    print(f"# threads {threads}, runs {args.runs} (median), scratch dir {tmp} ({fs_type(tmp)}), "
          f"load {loadavg()}", flush=True)

    raw = dict(
        machine=dict(nproc=ncpu, platform=platform.platform(), python=sys.version.split()[0]),
        ckpt=ckpt, ckpt_version=ckpt_version, zipnn_version=zipnn_version, zstd_version=zstd_version,
        runs=args.runs, threads=threads, scratch_dir=tmp, scratch_fs=fs_type(tmp),
        started=time.strftime("%Y-%m-%dT%H:%M:%S%z"), files=[],
    )
    tools = ("ckpt", "ckpt_mem", "ckpt_warm", "zipnn", "zstd")
    probe = os.path.join(os.path.dirname(ckpt), "examples", "codec_throughput")
    if not os.access(probe, os.X_OK):
        sys.exit(f"missing {probe}: cargo build --release --example codec_throughput")
    results = []  # per file: dict(key, dtype, bytes, summary[threads][tool])
    try:
        for path in args.files:
            absp = os.path.abspath(path)
            key = os.path.relpath(absp, CORPUS) if absp.startswith(os.path.abspath(CORPUS) + os.sep) else path
            dtype = dominant_dtype(path)
            with open(path, "rb") as f:
                data = f.read()  # also warms the page cache for the CLI tools
            nbytes = len(data)
            ref_sha = hashlib.sha256(data).hexdigest()
            zdtype = ZIPNN_DTYPE.get(dtype, "float32")
            print(f"== {key}: {dtype}, {nbytes / 1e6:.1f} MB, load {loadavg()}", flush=True)
            meas = {t: {tool: [] for tool in tools} for t in threads}
            load_start = loadavg()
            for rep in range(args.runs):
                for t in threads:
                    meas[t]["ckpt"].append(bench_ckpt(ckpt, path, t, tmp, ref_sha))
                    meas[t]["ckpt_mem"].append(bench_ckpt_mem(probe, path, t))
                    meas[t]["ckpt_warm"].append(bench_ckpt_mem(probe, path, t, repeat=3))
                    meas[t]["zipnn"].append(bench_zipnn(ZipNN, data, zdtype, t))
                    meas[t]["zstd"].append(bench_zstd(path, t, tmp, ref_sha))
                    line = "  ".join(
                        f"{tool} {fmt(meas[t][tool][-1]['comp_s'], '.3f')}/{fmt(meas[t][tool][-1]['decomp_s'], '.3f')}s"
                        + ("" if meas[t][tool][-1]["ok"] else " FAIL")
                        for tool in tools)
                    print(f"   run {rep + 1}/{args.runs} -j{t}: {line}", flush=True)
            del data
            summary = {t: {tool: summarize(meas[t][tool], nbytes) for tool in tools} for t in threads}
            for t in threads:
                for tool in tools:
                    for e in summary[t][tool]["errors"]:
                        print(f"   ERROR {tool} -j{t}: {e}", flush=True)
            results.append(dict(key=key, dtype=dtype, bytes=nbytes, summary=summary))
            raw["files"].append(dict(file=key, path=absp, dtype=dtype, bytes=nbytes, sha256=ref_sha,
                                     loadavg_start=load_start, loadavg_end=loadavg(),
                                     runs={str(t): meas[t] for t in threads},
                                     summary={str(t): summary[t] for t in threads}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    # ------------------------------------------------------------ tables
    all_ok = True
    summary_out = {}
    for t in threads:
        print(f"\n### {t} thread{'s' if t > 1 else ''}\n")
        print("| file | dtype | MB | ckpt % | ZipNN % | zstd-3 % "
              "| ckpt CLI comp | ckpt mem comp | ZipNN comp | zstd comp "
              "| ckpt CLI decomp | ckpt mem decomp | ZipNN decomp | zstd decomp "
              "| mem/ZipNN comp | mem/ZipNN decomp | warm/ZipNN comp | warm/ZipNN decomp "
              "| CLI/ZipNN comp | CLI/ZipNN decomp | ok |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        cr, dr, mcr, mdr, wcr, wdr = [], [], [], [], [], []
        for r in results:
            s = r["summary"][t]
            c, m, z, zs = s["ckpt"], s["ckpt_mem"], s["zipnn"], s["zstd"]
            rc, rd = ratio(c["comp_MBps"], z["comp_MBps"]), ratio(c["decomp_MBps"], z["decomp_MBps"])
            rmc, rmd = ratio(m["comp_MBps"], z["comp_MBps"]), ratio(m["decomp_MBps"], z["decomp_MBps"])
            w = s["ckpt_warm"]
            rwc, rwd = ratio(w["comp_MBps"], z["comp_MBps"]), ratio(w["decomp_MBps"], z["decomp_MBps"])
            for lst, v in ((cr, rc), (dr, rd), (mcr, rmc), (mdr, rmd), (wcr, rwc), (wdr, rwd)):
                if v is not None:
                    lst.append(v)
            bad = [tool for tool in tools if not s[tool]["ok"]]
            all_ok = all_ok and not bad
            print(f"| {r['key']} | {r['dtype']} | {r['bytes'] / 1e6:.1f} | {fmt(c['pct'], '.2f')} | {fmt(z['pct'], '.2f')} "
                  f"| {fmt(zs['pct'], '.2f')} | {fmt(c['comp_MBps'], '.0f')} | {fmt(m['comp_MBps'], '.0f')} "
                  f"| {fmt(z['comp_MBps'], '.0f')} | {fmt(zs['comp_MBps'], '.0f')} | {fmt(c['decomp_MBps'], '.0f')} "
                  f"| {fmt(m['decomp_MBps'], '.0f')} | {fmt(z['decomp_MBps'], '.0f')} | {fmt(zs['decomp_MBps'], '.0f')} "
                  f"| {fmt(rmc, '.2f')} | {fmt(rmd, '.2f')} | {fmt(rwc, '.2f')} | {fmt(rwd, '.2f')} "
                  f"| {fmt(rc, '.2f')} | {fmt(rd, '.2f')} "
                  f"| {'yes' if not bad else 'NO: ' + ', '.join(bad)} |")
        summary_out[str(t)] = dict(median_ckpt_over_zipnn_comp=median(cr), median_ckpt_over_zipnn_decomp=median(dr),
                                   median_mem_over_zipnn_comp=median(mcr), median_mem_over_zipnn_decomp=median(mdr),
                                   median_warm_over_zipnn_comp=median(wcr), median_warm_over_zipnn_decomp=median(wdr))
        print(f"\n{t} thread(s), median over files of throughput ratios vs ZipNN: in-memory compress "
              f"{fmt(median(mcr), '.2f')}, decompress {fmt(median(mdr), '.2f')}; in-memory warm compress "
              f"{fmt(median(wcr), '.2f')}, decompress {fmt(median(wdr), '.2f')}; CLI (with process start and "
              f"file I/O) compress {fmt(median(cr), '.2f')}, decompress {fmt(median(dr), '.2f')}")

    # ------------------------------------------------------------ summary
    lo, hi = min(threads), max(threads)
    if hi > lo:
        sc = [ratio(r["summary"][hi]["ckpt_warm"]["comp_MBps"], r["summary"][lo]["ckpt_warm"]["comp_MBps"])
              for r in results]
        sd = [ratio(r["summary"][hi]["ckpt_warm"]["decomp_MBps"], r["summary"][lo]["ckpt_warm"]["decomp_MBps"])
              for r in results]
        msc, msd = median(sc), median(sd)
        summary_out["ckpt_speedup"] = dict(threads=[hi, lo], compress_median=msc, decompress_median=msd,
                                           compress_per_file=sc, decompress_per_file=sd)
        print(f"ckpt in-memory (warm) speedup {hi}-thread/{lo}-thread (median over files): compress {fmt(msc, '.2f')}, "
              f"decompress {fmt(msd, '.2f')}")
    worse = []
    for r in results:
        if r["dtype"] not in FLOAT_DTYPES:
            continue
        for t in threads:
            c, z = r["summary"][t]["ckpt"]["size"], r["summary"][t]["zipnn"]["size"]
            if c is None or z is None or c > z:
                worse.append(f"{r['key']} (-j{t}: ckpt {c} B vs ZipNN {z} B)")
    worse = sorted(set(worse))
    summary_out["ckpt_size_le_zipnn_all_float_files"] = not worse
    summary_out["ckpt_size_gt_zipnn"] = worse
    summary_out["all_round_trips_ok"] = all_ok
    print("every float file: ckpt size <= ZipNN size: "
          + ("yes" if not worse else "NO: " + "; ".join(worse)))
    print("all round trips ok: " + ("yes" if all_ok else "NO"))

    if args.json:
        raw["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        raw["summary"] = summary_out
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)
        print(f"raw timings written to {args.json}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
