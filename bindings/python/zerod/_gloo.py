"""torch.distributed (gloo) for a framework's own collectives beside zerod
(Lightning's logging, barriers and broadcasts; Accelerate's gathers): the
gradients never go through it, the daemon reduces them.

Where the ranks meet, first that applies:
- under torchrun (or `accelerate launch`, which runs it): torch's env://
  rendezvous, through the agent's store, as DDP would;
- `zerod run` / `zerod serve` gave them ZEROD_ENDPOINT: a file in the
  directory of the daemon's socket, named for the job by the launcher ids
  libzerod tells jobs apart by (ZEROD_JOB_KEY, Slurm's job and step, Open
  MPI's or PMI's job, MASTER_ADDR:MASTER_PORT), so jobs that share one
  daemon meet apart. `zerod run` makes a fresh private directory each run;
  a daemon's own directory (`zerod serve --jobs`, `zerod run --socket`) can
  keep the file of a run that crashed, which the same ids would meet again:
  remove it, or give each run its own ZEROD_JOB_KEY;
- a launcher that sets MASTER_ADDR and MASTER_PORT (Lightning's own,
  mpirun or srun with zerod's convention, which leaves MASTER_PORT to
  torch): env:// there;
- otherwise a file in the working directory, named for the job.
"""
import hashlib
import os

import torch

# The variables that name a job, in libzerod's order (launcher_env.cpp).
_JOB_IDS = ("ZEROD_JOB_KEY", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID", "PMIX_NAMESPACE",
            "OMPI_MCA_ess_base_jobid", "PMI_JOBID", "MASTER_ADDR", "MASTER_PORT")


def _job_suffix():
    ids = ";".join(f"{k}={os.environ[k]}" for k in _JOB_IDS if os.environ.get(k))
    return "-" + hashlib.sha1(ids.encode()).hexdigest()[:12] if ids else ""


def init_gloo(rank, world, what):
    """Starts the default process group (gloo) of `world` ranks unless one is
    running; `what` names the store file ("lightning", "accelerate")."""
    if torch.distributed.is_initialized():
        return
    master = os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT")
    where = os.environ.get("ZEROD_ENDPOINT", "")
    where = where[len("unix:"):] if where.startswith("unix:") else where
    if master and (os.environ.get("TORCHELASTIC_RUN_ID") or not where):
        torch.distributed.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
        return
    path = os.path.join(os.path.dirname(where) or ".", f"{what}-store{_job_suffix()}")
    store = torch.distributed.FileStore(path, world)
    torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=world)
