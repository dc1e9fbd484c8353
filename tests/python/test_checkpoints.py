"""Checkpoints from PyTorch: DeepSpeed's save_checkpoint / load_checkpoint on
the engine resume exactly; `zerod ckpt` checks, exports (safetensors) and
reshards what they wrote."""
import contextlib
import json
import os
import subprocess

import pytest
import torch

import zerod.torch
from conftest import ZEROD
from models import batch, loss_of, make

JOB = """return {{
  zero = {{ stage = {stage}{extra} }},
  optimizer = {{ type = "adamw", lr = 3e-3, weight_decay = 0.05 }},
  gradient_clipping = 1.0,
}}"""


def engine(stage):
    extra = ", param_persistence_threshold = 0" if stage == 3 else ""
    return zerod.torch.initialize(make("gpt"), job_text=JOB.format(stage=stage, extra=extra))


def train(e, start, stop):
    for step in range(start, stop):
        inputs, y = batch("gpt", step)
        loss = loss_of("gpt", e, inputs, y, torch.float32)
        e.backward(loss)
        e.step()


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("stage", [0, 3])
def test_a_loaded_checkpoint_resumes_exactly(stage, tmp_path):
    a = engine(stage)
    train(a, 0, 3)
    assert a.save_checkpoint(tmp_path, client_state={"epoch": 7})
    train(a, 3, 6)
    want = a.state_dict()
    assert (tmp_path / "latest").read_text() == "global_step3"
    b = engine(stage)
    path, client = b.load_checkpoint(tmp_path)
    assert path == os.path.join(tmp_path, "global_step3") and client == {"epoch": 7}
    assert b.global_steps == 3
    train(b, 3, 6)
    assert same(b.state_dict(), want), "the resumed run ends where the uninterrupted one does"



# fp32 parameters under zerod's fp16 loss scaling (autocast's mixed
# precision): a scale of 2^4 that doubles after every 2 clean steps.
JOB_FP16 = """return {
  precision = "fp16",
  fp16 = { initial_scale_power = 4, loss_scale_window = 2 },
  optimizer = { type = "adamw", lr = 3e-3, weight_decay = 0.05 },
  gradient_clipping = 1.0,
}"""


def test_a_loaded_checkpoint_resumes_with_its_loss_scale(tmp_path):
    """The checkpoint holds the loss scale the run had grown to; the engine
    that loads it multiplies its next loss by that scale (zerod divides the
    gradients by it), so its next step is the uninterrupted run's."""
    a = zerod.torch.initialize(make("gpt"), job_text=JOB_FP16)
    train(a, 0, 4)
    assert a.zerod_model.loss_scale() == 64.0, "the scale grew from 16 (else this test shows nothing)"
    a.save_checkpoint(tmp_path)
    train(a, 4, 5)
    b = zerod.torch.initialize(make("gpt"), job_text=JOB_FP16)
    b.load_checkpoint(tmp_path)
    train(b, 4, 5)
    assert (b.last_step.loss_scale, b.last_step.grad_norm) == (a.last_step.loss_scale, a.last_step.grad_norm)
    assert same(b.state_dict(), a.state_dict())


def test_a_save_that_fails_writing_torch_state_leaves_no_checkpoint(tmp_path, monkeypatch):
    """torch_state.pt is written (to a temporary file, renamed) before
    zerod's save, whose manifest commits the checkpoint: a save that dies
    writing it leaves nothing that loads with the client state missing."""
    a = engine(0)
    train(a, 0, 2)

    def dies(obj, f, *args, **kwargs):  # half the file, then the disk is full
        with (open(f, "wb") if isinstance(f, (str, os.PathLike)) else contextlib.nullcontext(f)) as out:
            out.write(b"PK\x03\x04 half a file")
        raise OSError("No space left on device")
    monkeypatch.setattr(torch, "save", dies)
    with pytest.raises(OSError, match="No space left"):
        a.save_checkpoint(tmp_path, client_state={"epoch": 1})
    monkeypatch.undo()
    ckpt = tmp_path / "global_step2"
    assert not (tmp_path / "latest").exists()
    assert not ckpt.exists() or not list(ckpt.iterdir()), f"left behind: {list(ckpt.iterdir())}"
    with pytest.raises(zerod.ZerodError, match="no checkpoint"):
        engine(0).load_checkpoint(tmp_path, tag="global_step2")


