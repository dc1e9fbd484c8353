"""torch.distributed (gloo) for a framework's own collectives beside zerod
(Lightning's logging, barriers and broadcasts; Accelerate's gathers): the
gradients never go through it, the daemon reduces them.

Where the ranks meet, first that applies:
- under torchrun (or `accelerate launch`, which runs it): torch's env://
  rendezvous, through the agent's store, as DDP would;
- `zerod run` / `zerod serve` gave them ZEROD_ENDPOINT: a file in the
  directory of the daemon's socket. Under `zerod run` it is named for the
  run (`zerod-run-<ZEROD_RUN_ID>-<what>-store`), and `zerod run` removes it
  when the run ends, or its watchdog when `zerod run` is killed. Under
  `zerod serve` it is named for the job by the launcher ids libzerod tells
  jobs apart by (ZEROD_JOB_KEY, Slurm's job and step, Open MPI's or PMI's
  job, MASTER_ADDR:MASTER_PORT), so jobs that share one daemon meet apart;
- a launcher that sets MASTER_ADDR and MASTER_PORT (Lightning's own,
  mpirun or srun with zerod's convention, which leaves MASTER_PORT to
  torch): env:// there;
- otherwise a file in the working directory, named for the job.

Ranks on several nodes (a world larger than this node's ranks,
ZEROD_WORLD_SIZE > ZEROD_LOCAL_WORLD_SIZE, as under `mpirun ... zerod run
--nproc L`) never use a file: each node's `zerod run` has its own private
directory and run id, so each node's ranks would wait in a store of their
own until torch's timeout (30 minutes). They meet at MASTER_ADDR:MASTER_PORT
(env://, rank 0 serving torch's TCPStore), and without both set the rank
fails at once saying what to set.

A store file outlives a run that crashed (torch removes it only when every
rank destroys its store, which a killed rank does not), and the next run of
the same ids used to meet it: its ranks read the dead run's addresses and
failed to connect (`Gloo connectFullMesh failed ... Connection refused`).
Each rank now holds a shared flock on `<store>.lock` for as long as it
lives; a rank that finds nobody holding it (an exclusive lock succeeds) knows
that no rank of a live run uses the store and removes the file before it
starts a new one. The last rank to leave removes both (at exit). Files are
only ever removed under the exclusive lock and a store only used under the
shared one, so a rank never removes a store in use. What this cannot tell
apart: two runs of the same ids at once (a rank of the previous run still
running), which meet each other as before.
"""
import atexit
import fcntl
import hashlib
import os
import re

import torch

from .errors import ConfigError

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
    where = os.environ.get("ZEROD_ENDPOINT", "")
    where = where[len("unix:"):] if where.startswith("unix:") else where
    if _meets_at_master(rank, world, what, where):
        torch.distributed.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
    else:
        path = _store_path(what, where)
        _claim(path)
        store = torch.distributed.FileStore(path, world)
        torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=world)
    # Registered after _claim's _release, so it runs before it (atexit is
    # last in, first out): the store is closed before its file is removed.
    atexit.register(_destroy, os.getpid())


def _meets_at_master(rank, world, what, where):
    """Whether the ranks meet at MASTER_ADDR:MASTER_PORT (env://) rather
    than in a store file; on several nodes they must, so there a missing
    address is refused now instead of waited on in a file no other node sees."""
    master = bool(os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"))
    local, named = _ranks_on_this_node(world)
    if local < world:
        if not master:
            raise ConfigError(_no_master_message(rank, world, what, local, named))
        return True
    return master and bool(os.environ.get("TORCHELASTIC_RUN_ID") or not where)


def _ranks_on_this_node(world):
    """(how many of the `world` ranks run on this node, the variable that
    says so); all of them when no launcher says."""
    for name in ("ZEROD_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value), name
    return world, None


_FRAMEWORKS = {"accelerate": "Accelerate", "lightning": "Lightning"}


def _no_master_message(rank, world, what, local, named):
    framework = _FRAMEWORKS.get(what, what)
    return (f"rank {rank} of {world} runs on several nodes ({named}={local}: {local} of the {world} ranks on this "
            f"node), so the gloo process group of {framework}'s own collectives cannot meet in a file beside this "
            "node's daemon (every node's `zerod run` has its own); it meets at MASTER_ADDR:MASTER_PORT instead, "
            f"and {_missing_master()} not set. Set both in every rank's environment: MASTER_ADDR the host name or "
            "address of node 0 (where rank 0 runs), reachable from every node, and MASTER_PORT a free TCP port "
            "there, e.g. `mpirun -x MASTER_ADDR=nodeA -x MASTER_PORT=29500 ... zerod run --nproc N ...`, or "
            "export them before srun")


def _missing_master():
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
    return " and ".join(missing) + (" are" if len(missing) > 1 else " is")


def _destroy(pid):
    """At exit: ends the group this module started. torch does not, and a
    gloo group left to the interpreter's teardown could abort the process
    after the script had finished ("terminate called without an active
    exception", torch issue 190489), failing a run that had succeeded."""
    if os.getpid() == pid and torch.distributed.is_initialized():  # not a forked child's
        torch.distributed.destroy_process_group()


def _store_path(what, where):
    directory = os.path.dirname(where) or "."
    run = os.environ.get("ZEROD_RUN_ID", "")
    if where and re.fullmatch(r"[0-9A-Za-z]{1,64}", run):
        # zerod run's (daemon/launcher/watchdog.h: run_file_prefix): it removes these.
        return os.path.join(directory, f"zerod-run-{run}-{what}-store")
    return os.path.join(directory, f"{what}-store{_job_suffix()}")


# (pid, lock fd, store path, lock path) of the store this process uses.
_held = None


def _same_file(fd, path):
    try:
        a, b = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _unlink(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _claim(path):
    """Takes a shared lock on path + ".lock" for the life of this process;
    first removes the store file when no live rank holds the lock (a dead
    run's). Every lock taken is checked to be on the file that is at the
    path now: the last rank of a run removes the lock file as it leaves."""
    global _held
    if _held is not None and _held[0] == os.getpid() and _held[2] == path:
        return  # claimed already (an init that failed and is tried again)
    lock = path + ".lock"
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            alone = True
        except BlockingIOError:
            fcntl.flock(fd, fcntl.LOCK_SH)
            alone = False
        if alone and _same_file(fd, lock):
            _unlink(path)  # nobody uses it: a run that died left it
            # Not atomic: another rank may take the exclusive lock in
            # between, and remove the store no one has started yet.
            fcntl.flock(fd, fcntl.LOCK_SH)
        if _same_file(fd, lock):
            break
        os.close(fd)
    _held = (os.getpid(), fd, path, lock)
    atexit.register(_release)


def _release():
    """At exit: the last rank using the store removes it and its lock file
    (a failed upgrade drops this rank's lock, so the last one always can)."""
    held = _held
    if held is None or held[0] != os.getpid():  # a forked child: the lock is its parent's
        return
    _, fd, path, lock = held
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass  # others still use it
    else:
        if _same_file(fd, lock):
            _unlink(path)
            _unlink(lock)
    os.close(fd)
