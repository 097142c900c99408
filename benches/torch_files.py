#!/usr/bin/env python3
"""Store size of `torch.save` optimizer state against the same state as safetensors (issue 20).

Trains a small transformer language model with AdamW for a few steps (seeded), saves
`optimizer.state_dict()` with `torch.save` after epoch 1 and epoch 2, and commits the two epochs
into three fresh repositories:

- torch:  the `optimizer.pt` files as written (read storage by storage);
- st:     the same tensors as `optimizer.safetensors` (names `state.<i>.<key>`), the files a
          safetensors-based loop would write;
- opaque: the `optimizer.pt` files with their first byte flipped, so they are not recognised as
          zip archives: what ckpt stored for them before it read torch files (same size, same
          bytes but one).

Reports the store growth (bytes of .ckpt/objects) per epoch and in total for each, with the
ratios the issue targets: torch ≤ st × 1.02 and torch ≤ 0.75 × opaque.

With `--corpus`, the two states are instead the corpus AdamW state of a real fine-tune
(`series/optim/adamw_epoch_01` and `_02.safetensors`, from ../shared/corpus/make_corpus.sh),
saved with `torch.save` in `optimizer.state_dict()` form (`state.<i>.exp_avg`, ...) and as
the safetensors files themselves.

With `--series DTYPE` (fp32 or bf16), the whole corpus fine-tune series
(`series/DTYPE/epoch_00..10.safetensors`) is committed epoch by epoch twice: as the safetensors
files themselves and as `torch.save` of the same state dict (`model.pt`), and the two stores are
compared (the issue's target: the torch series within 2% of the safetensors series).

usage: ~/.cache/ckpt-corpus/venv/bin/python benches/torch_files.py [--ckpt target/release/ckpt]
       [--dim 256] [--layers 4] [--steps 20] [--corpus | --series fp32|bf16]
"""
import argparse
import os
import subprocess
import tempfile

import torch
from safetensors.torch import load_file, save_file

CORPUS = os.environ.get("CKPT_CORPUS") or os.path.join(os.path.expanduser("~"), ".cache", "ckpt-corpus")


def objects_bytes(repo):
    total = 0
    for root, _, files in os.walk(os.path.join(repo, ".ckpt", "objects")):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


def commit(ckpt, repo, src, name, message):
    data = open(src, "rb").read()
    with open(os.path.join(repo, name), "wb") as f:
        f.write(data)
    env = dict(os.environ, CKPT_COMPACT="inline")
    subprocess.run([ckpt, "-C", repo, "commit", "-q", "-m", message, name], check=True, env=env)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", default="target/release/ckpt")
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--corpus", action="store_true")
    ap.add_argument("--series", choices=("fp32", "bf16"))
    args = ap.parse_args()
    ckpt = os.path.abspath(args.ckpt)
    if args.series:
        return series(ckpt, args.series)

    torch.manual_seed(0)
    vocab = 4096
    layer = torch.nn.TransformerEncoderLayer(args.dim, 4, 4 * args.dim, batch_first=True)
    model = torch.nn.Sequential(
        torch.nn.Embedding(vocab, args.dim),
        torch.nn.TransformerEncoder(layer, args.layers),
        torch.nn.Linear(args.dim, vocab),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)

    def train(steps):
        for _ in range(steps):
            x = torch.randint(0, vocab, (8, 32), generator=g)
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab), x[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()

    def corpus_state(epoch):
        flat = load_file(os.path.join(CORPUS, "series", "optim", f"adamw_epoch_{epoch:02}.safetensors"))
        params = sorted({k.rsplit(".", 1)[0] for k in flat})
        state = {
            i: {"step": torch.tensor(float(epoch)), "exp_avg": flat[p + ".exp_avg"], "exp_avg_sq": flat[p + ".exp_avg_sq"]}
            for i, p in enumerate(params)
        }
        return {"state": state, "param_groups": [{"lr": 1e-4, "params": list(range(len(params)))}]}, flat

    with tempfile.TemporaryDirectory() as work:
        sources = []
        for epoch in (1, 2):
            st = os.path.join(work, f"optimizer_{epoch}.safetensors")
            pt = os.path.join(work, f"optimizer_{epoch}.pt")
            if args.corpus:
                state, flat = corpus_state(epoch)
            else:
                train(args.steps)
                state = opt.state_dict()
                flat = {f"state.{i}.{k}": v.contiguous() for i, s in state["state"].items() for k, v in s.items()}
            torch.save(state, pt)
            save_file(flat, st)
            opaque = os.path.join(work, f"optimizer_{epoch}.opaque")
            data = bytearray(open(pt, "rb").read())
            data[0] ^= 0xFF
            open(opaque, "wb").write(data)
            sources.append((pt, st, opaque))
        print(f"optimizer.pt: {os.path.getsize(sources[0][0]):,} bytes, {len(flat)} tensors")
        results = {}
        for kind, idx, name in (("torch", 0, "optimizer.pt"), ("st", 1, "optimizer.safetensors"), ("opaque", 2, "optimizer.pt")):
            repo = os.path.join(work, f"repo_{kind}")
            os.makedirs(repo)
            subprocess.run([ckpt, "init", repo], check=True, capture_output=True)
            sizes = []
            before = objects_bytes(repo)
            for epoch, src in enumerate(sources, 1):
                commit(ckpt, repo, src[idx], name, f"epoch {epoch}")
                now = objects_bytes(repo)
                sizes.append(now - before)
                before = now
            results[kind] = sizes
            raw = os.path.getsize(src[idx])
            print(f"{kind:7} raw {raw:>12,}  epoch 1 {sizes[0]:>12,}  epoch 2 {sizes[1]:>12,}  total {sum(sizes):>12,}")
        t, s, o = (sum(results[k]) for k in ("torch", "st", "opaque"))
        print(f"torch / safetensors = {t / s:.4f} (target <= 1.02)")
        print(f"torch / opaque      = {t / o:.4f} (target <= 0.75)")


def series(ckpt, dtype):
    """The corpus series as safetensors files and as `torch.save` files, committed epoch by epoch."""
    sources = [os.path.join(CORPUS, "series", dtype, f"epoch_{e:02}.safetensors") for e in range(11)]
    with tempfile.TemporaryDirectory() as work:
        repos = {}
        for kind, name in (("st", "model.safetensors"), ("torch", "model.pt")):
            repo = os.path.join(work, f"repo_{kind}")
            os.makedirs(repo)
            subprocess.run([ckpt, "init", repo], check=True, capture_output=True)
            repos[kind] = (repo, name)
        raw = {"st": 0, "torch": 0}
        for epoch, src in enumerate(sources):
            pt = os.path.join(work, "epoch.pt")
            torch.save(load_file(src), pt)
            for kind, path in (("st", src), ("torch", pt)):
                repo, name = repos[kind]
                raw[kind] += os.path.getsize(path)
                commit(ckpt, repo, path, name, f"epoch {epoch}")
        sizes = {kind: objects_bytes(repo) for kind, (repo, _) in repos.items()}
        for kind in ("st", "torch"):
            print(f"{kind:6} 11 files {raw[kind]:>13,} B raw, store {sizes[kind]:>12,} B ({sizes[kind] / raw[kind]:.1%})")
        print(f"torch / safetensors = {sizes['torch'] / sizes['st']:.4f} (target <= 1.02)")


if __name__ == "__main__":
    main()