def test_a_save_into_a_reused_directory_is_whole_or_the_old_one(tmp_path, monkeypatch):
    """Lightning's last.ckpt and Accelerate's save_state save into one
    directory again and again: a save that fails in zerod's part keeps the
    old checkpoint with its own torch state; one killed after zerod's
    manifest loads with the new torch state."""
    a = engine(0)
    train(a, 0, 2)
    a.save_checkpoint(tmp_path, tag="last", client_state={"step": 2})
    at2 = a.state_dict()
    train(a, 2, 3)
    with monkeypatch.context() as m:
        m.setattr(a.zerod_model, "save", lambda path: (_ for _ in ()).throw(OSError("No space left on device")))
        with pytest.raises(OSError):
            a.save_checkpoint(tmp_path, tag="last", client_state={"step": 3})
    b = engine(0)
    assert b.load_checkpoint(tmp_path, tag="last")[1] == {"step": 2} and same(b.state_dict(), at2)

    real = os.replace

    def killed(src, dst):  # after zerod's save, before torch_state.pt is renamed into place
        if os.path.basename(dst) == "torch_state.pt":
            raise KeyboardInterrupt
        real(src, dst)
    with monkeypatch.context() as m:
        m.setattr(os, "replace", killed)
        with pytest.raises(KeyboardInterrupt):
            a.save_checkpoint(tmp_path, tag="last", client_state={"step": 3})
    c = engine(0)
    assert c.load_checkpoint(tmp_path, tag="last")[1] == {"step": 3} and same(c.state_dict(), a.state_dict())


def test_torch_state_of_another_save_is_refused(tmp_path):
    a = engine(0)
    train(a, 0, 2)
    a.save_checkpoint(tmp_path, tag="two")
    train(a, 2, 3)
    a.save_checkpoint(tmp_path, tag="three")
    (tmp_path / "three" / "torch_state.pt").write_bytes((tmp_path / "two" / "torch_state.pt").read_bytes())
    b = engine(0)
    with pytest.raises(zerod.InvalidStateError, match="state of step 3, but torch_state.pt is of step 2.*nothing "
                                                      "was loaded"):
        b.load_checkpoint(tmp_path, tag="three")
    assert b.global_steps == 0 and b.zerod_model.optimizer_info().step == 0


def test_a_checkpoint_without_torch_state_loads_and_says_what_it_kept(tmp_path):
    """zd_model_save alone (C, Rust, a snapshot) writes no torch_state.pt:
    zerod's state loads, client_state is {}, and torch's own tensors keep
    their values, which a warning says."""
    a = engine(0)
    train(a, 0, 2)
    a.zerod_model.save(tmp_path / "c")
    model = make("gpt")
    model.register_buffer("seen", torch.full((1,), 7.0))
    b = zerod.torch.initialize(model, job_text=JOB.format(stage=0, extra=""))
    with pytest.warns(UserWarning, match="has no torch_state.pt .*'seen'"):
        path, client = b.load_checkpoint(tmp_path, tag="c")
    assert client == {} and b.global_steps == 2 and model.seen.item() == 7.0
    assert same(b.state_dict(), {**a.state_dict(), "seen": model.seen})

ST_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64,
             "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8, "BOOL": torch.bool}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        dtype = ST_DTYPES[t["dtype"]]
        raw = torch.frombuffer(bytearray(data[b:e]), dtype=dtype) if e > b else torch.empty(0, dtype=dtype)
        out[name] = raw.reshape(t["shape"])
    return header, out


