"""torch.distributed (gloo) for a framework's own collectives beside zerod
(Lightning's logging, barriers and broadcasts; Accelerate's gathers): the
gradients never go through it, the daemon reduces them.

Where the ranks meet, first that applies:
- `zerod run` / `zerod serve` gave them ZEROD_ENDPOINT: a file in the
  private directory of the daemon's socket, named for the job (its
  ZEROD_JOB_KEY, where several jobs share one daemon), which only this job
  sees and a later run does not find (`zerod run` makes a fresh directory);
- a launcher that sets MASTER_ADDR and MASTER_PORT (torchrun, `accelerate
  launch`, Lightning's own): torch's env:// rendezvous there, as DDP would;
- otherwise a file in the working directory, named for the job.
"""
import hashlib
import os

import torch


def _job_suffix():
    key = os.environ.get("ZEROD_JOB_KEY", "")
    return "-" + hashlib.sha1(key.encode()).hexdigest()[:12] if key else ""


def init_gloo(rank, world, what):
    """Starts the default process group (gloo) of `world` ranks unless one is
    running; `what` names the store file ("lightning", "accelerate")."""
    if torch.distributed.is_initialized():
        return
    where = os.environ.get("ZEROD_ENDPOINT", "")
    where = where[len("unix:"):] if where.startswith("unix:") else where
    if not where and os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        torch.distributed.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
        return
    path = os.path.join(os.path.dirname(where) or ".", f"{what}-store{_job_suffix()}")
    store = torch.distributed.FileStore(path, world)
    torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=world)
