"""Checkpoints from PyTorch: DeepSpeed's save_checkpoint / load_checkpoint on
the engine resume exactly; `zerod ckpt` checks, exports (safetensors) and
reshards what they wrote."""
import json
import os
import subprocess

import numpy as np
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
        raw = np.frombuffer(data[b:e], dtype={"F32": np.float32, "BF16": np.int16, "F16": np.float16}[t["dtype"]])
        tensor = torch.from_numpy(raw.copy()).reshape(t["shape"])
        out[name] = tensor.view(torch.bfloat16) if t["dtype"] == "BF16" else tensor
    return header, out


def test_zerod_ckpt_info_export_and_reshard(tmp_path):
    a = engine(3)
    train(a, 0, 4)
    a.save_checkpoint(tmp_path / "ckpt", tag="t")
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
    held = {k: v for k, v in state.items() if k in tensors}
    assert len(held) == len(tensors) and all(torch.equal(tensors[k], held[k]) for k in held), "fp32: exact"

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

    # Three shards; a job of any size loads them.
    rs = subprocess.run([ZEROD, "ckpt", "reshard", str(ckpt), "--world", "3", "--to", str(tmp_path / "three")],
                        capture_output=True, text=True)
    assert rs.returncode == 0, rs.stderr
    assert len(list((tmp_path / "three").glob("rank-*-of-00003.zdshard"))) == 3
    b = engine(0)
    b.zerod_model.load(tmp_path / "three")
    assert same({k: v for k, v in b.state_dict().items() if k in held}, held)

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