def with_buffer(stage):
    """engine(stage) of a model with a buffer, "seen" (zeros), beside zerod's parameters."""
    model = make("gpt")
    model.register_buffer("seen", torch.zeros(3))
    extra = ", param_persistence_threshold = 0" if stage == 3 else ""
    return zerod.torch.initialize(model, job_text=JOB.format(stage=stage, extra=extra))


def test_zerod_ckpt_info_export_and_reshard(tmp_path):
    a = with_buffer(3)
    train(a, 0, 4)
    a.module.seen.fill_(7.0)
    a.save_checkpoint(tmp_path / "ckpt", tag="t", client_state={"epoch": 4})
    state = a.state_dict()
    ckpt = tmp_path / "ckpt" / "t"
    info = subprocess.run([ZEROD, "ckpt", "info", str(ckpt), "--verify"], capture_output=True, text=True)
    assert info.returncode == 0, info.stderr
    assert "step 4, written by 1 rank at ZeRO stage 3" in info.stdout and "passes its checksum" in info.stdout

    ex = subprocess.run([ZEROD, "ckpt", "export", str(ckpt), "--to", str(tmp_path / "model.safetensors")],
                        capture_output=True, text=True)
    assert ex.returncode == 0, ex.stderr
    header, tensors = read_safetensors(tmp_path / "model.safetensors")
    assert header["__metadata__"]["zerod_step"] == "4"
    exported = {k: v for k, v in state.items() if k in tensors}  # all but a tied alias (lm_head.weight)
    assert len(exported) == len(tensors) and "seen" in tensors, "the buffer too"
    assert all(torch.equal(tensors[k], exported[k]) for k in exported), "fp32: exact"
    held = {k: v for k, v in exported.items() if k != "seen"}  # zerod's parameters

    # bf16, sharded into files of at most 16 KiB.
    ex = subprocess.run([ZEROD, "ckpt", "export", str(ckpt), "--to", str(tmp_path / "bf16.safetensors"), "--dtype",
                         "bf16", "--max-shard-size", "16KiB"], capture_output=True, text=True)
    assert ex.returncode == 0, ex.stderr
    index = json.loads((tmp_path / "bf16.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1
    got = {}
    for f in files:
        got.update(read_safetensors(tmp_path / f)[1])
    assert all(torch.equal(got[k], held[k].to(torch.bfloat16)) for k in held), "bf16: torch's rounding of the masters"
    assert torch.equal(got["seen"], state["seen"]), "a buffer in the dtype the model holds it"

    # Three shards; a job of any size loads them.
    rs = subprocess.run([ZEROD, "ckpt", "reshard", str(ckpt), "--world", "3", "--to", str(tmp_path / "three")],
                        capture_output=True, text=True)
    assert rs.returncode == 0, rs.stderr
    assert len(list((tmp_path / "three").glob("rank-*-of-00003.zdshard"))) == 3
    b = engine(0)
    b.zerod_model.load(tmp_path / "three")
    assert all(torch.equal(b.state_dict()[k], v) for k, v in held.items())
    # And zerod.torch's own files go with the shards: load_checkpoint takes
    # the directory (no `latest` there) with its client_state and buffers
    # (resharded, they were left behind: {} and the new model's zeros).
    c = with_buffer(0)
    path, client = c.load_checkpoint(tmp_path / "three")
    assert path == str(tmp_path / "three") and client == {"epoch": 4}
    assert same(c.state_dict(), state)

    # Into its own directory by another spelling (a trailing slash, "./", a
    # symlink): refused before anything is touched (it truncated the shards
    # being read and removed their manifest).
    (tmp_path / "link").symlink_to(ckpt)
    for to in (f"{ckpt}/", f"{ckpt}/.", tmp_path / "link"):
        rs = subprocess.run([ZEROD, "ckpt", "reshard", str(ckpt), "--world", "1", "--to", str(to)],
                            capture_output=True, text=True)
        assert rs.returncode != 0 and "is the checkpoint's own directory" in rs.stderr, (to, rs.stderr)
    info = subprocess.run([ZEROD, "ckpt", "info", str(ckpt), "--verify"], capture_output=True, text=True)
    assert info.returncode == 0 and "passes its checksum" in info.stdout, info.stderr


def test_a_damaged_checkpoint_is_named(tmp_path):
    a = engine(0)
    train(a, 0, 2)
    a.save_checkpoint(tmp_path, tag="t")
    shard = next((tmp_path / "t").glob("rank-*.zdshard"))
    with open(shard, "r+b") as f:
        f.seek(100)
        f.write(b"\x7f\x7f")
    r = subprocess.run([ZEROD, "ckpt", "info", str(tmp_path / "t"), "--verify"], capture_output=True, text=True)
    assert r.returncode == 1 and "fails its checksum" in r.stderr, r.stderr
    b = engine(0)
    before = b.state_dict()
    with pytest.raises(zerod.ZerodIOError, match="fails its checksum"):
        b.load_checkpoint(tmp_path, tag="t")
    assert same(b.state_dict(), before), "a failed load changes nothing"


def ckpt(*args):
    return subprocess.run([ZEROD, "ckpt", *map(str, args)], capture_output=True, text=True)


def test_a_failed_export_leaves_the_last_one_and_no_partial_file(tmp_path):
    """An export is written under a temporary name and renamed when whole:
    one that fails (a damaged record) left a valid-looking safetensors file
    with zeros for the tensors it missed, over the last good export."""
    a = engine(0)
    train(a, 0, 2)
    a.save_checkpoint(tmp_path, tag="t")
    out = tmp_path / "m.safetensors"
    assert ckpt("export", tmp_path / "t", "--to", out).returncode == 0
    good = out.read_bytes()
    shard = next((tmp_path / "t").glob("rank-*.zdshard"))
    with open(shard, "r+b") as f:
        f.seek(100)
        f.write(b"\x7f\x7f")
    r = ckpt("export", tmp_path / "t", "--to", out)
    assert r.returncode == 1 and "fails its checksum" in r.stderr, r.stderr
    assert out.read_bytes() == good, "the last good export is untouched"
    assert not list(tmp_path.glob("*.zerod-partial")), list(tmp_path.iterdir())

    # A manifest that claims 2^40 elements for a tensor: an error, not an
    # abort from std::bad_alloc (and no file left behind).
    a.save_checkpoint(tmp_path, tag="u")
    manifest = tmp_path / "u" / "zerod-checkpoint.txt"
    lines = manifest.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("param "))
    f = lines[at].split()
    ndim = int(f[3])
    lines[at] = " ".join(["param", str(1 << 40), f[2], "1", str(1 << 40), *f[4 + ndim:]])
    manifest.write_text("\n".join(lines) + "\n")
    r = ckpt("export", tmp_path / "u", "--to", tmp_path / "huge.safetensors")
    assert r.returncode == 1 and "terminate" not in r.stderr, r.stderr
    assert not (tmp_path / "huge.safetensors").exists() and not list(tmp_path.glob("*.zerod-partial"))


def test_zerod_ckpt_follows_latest_and_tag_picks_another(tmp_path):
    """save_checkpoint("ck") writes ck/global_stepN/ and names it in ck/latest,
    as DeepSpeed does: every `zerod ckpt` command given ck reads the tag latest
    names and says so; --tag reads another."""
    a = engine(0)
    train(a, 0, 2)
    a.save_checkpoint(tmp_path / "ck")              # global_step2
    at2 = a.state_dict()
    train(a, 2, 5)
    a.save_checkpoint(tmp_path / "ck")              # global_step5, now latest
    at5 = a.state_dict()
    ck = tmp_path / "ck"
    assert (ck / "latest").read_text() == "global_step5"
    assert not (ck / "zerod-checkpoint.txt").exists(), "ck itself is a folder of tags, not a checkpoint"

    info = ckpt("info", ck, "--verify")
    assert info.returncode == 0, info.stderr
    assert info.stdout.splitlines()[0] == f"{ck}: its 'latest' file names global_step5: reading {ck}/global_step5"
    assert "step 5, written by 1 rank" in info.stdout and "passes its checksum" in info.stdout

    ex = ckpt("export", ck, "--to", tmp_path / "latest.safetensors")
    assert ex.returncode == 0, ex.stderr
    assert f"its 'latest' file names global_step5: reading {ck}/global_step5" in ex.stdout
    header, tensors = read_safetensors(tmp_path / "latest.safetensors")
    assert header["__metadata__"]["zerod_step"] == "5"
    held = {k: v for k, v in at5.items() if k in tensors}
    assert len(held) == len(tensors) and all(torch.equal(tensors[k], held[k]) for k in held)

    # --tag picks the older one, whatever latest says.
    ex = ckpt("export", ck, "--tag", "global_step2", "--to", tmp_path / "two.safetensors")
    assert ex.returncode == 0, ex.stderr
    assert f"{ck}: --tag global_step2: reading {ck}/global_step2" in ex.stdout
    header, tensors = read_safetensors(tmp_path / "two.safetensors")
    assert header["__metadata__"]["zerod_step"] == "2"
    assert all(torch.equal(tensors[k], at2[k]) for k in tensors)
    info = ckpt("info", ck, "--tag", "global_step2")
    assert info.returncode == 0 and "step 2, written by 1 rank" in info.stdout, info.stdout + info.stderr

    rs = ckpt("reshard", ck, "--world", "2", "--to", tmp_path / "two_shards")
    assert rs.returncode == 0, rs.stderr
    assert "names global_step5" in rs.stdout
    assert len(list((tmp_path / "two_shards").glob("rank-*-of-00002.zdshard"))) == 2

    # A tag directory given directly is read as it is, with nothing said.
    info = ckpt("info", ck / "global_step2")
    assert info.returncode == 0 and info.stdout.startswith(f"{ck}/global_step2: zerod checkpoint"), info.stdout


def test_zerod_ckpt_says_what_is_missing(tmp_path):
    a = engine(0)
    train(a, 0, 1)
    a.save_checkpoint(tmp_path / "ck")
    ck = tmp_path / "ck"
    # A tag that is not there: named, as is the folder.
    r = ckpt("info", ck, "--tag", "global_step9")
    assert r.returncode == 1 and f"no checkpoint with tag 'global_step9' in {ck}" in r.stderr, r.stderr
    # latest naming a tag directory that is gone.
    (ck / "latest").write_text("global_step7\n")
    r = ckpt("info", ck)
    assert r.returncode == 1 and "its 'latest' file names 'global_step7'" in r.stderr, r.stderr
    # No latest and no manifest.
    (ck / "latest").unlink()
    r = ckpt("export", ck, "--to", tmp_path / "m.safetensors")
    assert r.returncode == 1 and f"no checkpoint at {ck}" in r.stderr and "no 'latest' file" in r.stderr, r.stderr
    assert not (tmp_path / "m.safetensors").exists()
    # DeepSpeed's own files under the tag latest names: pointed to import.
    ds = tmp_path / "ds"
    (ds / "global_step3").mkdir(parents=True)
    (ds / "global_step3" / "mp_rank_00_model_states.pt").write_bytes(b"")
    (ds / "latest").write_text("global_step3")
    r = ckpt("info", ds)
    assert r.returncode == 1 and "DeepSpeed's own checkpoint files" in r.stderr and "zerod ckpt import" in r.stderr, \
        r.stderr


class FrozenNet(torch.nn.Module):
    """What torch holds outside zerod beside zerod's parameters: a frozen
    embedding tied to a frozen output layer (one tensor under two keys), a
    BatchNorm's buffers (num_batches_tracked is int64), and a 0-dim
    parameter (a CLIP logit scale's)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 8)
        self.embed.requires_grad_(False)
        self.unembed = torch.nn.Linear(8, 10, bias=False)
        self.unembed.weight = self.embed.weight
        self.bn = torch.nn.BatchNorm1d(8)
        self.mix = torch.nn.Linear(8, 8)
        self.scale = torch.nn.Parameter(torch.tensor(1.5))

    def forward(self, idx):
        return self.unembed(self.mix(self.bn(self.embed(idx)))) * self.scale


def frozen_net_trained(tmp_path):
    torch.manual_seed(0)
    e = zerod.torch.initialize(FrozenNet(), job_text=JOB.format(stage=0, extra=""))
    for step in range(3):
        idx = torch.randint(10, (16,), generator=torch.Generator().manual_seed(step))
        e.backward(e(idx).pow(2).mean())
        e.step()
    e.save_checkpoint(tmp_path / "ck", client_state={"epoch": 3})
    return e


def test_export_holds_frozen_parameters_and_buffers(tmp_path):
    """`zerod ckpt export` wrote only the tensors zerod holds: a model
    loaded from it (from_pretrained) got random frozen weights and fresh
    BatchNorm statistics. save_checkpoint keeps those in
    torch_state.safetensors, which the export appends in their own dtypes;
    a 0-dim parameter, which zerod holds as (1,), is exported 0-dim."""
    e = frozen_net_trained(tmp_path)
    want = e.state_dict()
    assert want["bn.num_batches_tracked"].item() == 3
    r = ckpt("export", tmp_path / "ck", "--to", tmp_path / "m.safetensors")
    assert r.returncode == 0 and "warn" not in r.stderr, r.stderr
    _, got = read_safetensors(tmp_path / "m.safetensors")
    assert sorted(got) == sorted(k for k in want if k != "unembed.weight"), "every key but the tied alias"
    for k, v in got.items():
        assert v.dtype == want[k].dtype and v.shape == want[k].shape and torch.equal(v, want[k]), k
    assert got["scale"].shape == () and got["bn.num_batches_tracked"].dtype == torch.int64

    # A checkpoint of a zerod.torch from before torch_state.safetensors
    # holds them pickled only: export says how many it leaves out, and the
    # checkpoint still loads them.
    tag = tmp_path / "ck" / "global_step3"
    (tag / "torch_state.safetensors").unlink()
    rest = {k: v for k, v in e.module.state_dict(keep_vars=True).items() if id(v) not in e._slot_of}
    torch.save({"module_rest": {k: v.detach() for k, v in rest.items()}, "client_state": {"epoch": 3}, "step": 3},
               tag / "torch_state.pt")
    r = ckpt("export", tmp_path / "ck", "--to", tmp_path / "old.safetensors")
    assert r.returncode == 0 and "holds 4 tensor(s)" in r.stderr and "leaves out" in r.stderr, r.stderr
    assert "bn.running_mean" not in read_safetensors(tmp_path / "old.safetensors")[1]
    torch.manual_seed(1)
    b = zerod.torch.initialize(FrozenNet(), job_text=JOB.format(stage=0, extra=""))
    assert b.load_checkpoint(tmp_path / "ck")[1] == {"epoch": 3} and same(b.state_dict(), want)


def test_deepspeed_loads_a_reshard_output_without_latest(tmp_path):
    """`zerod ckpt reshard --to OUT` writes a checkpoint's own directory, no
    `latest` beside it: zerod.deepspeed's load_checkpoint(OUT) loads it, as
    zerod.torch's does (it warned 'nothing loaded' and trained on from the
    initial weights). A directory that is neither still warns, as
    DeepSpeed's does."""
    import zerod.deepspeed as zds

    cfg = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}}
    torch.manual_seed(0)
    a, *_ = zds.initialize(model=torch.nn.Linear(4, 2), config=cfg)
    x = torch.randn(4, 4)
    for _ in range(2):
        a.backward(a(x).pow(2).mean())
        a.step()
    a.save_checkpoint(tmp_path / "ck", tag="t", client_state={"epoch": 2})
    want = a.state_dict()
    rs = subprocess.run([ZEROD, "ckpt", "reshard", str(tmp_path / "ck" / "t"), "--world", "1", "--to",
                         str(tmp_path / "out")], capture_output=True, text=True)
    assert rs.returncode == 0, rs.stderr
    torch.manual_seed(1)
    b, *_ = zds.initialize(model=torch.nn.Linear(4, 2), config=cfg)
    path, client = b.load_checkpoint(tmp_path / "out")
    assert path is not None and client == {"epoch": 2}
    assert same(b.state_dict(), want)
    (tmp_path / "empty").mkdir()
    with pytest.warns(UserWarning, match="nothing loaded"):
        assert b.load_checkpoint(tmp_path / "empty") == (None, None)


