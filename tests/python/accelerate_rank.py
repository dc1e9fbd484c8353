"""One rank of the multi-process Accelerate test, started by
`zerod run --nproc 2`: the user's loop of test_accelerate under
ZerodAccelerator; Accelerate shards the dataloader (each rank its own
batches of 8). Prints "loss <batch> <value> <lr>" per batch; saves its
state after epoch 0 into argv[1], or with "resume" as argv[2] loads it and
runs epoch 1 only.
"""
import sys

import torch

from accelerate.utils import set_seed

from zerod.accelerate import ZerodAccelerator
from test_accelerate import objects, user_loop

torch.set_num_threads(1)
set_seed(0)
accelerator = ZerodAccelerator(gradient_accumulation_steps=2, gradient_clipping=0.5, zero_stage=3, offload=True)
assert accelerator.num_processes == 2
prepared = accelerator.prepare(*objects())
if sys.argv[2:] == ["resume"]:
    losses, lrs = user_loop(accelerator, *prepared, resume_from=sys.argv[1])
else:
    losses, lrs = user_loop(accelerator, *prepared, save_after=sys.argv[1])
for i, (v, lr) in enumerate(zip(losses, lrs)):
    print(f"loss {i} {v!r} {lr!r}", flush=True)
