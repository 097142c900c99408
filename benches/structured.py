"""Quantized weights in wide float files (issue 43): ckpt's grid recovery against z4ai and ZipNN.

Builds, from the real weights of the benchmark corpus (MiniLM fp32), one file per kind of
structure, quantized the way the tools named do it and dequantized (every 2-D weight matrix;
1-D tensors are cast as they are):

  gptq4_g128_zp_bf16   GPTQ/AWQ: 4-bit codes, group 128 along the row, zero point
                       (s = (max − min)/15, z = round(−min/s), c = clamp(round(w/s) + z, 0, 15));
                       scales kept in fp16 as AWQ does; dequantized (c − z)·s in f32, cast to bf16
  int8_row_bf16/_fp32  bitsandbytes LLM.int8: 8-bit per-row absmax (s = absmax/127,
                       c = round(w/s)); dequantized c·s in f32 (cast to bf16)
  fp8_e4m3_b128_bf16   DeepSeek-V3: e4m3 codes, one f32 scale per 128×128 block
                       (s = amax/448, q = e4m3(w/s)); dequantized q·s in f32, cast to bf16
  dense_bf16           the corpus's bf16 cast, unquantized: dense files must not get worse

Then, for each file, in the same run: ckpt's codec in-process (examples/codec_throughput, one
thread, at the default level and at `max`), z4ai 0.2.0 (safetensors API at its default level;
"best": the smaller of its safetensors API at zstd level 19 and every tensor with
effort="max" with --z4ai-effort-max), ZipNN 0.5.4 (byte API, Huffman, one thread). Prints one markdown row per file:
stored % of the file for each, and decode MB/s (one core) for ckpt and ZipNN.

  $CKPT_CORPUS/venv/bin/python benches/structured.py [--runs N] [--out DIR] [--only NAME...]

Needs `cargo build --release --example codec_throughput` (CARGO_TARGET_DIR honoured).
"""
import argparse
import json
import os
import statistics
import struct
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (bench_zipnn, bench_ckpt_mem, CORPUS)

SOURCE = "standalone/minilm_l6_v2_fp32.safetensors"


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    dt = {"F32": np.float32, "I64": np.int64}
    for name, e in header.items():
        a, b = e["data_offsets"]
        out[name] = np.frombuffer(blob[8 + n + a:8 + n + b], dtype=dt[e["dtype"]]).reshape(e["shape"])
    return out


def write_safetensors(path, tensors):
    """tensors: name -> torch tensor. Official layout (safetensors' own writer)."""
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in tensors.items()}, path)