def test_a_0_dim_parameter_loads_weights_only(tmp_path):
    """zerod holds a 0-dim parameter as (1,): the weights-only loads
    (zerod.deepspeed's load_optimizer_states=False and load_module_only,
    Lightning's validate(ckpt_path=...)) were refused ("has shape (1,), the
    model's is ()") after the parameters before it had been overwritten.
    They restore it bit for bit; a refusal changes nothing."""
    import zerod.deepspeed as zds

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.tensor(2.0))

        def forward(self, h):
            return h * self.scale

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Linear(4, 2)
            self.head = Head()

        def forward(self, x):
            return self.head(self.body(x))

    cfg = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}}
    torch.manual_seed(0)
    a, *_ = zds.initialize(model=Net(), config=cfg)
    x = torch.randn(4, 4)
    for _ in range(2):
        a.backward(a(x).pow(2).mean())
        a.step()
    a.save_checkpoint(tmp_path)
    want = a.state_dict()
    for flags in ({"load_optimizer_states": False}, {"load_module_only": True}):
        torch.manual_seed(1)
        b, *_ = zds.initialize(model=Net(), config=cfg)
        b.load_checkpoint(tmp_path, **flags)
        got = b.state_dict()
        assert same(got, want) and got["head.scale"].shape == (), flags

    # A value of another shape after the ones that fit: nothing is written.
    torch.manual_seed(1)
    c = zerod.torch.initialize(Net(), job_text=JOB.format(stage=0, extra=""))
    before = c.state_dict()
    with pytest.raises(zerod.InvalidArgumentError, match="'head.scale' has shape \\(2,\\), the model's is \\(\\)"):
        c.load_state_dict({**want, "head.scale": torch.ones(2)})
    assert same(c.state_dict(), before)


