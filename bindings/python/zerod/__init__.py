"""zerod for Python: DeepSpeed's ZeRO through libzerod's C ABI.

    import zerod
    client = zerod.connect()            # embedded, the daemon under `zerod run`, or the node's under torchrun
    model = client.create_model("job.lua")

`zerod.torch.initialize(model, job=...)` wraps a torch.nn.Module the way
deepspeed.initialize does (see docs/python.md). Every failed call raises a
ZerodError subclass carrying zerod's message.
"""
import os

from ._lib import ABI_MAJOR, ABI_MINOR, lib as _library
from .constants import (DEVICE_CPU, DEVICE_CUDA, MODEL_ALLOW_SCRIPT_IO, STEP_APPLIED, STEP_BOUNDARY,
                        STEP_SKIPPED, VIEW_READ_ONLY, Dtype, MemKind, Tier)
from .core import Client, ClientInfo, CommFigures, MemoryFigures, Model, OptimizerInfo, ParamInfo, StepResult
from .errors import (BudgetError, BufferTooSmallError, ConfigError, InternalError, InvalidArgumentError,
                     InvalidStateError, NotFoundError, OutOfMemoryError, PeerLostError, PluginError,
                     ShapeMismatchError, VersionError, ZerodError, ZerodIOError, ZerodNotImplementedError,
                     ZerodTimeoutError, status_name)
from .views import View

__version__ = _library.zd_version().decode()

__all__ = [
    "ABI_MAJOR", "ABI_MINOR", "abi_version", "connect", "default_client", "rank", "world_size", "status_name",
    "Client", "Model", "View", "ClientInfo", "ParamInfo", "StepResult", "MemoryFigures", "CommFigures",
    "OptimizerInfo", "Dtype", "Tier", "MemKind", "DEVICE_CPU", "DEVICE_CUDA", "MODEL_ALLOW_SCRIPT_IO",
    "STEP_APPLIED", "STEP_BOUNDARY", "STEP_SKIPPED", "VIEW_READ_ONLY",
    "ZerodError", "InvalidArgumentError", "InvalidStateError", "NotFoundError", "ShapeMismatchError",
    "ConfigError", "PluginError", "OutOfMemoryError", "BudgetError", "ZerodIOError", "ZerodNotImplementedError",
    "VersionError", "PeerLostError", "ZerodTimeoutError", "BufferTooSmallError", "InternalError",
]


def abi_version():
    """The loaded libzerod's ABI as (major, minor)."""
    v = _library.zd_abi_version()
    return v >> 16, v & 0xFFFF


def connect(uri=None, timeout_ms=0):
    """A new Client: "embedded:", "unix:/path.sock", or None for ZEROD_ENDPOINT
    (set by `zerod run`); else, under another launcher (torchrun, mpirun,
    srun), the node's daemon, which needs ZEROD_JOB set first
    (zerod.name_job_for_node_daemon); else embedded."""
    return Client(uri, timeout_ms)


_default = None


def default_client():
    """The process's shared client (connected on first use, where the
    environment says). zerod.torch uses it unless given another."""
    global _default
    if _default is None or _default._handle is None:
        # Ranks of another launcher whose job is not known yet (the
        # DeepSpeed, Accelerate and Lightning integrations connect before
        # they write it): the node's daemon starts with a job that holds
        # nothing of its own, and each model brings its script as always.
        # Its daemon-wide keys (metrics.listen) then take their defaults.
        name_job_for_node_daemon(job_text=_NODE_DAEMON_JOB)
        _default = Client()
    return _default


_NODE_DAEMON_JOB = "-- the node's daemon for ranks of another launcher; every model brings its own job\nreturn {}\n"


def name_job_for_node_daemon(job=None, job_text=None):
    """Before the shared client connects: a rank that another launcher
    started (torchrun, accelerate launch, mpirun, srun) starts its node's
    daemon on demand, and the daemon needs the job script first (ZEROD_JOB).
    Names `job` (a path) or `job_text` (written to a file of this user's)
    there, unless ZEROD_JOB or ZEROD_ENDPOINT is already set."""
    if os.environ.get("ZEROD_JOB") or os.environ.get("ZEROD_ENDPOINT") or not _launched():
        return
    if job is not None:
        os.environ["ZEROD_JOB"] = os.path.abspath(os.fspath(job))
    elif job_text is not None:
        import hashlib
        import tempfile
        text = job_text if isinstance(job_text, str) else job_text.decode()
        folder = os.path.join(tempfile.gettempdir(), f"zerod-jobs-{os.getuid()}")
        os.makedirs(folder, mode=0o700, exist_ok=True)
        path = os.path.join(folder, hashlib.sha256(text.encode()).hexdigest()[:16] + ".lua")
        if not os.path.exists(path):
            tmp = f"{path}.{os.getpid()}"
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, path)  # every rank writes the same bytes; each sees a whole file
        os.environ["ZEROD_JOB"] = path


def _launched():
    """Another launcher started this process as one of several."""
    for size in ("ZEROD_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "WORLD_SIZE", "SLURM_STEP_NUM_TASKS", "PMI_SIZE"):
        if os.environ.get(size, "").isdigit() and int(os.environ[size]) > 1:
            return True
    return False


def rank():
    """This trainer's rank (0 when embedded)."""
    return default_client().rank


def world_size():
    """The number of ranks in the job (1 when embedded)."""
    return default_client().world_size


def __getattr__(name):
    # `zerod.torch` without an explicit import, yet numpy-only users never
    # pay for importing torch.
    if name == "torch":
        import importlib
        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'zerod' has no attribute '{name}'")
