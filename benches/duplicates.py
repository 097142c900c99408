"""Duplicated tensors inside one file (issue #43 item 2): `ckpt compress` with reference
segments (copies and cross-precision derived tensors) against the same binary without them
(CKPT_REFERENCE_SEGMENTS=off), z4ai 0.2.0 (its safetensors mode, which deduplicates tensors)
and ZipNN 0.5.4 (byte API, whole file), on files built from the corpus's real weights:

  tied_fp32    MiniLM fp32 with its word embeddings saved again as `lm_head.weight`
  tied_bf16    the same in bf16
  shared_bf16  MiniLM bf16 with layer 0 saved again as layers 6-11 (shared layers, ALBERT-style)
  mixed        MiniLM fp32 master weights and their bf16 copy in one file (`master.*`, then `*`)

Sizes are deterministic; each ckpt container is decompressed and compared with its file.
usage: $CKPT_CORPUS/venv/bin/python benches/duplicates.py [--ckpt target/release/ckpt] [--runs 3]
Needs the corpus (bash ../shared/corpus/make_corpus.sh) and `pip install z4ai==0.2.0` in its venv.
"""
import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

CORPUS = os.environ.get("CKPT_CORPUS") or os.path.join(os.path.expanduser("~"), ".cache", "ckpt-corpus")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_st(path):
    """(metadata, [(name, dtype, shape, bytes)]) in data order."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", None)
    tensors = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    base = 8 + n
    return meta, [(k, v["dtype"], v["shape"], raw[base + v["data_offsets"][0]:base + v["data_offsets"][1]])
                  for k, v in tensors]


def write_st(path, tensors):
    header, at = {}, 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(data)]}
        at += len(data)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for t in tensors:
            f.write(t[3])


def build(scratch):
    _, fp32 = read_st(os.path.join(CORPUS, "standalone", "minilm_l6_v2_fp32.safetensors"))
    _, bf16 = read_st(os.path.join(CORPUS, "standalone", "minilm_l6_v2_bf16_rne.safetensors"))
    def tied(ts):
        emb = next(t for t in ts if t[0].endswith("word_embeddings.weight"))
        return ts + [("lm_head.weight", emb[1], emb[2], emb[3])]
    layer0 = [t for t in bf16 if ".layer.0." in t[0]]
    shared = bf16 + [(t[0].replace(".layer.0.", f".layer.{k}."), *t[1:]) for k in range(6, 12) for t in layer0]
    by_name = {t[0]: t for t in bf16}
    mixed = [("master." + t[0], *t[1:]) for t in fp32] + [by_name[t[0]] for t in fp32]
    files = {}
    for label, ts in [("tied_fp32", tied(fp32)), ("tied_bf16", tied(bf16)), ("shared_bf16", shared), ("mixed", mixed)]:
        files[label] = os.path.join(scratch, label + ".safetensors")
        write_st(files[label], ts)
    return files


def ckpt_compress(ckpt, path, out, references):
    env = dict(os.environ, CKPT_REFERENCE_SEGMENTS="on" if references else "off")
    t = time.perf_counter()
    subprocess.run([ckpt, "-q", "compress", path, "-o", out], check=True, env=env)
    elapsed = time.perf_counter() - t
    back = out + ".back"
    subprocess.run([ckpt, "-q", "decompress", out, "-o", back], check=True)
    same = open(back, "rb").read() == open(path, "rb").read()
    os.remove(back)
    if not same:
        sys.exit(f"{path}: ckpt round trip differs")
    return os.path.getsize(out), elapsed


def zipnn_size(path):
    from zipnn import ZipNN
    data = open(path, "rb").read()
    dtype = "float32" if "fp32" in path or "mixed" in path else "bfloat16"
    z = ZipNN(method="HUFFMAN", input_format="byte", bytearray_dtype=dtype, threads=os.cpu_count())
    return len(z.compress(bytearray(data)))


def z4ai_size(path, out):
    import z4ai.safetensors as zs
    zs.compress_file(path, out)
    back = out + ".back"
    zs.decompress_file(out, back)
    same = open(back, "rb").read() == open(path, "rb").read()
    os.remove(back)
    if not same:
        sys.exit(f"{path}: z4ai round trip differs")
    return os.path.getsize(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", default=os.path.join(ROOT, "target", "release", "ckpt"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(dir=os.path.join(CORPUS, "work")) as scratch:
        for label, path in build(scratch).items():
            n = os.path.getsize(path)
            row = {"file": label, "bytes": n}
            for refs, key in [(False, "ckpt_before"), (True, "ckpt_after")]:
                out = os.path.join(scratch, f"{label}.{key}.ckz")
                runs = [ckpt_compress(args.ckpt, path, out, refs) for _ in range(args.runs)]
                row[key] = 100.0 * runs[0][0] / n
                row[key + "_s"] = statistics.median(r[1] for r in runs)
            row["z4ai"] = 100.0 * z4ai_size(path, os.path.join(scratch, label + ".zstn")) / n
            row["zipnn"] = 100.0 * zipnn_size(path) / n
            rows.append(row)
            print(f"{label:12} {n / 1e6:7.1f} MB  ckpt before {row['ckpt_before']:6.2f}%  after {row['ckpt_after']:6.2f}%"
                  f"  z4ai {row['z4ai']:6.2f}%  ZipNN {row['zipnn']:6.2f}%"
                  f"  compress {row['ckpt_before_s']:.2f} s -> {row['ckpt_after_s']:.2f} s", flush=True)
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
