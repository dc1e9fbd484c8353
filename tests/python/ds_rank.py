"""One rank of the multi-rank zerod.deepspeed test: the DeepSpeed loop of
test_deepspeed_side_by_side on this rank's share of every batch, run under
`zerod run --nproc 2`, or ZEROD_TEST_WORLD ranks (test_cuda_integrations;
1: embedded); prints "loss <step> <value>" per micro-batch.

    ds_rank.py <config name>
"""
import json
import os
import sys

import torch

import zerod.deepspeed as deepspeed
from test_deepspeed_side_by_side import CONFIGS, STEPS, batch, make

torch.set_num_threads(1)
name = sys.argv[1]
world = int(os.environ.get("ZEROD_TEST_WORLD") or 2)  # 1: embedded, the reference of test_cuda_integrations
per = 8 // world  # the ranks split every batch of 8
cfg = dict(CONFIGS[name])
cfg["train_micro_batch_size_per_gpu"] = cfg["train_micro_batch_size_per_gpu"] // world
cfg.pop("train_batch_size", None)
model = make()  # on the CPU: initialize places it as DeepSpeed does (its rank's GPU where there is one)
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
assert engine.dp_world_size == world and engine.train_batch_size() == 8 * cfg.get("gradient_accumulation_steps", 1)
if os.environ.get("ZEROD_TEST_DEVICE") == "cuda":
    assert engine.device.type == "cuda", engine.device
part = slice(engine.global_rank * per, engine.global_rank * per + per)
for s in range(STEPS):
    x, y = batch(s)
    loss = ((engine(x[part].to(engine.device)) - y[part].to(engine.device)) ** 2).mean()
    engine.backward(loss)
    engine.step()
    print(f"loss {s} {loss.item():.9g} lr {engine.get_lr()[0]!r} steps {engine.global_steps}", flush=True)
engine.close()
print(json.dumps({"done": True}))
