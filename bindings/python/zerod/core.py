"""Clients and models: the zd_* calls as Python objects.

A Client is a connection to an engine (embedded or a daemon); a Model is one
job's state on it. Methods map one to one onto the C calls of zerod.h and
raise a ZerodError subclass on any non-OK status.
"""
import atexit
import ctypes
import os
import sys
import weakref
from collections import namedtuple
from ctypes import byref, c_char_p, c_double, c_int32

import numpy as np

from . import _lib
from . import _structs as S
from .constants import MODEL_ALLOW_SCRIPT_IO, PROGRESS_HAS_LOSS, STEP_APPLIED, STEP_BOUNDARY, STEP_SKIPPED, Dtype, MemKind, Tier
from .errors import InvalidArgumentError, check
from .views import View, numpy_dtype


ClientInfo = namedtuple("ClientInfo", "rank world_size local_rank embedded")
ParamInfo = namedtuple("ParamInfo", "name dtype module shape numel")
MemoryFigures = namedtuple("MemoryFigures", "current peak budget")
CommFigures = namedtuple("CommFigures", "bytes_sent network_bytes_sent collectives")
OptimizerInfo = namedtuple("OptimizerInfo", "name step slot_names")


class StepResult(namedtuple("StepResult", "flags step micro_step lr loss_scale grad_norm")):
    """What zd_step reports; `boundary`, `applied` and `skipped` read the flags."""

    @property
    def boundary(self):
        return bool(self.flags & STEP_BOUNDARY)

    @property
    def applied(self):
        return bool(self.flags & STEP_APPLIED)

    @property
    def skipped(self):
        return bool(self.flags & STEP_SKIPPED)


def _encode(s):
    return None if s is None else os.fsencode(s) if isinstance(s, os.PathLike) else s.encode()


class Client:
    """A connection to an engine.

    uri "embedded:" runs the engine in this process; "unix:/path.sock" talks
    to a daemon; None uses ZEROD_ENDPOINT (set by `zerod run`); else, in a
    process that another launcher (torchrun, mpirun, srun) started as one of
    several ranks, the node's daemon, joined or started on demand, which
    needs ZEROD_JOB set first (zerod.torch.initialize and the integrations
    set it; see zerod.name_job_for_node_daemon); else embedded.
    """

    def __init__(self, uri=None, timeout_ms=0):
        self._handle = None  # close() (from __del__) when zd_connect fails
        opts = S.ConnectOptions(abi_version=_lib.ABI_VERSION, timeout_ms=timeout_ms)
        handle = ctypes.c_void_p()
        check(_lib.zd_connect(_encode(uri), byref(opts), byref(handle)))
        self._handle = handle
        self._models = []
        _open_clients.add(self)
        info = S.ClientInfo()
        check(_lib.zd_client_get_info(handle, byref(info)))
        self.info = ClientInfo(info.rank, info.world_size, info.local_rank, bool(info.embedded))

    @property
    def rank(self):
        return self.info.rank

    @property
    def world_size(self):
        return self.info.world_size

    def create_model(self, script_path=None, script_text=None, script_name=None, allow_script_io=False,
                     device=None):
        """A model from a job script (a path, or its text); with neither, the
        script ZEROD_JOB names (`zerod run --job` sets it). `device`
        ("cpu", "cuda", "auto") overrides the script's: where the trainer
        computes, and so where its views point."""
        self._require_open()
        model = Model(self, script_path, script_text, script_name, allow_script_io, device)
        self._models.append(model)
        return model

    def _require_open(self):
        if self._handle is None:
            raise InvalidArgumentError("this zerod client is closed")

    def close(self):
        """Disconnects; frees every model still open on this client."""
        if self._handle is None:
            return
        for m in self._models:
            m._forget_views()  # their memory goes with the models
            m._handle = None  # zd_disconnect frees them
        self._models.clear()
        _lib.zd_disconnect(self._handle)
        self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if not sys.is_finalizing():
            self.close()


