"""A trainer the Python tests run through zerod, embedded or as one of the
ranks of `zerod run`: trains a model of models.py on this rank's slice of
each global batch and prints one line per step, "loss <step> <value>",
then "state <checksum>" of the full fp32 weights.

    train_rank.py <gpt|skip|tied> <fp32|bf16> <steps> [job.lua]
"""
import sys

import torch

import zerod.torch
from models import batch, loss_of, make

kind, precision, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
job = sys.argv[4] if len(sys.argv) > 4 else None  # None: ZEROD_JOB from `zerod run`
dtype = torch.bfloat16 if precision == "bf16" else torch.float32
torch.set_num_threads(1)

engine = zerod.torch.initialize(make(kind), job=job, dtype=dtype)
for step in range(steps):
    inputs, y = batch(kind, step, engine.rank, engine.world_size)
    loss = loss_of(kind, engine, inputs, y, dtype)
    engine.backward(loss)
    engine.step()
    print(f"loss {step} {loss.item():.9g}", flush=True)
state = engine.state_dict()
print(f"state {sum(float(v.double().abs().sum()) for v in state.values()):.9g}")
