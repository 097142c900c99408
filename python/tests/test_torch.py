"""With torch installed (skipped otherwise): torch tensors, ckpt.torch.save/load, and a Trainer run
with the callback when transformers (and accelerate) are installed."""

import hashlib

import pytest

torch = pytest.importorskip("torch")

import ckpt  # noqa: E402
import ckpt.torch  # noqa: E402


def raw(t):
    return bytes(t.detach().contiguous().view(-1).view(torch.uint8).numpy())


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and raw(a) == raw(b)


def tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "w.bf16": torch.randn(33, 17, generator=g).to(torch.bfloat16),
        "w.f16": torch.randn(5, 7, generator=g).to(torch.float16),
        "w.f32": torch.randn(64, 3, generator=g),
        "step": torch.tensor(7, dtype=torch.int64),
        "mask": torch.rand(4, 4, generator=g) > 0.5,
        # A non-contiguous view and a tensor that requires grad.
        "t": torch.randn(6, 4, generator=g).t(),
        "p": torch.nn.Parameter(torch.randn(3, generator=g)),
    }


def test_torch_dict_is_byte_identical_to_safetensors_torch(repo, tmp_path):
    from safetensors.torch import save_file

    t = tensors()
    repo.commit({"m.safetensors": t}, "torch")
    repo.checkout(output=tmp_path / "out")
    ref = tmp_path / "ref.safetensors"
    save_file({k: v.detach().contiguous() for k, v in t.items()}, str(ref), metadata={"format": "pt"})
    repo2 = ckpt.Repo.init(tmp_path / "r2")
    repo2.commit({"m.safetensors": t}, "with metadata", metadata={"m.safetensors": {"format": "pt"}})
    repo2.checkout(output=tmp_path / "o2")
    assert (tmp_path / "o2" / "m.safetensors").read_bytes() == ref.read_bytes()
    loaded = repo.load(framework="pt")
    for k, v in t.items():
        assert same(loaded[k], v.detach()), k


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 16)
        self.fc = torch.nn.Linear(16, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        self.calls += 1
        return self.norm(self.fc(self.embed(x).mean(1)))


def train(model, opt, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randint(0, 50, (8, 5), generator=g)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def state_bytes(sd):
    h = hashlib.sha256()
    for k in sorted(sd, key=str):
        v = sd[k]
        h.update(str(k).encode())
        if isinstance(v, torch.Tensor):
            h.update(str(v.dtype).encode())
            h.update(raw(v))
        elif isinstance(v, dict):
            h.update(state_bytes(v).encode())
        else:
            h.update(repr(v).encode())
    return h.hexdigest()


@pytest.mark.parametrize("background", [False, True])
def test_save_and_load_model_and_adamw_bit_exactly(repo, background):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    saved = []
    for epoch in range(3):
        train(model, opt, 4, seed=epoch)
        sched.step()
        r = ckpt.torch.save(repo, model=model, optimizer=opt, scheduler=sched, extra={"epoch": epoch, "best": float("inf")},
                            message=f"epoch {epoch}", background=background)
        if background:
            r = r.wait()
        saved.append((r, state_bytes(model.state_dict()), state_bytes(opt.state_dict()), sched.state_dict()))
    assert repo.files() == ["model.safetensors", "optimizer.safetensors", "state.json"]
    for vid, model_hash, opt_hash, sched_state in saved:
        torch.manual_seed(1)
        fresh = Net()
        fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1.0)
        fresh_sched = torch.optim.lr_scheduler.StepLR(fresh_opt, step_size=9)
        out = ckpt.torch.load(repo, vid, model=fresh, optimizer=fresh_opt, scheduler=fresh_sched)
        assert state_bytes(fresh.state_dict()) == model_hash
        assert state_bytes(fresh_opt.state_dict()) == opt_hash
        assert fresh_sched.state_dict() == sched_state
        assert out["extra"]["best"] == float("inf")
    # Training resumes identically from a restored state.
    torch.manual_seed(1)
    a, b = Net(), Net()
    opt_a, opt_b = torch.optim.AdamW(a.parameters()), torch.optim.AdamW(b.parameters())
    ckpt.torch.load(repo, saved[1][0], model=a, optimizer=opt_a)
    ckpt.torch.load(repo, saved[1][0], model=b, optimizer=opt_b)
    train(a, opt_a, 2, seed=9)
    train(b, opt_b, 2, seed=9)
    assert state_bytes(a.state_dict()) == state_bytes(b.state_dict())


def test_trainer_with_callback(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from ckpt.transformers import CkptCallback

    assert isinstance(CkptCallback(), transformers.TrainerCallback)
    config = transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, num_labels=2)
    model = transformers.BertForSequenceClassification(config)

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            return {"input_ids": torch.randint(0, 64, (8,), generator=g), "labels": torch.tensor(i % 2)}

    out = tmp_path / "out"
    args = transformers.TrainingArguments(output_dir=str(out), num_train_epochs=2, per_device_train_batch_size=8,
                                          save_strategy="epoch", save_total_limit=1, report_to=[],
                                          use_cpu=True, logging_strategy="no")
    callback = CkptCallback()
    transformers.Trainer(model=model, args=args, train_dataset=Data(), callbacks=[callback]).train()
    repo = ckpt.Repo(out)
    log = repo.log()
    assert [v["message"] for v in log] == ["step 4", "step 2"]
    assert set(repo.tags()) == {"step-2", "step-4"}
    assert not (out / "checkpoint-2").exists()  # deleted by save_total_limit, kept by ckpt
    files = repo.files("step-2")
    assert "model.safetensors" in files and "trainer_state.json" in files
    repo.checkout("step-4", output=tmp_path / "restored")
    for name in files:
        assert (tmp_path / "restored" / name).read_bytes() == (out / "checkpoint-4" / name).read_bytes()
