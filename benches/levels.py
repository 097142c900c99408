"""Compression levels against ZipNN, one thread, in memory, same run, same files.

For each file: ZipNN 0.5.4 (byte API, method="HUFFMAN"), then ckpt's codec in-process
(examples/codec_throughput, warm: median of --repeat runs into the same buffers) at the default
level and at `max`; with `--before PATH`, also another build's codec_throughput at `max` or
`--before-level default` (an A/B of two builds in the same run, interleaved per run). Prints one markdown row per file: stored %,
the difference to ZipNN in percentage points, and compress / decompress MB/s of each; then the
medians of the speed ratios.

  $CKPT_CORPUS/venv/bin/python benches/levels.py [--runs N] [--repeat R] [--before PROBE] FILE...

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
    ap.add_argument("--before", help="another build's codec_throughput, run beside this one's")
    ap.add_argument("--before-level", default="max", choices=["default", "max"],
                    help="the level --before runs at (default: %(default)s)")
    args = ap.parse_args()
    from zipnn import ZipNN

    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(os.path.dirname(__file__), "..", "target")
    probe = os.path.join(target, "release", "examples", "codec_throughput")
    for p in [probe] + ([args.before] if args.before else []):
        if not os.access(p, os.X_OK):
            sys.exit(f"missing {p}: cargo build --release --example codec_throughput")
    before = f"before {args.before_level}"
    tools = ["zipnn", "default", "max"] + ([before] if args.before else [])
    print(f"# load average {compare.loadavg()}")
    head = "| file | dtype | MB | ZipNN % | default % | max % |"
    if args.before:
        head += f" {before} % |"
    head += " default − ZipNN pp | max − ZipNN pp | ZipNN comp/decomp MB/s | default comp/decomp MB/s | max comp/decomp MB/s |"
    if args.before:
        head += f" {before} comp/decomp MB/s |"
    print(head + " ok |")
    print("|---|---|" + "---:|" * (head.count("|") - 3) + "---|")
    ratios = {f"{t} {d}": [] for t in tools[1:] for d in ("comp", "decomp")}
    for path in args.files:
        dtype = compare.dominant_dtype(path)
        with open(path, "rb") as f:
            data = f.read()
        mb = len(data) / 1e6
        zdtype = compare.ZIPNN_DTYPE.get(dtype, "float32")
        runs = {t: [] for t in tools}
        for _ in range(args.runs):
            for tool in tools:
                if tool == "zipnn":
                    runs[tool].append(compare.bench_zipnn(ZipNN, data, zdtype, 1))
                else:
                    os.environ["CKPT_LEVEL"] = tool.split()[-1]
                    exe = args.before if tool.startswith("before") else probe
                    runs[tool].append(compare.bench_ckpt_mem(exe, path, 1, repeat=args.repeat))
        res = {}
        for tool, rs in runs.items():
            res[tool] = dict(
                pct=100.0 * rs[0]["size"] / len(data),
                comp=mb / statistics.median(r["comp_s"] for r in rs),
                decomp=mb / statistics.median(r["decomp_s"] for r in rs),
                ok=all(r["ok"] for r in rs),
            )
        z = res["zipnn"]
        for tool in tools[1:]:
            ratios[f"{tool} comp"].append(res[tool]["comp"] / z["comp"])
            ratios[f"{tool} decomp"].append(res[tool]["decomp"] / z["decomp"])
        key = os.path.relpath(path, compare.CORPUS) if os.path.abspath(path).startswith(compare.CORPUS) else path
        ok = all(r["ok"] for r in res.values())
        row = f"| {key} | {dtype} | {mb:.1f} | {z['pct']:.2f} | {res['default']['pct']:.2f} | {res['max']['pct']:.2f} |"
        if args.before:
            row += f" {res[before]['pct']:.2f} |"
        row += (f" {res['default']['pct'] - z['pct']:+.2f} | {res['max']['pct'] - z['pct']:+.2f} "
                f"| {z['comp']:.0f} / {z['decomp']:.0f} | {res['default']['comp']:.0f} / {res['default']['decomp']:.0f} "
                f"| {res['max']['comp']:.0f} / {res['max']['decomp']:.0f} |")
        if args.before:
            row += f" {res[before]['comp']:.0f} / {res[before]['decomp']:.0f} |"
        print(row + f" {'yes' if ok else 'NO'} |", flush=True)
    print()
    print("median over files of speed ratios vs ZipNN (1 thread): "
          + ", ".join(f"{k} {statistics.median(v):.2f}×" for k, v in ratios.items()))


if __name__ == "__main__":
    main()