def gptq4(w):
    """4-bit, group 128 along the row, zero point; fp16 scales; (c − z)·s in f32."""
    rows, cols = w.shape
    g = w.reshape(rows, cols // 128, 128)
    lo, hi = g.amin(dim=2, keepdim=True), g.amax(dim=2, keepdim=True)
    s = ((hi - lo) / 15).clamp(min=1e-8).half().float()
    z = torch.round(-lo / s)
    c = torch.clamp(torch.round(g / s) + z, 0, 15)
    return ((c - z) * s).reshape(rows, cols)


def int8_row(w):
    """LLM.int8: per-row absmax, c = round(w/s), c·s in f32."""
    s = (w.abs().amax(dim=1, keepdim=True) / 127).clamp(min=1e-12)
    c = torch.clamp(torch.round(w / s), -127, 127)
    return c * s


def fp8_blocks(w):
    """DeepSeek-V3: e4m3 codes, one f32 scale per 128×128 block (amax/448), q·s in f32."""
    rows, cols = w.shape
    out = torch.empty_like(w)
    for r in range(0, rows, 128):
        for c in range(0, cols, 128):
            blk = w[r:r + 128, c:c + 128]
            s = (blk.abs().amax() / 448).clamp(min=1e-12)
            q = (blk / s).to(torch.float8_e4m3fn)
            out[r:r + 128, c:c + 128] = q.float() * s
    return out


def build(out_dir):
    src = read_safetensors(os.path.join(compare.CORPUS, SOURCE))
    kinds = {
        "gptq4_g128_zp_bf16": (gptq4, torch.bfloat16),
        "int8_row_bf16": (int8_row, torch.bfloat16),
        "int8_row_fp32": (int8_row, torch.float32),
        "fp8_e4m3_b128_bf16": (fp8_blocks, torch.bfloat16),
        "dense_bf16": (None, torch.bfloat16),
    }
    paths = []
    os.makedirs(out_dir, exist_ok=True)
    for name, (quant, dtype) in kinds.items():
        path = os.path.join(out_dir, name + ".safetensors")
        paths.append(path)
        if os.path.exists(path):
            continue
        tensors = {}
        for k, a in src.items():
            t = torch.from_numpy(a.copy())
            if t.dtype != torch.float32:
                tensors[k] = t
            elif quant is not None and t.dim() == 2 and t.shape[1] % 128 == 0:
                tensors[k] = quant(t).to(dtype)
            else:
                tensors[k] = t.to(dtype)
        write_safetensors(path + ".tmp", tensors)
        os.replace(path + ".tmp", path)
    return paths


def z4ai_sizes(data, effort_max):
    """(default, best) stored bytes of z4ai 0.2.0 on a safetensors file, round trips checked;
    best is its safetensors API at zstd level 19, and with `effort_max` also every tensor with
    effort="max" (slow: minutes per file here), whichever is smaller."""
    import z4ai
    default = z4ai.safetensors.compress_bytes(data)
    assert z4ai.safetensors.decompress_bytes(default) == data
    best = len(z4ai.safetensors.compress_bytes(data, level=19))
    if not effort_max:
        return len(default), best
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    per_tensor = 8 + n
    zdt = {"BF16": "bf16", "F16": "fp16", "F32": "fp32"}
    for e in header.values():
        a, b = e["data_offsets"]
        raw = data[8 + n + a:8 + n + b]
        frame = z4ai.compress(raw, dtype=zdt.get(e["dtype"]), effort="max")
        assert z4ai.decompress(frame) == raw
        per_tensor += len(frame)
    return len(default), min(best, per_tensor)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="timed runs per tool; medians are reported")
    ap.add_argument("--out", default=os.path.join(compare.CORPUS, "structured"), help="where the files go")
    ap.add_argument("--only", nargs="*", help="file names (without .safetensors) to bench")
    ap.add_argument("--z4ai-effort-max", action="store_true", help="also z4ai effort=max per tensor (slow)")
    args = ap.parse_args()
    from zipnn import ZipNN

    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(os.path.dirname(__file__), "..", "target")
    probe = os.path.join(target, "release", "examples", "codec_throughput")
    if not os.access(probe, os.X_OK):
        sys.exit(f"missing {probe}: cargo build --release --example codec_throughput")
    paths = build(args.out)
    if args.only:
        paths = [p for p in paths if os.path.basename(p).split(".")[0] in args.only]
    print(f"# load average {compare.loadavg()}; torch {torch.__version__}")
    print("| file | MB | ckpt default % | ckpt max % | z4ai default % | z4ai best % | ZipNN % "
          "| max − min(z4ai, ZipNN) pp | decode MB/s/core: ckpt default / max / ZipNN | ok |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        mb = len(data) / 1e6
        dtype = compare.dominant_dtype(path)
        zdtype = compare.ZIPNN_DTYPE.get(dtype, "float32")
        res = {}
        for tool in ["default", "max", "zipnn"]:
            rs = []
            for _ in range(args.runs):
                if tool == "zipnn":
                    rs.append(compare.bench_zipnn(ZipNN, data, zdtype, 1))
                else:
                    os.environ["CKPT_LEVEL"] = tool
                    rs.append(compare.bench_ckpt_mem(probe, path, 1, repeat=3))
            res[tool] = dict(pct=100.0 * rs[0]["size"] / len(data),
                             decomp=mb / statistics.median(r["decomp_s"] for r in rs),
                             ok=all(r["ok"] for r in rs))
        t = time.perf_counter()
        z_default, z_best = z4ai_sizes(data, args.z4ai_effort_max)
        z_s = time.perf_counter() - t
        zd, zb = 100.0 * z_default / len(data), 100.0 * z_best / len(data)
        rival = min(zd, zb, res["zipnn"]["pct"])
        ok = all(r["ok"] for r in res.values())
        print(f"| {os.path.basename(path)} | {mb:.1f} | {res['default']['pct']:.2f} | {res['max']['pct']:.2f} "
              f"| {zd:.2f} | {zb:.2f} | {res['zipnn']['pct']:.2f} | {res['max']['pct'] - rival:+.2f} "
              f"| {res['default']['decomp']:.0f} / {res['max']['decomp']:.0f} / {res['zipnn']['decomp']:.0f} "
              f"| {'yes' if ok else 'NO'} |", flush=True)
        del z_s


if __name__ == "__main__":
    main()
