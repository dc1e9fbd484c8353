"""The integrations on a GPU through the daemon (issue 32 section 3): under
`zerod run --nproc N`, each rank a process of its own on its GPU whose
device pool the daemon owns, `Trainer(strategy="zerod_stage_3_offload",
accelerator="cuda")`, `ZerodAccelerator` and `zerod.deepspeed.initialize`
(which moves the model to the rank's GPU as DeepSpeed does) train as their
plain counterparts on the GPU:
  - Lightning against Lightning itself in one process on the GPU ("auto"
    with one rank, "ddp" with its DistributedSampler with two), the mean of
    the ranks' losses batch for batch, fp32 within 1e-4 relative;
  - Accelerate against a plain Accelerator on the GPU over the global
    batch, within 1e-4, with the same learning rates;
  - the DeepSpeed API against the same script embedded on the CPU
    (DS_ACCELERATOR=cpu), which python.deepspeed_side_by_side holds to the
    real DeepSpeed step for step; within 1e-4.

N is the number of GPUs up to 2: Lightning and Accelerate give each rank a
GPU of its own (Lightning refuses devices=2 on one GPU, and NCCL two ranks
on one GPU), so a machine with one GPU runs one rank under the daemon. Two
ranks on one GPU are python.cuda_daemon's, with zerod.torch.

ctest runs this through gpu_or_skip.py: SKIPPED, with the reason, where
torch sees no GPU or libzerod has no cuda device, or this Python lacks
Lightning or Accelerate; a plain pytest run skips it with the same reason.
"""
import subprocess
import sys

import pytest
import torch

from conftest import HERE, rank_env, zerod_run
from gpu_or_skip import skip_module_without_gpu

skip_module_without_gpu("lightning", "accelerate")

WORLD = min(2, torch.cuda.device_count())
JOB = "return { zero = { stage = 3 } }\n"  # checked by zerod run; each integration brings its own


def env(**extra):
    return rank_env(**{"ZEROD_TEST_DEVICE": "cuda", "ZEROD_TEST_WORLD": WORLD, **extra})


def ranks_of(script, *args, tmp_job):
    rc, ranks, out = zerod_run(WORLD, tmp_job(JOB), f"{HERE}/{script}", *args, timeout=300, env=env())
    assert rc == 0, out[-4000:]
    assert sorted(ranks) == list(range(WORLD)), out[-4000:]
    return ranks


def fields(lines, prefix="loss "):
    return [line.split()[2:] for line in lines if line.startswith(prefix)]


def mean_losses(ranks):
    per_rank = [[float(f[0]) for f in fields(ranks[r])] for r in range(WORLD)]
    assert all(len(p) == len(per_rank[0]) > 0 for p in per_rank), per_rank
    return [sum(v) / WORLD for v in zip(*per_rank)]


def same_curve(name, ours, theirs, tol):
    assert len(ours) == len(theirs) > 0, (len(ours), len(theirs))
    assert sum(theirs[-3:]) < sum(theirs[:3]), f"the reference did not learn: {theirs}"
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
    print(f"\n{name}, {WORLD} rank(s) on the GPU under the daemon: worst relative loss difference {worst:.2e} "
          f"over {len(ours)} batches (tolerance {tol:g})")
    assert worst <= tol, f"{name}: zerod {ours}\nreference {theirs}"


def test_lightning_strategy_on_the_gpu(tmp_path, tmp_job):
    ours = mean_losses(ranks_of("lightning_rank.py", "zerod_stage_3_offload", tmp_path / "ckpt", tmp_job=tmp_job))
    # The reference: Lightning alone, one process on the GPU.
    p = subprocess.run([sys.executable, f"{HERE}/lightning_rank.py", "auto" if WORLD == 1 else "ddp",
                        str(tmp_path / "ref")], capture_output=True, text=True, timeout=300,
                       env=env(ZEROD_TEST_WORLD=1))
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    theirs = [float(f[0]) for f in fields(p.stdout.splitlines())]
    same_curve("Lightning zerod_stage_3_offload vs Lightning", ours, theirs, 1e-4)


def test_accelerate_on_the_gpu(tmp_path, tmp_job):
    ranks = ranks_of("accelerate_rank.py", tmp_path / "state", tmp_job=tmp_job)
    ours = mean_losses(ranks)
    our_lrs = [float(f[1]) for f in fields(ranks[0])]
    from accelerate import Accelerator
    from test_accelerate import run
    (theirs, their_lrs), accelerator, _ = run(lambda: Accelerator(gradient_accumulation_steps=2),
                                              batch_size=8 * WORLD)
    assert accelerator.device.type == "cuda", accelerator.device
    same_curve("ZerodAccelerator vs Accelerator", ours, theirs, 1e-4)
    assert our_lrs == pytest.approx(their_lrs, rel=1e-12)


@pytest.mark.parametrize("name", ["adamw_warmup_clip_gas2", "stage3_offload_cosine"])
def test_deepspeed_api_on_the_gpu(name, tmp_job):
    ours = mean_losses(ranks_of("ds_rank.py", name, tmp_job=tmp_job))
    # The reference: the same script embedded on the CPU.
    p = subprocess.run([sys.executable, f"{HERE}/ds_rank.py", name], capture_output=True, text=True, timeout=300,
                       env=rank_env(ZEROD_TEST_WORLD=1, DS_ACCELERATOR="cpu"))
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    theirs = [float(f[0]) for f in fields(p.stdout.splitlines())]
    same_curve(f"zerod.deepspeed {name} on the GPU vs on the CPU", ours, theirs, 1e-4)
