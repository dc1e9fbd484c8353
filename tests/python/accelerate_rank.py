"""One rank of the multi-process Accelerate test, started by
`zerod run --nproc 2` (or `accelerate launch --num_processes 2`): the user's loop of test_accelerate under
ZerodAccelerator; Accelerate splits each batch of 16 between the ranks
(split_batches: the LR scheduler steps once an update, as in the
one-process run it is compared with; without it Accelerate steps it once
per process, test_accelerate's scheduler test). Prints "loss <batch> <value> <lr>" per batch; saves its
state after epoch 0 into argv[1], or with "resume" as argv[2] loads it and
runs epoch 1 only. With a folder as argv[3] (test_launchers, under
`accelerate launch`) it also writes them into <folder>/rank<r>.txt.
"""
import os
import sys

import torch

from accelerate.utils import DataLoaderConfiguration, set_seed

from zerod.accelerate import ZerodAccelerator
from test_accelerate import objects, user_loop

torch.set_num_threads(1)
set_seed(0)
accelerator = ZerodAccelerator(gradient_accumulation_steps=2, gradient_clipping=0.5, zero_stage=3, offload=True,
                               dataloader_config=DataLoaderConfiguration(split_batches=True))
# Under ZEROD_TEST_DEVICE=cuda (test_cuda_integrations) ZEROD_TEST_WORLD
# ranks, as many as `zerod run` started, each on its GPU (Accelerate places
# the model there).
assert accelerator.num_processes == int(os.environ.get("ZEROD_TEST_WORLD") or 2)
if os.environ.get("ZEROD_TEST_DEVICE") == "cuda":
    assert accelerator.device.type == "cuda", accelerator.device
prepared = accelerator.prepare(*objects(batch_size=8 * accelerator.num_processes))
# Each rank's micro-batch is its share of the sharded loader's (8), as
# under Accelerate's DeepSpeed path; the global batch counts every rank.
engine = accelerator.zerod_engine
print(f"batch {engine.train_micro_batch_size_per_gpu()} {engine.train_batch_size()}", flush=True)
if sys.argv[2:] == ["resume"]:
    losses, lrs = user_loop(accelerator, *prepared, resume_from=sys.argv[1])
else:
    losses, lrs = user_loop(accelerator, *prepared, save_after=sys.argv[1])
lines = [f"loss {i} {v!r} {lr!r}" for i, (v, lr) in enumerate(zip(losses, lrs))]
if len(sys.argv) > 3:  # test_launchers: each rank's lines into a file of its own
    with open(f"{sys.argv[3]}/rank{accelerator.process_index}.txt", "w") as f:
        f.write("\n".join(lines) + "\n")
for line in lines:
    print(line, flush=True)
