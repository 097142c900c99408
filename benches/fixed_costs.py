"""Fixed costs, file to file, one thread: the two ratios of issue #28 item 5 in one run.

  1. `ckpt decompress` of a small model vs ZipNN decompressing the same file (target ≥ 1.0×):
     process start, mmap, hash verification and page zeroing dominate on small files;
  2. `ckpt compress` of a large bf16 model vs ZipNN compressing it (target ≥ 2.5×).

ckpt is timed as the CLI runs (`ckpt -q -j 1 compress|decompress IN -o OUT`, wall time of the
process, page cache warm); ZipNN in this process from reading the input file to writing the
output file (byte API, method="HUFFMAN", threads=1; no interpreter start, which would be unfair
to it). Prints MB/s of each and the ratio, medians of --runs runs. A benchmark, not a test: it
is there so that a drop such as 2.9× → 2.3× is seen.

  $CKPT_CORPUS/venv/bin/python benches/fixed_costs.py [--ckpt PATH]... [--runs N] [--small F] [--large F]

Several --ckpt builds (an A/B) are timed interleaved in the same repetitions as ZipNN, and each
gets its own pair of ratios.

Defaults: the corpus's smallest float file (standalone/mediapipe_pose_landmark_full_fp16, 6.4 MB)
and series/bf16/epoch_10 (45 MB bf16), the nearest stand-ins in the corpus for the issue's 15 MB
fp32 and 235 MB bf16 models.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (CORPUS, ZIPNN_DTYPE, dominant_dtype)


def wall(cmd):
    t = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - t


def zipnn_file(ZipNN, src, dst, dtype, compress):
    t = time.perf_counter()
    with open(src, "rb") as f:
        data = bytearray(f.read())
    z = ZipNN(method="HUFFMAN", input_format="byte", bytearray_dtype=dtype, threads=1)
    out = z.compress(data) if compress else z.decompress(bytes(data))
    with open(dst, "wb") as f:
        f.write(out)
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", action="append", help="ckpt binary; repeat for an A/B (default: the release build)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--small", default=os.path.join(compare.CORPUS, "standalone/mediapipe_pose_landmark_full_fp16.safetensors"))
    ap.add_argument("--large", default=os.path.join(compare.CORPUS, "series/bf16/epoch_10.safetensors"))
    args = ap.parse_args()
    builds = args.ckpt or [os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release", "ckpt")]
    from zipnn import ZipNN

    print(f"# {args.runs} runs, load average {compare.loadavg()}")
    with tempfile.TemporaryDirectory(dir=os.path.join(compare.CORPUS, "work")) as tmp:
        # 1. Decompression of the small file (each build decompresses its own container).
        small_mb = os.path.getsize(args.small) / 1e6
        zdtype = compare.ZIPNN_DTYPE.get(compare.dominant_dtype(args.small), "float32")
        ckz = [os.path.join(tmp, f"s{i}.ckz") for i in range(len(builds))]
        znn = os.path.join(tmp, "s.znn")
        for b, c in zip(builds, ckz):
            subprocess.run([b, "-q", "-j", "1", "compress", args.small, "-o", c], check=True)
        zipnn_file(ZipNN, args.small, znn, zdtype, True)
        ckpt_d, zipnn_d = [[] for _ in builds], []
        for _ in range(args.runs):
            for i, (b, c) in enumerate(zip(builds, ckz)):
                ckpt_d[i].append(wall([b, "-q", "-j", "1", "decompress", c, "-o", os.path.join(tmp, "s.out")]))
            zipnn_d.append(zipnn_file(ZipNN, znn, os.path.join(tmp, "s.zout"), zdtype, False))
        # 2. Compression of the large file.
        large_mb = os.path.getsize(args.large) / 1e6
        zdtype = compare.ZIPNN_DTYPE.get(compare.dominant_dtype(args.large), "float32")
        ckpt_c, zipnn_c = [[] for _ in builds], []
        for _ in range(args.runs):
            for i, b in enumerate(builds):
                ckpt_c[i].append(wall([b, "-q", "-j", "1", "compress", args.large, "-o", os.path.join(tmp, "l.ckz")]))
            zipnn_c.append(zipnn_file(ZipNN, args.large, os.path.join(tmp, "l.znn"), zdtype, True))
    zd, zc = small_mb / statistics.median(zipnn_d), large_mb / statistics.median(zipnn_c)
    for i, b in enumerate(builds):
        d = small_mb / statistics.median(ckpt_d[i])
        c = large_mb / statistics.median(ckpt_c[i])
        print(f"ckpt {b}")
        print(f"  decompress {os.path.basename(args.small)} ({small_mb:.1f} MB): ckpt {d:.0f} MB/s, "
              f"ZipNN {zd:.0f} MB/s, ratio {d / zd:.2f}x (target >= 1.0)")
        print(f"  compress {os.path.basename(args.large)} ({large_mb:.1f} MB): ckpt {c:.0f} MB/s, "
              f"ZipNN {zc:.0f} MB/s, ratio {c / zc:.2f}x (target >= 2.5)")


if __name__ == "__main__":
    main()
