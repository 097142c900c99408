#!/usr/bin/env python3
"""Entropy of ckpt's byte groups under candidate rANS contexts (issue #28, context sources).

For each float file (or XOR delta of two files with the same layout), tensor by tensor, the
elements are byte-grouped as ckpt does (exponent extraction: the top byte holds the exponent,
the sign moves to the top bit of the byte below). Per byte group it prints bits per element:

  o0 file     order-0 over the whole file (one table)
  o0 tensor   order-0, one table per tensor
  o0 chunk    order-0, one table per 256 KiB chunk (what ckpt codes)
  prev        previous byte of the group as context, one table per context per chunk
  grp j       the same element's byte in group j as context (per chunk)
  ref j       (deltas) the reference element's byte in group j as context (per chunk)

These are entropies with table costs NOT counted. The `*est` columns are the estimated coded
size of a rANS model as ckpt builds one (at most 15 dedicated contexts + a default one, the
most used context values, 12-bit tables, one varint per alphabet symbol per table, the
encoder's choice of 0/1/3/7/15 contexts) per 256 KiB chunk, tables included; `bin` is the same
with coarse tables (one frequency per run of 16 byte values, uniform inside a run).

  $CKPT_CORPUS/venv/bin/python benches/context_entropy.py FILE [FILE ...]
  $CKPT_CORPUS/venv/bin/python benches/context_entropy.py --delta OLD NEW
"""
import argparse
import json
import struct
import sys

import numpy as np

CHUNK = 256 << 10
WIDTH = {"F32": 4, "BF16": 2, "F16": 2}


def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = np.frombuffer(f.read(), dtype=np.uint8)
    out = {}
    for name, t in header.items():
        if name == "__metadata__" or t["dtype"] not in WIDTH:
            continue
        a, b = t["data_offsets"]
        out[name] = (t["dtype"], data[a:b])
    return out


def grouped(dtype, raw):
    """Byte groups (least significant first) after exponent extraction, as ckpt codes them."""
    w = WIDTH[dtype]
    if w == 2:
        v = raw.view("<u2").astype(np.uint32)
        v = ((v << 1) & 0xFF00) | ((v >> 8) & 0x80) | (v & 0x7F)
    else:
        v = raw.view("<u4").astype(np.uint64)
        v = ((v << 1) & 0xFF000000) | ((v >> 8) & 0x800000) | (v & 0x7FFFFF)
    return [((v >> (8 * g)) & 0xFF).astype(np.int64) for g in range(w)]


def entropy_bits(counts):
    counts = counts[counts > 0].astype(np.float64)
    n = counts.sum()
    return float((counts * np.log2(n / counts)).sum()) if n else 0.0


def cond_bits(ctx, sym):
    joint = np.bincount(ctx * 256 + sym, minlength=65536).reshape(256, 256)
    return sum(entropy_bits(row) for row in joint)


def varint_len(f):
    return np.where(f < 128, 1, 2)


def quantize(counts):
    tot = counts.sum()
    f = np.where(counts > 0, np.maximum(1, np.round(counts * 4096.0 / tot)), 0)
    return f


def model_cost(ctx, sym, binned=False):
    """Estimated rANS payload bytes (ckpt's model: top-K contexts + default, K in 0/1/3/7/15)."""
    joint = np.bincount(ctx * 256 + sym, minlength=65536).reshape(256, 256).astype(np.float64)
    alphabet = joint.sum(0) > 0
    nsym = int(alphabet.sum())
    use = joint.sum(1)
    order = np.argsort(-use, kind="stable")
    best = None
    for k in (0, 1, 3, 7, 15):
        if k > (use > 0).sum():
            break
        dedicated = order[:k]
        rest = np.ones(256, bool)
        rest[dedicated] = False
        tables = [joint[rest].sum(0)] + [joint[c] for c in dedicated]
        bits = 0.0
        tbytes = 0
        for t in tables:
            if t.sum() == 0:
                tbytes += nsym if not binned else 16
                continue
            if binned:
                b = t.reshape(16, 16).sum(1)
                q = np.where(b > 0, np.maximum(1, np.round(b * 256.0 / b.sum())), 0)
                p = q / q.sum() / 16.0
                pb = np.repeat(p, 16)
                bits += float((t[t > 0] * -np.log2(pb[t > 0])).sum())
                tbytes += int(varint_len(q).sum())
            else:
                q = quantize(t)
                p = q / q.sum()
                bits += float((t[t > 0] * -np.log2(p[t > 0])).sum())
                tbytes += int(varint_len(q[alphabet]).sum())
        size = 1 + k + 32 + 36 + tbytes + bits / 8
        if best is None or size < best:
            best = size
    return best


