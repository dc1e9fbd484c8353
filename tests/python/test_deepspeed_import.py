"""A DeepSpeed user moves a run to zerod: real DeepSpeed (from PyPI, on the
CPU) trains a model at ZeRO stages 1, 2 and 3 and saves a checkpoint;
`zerod ckpt import` turns it into a zerod checkpoint; zerod.torch loads it,
and every parameter's fp32 master and AdamW moments are DeepSpeed's, bit for
bit, at the step DeepSpeed reached. zerod.deepspeed's load_checkpoint given
DeepSpeed's own files refuses them naming that import.

Runs under the Python of build/venv (torch 2.x and DeepSpeed 0.19, which
scripts/python-venv.sh installs); ctest reports it Skipped, with the reason,
where that environment cannot be made.
"""
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from conftest import ZEROD, reserved_port

TRAIN = r'''
import os, sys, torch, torch.nn as nn
for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": sys.argv[3], "RANK": "0", "WORLD_SIZE": "1",
             "LOCAL_RANK": "0"}.items():
    os.environ.setdefault(k, v)
import deepspeed
sys.path.insert(0, os.path.dirname(sys.argv[0]))
from test_deepspeed_import import make, batch
stage, out = int(sys.argv[1]), sys.argv[2]
model = make()
cfg = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
       "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.05}},
       "zero_optimization": {"stage": stage}}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
for s in range(5):
    x, y = batch(s)
    loss = ((engine(x) - y) ** 2).mean()
    engine.backward(loss)
    engine.step()
engine.save_checkpoint(out)
# What DeepSpeed holds now, for the test to compare: fp32 masters and moments.
from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
torch.save(get_fp32_state_dict_from_zero_checkpoint(out), os.path.join(out, "fp32_reference.pt"))
'''


def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(8, 8, generator=g), torch.randn(8, 4, generator=g)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_deepspeed_checkpoint_loads_into_zerod(stage, tmp_path):
    import zerod.torch

    here = os.path.dirname(os.path.abspath(__file__))
    script = tmp_path / "train_ds.py"
    script.write_text(TRAIN)
    env = dict(os.environ, DS_ACCELERATOR="cpu", PYTHONPATH=here + os.pathsep + os.environ.get("PYTHONPATH", ""))
    ds = tmp_path / "ds"
    with reserved_port() as port:
        r = subprocess.run([sys.executable, str(script), str(stage), str(ds), str(port)], env=env,
                           capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = tmp_path / "zerod"
    r = subprocess.run([ZEROD, "ckpt", "import", str(ds), "--to", str(out)], capture_output=True, text=True,
                       env=dict(env, ZEROD_PYTHON=sys.executable), timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"DeepSpeed ZeRO stage {stage}, adamw" in r.stdout
    # DeepSpeed's folder: the tag its latest names, and said.
    assert r.stdout.startswith(f"{ds}: its 'latest' file names global_step5: reading {ds}/global_step5"), r.stdout
    if stage == 1:  # --tag picks the tag, and is said too
        r = subprocess.run([ZEROD, "ckpt", "import", str(ds), "--tag", "global_step5", "--to", str(tmp_path / "t")],
                           capture_output=True, text=True, env=dict(env, ZEROD_PYTHON=sys.executable), timeout=600)
        assert r.returncode == 0 and r.stdout.startswith(f"{ds}: --tag global_step5: reading"), r.stdout + r.stderr

    engine = zerod.torch.initialize(make(), job_text='return { optimizer = { type = "adamw", lr = 1e-2, '
                                                     'weight_decay = 0.05 } }')
    engine.zerod_model.load(out)
    assert engine.zerod_model.optimizer_info().step == 5
    want = torch.load(ds / "global_step5" / "fp32_reference.pt", weights_only=False) if \
        (ds / "global_step5" / "fp32_reference.pt").exists() else torch.load(ds / "fp32_reference.pt", weights_only=False)
    got = engine.state_dict()
    for name, w in want.items():
        assert torch.equal(got[name], w.float()), f"{name}: DeepSpeed's fp32 master is not what zerod loaded"
    # The moments moved and came along (a zero moment would mean they did not).
    state = engine.optimizer_state_dict()["state"]
    assert all(float(s["exp_avg_sq"].abs().sum()) > 0 for s in state.values())


def test_load_checkpoint_of_deepspeeds_own_files_names_the_import(tmp_path):
    """zerod.deepspeed's load_checkpoint on the folder DeepSpeed's
    save_checkpoint filled (latest, global_step5/*_model_states.pt) refuses
    it naming `zerod ckpt import` and the directory to give it, not a
    missing zerod file; what the import writes then loads."""
    import zerod.deepspeed
    from zerod.errors import ZerodIOError

    here = os.path.dirname(os.path.abspath(__file__))
    script = tmp_path / "train_ds.py"
    script.write_text(TRAIN)
    env = dict(os.environ, DS_ACCELERATOR="cpu", PYTHONPATH=here + os.pathsep + os.environ.get("PYTHONPATH", ""))
    ds = tmp_path / "ds"
    with reserved_port() as port:
        r = subprocess.run([sys.executable, str(script), "2", str(ds), str(port)], env=env, capture_output=True,
                           text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    cfg = {"train_micro_batch_size_per_gpu": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2,
                                                                                         "weight_decay": 0.05}}}
    engine, _, _, _ = zerod.deepspeed.initialize(model=make(), config=cfg)
    try:
        tag = ds / "global_step5"
        with pytest.raises(ZerodIOError, match=re.escape(
                f"{tag}: it holds DeepSpeed's own checkpoint files (mp_rank_00_model_states.pt), not zerod's: "
                f"convert them with `zerod ckpt import {tag} --to OUT` and load OUT")):
            engine.load_checkpoint(str(ds))
        out = tmp_path / "zerod"
        r = subprocess.run([ZEROD, "ckpt", "import", str(tag), "--to", str(out)], capture_output=True, text=True,
                           env=dict(env, ZEROD_PYTHON=sys.executable), timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert engine.load_checkpoint(str(out))[0] == str(out)
        want = torch.load(tag / "fp32_reference.pt", weights_only=False) if (tag / "fp32_reference.pt").exists() \
            else torch.load(ds / "fp32_reference.pt", weights_only=False)
        got = engine.state_dict()
        assert all(torch.equal(got[n], w.float()) for n, w in want.items())
        assert engine.global_steps == 5
    finally:
        engine.destroy()
