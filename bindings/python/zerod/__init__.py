"""zerod for Python: DeepSpeed's ZeRO through libzerod's C ABI.

    import zerod
    client = zerod.connect()            # embedded, or the daemon under `zerod run`
    model = client.create_model("job.lua")

`zerod.torch.initialize(model, job=...)` wraps a torch.nn.Module the way
deepspeed.initialize does (see docs/python.md). Every failed call raises a
ZerodError subclass carrying zerod's message.
"""
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
    (set by `zerod run`), else embedded."""
    return Client(uri, timeout_ms)


_default = None


def default_client():
    """The process's shared client (connected on first use, where the
    environment says). zerod.torch uses it unless given another."""
    global _default
    if _default is None or _default._handle is None:
        _default = Client()
    return _default


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