def measure(label, items, deltas=None):
    """items: name -> (dtype, raw bytes); deltas: name -> reference raw bytes."""
    width = None
    elems = 0
    cols = {}

    def add(g, key, bits):
        cols.setdefault((g, key), 0.0)
        cols[(g, key)] += bits

    file_hist = {}
    for name, (dtype, raw) in items.items():
        w = WIDTH[dtype]
        width = w
        groups = grouped(dtype, raw)
        refs = None
        if deltas is not None:
            refs = grouped(dtype, deltas[name])
            groups = [a ^ b for a, b in zip(groups, refs)]
        n = len(groups[0])
        elems += n
        per = CHUNK // w
        for g in range(w):
            file_hist.setdefault(g, np.zeros(256, np.int64))
            file_hist[g] += np.bincount(groups[g], minlength=256)
            add(g, "o0 tensor", entropy_bits(np.bincount(groups[g], minlength=256)))
        for at in range(0, n, per):
            sl = slice(at, min(n, at + per))
            for g in range(w):
                s = groups[g][sl]
                add(g, "o0 chunk", entropy_bits(np.bincount(s, minlength=256)))
                prev = np.concatenate([[0], s[:-1]])
                add(g, "prev", cond_bits(prev, s))
                add(g, "o0 est", 8 * model_cost(np.zeros_like(s), s))
                add(g, "prev est", 8 * model_cost(prev, s))
                for j in range(w):
                    if j != g:
                        add(g, f"grp {j}", cond_bits(groups[j][sl], s))
                        add(g, f"grp {j} est", 8 * model_cost(groups[j][sl], s))
                        add(g, f"grp {j} bin", 8 * model_cost(groups[j][sl], s, binned=True))
                        add(g, f"grp {j} hi est", 8 * model_cost(groups[j][sl] >> 4, s))
                    if refs is not None:
                        add(g, f"ref {j}", cond_bits(refs[j][sl], s))
                        add(g, f"ref {j} est", 8 * model_cost(refs[j][sl], s))
                        add(g, f"ref {j} hi est", 8 * model_cost(refs[j][sl] >> 4, s))
    for g in range(width):
        add(g, "o0 file", entropy_bits(file_hist[g]))
    print(f"\n## {label}: {elems} elements, {width} byte groups, bits per element (% of the file)")
    keys = sorted({k for (_, k) in cols}, key=lambda k: (k.split()[0] not in ("o0",), k))
    print("| group | " + " | ".join(keys) + " |")
    print("|---|" + "---:|" * len(keys))
    for g in range(width):
        row = [f"{cols.get((g, k), float('nan')) / elems:.3f}" for k in keys]
        print(f"| {g} | " + " | ".join(row) + " |")
    best_total = 0.0
    for g in range(width):
        ests = {k: v for (gg, k), v in cols.items() if gg == g and (k.endswith("est") or k.endswith("bin"))}
        k, v = min(ests.items(), key=lambda kv: kv[1])
        best_total += v
        print(f"group {g}: best estimate {k}: {v / elems:.3f} bits/elem (o0 est {cols[(g, 'o0 est')] / elems:.3f},"
              f" prev est {cols[(g, 'prev est')] / elems:.3f})")
    o0 = sum(cols[(g, "o0 est")] for g in range(width))
    prev = sum(min(cols[(g, "o0 est")], cols[(g, "prev est")]) for g in range(width))
    bits = 8 * width * elems
    print(f"total: o0 est {100 * o0 / bits:.2f}%, best of o0/prev est {100 * prev / bits:.2f}%,"
          f" best of all est {100 * best_total / bits:.2f}%")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="*")
    ap.add_argument("--delta", nargs=2, action="append", default=[], metavar=("OLD", "NEW"))
    args = ap.parse_args()
    for path in args.files:
        measure(path.split("/")[-1], tensors(path))
    for old, new in args.delta:
        ref = {k: raw for k, (_, raw) in tensors(old).items()}
        measure(f"{new.split('/')[-1]} XOR {old.split('/')[-1]}", tensors(new), ref)


if __name__ == "__main__":
    sys.exit(main())
