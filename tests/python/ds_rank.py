"""One rank of the multi-rank zerod.deepspeed test: the DeepSpeed loop of
test_deepspeed_side_by_side on this rank's half of every batch, run under
`zerod run --nproc 2`; prints "loss <step> <value>" per micro-batch.

    ds_rank.py <config name>
"""
import json
import sys

import torch

import zerod.deepspeed as deepspeed
from test_deepspeed_side_by_side import CONFIGS, STEPS, batch, make

torch.set_num_threads(1)
name = sys.argv[1]
cfg = dict(CONFIGS[name])
cfg["train_micro_batch_size_per_gpu"] = cfg["train_micro_batch_size_per_gpu"] // 2  # 2 ranks, same global batch
cfg.pop("train_batch_size", None)
model = make()
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
assert engine.dp_world_size == 2 and engine.train_batch_size() == 8 * cfg.get("gradient_accumulation_steps", 1)
half = slice(engine.global_rank * 4, engine.global_rank * 4 + 4)
for s in range(STEPS):
    x, y = batch(s)
    loss = ((engine(x[half]) - y[half]) ** 2).mean()
    engine.backward(loss)
    engine.step()
    print(f"loss {s} {loss.item():.9g} lr {engine.get_lr()[0]!r} steps {engine.global_steps}", flush=True)
engine.close()
print(json.dumps({"done": True}))
