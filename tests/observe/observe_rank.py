"""A rank for the observing tests, on zerod's core Python API (numpy, no
torch): a chain of four linear modules fitted to a fixed target, each step
reported to zerod (tokens, samples, loss). With OBSERVE_PAUSE_AT=k and
OBSERVE_GO=path it stops after step k until that file exists, so a test
can scrape the daemon's metrics and watch `zerod top` while the job is
alive and between steps. At the end it prints its device and host tiers'
peaks.

    observe_rank.py STEPS
"""
import os
import sys
import time

import numpy as np

import zerod
from zerod import Dtype, Tier

steps = int(sys.argv[1])
pause_at = int(os.environ.get("OBSERVE_PAUSE_AT", "0"))
go = os.environ.get("OBSERVE_GO", "")
TOKENS, SAMPLES, N = 256, 8, 64

client = zerod.default_client()
model = client.create_model()
rng = np.random.default_rng(1)
params = []
for i in range(4):
    params.append(model.register_param(f"l{i}.w", f"l{i}", (N, N), Dtype.F32,
                                       init=rng.standard_normal((N, N)).astype(np.float32) * 0.1))
model.finalize()
modules = [model.find_module(f"l{i}") for i in range(4)]
target = np.eye(N, dtype=np.float32)
for step in range(1, steps + 1):
    weights = []
    for m, p in zip(modules, params):
        model.forward_begin(m)
        weights.append(model.param_view(p).numpy().copy())
        model.forward_end(m)
    loss = 0.0
    for m, p, w in reversed(list(zip(modules, params, weights))):
        model.backward_begin(m)
        g = w - target  # the gradient of 0.5 |w - I|^2
        loss += 0.5 * float((g * g).sum())
        model.grad_view(p).numpy()[:] = g
        model.backward_end(m)
    model.step()
    model.report(tokens=TOKENS, samples=SAMPLES, loss=loss)
    if step == pause_at and go:
        print(f"paused at step {step}", flush=True)
        deadline = time.time() + 120
        while not os.path.exists(go) and time.time() < deadline:
            time.sleep(0.05)
print(f"done {steps} steps, loss {loss:.6f}", flush=True)
print(f"rank {client.rank} device peak {model.memory(Tier.DEVICE).peak} host peak {model.memory(Tier.HOST).peak}",
      flush=True)
