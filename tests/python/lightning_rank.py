"""One rank of the multi-process Lightning test, started by
`zerod run --nproc 2` (or by Lightning's own launcher, test_launchers; with
LIGHTNING_RANK_OUT=<folder> each rank also writes its lines into
<folder>/rank<r>.txt): Trainer(devices=2, strategy=...) on this rank's share
of the data (Lightning's DistributedSampler, batch 4: the two ranks' batches
together are the one-process run's batch of 8). With ZEROD_TEST_DEVICE=cuda,
on the GPU with as many ranks as `zerod run` started. With
LIGHTNING_NUM_NODES=K (test_launchers_hosts: torchrun on two hosts),
Trainer(devices=ZEROD_TEST_WORLD, num_nodes=K), the batch of 8 split among
all K nodes' ranks. Prints "loss <batch> <value>" per batch and
"global_step <n>" at the end.

    lightning_rank.py <strategy> <checkpoint dir> [<checkpoint to resume from>]
"""
import os
import sys

import torch

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint

import zerod.lightning  # noqa: F401
from test_lightning import LitGPT, Losses, Windows

# ZEROD_TEST_DEVICE=cuda (test_cuda_integrations): on the GPUs, one a rank,
# ZEROD_TEST_WORLD ranks (as many as `zerod run` started; 1 for the
# one-process reference); the batch of 8 split among them.
ACCELERATOR = os.environ.get("ZEROD_TEST_DEVICE", "cpu")
DEVICES = int(os.environ.get("ZEROD_TEST_WORLD") or 2)
NODES = int(os.environ.get("LIGHTNING_NUM_NODES") or 1)

torch.set_num_threads(1)
losses = Losses()
trainer = pl.Trainer(strategy=sys.argv[1], accelerator=ACCELERATOR, devices=DEVICES, num_nodes=NODES, max_epochs=2,
                     logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                     accumulate_grad_batches=2, gradient_clip_val=0.5, default_root_dir=sys.argv[2],
                     callbacks=[losses, ModelCheckpoint(dirpath=sys.argv[2], save_top_k=-1)])
loader = torch.utils.data.DataLoader(Windows(), batch_size=8 // (DEVICES * NODES), shuffle=False)
module = LitGPT()
trainer.fit(module, loader, ckpt_path=sys.argv[3] if len(sys.argv) > 3 else None)
lines = [f"loss {i} {v!r}" for i, v in enumerate(losses.losses)] + [f"global_step {trainer.global_step}"]
if os.environ.get("LIGHTNING_RANK_OUT"):  # test_launchers: each rank's lines into a file of its own
    with open(os.path.join(os.environ["LIGHTNING_RANK_OUT"], f"rank{trainer.global_rank}.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
for line in lines:
    print(line, flush=True)