SAVE_FAILS_ON_RANK_0 = '''
import torch, zerod.torch
torch.manual_seed(0)
e = zerod.torch.initialize(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)))
x = torch.randn(4, 8)
def train():
    e.backward(e(x).pow(2).mean())
    e.step()
train()
real = torch.save
if e.rank == 0:
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")
    torch.save = full
try:
    e.save_checkpoint(__import__("sys").argv[1])
    print("saved", flush=True)
except Exception as ex:
    print("refused", type(ex).__name__, ex, flush=True)
torch.save = real
train()
print("trained on to step", e.global_steps, flush=True)
'''


def test_a_save_rank_0_cannot_stage_fails_on_every_rank(tmp_path, tmp_job):
    """Rank 0 writes torch_state before zerod's save, a collective: where it
    failed (a full disk, a client_state that does not pickle), rank 0
    raised and rank 1 waited in zd_model_save until the job broke ("ranks
    disagree at collective"). Every rank now learns it first, raises the
    same error, and trains on."""
    from conftest import zerod_run

    script = tmp_path / "rank.py"
    script.write_text(SAVE_FAILS_ON_RANK_0)
    rc, ranks, out = zerod_run(2, tmp_job("return { zero = { stage = 2 }, comm = { timeout = 30 } }"), str(script),
                               tmp_path / "ck", timeout=120)
    assert rc == 0, out[-4000:]
    for r in (0, 1):
        said = [line for line in ranks[r] if line.startswith(("refused", "saved", "trained"))]
        assert said[0].startswith("refused ZerodIOError") and "rank 0 could not write torch_state" in said[0] \
            and "No space left on device" in said[0], ranks[r]
        assert said[1] == "trained on to step 2", ranks[r]
    assert not (tmp_path / "ck" / "latest").exists()
