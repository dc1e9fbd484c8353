"""A trainer the Python tests run through zerod, embedded or as one of the
ranks of `zerod run`: trains a model of models.py on this rank's slice of
each global batch and prints one line per step, "loss <step> <value>",
then "state <checksum>" of the full fp32 weights.

    train_rank.py <gpt|skip|tied> <fp32|bf16> <steps> [job.lua]

A job that keeps its state in the daemon resumes where it stands (the
steps before it are not run again: "resumed at step N"). With
ZEROD_TEST_DIE_AT=K rank 1 kills itself (SIGKILL) in step K, between its
forward and its backward (on a GPU with the forward's kernels queued on
its stream). cuda_rank.py runs the same on the GPU.
"""
import os
import signal
import sys

import torch

import zerod.torch
from models import batch, loss_of, make


def main(device=torch.device("cpu")):
    kind, precision, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    job = sys.argv[4] if len(sys.argv) > 4 else None  # None: ZEROD_JOB from `zerod run`
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    torch.set_num_threads(1)
    engine = zerod.torch.initialize(make(kind).to(device), job=job, dtype=dtype)
    assert engine.device.type == device.type, engine.device
    start = engine.global_steps
    if start:
        print(f"resumed at step {start}", flush=True)
    die_at = int(os.environ.get("ZEROD_TEST_DIE_AT", -1))
    for step in range(start, steps):
        inputs, y = batch(kind, step, engine.rank, engine.world_size)
        inputs = tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in inputs)
        loss = loss_of(kind, engine, inputs, y.to(device), dtype)
        if step == die_at and engine.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        engine.backward(loss)
        engine.step()
        print(f"loss {step} {loss.item():.9g}", flush=True)
    state = engine.state_dict()
    print(f"state {sum(float(v.double().abs().sum()) for v in state.values()):.9g}")


if __name__ == "__main__":
    main()
