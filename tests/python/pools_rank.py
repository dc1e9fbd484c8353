"""A rank that trains a few steps under `zerod run`, then prints which
device-pool regions of the daemon this process has mapped: the names of
the memfds in /proc/self/maps ("zerod-rank<R>-<N>", engine/memory/arena.cpp).

    pools_rank.py <steps>
"""
import sys

import torch

import zerod.torch
from models import batch, loss_of, make

steps = int(sys.argv[1])
torch.set_num_threads(1)
engine = zerod.torch.initialize(make("gpt"))
for step in range(steps):
    inputs, y = batch("gpt", step, engine.rank, engine.world_size)
    loss = loss_of("gpt", engine, inputs, y, torch.float32)
    engine.backward(loss)
    engine.step()
pools = set()
with open("/proc/self/maps") as f:
    for line in f:
        at = line.find("memfd:zerod-rank")
        if at >= 0:
            pools.add(line[at + len("memfd:"):].split()[0])
print("rank", engine.rank, "pools", " ".join(sorted(pools)), flush=True)
