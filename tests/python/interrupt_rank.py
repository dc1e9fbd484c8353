"""A rank for the Ctrl-C tests: trains a small model through zerod, printing
"rank R pid P" first and "step N" after every step. With INTERRUPT=<rank>:<where>
that rank sends itself SIGINT (what Ctrl-C does) at step 3, in the middle of
a forward, a backward, or between steps; the KeyboardInterrupt is left to
Python's default handling, as in a trainer that does nothing about it.
With SAVE_ON_CTRL_C=<dir> it is a trainer that does: Ctrl-C ends the loop
after the step under way, which saves a checkpoint in <dir> and prints
"rank R saved at step N".
"""
import os
import signal
import sys

import torch
import torch.nn as nn

import zerod.torch

torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))
engine = zerod.torch.initialize(model)
rank = engine.rank
print(f"rank {rank} pid {os.getpid()}", flush=True)
target, _, where = (os.environ.get("INTERRUPT") or "-1:").partition(":")
interrupt = int(target) == rank
step_now = [0]


def ctrl_c():
    if interrupt and step_now[0] == 3:
        os.kill(os.getpid(), signal.SIGINT)


if where == "forward":
    model[2].register_forward_hook(lambda *a: ctrl_c())
elif where == "backward":
    model[2].weight.register_hook(lambda g: ctrl_c())

save_dir = os.environ.get("SAVE_ON_CTRL_C")
stopped = []
if save_dir:
    signal.signal(signal.SIGINT, lambda *a: stopped.append(True))

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10**9
for step in range(steps):
    step_now[0] = step
    x = torch.randn(8, 16)
    loss = engine(x).square().mean()
    engine.backward(loss)
    engine.step()
    if where == "step":
        ctrl_c()
    print(f"step {step}", flush=True)
    if stopped:
        engine.save_checkpoint(save_dir)
        print(f"rank {rank} saved at step {step}", flush=True)
        break
print(f"rank {rank} done", flush=True)