_open_clients = weakref.WeakSet()


@atexit.register
def _close_at_exit():
    # A trainer that ends normally leaves its models (the daemon logs that
    # the rank left). After an uncaught exception (Ctrl-C's
    # KeyboardInterrupt, a ZerodError) nothing is called: the process
    # exiting closes the socket, the daemon reports the rank lost, and no
    # call can wait on ranks that are going away too.
    if getattr(sys, "last_value", None) is not None:
        return
    for c in list(_open_clients):
        c.close()


class Model:
    """One job's model state: parameters, gradients, optimizer state."""

    def __init__(self, client, script_path=None, script_text=None, script_name=None, allow_script_io=False,
                 device=None):
        opts = S.ModelOptions(flags=MODEL_ALLOW_SCRIPT_IO if allow_script_io else 0,
                              script_path=_encode(script_path), script_text=_encode(script_text),
                              script_name=_encode(script_name), device=_encode(device))
        handle = ctypes.c_void_p()
        check(_lib.zd_model_create(client._handle, byref(opts), byref(handle)))
        self.client = client
        self._handle = handle
        # Views handed out, per module, to invalidate at that module's _end.
        self._open_views = {}
        self._param_infos = {}

    # -- registration -------------------------------------------------------

    def register_param(self, name, module, shape, dtype=Dtype.F32, init=None):
        """Registers a parameter and returns its id; `init` is an array
        (numpy, torch, or anything np.asarray takes) whose values rank 0
        contributes, or None for zeros."""
        shape = tuple(int(e) for e in shape)
        c_shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        desc = S.ParamDesc(dtype=int(dtype), name=_encode(name), module=_encode(module), ndim=len(shape),
                           shape=c_shape)
        keep = None
        if init is not None:
            keep, init_dtype = _host_array(init, dtype)
            desc.init = keep.ctypes.data
            desc.init_dtype = int(init_dtype)
        pid = c_int32()
        check(_lib.zd_model_register_param(self._h(), byref(desc), byref(pid)))
        return pid.value

    def finalize(self):
        check(_lib.zd_model_finalize(self._h()))

    # -- lookups ------------------------------------------------------------

    def find_module(self, name):
        out = c_int32()
        check(_lib.zd_model_find_module(self._h(), _encode(name), byref(out)))
        return out.value

    def find_param(self, name):
        out = c_int32()
        check(_lib.zd_model_find_param(self._h(), _encode(name), byref(out)))
        return out.value

    @property
    def param_count(self):
        out = c_int32()
        check(_lib.zd_model_param_count(self._h(), byref(out)))
        return out.value

    @property
    def module_count(self):
        out = c_int32()
        check(_lib.zd_model_module_count(self._h(), byref(out)))
        return out.value

    def param_info(self, param):
        # A registered parameter never changes: asked of zerod once (views
        # and reads need it on every call, a round trip under the daemon).
        known = self._param_infos.get(param)
        if known is not None:
            return known
        info = S.ParamInfo()
        check(_lib.zd_model_param_info(self._h(), param, byref(info)))
        known = ParamInfo(info.name.decode(), Dtype(info.dtype), info.module, tuple(info.shape[:info.ndim]),
                          info.numel)
        self._param_infos[param] = known
        return known

    def module_info(self, module):
        """(name, [parameter ids]) of a module."""
        name = c_char_p()
        count = c_int32(0)
        check(_lib.zd_model_module_info(self._h(), module, byref(name), None, byref(count)))
        ids = (c_int32 * max(count.value, 1))()
        check(_lib.zd_model_module_info(self._h(), module, byref(name), ids, byref(count)))
        return name.value.decode(), list(ids[:count.value])

    # -- one micro-batch ----------------------------------------------------

    def forward_begin(self, module):
        check(_lib.zd_forward_begin(self._h(), module))

    def forward_end(self, module):
        check(_lib.zd_forward_end(self._h(), module))
        self._invalidate(module)

    def backward_begin(self, module):
        check(_lib.zd_backward_begin(self._h(), module))

    def backward_end(self, module):
        check(_lib.zd_backward_end(self._h(), module))
        self._invalidate(module)

    def param_view(self, param):
        """The working copy of a parameter whose module is begun (read-only)."""
        return self._view(_lib.zd_param_view, param)

    def grad_view(self, param):
        """The gradient buffer of a parameter whose module is in backward."""
        return self._view(_lib.zd_grad_view, param)

    def _view(self, call, param):
        raw = S.View()
        check(call(self._h(), param, byref(raw)))
        view = View(raw)
        module = self.param_info(param).module
        self._open_views.setdefault(module, []).append(view)
        return view

    def _invalidate(self, module):
        for v in self._open_views.pop(module, ()):
            v._invalidate()

    def _forget_views(self):
        """Every open view is invalid from now on (the model is going)."""
        for views in self._open_views.values():
            for v in views:
                v._invalidate()
        self._open_views.clear()

    def step(self):
        r = S.StepResult()
        check(_lib.zd_step(self._h(), byref(r)))
        return StepResult(r.flags, r.step, r.micro_step, r.lr, r.loss_scale, r.grad_norm)

    def set_lr(self, lr):
        """Sets the lr of every update from the next accumulation boundary on,
        in place of the job's schedule, until set again (ABI 1.7,
        zd_model_set_lr): finite and >= 0, between modules. On several ranks
        every rank calls it with the same value (a collective; different
        values are refused on every rank). Checkpoints keep it with the step;
        StepResult.lr says what an update used."""
        check(_lib.zd_model_set_lr(self._h(), float(lr)))

    def loss_scale(self):
        out = c_double()
        check(_lib.zd_model_loss_scale(self._h(), byref(out)))
        return out.value

    def save(self, directory):
        """Writes a checkpoint of the model state into `directory` (every rank
        calls it, between steps); it loads at any world size and stage."""
        check(_lib.zd_model_save(self._h(), _encode(os.fspath(directory))))

    def load(self, directory):
        """Loads a checkpoint save() wrote (every rank, between steps)."""
        check(_lib.zd_model_load(self._h(), _encode(os.fspath(directory))))

    def set_stream(self, stream):
        """The CUDA stream the trainer computes on (a cudaStream_t as an int,
        e.g. torch.cuda.current_stream().cuda_stream; 0 or None = the
        default stream). The cpu device takes only None/0."""
        check(_lib.zd_model_set_stream(self._h(), ctypes.c_void_p(stream or None)))

    # -- whole parameters ---------------------------------------------------

    def param_read(self, param, dtype=Dtype.F32, out=None):
        """The full master value of a parameter, as a numpy array of `dtype`
        (bf16 comes as uint16 bits). A collective at ZeRO stage >= 1 on
        several ranks: every rank reads the same parameter, in the same order."""
        info = self.param_info(param)
        if out is None:
            out = np.empty(info.shape, dtype=numpy_dtype(dtype))
        elif not (out.flags.c_contiguous and out.flags.writeable):
            raise InvalidArgumentError("param_read: out must be a writable C-contiguous array")
        check(_lib.zd_param_read(self._h(), param, int(dtype), out.ctypes.data, out.nbytes))
        return out

    def param_write(self, param, value, dtype=None):
        """Overwrites master and working copy of a parameter (between steps)
        from an array of its full shape; `dtype` is needed only for raw
        16-bit bits (uint16). On several ranks every rank writes the same value."""
        arr, arr_dtype = _host_array(value, dtype)
        check(_lib.zd_param_write(self._h(), param, int(arr_dtype), arr.ctypes.data, arr.nbytes))

    # -- optimizer state, for checkpoints ------------------------------------

    def optimizer_info(self):
        """The optimizer's name, its applied updates, and its state slots."""
        info = S.OptimizerInfo()
        check(_lib.zd_model_optimizer_info(self._h(), byref(info)))
        slots = tuple(info.slot_names[i].decode() for i in range(info.state_slots))
        return OptimizerInfo(info.name.decode() if info.name else "", info.step, slots)

    def optimizer_state_read(self, param, slot, dtype=Dtype.F32):
        """One state slot of a parameter, whole (a collective like param_read)."""
        out = np.empty(self.param_info(param).shape, dtype=numpy_dtype(dtype))
        check(_lib.zd_optimizer_state_read(self._h(), param, slot, int(dtype), out.ctypes.data, out.nbytes))
        return out

    def optimizer_state_write(self, param, slot, value, dtype=None):
        """Overwrites a state slot of a parameter; every rank the same value."""
        arr, arr_dtype = _host_array(value, dtype)
        check(_lib.zd_optimizer_state_write(self._h(), param, slot, int(arr_dtype), arr.ctypes.data, arr.nbytes))

    def set_step(self, step):
        """Sets the count of applied updates (restoring a checkpoint)."""
        check(_lib.zd_model_set_step(self._h(), step))

    def memory(self, tier=Tier.DEVICE, kind=MemKind.ALL, rank=-1):
        """Bytes of one kind in one tier for one rank (-1 = this one)."""
        f = S.MemoryFigures()
        check(_lib.zd_model_memory(self._h(), rank, int(tier), int(kind), byref(f)))
        return MemoryFigures(f.current, f.peak, f.budget)

    def comm_figures(self, rank=-1):
        """Traffic of one rank's collectives so far (-1 = this one)."""
        f = S.CommFigures()
        check(_lib.zd_model_comm_figures(self._h(), rank, byref(f)))
        return CommFigures(f.bytes_sent, f.network_bytes_sent, f.collectives)

    def report(self, tokens=0, samples=0, loss=None):
        """Reports what this rank processed since its last report and its loss
        (ABI 1.3): zerod's metrics (tokens or samples per second, the loss) and
        the trace's loss curve come from it. Once per step is typical."""
        p = S.Progress()
        p.tokens = int(tokens)
        p.samples = int(samples)
        if loss is not None:
            p.flags = PROGRESS_HAS_LOSS
            p.loss = float(loss)
        check(_lib.zd_model_report(self._h(), byref(p)))

    @property
    def last_error(self):
        return _lib.zd_model_last_error(self._h()).decode(errors="replace")

    def _h(self):
        if self._handle is None:
            raise InvalidArgumentError("this zerod model is closed")
        return self._handle

    def close(self):
        if self._handle is None:
            return
        self._forget_views()
        _lib.zd_model_destroy(self._handle)
        self._handle = None
        if self in self.client._models:
            self.client._models.remove(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_NUMPY_TO_DTYPE = {np.dtype(np.float32): Dtype.F32, np.dtype(np.float16): Dtype.F16}


def _host_array(value, dtype=None):
    """(a C-contiguous numpy array, its zd dtype) for values given as numpy
    arrays, torch tensors (bf16 included) or nested sequences. 16-bit raw bits
    (uint16) are taken as `dtype`, which must then say BF16 or F16."""
    if type(value).__module__.startswith("torch"):
        import torch
        t = value.detach().to("cpu").contiguous()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(np.uint16), Dtype.BF16
        value = t.numpy()
    arr = np.ascontiguousarray(value)
    if arr.dtype == np.uint16:
        if dtype not in (Dtype.BF16, Dtype.F16):
            raise InvalidArgumentError("uint16 values are 16-bit float bits: say which with "
                                       "dtype=Dtype.BF16 or Dtype.F16 (or give float32 values)")
        return arr, Dtype(dtype)
    if arr.dtype not in _NUMPY_TO_DTYPE:
        arr = arr.astype(np.float32)
    return arr, _NUMPY_TO_DTYPE[arr.dtype]
