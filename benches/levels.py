"""Compression levels against ZipNN, one thread, in memory, same run, same files.

For each file: ZipNN 0.5.4 (byte API, method="HUFFMAN"), then ckpt's codec in-process
(examples/codec_throughput, warm: median of --repeat runs into the same buffers) at the default
level and at `max`. Prints one markdown row per file: stored %, the difference to ZipNN in
percentage points, and compress / decompress MB/s of each; then the medians of the speed ratios.

  $CKPT_CORPUS/venv/bin/python benches/levels.py [--runs N] [--repeat R] FILE...

Needs `cargo build --release --example codec_throughput` (CARGO_TARGET_DIR honoured).
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (bench_zipnn, bench_ckpt_mem, dominant_dtype)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--runs", type=int, default=3, help="runs per tool; medians are reported")
    ap.add_argument("--repeat", type=int, default=3, help="in-process repetitions per ckpt run")
    args = ap.parse_args()
    from zipnn import ZipNN

    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(os.path.dirname(__file__), "..", "target")
    probe = os.path.join(target, "release", "examples", "codec_throughput")
    if not os.access(probe, os.X_OK):
        sys.exit(f"missing {probe}: cargo build --release --example codec_throughput")
    print(f"# load average {compare.loadavg()}")
    print("| file | dtype | MB | ZipNN % | default % | max % | default − ZipNN pp | max − ZipNN pp "
          "| ZipNN comp/decomp MB/s | default comp/decomp MB/s | max comp/decomp MB/s | ok |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    ratios = {"default comp": [], "default decomp": [], "max comp": [], "max decomp": []}
    for path in args.files:
        dtype = compare.dominant_dtype(path)
        with open(path, "rb") as f:
            data = f.read()
        mb = len(data) / 1e6
        zdtype = compare.ZIPNN_DTYPE.get(dtype, "float32")
        res = {}
        for tool in ("zipnn", "default", "max"):
            runs = []
            for _ in range(args.runs):
                if tool == "zipnn":
                    runs.append(compare.bench_zipnn(ZipNN, data, zdtype, 1))
                else:
                    os.environ["CKPT_LEVEL"] = tool
                    runs.append(compare.bench_ckpt_mem(probe, path, 1, repeat=args.repeat))
            res[tool] = dict(
                pct=100.0 * runs[0]["size"] / len(data),
                comp=mb / statistics.median(r["comp_s"] for r in runs),
                decomp=mb / statistics.median(r["decomp_s"] for r in runs),
                ok=all(r["ok"] for r in runs),
            )
        z = res["zipnn"]
        for lvl in ("default", "max"):
            ratios[f"{lvl} comp"].append(res[lvl]["comp"] / z["comp"])
            ratios[f"{lvl} decomp"].append(res[lvl]["decomp"] / z["decomp"])
        key = os.path.relpath(path, compare.CORPUS) if os.path.abspath(path).startswith(compare.CORPUS) else path
        ok = all(r["ok"] for r in res.values())
        print(f"| {key} | {dtype} | {mb:.1f} | {z['pct']:.2f} | {res['default']['pct']:.2f} | {res['max']['pct']:.2f} "
              f"| {res['default']['pct'] - z['pct']:+.2f} | {res['max']['pct'] - z['pct']:+.2f} "
              f"| {z['comp']:.0f} / {z['decomp']:.0f} | {res['default']['comp']:.0f} / {res['default']['decomp']:.0f} "
              f"| {res['max']['comp']:.0f} / {res['max']['decomp']:.0f} | {'yes' if ok else 'NO'} |", flush=True)
    print()
    print("median over files of speed ratios vs ZipNN (1 thread): "
          + ", ".join(f"{k} {statistics.median(v):.2f}×" for k, v in ratios.items()))


if __name__ == "__main__":
    main()
