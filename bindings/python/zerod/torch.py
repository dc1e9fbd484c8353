"""zerod.torch: a torch.nn.Module trained through zerod, DeepSpeed-style.

    engine = zerod.torch.initialize(model, job="job.lua")
    for batch in data:                  # one micro-batch per iteration
        loss = engine(batch)
        engine.backward(loss)
        engine.step()

zerod owns the trainable parameters, their gradients and the optimizer
state; torch keeps doing the math. How it works (docs/python.md has more):

- Modules. Submodules become zerod modules (the unit of residency) by a rule:
  by default every module that directly owns trainable parameters (for most
  models, the leaf layers); `modules=[Block]` or `modules=["blocks.*"]` makes
  each match one unit for its whole subtree. A container without a forward
  (nn.ParameterList) never runs: its parameters go to the nearest enclosing
  module with one. Parameters without elements stay in torch. Units that
  share a Parameter (weight tying) are merged into one zerod module,
  resident whenever either runs.
- Forward. A unit's forward pre-hook calls forward_begin and points each
  parameter's .data at zerod's view (no copy); its forward hook calls
  forward_end and empties .data again, as DeepSpeed's ZeRO-3 does.
- Saved tensors. Autograd keeps views of parameters (e.g. W.t() in a linear)
  for the backward; at stage 3 that memory is released at forward_end. A
  saved-tensor hook records such a tensor as (parameter, size, stride,
  offset) and rebuilds it from the resident view when the backward needs it.
- Backward. A module enters backward (backward_begin) the first time the
  backward needs it: a saved view of its parameters is unpacked, or a
  gradient arrives for one of them. Each parameter's AccumulateGrad hook adds
  the gradient into zerod's gradient view and drops param.grad at once, so no
  full-model gradient ever exists in torch. A module leaves backward
  (backward_end) when every parameter it used in the forward has its
  gradient, and engine.backward() ends whatever is still begun.
- Recomputation (activation checkpointing). Where torch shows zerod which
  saved-tensor hooks stand on top (torch 2.15 does, 1.13 does not), a
  forward inside the backward is a forward pair like any other: what
  torch's checkpoint keeps passes through zerod's hooks (a delegate put
  over the checkpoint's own), which keep views of parameters as where they
  sit, so nothing holds zerod's memory after the pair ends. The module that
  ends each checkpointed region (learnt in the same micro-batch's forward)
  begins its backward instead, which comes next. On torch 1.13 every
  recomputed module begins its backward and stays resident until then.
  After a reentrant checkpoint's no_grad forward, the recomputation is what
  counts the module's parameters, so the module still ends early.
- The model's own state_dict() and load_state_dict() go through zerod
  (hooks on the model), as engine.state_dict() and load_state_dict() do.
"""
import ctypes
import inspect
import json
import os
import warnings
import weakref
from collections import OrderedDict

import numpy as np
import torch

from . import _lib, default_client, name_job_for_node_daemon
from . import _ckpt_masters
from . import _structs as S
from ._modules import plan_modules
from .constants import Dtype, MemKind, Tier
from .errors import ConfigError, InvalidArgumentError, InvalidStateError, ZerodIOError, check
from .views import torch_at

__all__ = ["initialize", "Engine"]


def _saved_tensors_hooks_reader():
    """The function that returns the saved-tensor hooks a tensor saved now
    would go through (a (pack, unpack) pair, or None), where torch can say
    and can run a forward hook when the forward raises (torch 2.15 can);
    None where it cannot (torch 1.13). Recomputation runs as forward pairs
    only with both (Engine._begin_recomputed): zerod must see when
    torch.utils.checkpoint's hooks stand above its own, and its forward hook
    must end the pair when the checkpoint stops a recomputation part way by
    raising."""
    read = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    always_call = "always_call" in inspect.signature(torch.nn.Module.register_forward_hook).parameters
    if read is None or not always_call or not hasattr(torch._C._autograd, "_saved_tensors_hooks_is_enabled"):
        return None
    try:
        read(False)  # False: the hooks as a tensor saved now sees them, tracing or not
    except TypeError:  # a binding of another shape: stay on the torch 1.13 path
        return None
    return lambda: read(False)


_top_saved_tensors_hooks = _saved_tensors_hooks_reader()
_RECOMPUTE_IN_PAIRS = _top_saved_tensors_hooks is not None


def _outside_dispatch_modes():
    """A context in which zerod's own tensor bookkeeping (a view over its
    memory, the copy of an output that is a parameter) runs under no torch
    dispatch mode. Those ops are not the model's: selective activation
    checkpointing (checkpoint(context_fn=...)) counts every op its modes see
    and wants the same count in the recomputation, where a view zerod made
    in the forward may come from its cache (and a gather at another address
    makes one it did not). torch 1.13 has no such modes to leave."""
    try:
        from torch.utils._python_dispatch import _disable_current_modes
    except ImportError:
        import contextlib
        return contextlib.nullcontext()
    return _disable_current_modes()

_ZD_DTYPE = {torch.float32: Dtype.F32, torch.bfloat16: Dtype.BF16, torch.float16: Dtype.F16}
# Tensors cached per parameter and address; more than this many distinct
# addresses for one parameter means the pool is not reusing them: start over.
_CACHE_LIMIT = 8
# Engine._trainer_lr of a resumed model: zerod restored whatever lr was set.
_UNKNOWN_LR = object()
# The engines not yet closed: their parameters are empty placeholders, which
# a second initialize() of the same model must refuse by name (_refuse_held).
_LIVE_ENGINES = weakref.WeakSet()
# What torch holds outside zerod in a checkpoint (save_checkpoint), and the
# names they have until zerod's part of the save is whole: its tensors
# (buffers, frozen parameters) in safetensors, which `zerod ckpt export`
# reads, and the rest (client_state, a module's extra state) pickled.
_TORCH_STATE = "torch_state.pt"
_TORCH_STATE_STAGED = "torch_state.next.pt"
_TORCH_TENSORS = "torch_state.safetensors"
_TORCH_TENSORS_STAGED = "torch_state.next.safetensors"
# torch's dtypes as safetensors names them; a tensor of another dtype (a
# complex buffer) stays in the pickle, which export does not read.
_ST_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
              torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
              torch.bool: "BOOL"}
for _name, _st in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")):  # torch 2.1 and later
    if hasattr(torch, _name):
        _ST_DTYPES[getattr(torch, _name)] = _st
del _name, _st
_ST_TORCH = {v: k for k, v in _ST_DTYPES.items()}


def initialize(model, job=None, *, job_text=None, modules=None, dtype=None, client=None,
               allow_script_io=False, job_name=None, engine_class=None):
    """Hands `model`'s trainable parameters to zerod and returns an Engine.

    job       path of the Lua job script; with neither it nor `job_text`,
              the script ZEROD_JOB names (`zerod run --job` sets it).
    modules   which submodules are zerod modules: None (every module that
              owns trainable parameters directly), or classes and/or
              fnmatch patterns of qualified names, e.g. [Block] or ["h.*"].
    dtype     converts the model's floating-point parameters first (e.g.
              torch.bfloat16 for a bf16 job); buffers keep their type, as
              DeepSpeed 0.19 keeps them (a rotary embedding's fp32 inv_freq).
    client    a zerod.Client; by default the process's shared one, which
              connects where the environment says: ZEROD_ENDPOINT (the
              daemon under `zerod run`); else, under torchrun, mpirun or
              srun, the node's daemon, given `job` or `job_text`; else
              embedded.
    job_name  the name errors give `job_text` (e.g. "ds_config.json").
    engine_class  the Engine subclass to make (the integrations' own).

    Every rank must call it with the same model structure; rank 0's initial
    values are used: of the trainable parameters, which zerod holds, and of
    the frozen parameters and buffers, which stay in torch and which rank 0
    sends to the others (as DDP does when it wraps a model).
    """
    _refuse_held(model)
    if dtype is not None:
        _cast_parameters(model, dtype)
    device = _model_device(model)
    if device.type == "cuda":
        # An embedded engine opens the GPU current on this thread.
        torch.cuda.set_device(device)
    plan = plan_modules(model, modules)
    if client is None:
        name_job_for_node_daemon(job, job_text)
    client = client or default_client()
    zmodel = client.create_model(script_path=job, script_text=job_text, script_name=job_name,
                                 allow_script_io=allow_script_io, device=device.type)
    try:
        for group_name, _, params in plan:
            for pname, p in params:
                if p.dtype not in _ZD_DTYPE:
                    raise InvalidArgumentError(
                        f"parameter '{pname}' is {p.dtype}; zerod holds float32, bfloat16 and float16 "
                        "parameters (convert the model, e.g. model.float())")
                # A 0-dim parameter (CLIP's logit_scale) is registered as
                # (1,): zd_param_desc's ndim is 1..ZD_MAX_DIMS, and the views,
                # zd_param_info and every checkpoint's manifest follow it.
                # Letting ndim be 0 there would change the ABI and the
                # manifest format (and what an older checkpoint's (1,) must
                # match) for one element; the torch side keeps the shape
                # instead: loads reshape (_fit_shape) and save_checkpoint
                # names such parameters for `zerod ckpt export`, which writes
                # them as shape [].
                zmodel.register_param(pname, group_name, tuple(p.shape) or (1,), _ZD_DTYPE[p.dtype],
                                      init=p.detach())
        zmodel.finalize()
        _broadcast_rest(model, {id(p) for _, _, params in plan for _, p in params}, client)
        return (engine_class or Engine)(model, zmodel, plan, device)
    except BaseException:
        zmodel.close()
        raise


def _refuse_held(model):
    """A parameter a live engine holds is an empty placeholder: registering
    it again would fail on its extent 0 (or, cast first, break the engine's
    gradient hooks). Refused naming it and what gives the weights back."""
    held = {id(s.param): e for e in list(_LIVE_ENGINES) for s in e._slots}
    for name, p in model.named_parameters():
        engine = held.get(id(p))
        if engine is None:
            continue
        how = ("call its destroy() first, which gives the model the trained weights back (or its close(), which "
               "frees it and leaves the parameters empty)"
               if hasattr(engine, "destroy") else
               "take its state_dict() and close() it first, then give the parameters their values back "
               "(close() leaves them empty)")
        raise InvalidArgumentError(f"parameter '{name}' is held by a live zerod engine (an empty placeholder while "
                                   f"it is): {how}")


def _cast_parameters(model, dtype):
    """The model's floating-point parameters in `dtype`, its buffers as they
    are: DeepSpeed 0.19's cast for fp16/bf16 (engine.py, "preserve fp32
    buffers"), not model.to(dtype), which would round a rotary embedding's
    inv_freq to bf16 and move every position's angle with it."""
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point() and p.dtype != dtype:
                p.data = p.data.to(dtype)


# The bytes of frozen parameters and buffers that one zerod model carries
# from rank 0 to the others (_broadcast_rest): bounds what it holds at once.
_BROADCAST_CHUNK = 1 << 28


def _broadcast_rest(model, trainable, client):
    """Rank 0's values of what zerod does not hold (frozen parameters and
    buffers) into every other rank's model, as DDP broadcasts the module's
    state when it wraps it: ranks that built the model without a common seed
    (or loaded different frozen weights) would otherwise each train with
    their own. zerod's own collective carries them: a model of one fp32
    parameter per chunk of bytes, registered with rank 0's bytes as its
    initial value (the values every rank then reads are rank 0's, bit for
    bit: an fp32 copy moves bytes, whatever their type). Nothing to do on
    one rank."""
    if client.world_size <= 1:
        return
    tensors, seen = [], set()
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in trainable and id(t) not in seen and t.numel():
            seen.add(id(t))
            tensors.append(t)
    if not tensors:
        return
    sizes = [t.numel() * t.element_size() for t in tensors]
    send = client.rank == 0
    # Each chunk: [(tensor index, byte offset, bytes)] of whole tensors or
    # pieces of one, in order.
    chunks, cur, room = [], [], _BROADCAST_CHUNK
    for i, n in enumerate(sizes):
        off = 0
        while off < n:
            take = min(n - off, room)
            cur.append((i, off, take))
            off += take
            room -= take
            if not room:
                chunks.append(cur)
                cur, room = [], _BROADCAST_CHUNK
    if cur:
        chunks.append(cur)
    staged = {}  # tensor index -> its bytes (rank 0: the tensor's; others: received so far)

    def bytes_of(i):
        if i not in staged:
            t = tensors[i].detach()
            staged[i] = (t.cpu().contiguous().reshape(-1).view(torch.uint8) if send else
                         torch.empty(sizes[i], dtype=torch.uint8))
        return staged[i]

    with torch.no_grad():
        for k, chunk in enumerate(chunks):
            total = sum(n for _, _, n in chunk)
            buf = torch.zeros((total + 3) // 4 * 4, dtype=torch.uint8)
            if send:
                at = 0
                for i, off, n in chunk:
                    buf[at:at + n] = bytes_of(i)[off:off + n]
                    at += n
                    if off + n == sizes[i]:
                        del staged[i]
            got = _rank0_bytes(client, buf if send else None, buf.numel(), f"rest{k}")
            if send:
                continue
            at = 0
            for i, off, n in chunk:
                bytes_of(i)[off:off + n] = got[at:at + n]
                at += n
                if off + n == sizes[i]:  # the tensor's last piece: into the model
                    t = tensors[i]
                    t.data.copy_(staged.pop(i).view(t.dtype).view(t.shape))


_BROADCAST_JOB = 'return { optimizer = { type = "sgd", lr = 1 }, zero = { stage = 0 } }'


def _rank0_bytes(client, data, nbytes, name):
    """Rank 0's `nbytes` bytes (`data`: bytes or a uint8 tensor, zeros
    after it; None on the other ranks) on every rank, as a uint8 tensor.
    zerod's own collective carries them: a model of one fp32 parameter,
    registered with rank 0's bytes as its initial value, which every rank
    then reads (rank 0's, bit for bit: an fp32 copy moves bytes, whatever
    their type). Every rank calls it."""
    padded = (nbytes + 3) // 4 * 4
    init = None
    if client.rank == 0:
        if isinstance(data, torch.Tensor) and data.numel() == padded:
            buf = data
        else:
            buf = torch.zeros(padded, dtype=torch.uint8)
            if len(data):
                buf[:len(data)] = data if isinstance(data, torch.Tensor) else \
                    torch.frombuffer(bytearray(data), dtype=torch.uint8)
        init = buf.view(torch.float32).numpy()
    side = client.create_model(script_text=_BROADCAST_JOB, script_name="zerod.torch broadcast", device="cpu")
    try:
        pid = side.register_param(name, "rest", (padded // 4,), Dtype.F32, init=init)
        side.finalize()
        return torch.from_numpy(side.param_read(pid, Dtype.F32)).view(torch.uint8)[:nbytes]
    finally:
        side.close()


def _model_device(model):
    """The one device the model's parameters are on: zerod's views will be
    there (the cpu device for CPU tensors, the cuda device for a GPU's)."""
    devices = {}
    for name, p in model.named_parameters():
        devices.setdefault(p.device, name)
    if len(devices) > 1:
        where = ", ".join(f"'{n}' on {d}" for d, n in devices.items())
        raise InvalidArgumentError(f"the model's parameters are on several devices ({where}); move the whole model "
                                   "to one, e.g. model.cuda() or model.cpu()")
    device = next(iter(devices), torch.device("cpu"))
    if device.type not in ("cpu", "cuda"):
        raise InvalidArgumentError(f"the model is on {device}; zerod trains models on the CPU or on a CUDA GPU")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


class _Slot:
    """One parameter zerod owns."""

    __slots__ = ("param", "pid", "name", "group", "shape", "zd_dtype", "nbytes", "placeholder", "acc",
                 "ptr", "tensors", "grad", "grad_tensors")

    def __init__(self, name, param, pid, group):
        self.name, self.param, self.pid, self.group = name, param, pid, group
        self.shape = tuple(param.shape)
        self.zd_dtype = _ZD_DTYPE[param.dtype]
        self.nbytes = param.numel() * param.element_size()
        # Same dtype and device as the parameter: otherwise set_data would
        # drop the AccumulateGrad node the gradient hooks sit on.
        self.placeholder = torch.empty(0, dtype=param.dtype, device=param.device)
        self.ptr = 0       # address of the resident view, 0 when not resident
        self.tensors = {}  # address -> tensor over the parameter's view there
        self.grad = None   # tensor over the gradient view while in backward
        self.grad_tensors = {}


class _Group:
    """One zerod module: one or more torch modules and their parameters."""

    __slots__ = ("name", "mid", "units", "slots", "depth", "in_backward", "ran", "pending", "ended",
                 "ends_region")

    def __init__(self, name, mid, units):
        self.name, self.mid, self.units = name, mid, units
        self.slots = []
        self.depth = 0            # nesting of its forwards now running
        self.in_backward = False
        self.ran = False          # ran a forward with gradients in this micro-batch
        self.pending = 0          # parameters whose gradient has not arrived yet
        self.ended = False        # its backward ended in this backward()
        self.ends_region = False  # ran last in a checkpointed region of this micro-batch's forward


class _Saved:
    """A saved tensor that is a view of a parameter, kept as where it sits."""

    __slots__ = ("slot", "size", "stride", "offset")

    def __init__(self, slot, t):
        self.slot, self.size, self.stride, self.offset = slot, t.size(), t.stride(), t.storage_offset()


class _Packed:
    """A saved tensor taken while a zerod module's forward ran (_RECOMPUTE_IN_PAIRS):
    `kept` is the tensor, or what the hooks below a _Delegate made of it;
    for a view of a parameter, `view` says where it sits. Unpacking one
    means the backward has reached `group`, or a checkpoint inside it is
    recomputing with its parameters."""

    __slots__ = ("kept", "group", "view")

    def __init__(self, kept, group, view=None):
        self.kept, self.group, self.view = kept, group, view


class _Call:
    """A forward of a zerod module's torch module now running
    (_RECOMPUTE_IN_PAIRS): what its forward hook undoes."""

    __slots__ = ("module", "group", "delegate", "counted", "saved_own")

    def __init__(self, module, group, delegate, counted):
        self.module, self.group = module, group
        self.delegate = delegate    # the _Delegate its pre-hook pushed, or None
        self.counted = counted      # counted in group.depth: a forward pair, not a backward
        self.saved_own = False      # saved a tensor through zerod's own hooks


class _Delegate:
    """zerod's saved-tensor hooks put over another pair while a zerod module
    runs: torch.utils.checkpoint's, which stand above zerod's inside a
    checkpointed region and its recomputation. Every tensor goes on to the
    pair below, in order, since the checkpoint counts them and matches the
    recomputation's to the forward's by position, shape, dtype and device.
    A view of a resident parameter goes as a stand-in of that shape that
    has no memory, so what the checkpoint keeps does not hold zerod's memory
    (its recomputation would otherwise keep raw views of it); the backward
    gets the view rebuilt from the parameter, as zerod's own hooks do."""

    __slots__ = ("engine", "group", "below")

    def __init__(self, engine, group, below):
        self.engine, self.group, self.below = engine, group, below

    def pack(self, t):
        # No try block: what the pair below raises (the checkpoint's early
        # stop, _StopRecomputationError) must reach the checkpoint as itself.
        engine = self.engine
        s = engine._resident_slot(t)
        if s is None:
            return _Packed(self.below[0](t), self.group)
        if t.dtype != s.param.dtype:  # a view of another dtype cannot be rebuilt from the parameter
            return _Packed(self.below[0](t.clone()), self.group)
        return _Packed(self.below[0](engine._stand_in(t)), self.group, _Saved(s, t))

    def unpack(self, x):
        got = self.below[1](x.kept)  # may run the recomputation
        return self.engine._unpacked(x, got)


class _DelegatePack:
    """A _Delegate's pack hook as torch's stack holds it. It says it is part
    of the checkpoint's machinery, as the checkpoint's own hook does, so that
    selective checkpointing with respect_saved_tensors_hooks=True sends what
    it caches to the hooks the checkpoint found when it began (zerod's own,
    which keep a parameter's view as where it sits), not through the
    checkpoint's hook, which counts it as a saved tensor of the forward and
    then finds the recomputation's counts off."""

    __slots__ = ("delegate",)
    _checkpoint_internal = True

    def __init__(self, delegate):
        self.delegate = delegate

    @property
    def _user_hooks(self):
        return self.delegate.below  # torch walks on while those are a checkpoint's too

    @property
    def __self__(self):
        return self.delegate  # as the bound method it stands for (_route_saved_tensors, _pop_delegate)

    def __call__(self, t):
        return self.delegate.pack(t)


class Engine:
    """A model whose parameters, gradients and optimizer state zerod holds.

    Per micro-batch: `loss = engine(batch)`, `engine.backward(loss)`,
    `engine.step()`. Under `zerod run` every rank runs the same sequence of
    forwards (training and evaluation) and calls state_dict() together.
    """

    def __init__(self, model, zmodel, plan, device=None):
        self.module = model
        self.zerod_model = zmodel
        self.rank = zmodel.client.rank
        self.world_size = zmodel.client.world_size
        self.device = device or torch.device("cpu")
        self._stream = None  # the CUDA stream zerod was given (its cuda_stream handle)
        self._follow_stream()
        self.last_step = None
        # Where the job stands: a job that takes snapshots resumes at finalize.
        self._resumed_step = zmodel.optimizer_info().step
        # The lr zerod applies in place of the job's schedule (set_lr): None
        # while the schedule applies, as in a new model; _UNKNOWN_LR in a
        # resumed one (a snapshot, a model the daemon kept), which restored
        # whatever lr had been set.
        self._trainer_lr = None if self._resumed_step == 0 else _UNKNOWN_LR
        self._h = zmodel._handle
        self._raw = S.View()
        self._raw_ref = ctypes.byref(self._raw)
        self._groups, self._slots = [], []
        self._slot_of = {}   # id(Parameter) -> _Slot
        self._resident = {}  # view address -> _Slot, for every resident parameter
        self._in_backward = False
        self._hooks_active = 0
        self._phase = "idle"  # -> "forward" (trained forward ran) -> "backward" -> step -> "idle"
        self._dropped_by = None  # the call that dropped a forward-only phase (_require_between_steps)
        self._broken = None
        self._hook_error = None  # what a hook raised inside autograd, to re-raise as itself
        self._backward_began = False  # a module of this backward() reached zd_backward_begin
        self._loss_scale = zmodel.loss_scale()
        self._handles = []
        # Recomputation as forward pairs (_RECOMPUTE_IN_PAIRS): the module
        # forwards now running, and what this micro-batch's forward showed
        # of its checkpointed regions (_saved_by_zerod).
        self._calls = []
        self._learning_regions = False  # a forward with gradients is running
        self._region_end = None  # the last module that ran without saving through zerod's own hooks
        self._stand_ins = {}  # (dtype, device) -> one element the _Delegate's stand-ins expand
        for name, units, params in plan:
            g = _Group(name, zmodel.find_module(name), units)
            self._groups.append(g)
            for pname, p in params:
                s = _Slot(pname, p, zmodel.find_param(pname), g)
                g.slots.append(s)
                self._slots.append(s)
                self._slot_of[id(p)] = s
            for u in units:
                self._handles.append(u.register_forward_pre_hook(self._pre_hook(g)))
                # always_call: the forward hook also ends a forward that
                # raised, as a checkpoint's recomputation does to stop early.
                self._handles.append(u.register_forward_hook(
                    self._post_hook(g), **({"always_call": True} if _RECOMPUTE_IN_PAIRS else {})))
        with torch.enable_grad():
            for s in self._slots:
                p = s.param
                # The AccumulateGrad node is made now, while .data has the
                # real shape, and held so that every graph uses this one.
                s.acc = p.expand_as(p).grad_fn.next_functions[0][0]
                self._handles.append(p.register_hook(self._grad_arriving(s)))
                self._handles.append(s.acc.register_hook(self._grad_arrived(s)))
                p.grad = None
                p.data = s.placeholder
        self._handles += self._hook_the_models_state_dict()
        _LIVE_ENGINES.add(self)

    # -- DeepSpeed's surface -------------------------------------------------

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        """Runs the model. With gradients enabled it starts a micro-batch that
        backward() and step() finish."""
        self._require_usable()
        self._check_parameters()  # first: a model moved after initialize() is the parameters' fault
        self._check_devices(args, kwargs)
        if self._phase == "idle":
            self._follow_stream()
        grad = torch.is_grad_enabled()
        if grad and self._phase == "backward":
            raise InvalidStateError(
                "forward with gradients after backward() but before step(): call engine.step() after "
                "every micro-batch's backward (zerod counts micro-batches at step() and averages them)")
        if grad and self._phase == "idle":
            self._forget_regions()
        self._hooks_active += 1
        self._hook_error = None
        entry = self._saved_tensors_hooks_on_top()
        self._learning_regions = grad and _RECOMPUTE_IN_PAIRS
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                out = self.module(*args, **kwargs)
        except BaseException as e:
            self._drop_calls(entry)
            self._abort_forward()
            if isinstance(e, RuntimeError):
                self._raise_hook_error(e)
            raise
        finally:
            self._hooks_active -= 1
            if self._learning_regions:
                self._close_region()  # the forward may end inside a checkpointed region
            self._learning_regions = False
        if grad:
            self._phase = "forward"
            self._dropped_by = None
        return out

    def backward(self, loss, retain_graph=False):
        """Backpropagates `loss` (this rank's micro-batch mean loss) into
        zerod's gradient buffers; zerod averages over micro-batches and ranks."""
        self._require_usable()
        if self._phase == "backward":
            raise InvalidStateError(
                "backward() was already called for this micro-batch: call engine.step() after each "
                "backward(), then run the next micro-batch's forward")
        if self._phase != "forward":
            dropped = (f" (the forward that ran before {self._dropped_by} was dropped by it: a forward and "
                       "its backward cannot have another call between them)" if self._dropped_by else "")
            raise InvalidStateError(
                "backward() without a forward: run loss = engine(batch) with gradients enabled (not under "
                f"torch.no_grad()) in this micro-batch first{dropped}")
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            raise InvalidArgumentError(
                "backward(loss): loss must be a tensor computed from engine(...)'s output with gradients "
                "enabled")
        if loss.numel() != 1:
            # Refused here, not by torch inside the backward: the forward's
            # graph stays whole, so a backward of the mean can follow.
            raise InvalidArgumentError(f"backward(loss): loss has {loss.numel()} elements; it must be one (this "
                                       "rank's mean loss, e.g. loss.mean())")
        for g in self._groups:
            g.pending = len(g.slots) if g.ran else 0
            g.ended = False
        self._hook_error = None
        self._backward_began = False
        self._in_backward = True
        self._hooks_active += 1
        entry = self._saved_tensors_hooks_on_top()
        try:
            try:
                with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                    scaled = loss * self._loss_scale if self._loss_scale != 1.0 else loss
                    scaled.backward(retain_graph=retain_graph)
            except RuntimeError as e:
                self._raise_hook_error(e)
                raise
            for g in self._groups:
                if g.in_backward:
                    self._backward_end(g)
        except BaseException as e:
            self._drop_calls(entry)
            self._abort_forward()  # recomputations an interrupt left begun
            if not self._backward_began:
                # Failed before any gradient reached zerod (torch refused the
                # graph, e.g. one a loss.backward() already ran through):
                # nothing to undo, the engine stays usable.
                for g in self._groups:
                    g.pending = 0
                raise
            why = type(e).__name__ + (f": {e}" if str(e) else "")
            self._broken = (f"an earlier backward() did not finish ({why}); the gradients of this accumulation "
                            "window are incomplete and zerod cannot drop them. Start again from a checkpoint "
                            "(a new process, or initialize() on a fresh model)")
            raise
        finally:
            self._in_backward = False
            self._hooks_active -= 1
        for g in self._groups:
            g.ran = False
            g.pending = 0
        self._phase = "backward"

    def step(self):
        """Ends the micro-batch; at an accumulation boundary zerod reduces,
        clips and applies the optimizer. Returns a zerod.StepResult."""
        self._require_usable()
        if self._phase != "backward":
            why = (" (this micro-batch's forward ran, its backward did not)" if self._phase == "forward" else "")
            raise InvalidStateError(
                f"step() without backward(){why}: each micro-batch is loss = engine(batch); "
                "engine.backward(loss); engine.step()")
        r = self.zerod_model.step()
        self._loss_scale = r.loss_scale
        self._phase = "idle"
        self.last_step = r
        return r

    def set_lr(self, lr):
        """Sets the lr of every update from the next accumulation boundary on,
        in place of the job's schedule, until set again (zd_model_set_lr): a
        schedule the training loop computes (nanoGPT's get_lr(it), one that
        follows the loss). Finite and >= 0; any time between the engine's
        calls, inside an accumulation window too (the window's update reads
        it). Every rank calls it with the same value (a collective: values
        that differ are refused on every rank). Checkpoints keep it, and
        load_checkpoint restores it; StepResult.lr says what an update used."""
        self._require_usable()
        self.zerod_model.set_lr(lr)
        self._trainer_lr = float(lr)

    def _runs_schedule(self):
        """True until a trainer lr is set through this engine: zerod runs the
        job's schedule, or (a resumed model) whatever lr it restored, which
        the integrations keep while the loop writes nothing else."""
        return self._trainer_lr is None or self._trainer_lr is _UNKNOWN_LR

    def _follow_lr(self, lr):
        """For the integrations, which read the lr a training loop left in
        its torch optimizer: zerod applies `lr` from the next boundary on
        (set_lr). Set at every window once the loop writes its own, changed
        or not: set_lr is a collective, and a rank whose lr changed alone (a
        ReduceLROnPlateau on a metric each rank computes itself) meets the
        others there, which refuse the difference with it."""
        self.set_lr(lr)

    def report(self, tokens=0, samples=0, loss=None):
        """Tells zerod what this rank processed since its last report and its
        loss (a float or a one-element tensor): the daemon's metrics (tokens
        per second, the loss, `zerod top`) and the trace's loss curve come from
        it. Call it after step(); it changes nothing in training."""
        if loss is not None and hasattr(loss, "item"):
            loss = loss.item()
        self.zerod_model.report(tokens=tokens, samples=samples, loss=loss)

    def no_sync(self):
        """DDP's and DeepSpeed's context that skips the gradient reduction of
        the backward() calls inside it (accumulating by hand): refused, as
        zerod.deepspeed refuses it; zerod reduces a window's gradients itself."""
        raise InvalidArgumentError(
            "engine.no_sync() is not supported by zerod: zerod accumulates the gradients of an accumulation "
            "window's micro-batches itself and decides when they are reduced across ranks, so there is no "
            "per-backward reduction to turn off. Accumulate with gradient_accumulation_steps in the job script and "
            "call backward() and step() on every micro-batch (zerod applies the update at the window's last step())")

    def train(self, mode=True):
        self.module.train(mode)
        return self

    def eval(self):
        self.module.eval()
        return self

    @property
    def global_steps(self):
        """Optimizer steps applied so far (a loaded checkpoint's count included)."""
        return self.last_step.step if self.last_step else self._resumed_step

    @property
    def num_parameters(self):
        return sum(int(np.prod(s.shape)) for s in self._slots)

    @property
    def zerod_modules(self):
        """{zerod module name: [its torch modules]}."""
        return {g.name: list(g.units) for g in self._groups}

    def memory(self, kind=MemKind.ALL, rank=-1):
        """{tier name: zerod.MemoryFigures} of this rank (or `rank`)."""
        return {t.name.lower(): self.zerod_model.memory(t, kind, rank) for t in Tier}

    def state_dict(self):
        """The model's state_dict with full fp32 values of zerod's parameters
        (tied ones share a tensor, as in torch). With ZeRO stage >= 1 on
        several ranks every rank must call it: the reads are collectives."""
        self._require_between_steps("state_dict()")
        out, read = OrderedDict(), {}
        for key, value in self.module.state_dict(keep_vars=True).items():
            s = self._slot_of.get(id(value))
            if s is None:
                # A module's get_extra_state() need not be a tensor: as torch's.
                out[key] = value.detach() if isinstance(value, torch.Tensor) else value
                continue
            out[key] = self._full_value(s, read)
        return out

    def _full_value(self, s, read):
        """The full fp32 master of slot `s` as a CPU tensor, read once per
        parameter into `read` (tied keys share it)."""
        if s.pid not in read:
            read[s.pid] = torch.from_numpy(self.zerod_model.param_read(s.pid, Dtype.F32)).reshape(s.shape)
        return read[s.pid]

    def load_state_dict(self, state_dict, strict=True):
        """Loads values (as torch's load_state_dict): zerod's parameters get
        new master and working copies; optimizer state is kept. Every rank
        loads the same values. Returns torch's NamedTuple of missing_keys and
        unexpected_keys. Every shape is checked before anything changes: a
        refusal leaves the model as it was. Tied keys with different values
        load as in torch: the last key in the model's order wins."""
        self._require_between_steps("load_state_dict()")
        own = self.module.state_dict(keep_vars=True)
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        if strict and (missing or unexpected):
            raise InvalidArgumentError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        values = {}  # pid -> its value, in the parameter's shape
        for key, current in own.items():
            if key not in state_dict:
                continue
            s = self._slot_of.get(id(current))
            if s is None:
                _check_rest_shape(key, state_dict[key], current)
            else:  # a later tied key replaces an earlier one's value, as torch's copies in order do
                values[s.pid] = _fit_shape(key, state_dict[key], s.shape)
        for pid, value in values.items():
            self.zerod_model.param_write(pid, value.detach().to(torch.float32))
        self._load_rest(state_dict, own)
        return torch.nn.modules.module._IncompatibleKeys(missing, unexpected)

    def _load_rest(self, state_dict, own=None):
        """The entries of `state_dict` that torch holds (buffers, frozen
        parameters, a module's extra state) into the module, through torch's
        own load_state_dict (set_extra_state, its shape checks); zerod's
        parameters are left out of what it is given."""
        own = self.module.state_dict(keep_vars=True) if own is None else own
        rest = {k: v for k, v in state_dict.items() if k in own and id(own[k]) not in self._slot_of}
        if rest:
            self.module.load_state_dict(rest, strict=False)

    # -- the model's own state_dict and load_state_dict ------------------------
    # nanoGPT and Hugging Face save torch.save(model.state_dict()) and load
    # with model.load_state_dict(); on the wrapped model the parameters are
    # empty between forwards, so torch alone would save empty tensors and
    # refuse every shape. Hooks on the model route both through zerod. They
    # leave keep_vars=True alone (values that are the Parameters themselves):
    # that is how the engine and the integrations map keys to parameters.

    def _hook_the_models_state_dict(self):
        m = self.module
        post = getattr(m, "register_state_dict_post_hook", None) or m._register_state_dict_hook  # torch 1.13

        def fill_in(*args):  # a function: torch 2 marks the hook with an attribute, which a method cannot take
            self._fill_in_state_dict(*args)
        return [post(fill_in),
                m._register_load_state_dict_pre_hook(self._load_into_zerod, with_module=True)]

    def _slot_keys(self, prefix):
        """[(prefix + state_dict key, slot)] of zerod's parameters (tied ones
        under each of their keys)."""
        own = self.module.state_dict(keep_vars=True)  # these hooks leave it alone
        return [(prefix + k, self._slot_of[id(v)]) for k, v in own.items() if id(v) in self._slot_of]

    def _fill_in_state_dict(self, module, state_dict, prefix, local_metadata):
        if any(id(v) in self._slot_of for k, v in state_dict.items() if k.startswith(prefix)):
            return None  # keep_vars=True
        if self.world_size > 1:
            raise InvalidStateError(
                f"model.state_dict() of a model zerod.torch.initialize() wrapped, on {self.world_size} ranks: "
                "zerod holds its trainable parameters, and reading them is a collective where they are "
                "partitioned (ZeRO stage >= 1), which one rank cannot make alone; call engine.state_dict() on "
                "every rank (rank 0 can then save it)")
        self._require_between_steps("model.state_dict()")
        read = {}
        for key, s in self._slot_keys(prefix):
            if key in state_dict:
                state_dict[key] = self._full_value(s, read)
        return None

    def _load_into_zerod(self, module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                         error_msgs):
        given = [(key, s) for key, s in self._slot_keys(prefix) if key in state_dict]
        if not given:
            return  # none of zerod's (the engine's own load of the rest)
        if local_metadata.get("assign_to_params_buffers"):
            raise InvalidArgumentError(
                "model.load_state_dict(..., assign=True) on a model zerod.torch.initialize() wrapped would put "
                "new Parameters in place of the ones zerod holds; load without assign=True (or call "
                "engine.load_state_dict())")
        self._require_between_steps("model.load_state_dict()")
        # Every shape first: a refusal changes nothing. Tied keys: the last
        # one in the model's order wins, as torch's copies in order do.
        values = {s.pid: _fit_shape(key[len(prefix):], state_dict[key], s.shape) for key, s in given}
        for pid, value in values.items():
            self.zerod_model.param_write(pid, value.detach().to(torch.float32))
        for key, s in given:
            # What torch then copies into the (empty) parameter: nothing.
            state_dict[key] = s.placeholder

    def optimizer_state_dict(self):
        """The optimizer's state for a checkpoint: {"optimizer": name, "step":
        updates applied, "state": {parameter key: {slot name: tensor}}}, full
        fp32 values: every parameter zerod holds, once (tied ones under their
        first key); a parameter without elements stays in torch and has no
        optimizer state. Like state_dict(), every rank must call it when the
        state is partitioned (ZeRO stage >= 1 on several ranks)."""
        self._require_between_steps("optimizer_state_dict()")
        info = self.zerod_model.optimizer_info()
        state, seen = OrderedDict(), set()
        for key, value in self.module.state_dict(keep_vars=True).items():
            s = self._slot_of.get(id(value))
            if s is None or s.pid in seen:
                continue
            seen.add(s.pid)
            state[key] = OrderedDict(
                (name, torch.from_numpy(self.zerod_model.optimizer_state_read(s.pid, i)).reshape(s.shape))
                for i, name in enumerate(info.slot_names))
        return {"optimizer": info.name, "step": info.step, "state": state}

    def load_optimizer_state_dict(self, state_dict):
        """Loads what optimizer_state_dict() returned (every rank the same):
        each parameter's state slots and the step. Error feedback of 1-bit
        Adam restarts at zero. The dict holds no per-tensor scalars (1-bit
        LAMB's frozen trust ratios, 0/1 Adam's sum of learning rates): where
        the next update reads them and this engine holds none, it raises
        ConfigError (save_checkpoint()/load_checkpoint() carry them). The
        dict must hold every parameter zerod holds, once, with every slot in
        the parameter's shape (as torch's optimizer refuses a dict of another
        size): all of that is checked before the step or any slot is
        written, so a refusal changes nothing."""
        self._require_between_steps("load_optimizer_state_dict()")
        info = self.zerod_model.optimizer_info()
        if state_dict.get("optimizer") != info.name:
            raise InvalidArgumentError(f"load_optimizer_state_dict: the checkpoint is of optimizer "
                                       f"'{state_dict.get('optimizer')}', this model runs '{info.name}'")
        writes = self._optimizer_state_writes(state_dict["state"], info.slot_names)
        # The step first: zd_model_set_step refuses a step whose next update
        # reads per-tensor scalars the dict cannot carry, before any slot is
        # written.
        try:
            self.zerod_model.set_step(int(state_dict["step"]))
        except ConfigError as e:
            raise ConfigError(f"load_optimizer_state_dict: {e.message}") from None
        for pid, i, value in writes:
            self.zerod_model.optimizer_state_write(pid, i, value.detach().to(torch.float32))

    def _optimizer_state_writes(self, state, slot_names):
        """[(pid, slot index, value)] of an optimizer_state_dict()'s "state",
        every key and shape checked: a parameter missing (its moments would
        stay zero under a restored step, and Adam's bias correction would
        then make its next updates several times too large), given twice
        (tied keys), not held by zerod or with a slot of another shape is
        refused, naming it."""
        own = self.module.state_dict(keep_vars=True)
        writes, given = [], {}  # given: pid -> its key in the dict
        for key, slots in state.items():
            s = self._slot_of.get(id(own.get(key)))
            if s is None:
                raise InvalidArgumentError(f"load_optimizer_state_dict: '{key}' is not a parameter zerod holds")
            if s.pid in given:
                raise InvalidArgumentError(f"load_optimizer_state_dict: '{given[s.pid]}' and '{key}' are one "
                                           "parameter (tied): give its state once")
            given[s.pid] = key
            for i, name in enumerate(slot_names):
                if name not in slots:
                    raise InvalidArgumentError(f"load_optimizer_state_dict: '{key}' has no '{name}'")
                writes.append((s.pid, i, _fit_shape(key, slots[name], s.shape,
                                                    f"load_optimizer_state_dict, slot '{name}'")))
        self._refuse_missing_state(own, given)
        return writes

    def _refuse_missing_state(self, own, given):
        """Refuses a dict that leaves out parameters zerod holds (`given`:
        pid -> key of those it holds), naming them by their first key."""
        first_key = {}  # pid -> the parameter's first key in the model's order
        for key, value in own.items():
            s = self._slot_of.get(id(value))
            if s is not None:
                first_key.setdefault(s.pid, key)
        missing = [k for pid, k in first_key.items() if pid not in given]
        if not missing:
            return
        shown = ", ".join(f"'{k}'" for k in missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise InvalidArgumentError(
            f"load_optimizer_state_dict: the dict holds the state of {len(given)} of the {len(first_key)} "
            f"parameters zerod holds; missing {shown}. Give the whole optimizer_state_dict() (every "
            "parameter's state is restored with the step, or none is)")

    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True):
        """DeepSpeed's: writes a checkpoint into save_dir/<tag> (default
        "global_step<N>") and names it in save_dir/latest. zerod writes the
        masters and optimizer state (each rank its shard, docs/checkpoints.md);
        rank 0 adds what torch holds outside zerod: its tensors (buffers,
        frozen parameters) in torch_state.safetensors, client_state and the
        rest in torch_state.pt. Every rank calls it, between steps; where
        rank 0 cannot write its files, every rank raises and nothing is saved."""
        self._require_between_steps("save_checkpoint()")
        if self.last_step is not None and not self.last_step.boundary:
            # zd_model_save refuses it too, but after rank 0 staged its files.
            raise InvalidStateError("save_checkpoint() inside an accumulation window: call it after the window's "
                                    "last step(); nothing was written")
        tag = str(tag) if tag is not None else f"global_step{self.global_steps}"
        path = os.path.join(os.fspath(save_dir), tag)
        step = self.zerod_model.optimizer_info().step
        # Staged before zerod's save, whose manifest (renamed into place
        # last) is the commit: a save that fails or is killed before it
        # leaves no checkpoint, or in a reused directory (Lightning's
        # last.ckpt, Accelerate's save_state) the old one whole, and the old
        # torch state beside it. The step says which zerod state each file
        # belongs to (load_checkpoint picks by it).
        failed = None
        if self.rank == 0:
            try:
                self._stage_torch_state(path, step, client_state)
            except Exception as e:  # every rank is told, then it is raised (_raise_if_rank0_failed)
                failed = e
        self._raise_if_rank0_failed(failed, path)
        self.zerod_model.save(path)
        if self.rank == 0:
            # The pickle first: `zerod ckpt reshard` tells which pickle goes
            # with the tensors file of the manifest's step by this order
            # (engine/checkpoint/torch_state.h).
            for staged, final in ((_TORCH_STATE_STAGED, _TORCH_STATE), (_TORCH_TENSORS_STAGED, _TORCH_TENSORS)):
                os.replace(os.path.join(path, staged), os.path.join(path, final))
        if self.rank == 0 and save_latest:
            tmp = os.path.join(os.fspath(save_dir), "latest.tmp")
            with open(tmp, "w") as f:
                f.write(tag)
            os.replace(tmp, os.path.join(os.fspath(save_dir), "latest"))
        return True

    def _stage_torch_state(self, path, step, client_state):
        """Rank 0's part of save_checkpoint before zerod's: what torch holds
        outside zerod, under the staged names. Its tensors go to safetensors,
        which `zerod ckpt export` reads without torch (a tensor shared under
        several keys, once: the others are named aliases); the pickle keeps
        the rest and says where the tensors are."""
        rest = OrderedDict((k, v) for k, v in self.module.state_dict(keep_vars=True).items()
                           if id(v) not in self._slot_of)
        tensors, pickled, aliases, first_key = OrderedDict(), OrderedDict(), {}, {}
        for key, value in rest.items():
            if not isinstance(value, torch.Tensor):
                pickled[key] = value  # a module's extra state
            elif id(value) in first_key:
                aliases[key] = first_key[id(value)]
            elif value.dtype in _ST_DTYPES and value.layout == torch.strided:
                first_key[id(value)] = key
                tensors[key] = value.detach().cpu().contiguous()
            else:
                pickled[key] = value.detach().cpu()
        metadata = {"format": "pt", "zerod_step": str(step)}
        scalars = [s.name for s in self._slots if s.shape == ()]
        if scalars:
            metadata["zerod_scalar_parameters"] = json.dumps(scalars)
        if aliases:
            metadata["zerod_aliases"] = json.dumps(aliases)
        pickled_only = sum(isinstance(v, torch.Tensor) for v in pickled.values())
        if pickled_only:
            metadata["zerod_pickled_only"] = str(pickled_only)
        os.makedirs(path, exist_ok=True)
        staged_tensors = os.path.join(path, _TORCH_TENSORS_STAGED)
        _write_safetensors_atomically(staged_tensors, tensors, metadata)
        try:
            _write_atomically(os.path.join(path, _TORCH_STATE_STAGED),
                              {"module_rest": pickled, "client_state": client_state or {}, "step": step,
                               "tensors_in": _TORCH_TENSORS})
        except BaseException:
            os.remove(staged_tensors)  # a failed save leaves nothing of its own
            raise

    def _raise_if_rank0_failed(self, failed, path):
        """Raises, on every rank, what rank 0 met staging its files: the
        other ranks would otherwise wait for it in zd_model_save, a
        collective, until the job broke. Every rank learns it through
        zerod's own collective (_rank0_bytes); nothing was saved and every
        rank can go on. The same error on one rank as on several."""
        why = f"{type(failed).__name__}: {failed}" if failed is not None else ""
        if self.world_size > 1:
            got = _rank0_bytes(self.zerod_model.client, why.encode()[:_REASON_BYTES] if self.rank == 0 else None,
                               _REASON_BYTES, "save_checkpoint staged")
            why = bytes(got.numpy()).rstrip(b"\0").decode(errors="replace")
        if why:
            raise ZerodIOError(f"save_checkpoint: rank 0 could not write torch_state (what torch holds outside "
                               f"zerod, and client_state) into {path}: {why}; no rank saved anything") from failed

    def load_checkpoint(self, load_dir, tag=None):
        """DeepSpeed's: loads load_dir/<tag> (default: what load_dir/latest
        names, or load_dir itself where it is a checkpoint without `latest`:
        what `zerod ckpt reshard` writes) and returns (its path, the
        client_state saved with it). It loads at any world size and ZeRO
        stage. Every rank calls it, between steps. A checkpoint that
        zd_model_save wrote without zerod.torch (C, Rust, a snapshot) has no
        torch_state.pt: the module's buffers and frozen parameters then keep
        their values (with a warning, where the module has any) and
        client_state is {}."""
        self._require_between_steps("load_checkpoint()")
        path = _checkpoint_path(os.fspath(load_dir), tag)
        # Read and checked first: a refusal, like zd_model_load's, changes nothing.
        step = _manifest_step(path)
        extra = self._torch_state(path, step) if step is not None else None
        own = self.module.state_dict(keep_vars=True)
        for key, value in (extra["module_rest"] if extra else {}).items():
            if key in own and id(own[key]) not in self._slot_of:
                _check_rest_shape(key, value, own[key])
        self.zerod_model.load(path)
        # zd_model_load restored the loss scale with the step: backward()
        # multiplies by it and zerod divides by its own, so they must agree.
        self._loss_scale = self.zerod_model.loss_scale()
        self.last_step = None
        self._resumed_step = self.zerod_model.optimizer_info().step
        # And the lr the trainer had set, if any (the manifest's lr line).
        self._trainer_lr = _ckpt_masters.read_manifest(path).lr
        if extra is None:
            rest = [k for k, v in own.items() if id(v) not in self._slot_of]
            if rest:
                warnings.warn(f"load_checkpoint: {path} has no {_TORCH_STATE} (zd_model_save wrote it without "
                              f"zerod.torch): {len(rest)} tensor(s) zerod does not hold (buffers, frozen "
                              f"parameters; '{rest[0]}' first) keep their current values, and client_state is {{}}")
            extra = {"module_rest": {}, "client_state": {}}
        self._load_rest(extra["module_rest"], own)
        return path, extra["client_state"]

    def _torch_state(self, path, step):
        """What save_checkpoint kept beside zerod's state of `step` in `path`,
        or None where it kept nothing. A staged file is a save's whose
        manifest may or may not have been written (killed in between): it is
        this checkpoint's when its step is. A file without a step (zerod ckpt
        import) belongs to the directory's one checkpoint. Its module_rest
        holds the tensors of torch_state.safetensors too, where the pickle
        says they are there (a checkpoint from before keeps them in it)."""
        found = []
        for name in (_TORCH_STATE_STAGED, _TORCH_STATE):
            p = os.path.join(path, name)
            if not os.path.exists(p):
                continue
            # Tensors and the caller's client state (Lightning's holds loops
            # and callbacks), so not weights-only.
            extra = torch.load(p, weights_only=False)
            if extra.get("step", step) == step:
                if "tensors_in" in extra:
                    extra["module_rest"] = {**_saved_tensors(path, step), **extra["module_rest"]}
                return extra
            found.append(f"{name} is of step {extra['step']}")
        if found:
            raise InvalidStateError(
                f"load_checkpoint: {path} holds zerod's state of step {step}, but " + " and ".join(found) +
                f": the buffers and client_state saved with step {step} are not there (files of another save "
                "copied in?); nothing was loaded")
        return None

    def close(self):
        """Removes the hooks and frees zerod's model. The torch parameters
        stay empty: take state_dict() first to keep the weights."""
        _LIVE_ENGINES.discard(self)
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.zerod_model.close()

    # -- checks ---------------------------------------------------------------

    def _require_usable(self):
        if self._broken:
            raise InvalidStateError(self._broken)
        if self.zerod_model._handle is None:
            raise InvalidStateError("this engine is closed")

    def _follow_stream(self):
        """On a GPU zerod orders its copies against the stream torch computes
        on: tell it when that changes (between micro-batches)."""
        if self.device.type != "cuda":
            return
        handle = torch.cuda.current_stream(self.device).cuda_stream
        if handle != self._stream:
            self.zerod_model.set_stream(handle)
            self._stream = handle

    def _require_between_steps(self, what):
        self._require_usable()
        if self._phase == "forward":
            # Only a forward ran (an evaluation with gradients enabled, or a
            # training forward left without its backward): nothing of it is
            # in zerod yet (its forwards are ended, no gradient arrived), so
            # it is dropped, and a backward() of its graph is refused.
            self._drop_forward(what)
        if self._phase != "idle":
            raise InvalidStateError(f"{what} in the middle of a micro-batch: call it after engine.step()")

    def _drop_forward(self, why):
        for g in self._groups:
            g.ran = False
        self._phase = "idle"
        self._dropped_by = why

    def _check_devices(self, args, kwargs):
        # Floating-point inputs only: torch itself wants some integer
        # tensors on the CPU whatever the model's device (the lengths of
        # pack_padded_sequence), and says so for token ids on the wrong one.
        for i, t in enumerate(_tensors(args, kwargs)):
            if t.is_floating_point() and t.device != self.device:
                raise InvalidArgumentError(
                    f"input tensor {i} is on {t.device}, but the model's parameters live on {self.device} "
                    f"(zerod's views): move the batch there first, e.g. batch.to('{self.device}'); or, to "
                    f"train on {t.device}, move the model there before initialize(), e.g. "
                    f"zerod.torch.initialize(model.to('{t.device}'), ...)")

    def _check_parameters(self):
        for s in self._slots:
            self._check_slot(s)
        for p in self.module.parameters():
            # A parameter without elements stays in torch (plan_modules).
            if id(p) not in self._slot_of and p.requires_grad and p.numel():
                name = next(n for n, q in self.module.named_parameters() if q is p)
                raise InvalidStateError(
                    f"parameter '{name}' was created (or unfrozen) after zerod.torch.initialize(): zerod "
                    "does not hold it, so it would never be trained. Build the whole model, then call "
                    "initialize()")

    def _check_slot(self, s):
        p = s.param
        if not s.ptr and not p.is_set_to(s.placeholder):
            # Module._apply (model.cuda(), .to(dtype), .half()) replaced the
            # parameter's data; torch then drops the AccumulateGrad node the
            # gradient hooks sit on (casting back does not restore it), so
            # gradients would pile up in p.grad and zerod step with zeros.
            raise InvalidStateError(
                f"parameter '{s.name}' was moved or cast (now {p.dtype} on {p.device}) after "
                f"zerod.torch.initialize(), which registered it as {s.placeholder.dtype} on "
                f"{s.placeholder.device}: zerod holds it there, and torch dropped the gradient hooks the engine "
                "set on it. Move or cast the model before initialize(), e.g. "
                "zerod.torch.initialize(model.cuda(), ...) or initialize(model, dtype=torch.bfloat16, ...)")
        if not p.requires_grad:
            raise InvalidStateError(
                f"parameter '{s.name}' was frozen (requires_grad=False) after zerod.torch.initialize(): zerod "
                "holds it and its optimizer would keep updating it (weight decay, momentum). To train without "
                "it, freeze it before initialize() (frozen parameters stay in torch)")

    # -- residency ------------------------------------------------------------

    def _view_tensor(self, s, cache):
        ptr = self._raw.data
        t = cache.get(ptr)
        if t is None:
            if len(cache) >= _CACHE_LIMIT:
                cache.clear()
            # Cached for every later forward and backward: never an
            # inference tensor (one made under torch.inference_mode() cannot
            # be saved for a backward, so every later training step would fail).
            with torch.inference_mode(False), _outside_dispatch_modes():
                t = cache[ptr] = torch_at(ptr, s.nbytes, s.zd_dtype, s.shape, self._raw.device_type,
                                          self._raw.device_id)
        return t, ptr

    def _make_resident(self, g):
        for s in g.slots:
            check(_lib.zd_param_view(self._h, s.pid, self._raw_ref))
            t, ptr = self._view_tensor(s, s.tensors)
            s.param.data = t
            s.ptr = ptr
            self._resident[ptr] = s

    def _release(self, g):
        for s in g.slots:
            self._resident.pop(s.ptr, None)
            s.ptr = 0
            s.param.data = s.placeholder

    def _pre_hook(self, g):
        """Routes what the module saves through zerod's hooks, begins its
        forward pair (a recomputation: _begin_recomputed) and leaves the call
        for the forward hook to undo."""
        if not _RECOMPUTE_IN_PAIRS:
            return self._pre_hook_torch1(g)

        def hook(module, inputs):
            routed, delegate = self._route_saved_tensors(g)
            try:
                counted = self._begin_recomputed(g, routed) if self._in_backward else self._begin_forward(g)
            except BaseException as e:
                self._pop_delegate(delegate)
                if self._in_backward:
                    self._hook_error = e
                raise
            self._calls.append(_Call(module, g, delegate, counted))
        return hook

    def _post_hook(self, g):
        """Undoes the pre-hook's call: also when the forward raised
        (always_call), as a checkpoint's recomputation does to stop early."""
        if not _RECOMPUTE_IN_PAIRS:
            return self._post_hook_torch1(g)

        def hook(module, inputs, output):
            call = self._calls[-1] if self._calls else None
            if call is None or call.module is not module:
                return None  # its pre-hook did not run: an earlier pre-hook raised
            self._calls.pop()
            self._pop_delegate(call.delegate)
            if self._learning_regions and not call.saved_own:
                self._region_end = g  # inside a checkpointed region: it saved nothing through zerod's own hooks
            try:
                return self._end_forward(g, output) if call.counted else None
            except BaseException as e:
                if self._in_backward:
                    self._hook_error = e
                raise
        return hook

    def _pre_hook_torch1(self, g):
        def hook(module, inputs):
            if self._in_backward:
                self._recompute_begin(g)
                return
            self._begin_forward(g)
        return hook

    def _post_hook_torch1(self, g):
        def hook(module, inputs, output):
            if self._in_backward:  # a recomputation: the module stays begun until its backward ends
                return None
            return self._end_forward(g, output)
        return hook

    def _begin_forward(self, g):
        """A forward pre-hook outside the backward: the module's outermost call
        begins its forward pair. Returns True: the call counts in g.depth."""
        if g.depth == 0:
            grad = torch.is_grad_enabled()
            if grad and not self._hooks_active:
                raise InvalidStateError(
                    f"module '{g.name}' ran outside the engine with gradients enabled: call engine(batch), "
                    "not the model (or evaluate under torch.no_grad())")
            check(_lib.zd_forward_begin(self._h, g.mid))
            self._make_resident(g)
            g.ran = g.ran or grad
        g.depth += 1
        return True

    def _begin_recomputed(self, g, routed):
        """A forward inside the backward: activation checkpointing recomputes
        the module (_RECOMPUTE_IN_PAIRS). Returns whether the call counts in
        g.depth.

        Everything the recomputation saves goes through zerod's hooks
        (`routed`), which keep views of parameters as where they sit, so it
        runs as a forward pair like the first forward: resident while it
        runs, released after (with the default leaf modules, one module of
        the region at a time, where staying begun until the backward held
        the whole region). The module that ended its checkpointed region in
        the forward has its backward next: it begins that backward now, one
        gather instead of a forward pair's and then a backward's (so a block
        checkpointed whole, modules=[Block], is gathered once, as before).
        Deciding from this micro-batch's forward keeps the calls the same in
        every micro-batch, which stage 3's prefetch follows (the first
        micro-batch's order is its record). Without routing (saved-tensor
        hooks off, as under torch.func) the module stays begun until its
        backward, as on torch 1.13."""
        if g.in_backward:
            return False  # its backward has begun: resident until it ends
        if g.depth == 0 and (g.ends_region or not routed):
            self._recompute_begin(g)
            return False
        if g.depth == 0:
            check(_lib.zd_forward_begin(self._h, g.mid))
            self._make_resident(g)
        g.depth += 1
        self._count_recomputed(g)
        return True

    def _end_forward(self, g, output):
        """A forward hook of a counted call: the outermost one ends the pair."""
        g.depth -= 1
        if g.depth:
            return None
        # An output that is a view of a parameter would outlive the
        # parameter's residency: hand out a copy instead.
        out = _map_tensors(output, self._copy_if_parameter)
        check(_lib.zd_forward_end(self._h, g.mid))
        self._release(g)
        return out if out is not output else None

    def _copy_if_parameter(self, t):
        if _storage_base(t) not in self._resident:
            return t
        with _outside_dispatch_modes():
            return t.clone()

    # -- saved-tensor hooks for recomputation in forward pairs -------------------

    def _saved_tensors_hooks_on_top(self):
        """The saved-tensor hooks on top of torch's stack, None when there are
        none or torch 1.13 cannot say."""
        if not _RECOMPUTE_IN_PAIRS or not torch._C._autograd._saved_tensors_hooks_is_enabled():
            return None
        return _top_saved_tensors_hooks()

    def _route_saved_tensors(self, g):
        """Makes what module g is about to save go through zerod's hooks.
        Returns (routed, the _Delegate pushed or None): zerod's own hooks on
        top route it as they are; other hooks (a checkpoint's) get a delegate
        over them. Nothing routes it where no hooks stand or torch has them
        off (torch.func's transforms refuse a push)."""
        top = self._saved_tensors_hooks_on_top()
        if top is None:
            return False, None
        if top[0] == self._pack:
            return True, None
        below = top
        mine = getattr(top[0], "__self__", None)
        if type(mine) is _Delegate and mine.engine is self:
            below = mine.below  # a module inside another's forward: one delegate, its own module
        delegate = _Delegate(self, g, below)
        torch._C._autograd._push_saved_tensors_default_hooks(_DelegatePack(delegate), delegate.unpack)
        return True, delegate

    def _pop_delegate(self, delegate):
        if delegate is None:
            return
        top = _top_saved_tensors_hooks()
        # Only its own pair: one a forward left above it is no module's to drop.
        if top is not None and getattr(top[0], "__self__", None) is delegate:
            torch._C._autograd._pop_saved_tensors_default_hooks()

    def _drop_calls(self, entry):
        """After an exception that skipped forward hooks (a KeyboardInterrupt:
        torch runs always_call hooks for an Exception only): forgets the
        module calls left open and pops the saved-tensor hooks left above
        `entry`, the pair on top when forward() or backward() began (a
        delegate, or zerod's own once the checkpoint's with-block popped the
        delegate in its place)."""
        self._calls.clear()
        if not _RECOMPUTE_IN_PAIRS:
            return
        while True:
            top = self._saved_tensors_hooks_on_top()
            if top is None or (entry is not None and top[0] is entry[0]):
                return
            torch._C._autograd._pop_saved_tensors_default_hooks()

    def _stand_in(self, t):
        """A tensor of t's shape, dtype and device without t's memory: one
        element, expanded."""
        key = (t.dtype, t.device)
        one = self._stand_ins.get(key)
        if one is None:
            with torch.inference_mode(False):
                one = self._stand_ins[key] = torch.empty((), dtype=t.dtype, device=t.device)
        with _outside_dispatch_modes():
            return one.expand(t.shape)

    # -- checkpointed regions, from the forward ------------------------------

    def _forget_regions(self):
        for g in self._groups:
            g.ends_region = False
        self._region_end = None

    def _saved_by_zerod(self):
        """zerod's own hooks take a tensor in a forward with gradients, so no
        checkpointed region is running here (inside one, the checkpoint's
        hooks take what is saved, through a delegate, or nothing is saved:
        the reentrant checkpoint's forward runs under no_grad). The module
        that ran last without saving through zerod's hooks ended a region."""
        if self._calls:
            self._calls[-1].saved_own = True
        self._close_region()

    def _close_region(self):
        if self._region_end is not None:
            self._region_end.ends_region = True
            self._region_end = None

    def _abort_forward(self):
        """After an exception in a forward: ends the modules it had begun
        (nothing was accumulated yet, so the model stays usable)."""
        for g in self._groups:
            if g.depth:
                g.depth = 0
                _lib.zd_forward_end(self._h, g.mid)
                self._release(g)

    # -- backward -------------------------------------------------------------

    def _backward_begin(self, g):
        if not self._in_backward:
            raise InvalidStateError(
                f"a backward reached module '{g.name}' outside engine.backward(): call engine.backward(loss), "
                "not loss.backward(), so zerod can collect the gradients. This backward has freed part of the "
                "forward's graph (without retain_graph=True): run the forward again")
        check(_lib.zd_backward_begin(self._h, g.mid))
        self._backward_began = True
        g.in_backward = True
        self._make_resident(g)
        for s in g.slots:
            check(_lib.zd_grad_view(self._h, s.pid, self._raw_ref))
            s.grad = self._view_tensor(s, s.grad_tensors)[0]

    def _recompute_begin(self, g):
        # A forward inside the backward is activation checkpointing running
        # the module again; here it begins the module's backward, which
        # keeps it resident through its backward (one backward pair, not a
        # forward pair of its own). On torch 1.13, and where zerod's hooks
        # cannot take what the recomputation saves, the checkpoint keeps
        # that (views of the parameters included) in its own saved-tensor
        # hooks, which stand before ours: it must stay valid until the
        # module's backward has used it. The recomputation may also stop
        # part way (torch's early stop raises out of the module), leaving no
        # forward to end.
        try:
            if not g.in_backward:
                self._backward_begin(g)
            self._count_recomputed(g)
        except BaseException as e:
            self._hook_error = e
            raise

    def _count_recomputed(self, g):
        if not g.ran and torch.is_grad_enabled():
            # The reentrant checkpoint (Hugging Face's default) ran the
            # first forward under no_grad, so backward() counted none of
            # the module's parameters; this recomputation's own backward
            # delivers their gradients: count them now, so the module
            # ends when they have arrived, not when backward() returns.
            g.ran = True
            g.pending = len(g.slots)

    def _backward_end(self, g):
        g.in_backward = False
        g.ended = True
        for s in g.slots:
            s.grad = None
        self._release(g)
        check(_lib.zd_backward_end(self._h, g.mid))

    # The hooks below run inside autograd, which turns anything they raise
    # (a ZerodError, Ctrl-C's KeyboardInterrupt) into a RuntimeError; they
    # keep it for forward() and backward() to raise as itself.

    def _grad_arriving(self, s):
        # Runs just before AccumulateGrad: the parameter must be resident
        # with its real shape for autograd to accumulate into param.grad.
        def hook(grad):
            try:
                if not s.group.in_backward:
                    self._backward_begin(s.group)
            except BaseException as e:
                self._hook_error = e
                raise
        return hook

    def _grad_arrived(self, s):
        # Runs after AccumulateGrad, once per backward with the sum of every
        # use of the parameter: move it into zerod's gradient view.
        def hook(grad_inputs, grad_outputs):
            try:
                p, g = s.param, s.group
                if p.grad is not None:
                    if s.grad is None:
                        self._backward_begin(g)
                    s.grad.add_(p.grad)
                    p.grad = None
                if g.pending:
                    g.pending -= 1
                    if not g.pending and g.in_backward:
                        self._backward_end(g)
            except BaseException as e:
                self._hook_error = e
                raise
        return hook

    # -- saved tensors --------------------------------------------------------

    def _pack(self, t):
        try:
            if self._learning_regions:
                self._saved_by_zerod()
            s = self._resident_slot(t)
            if s is not None:
                # A view of another dtype cannot be rebuilt from the parameter.
                return _Saved(s, t) if t.dtype == s.param.dtype else t.clone()
            if self._calls:  # a checkpoint inside this module saves its inputs here, among others
                return _Packed(t, self._calls[-1].group)
            return t
        except BaseException as e:
            self._hook_error = e
            raise

    def _unpack(self, x):
        try:
            kind = type(x)
            if kind is _Saved:
                return self._rebuild(x)
            if kind is _Packed:
                self._module_reached(x.group)
                return x.kept
            return x
        except BaseException as e:
            self._hook_error = e
            raise

    def _unpacked(self, x, got):
        """What a _Delegate's unpack returns, once the hooks below it gave
        `got` for x.kept."""
        try:
            if x.view is not None:
                return self._rebuild(x.view)
            self._module_reached(x.group)
            return got
        except BaseException as e:
            self._hook_error = e
            raise

    def _resident_slot(self, t):
        """The parameter whose resident view t is a view of, or None."""
        return self._resident.get(_storage_base(t)) if self._resident else None

    def _rebuild(self, saved):
        s = saved.slot
        if not s.ptr:
            self._backward_begin(s.group)
        with _outside_dispatch_modes():
            return s.param.data.as_strided(saved.size, saved.stride, saved.offset)

    def _module_reached(self, g):
        # A tensor that module g saved is unpacked: the backward has reached
        # g. Most of g's backward needs its parameters, and a checkpoint
        # inside g's forward (Block.forward calling checkpoint(self.mlp, x))
        # recomputes with them, touching no hook of zerod's but this one
        # (its inputs were saved here). Not when g is resident in a forward
        # pair, nor again once its gradients have all arrived.
        if self._in_backward and not g.in_backward and not g.ended and not g.depth:
            self._backward_begin(g)

    def _raise_hook_error(self, runtime_error=None):
        """Raises what a hook kept, if anything (called on a RuntimeError).
        Ctrl-C can also land in a hook before its try block starts, so that
        no hook kept it: autograd then reports "KeyboardInterrupt: ..." and
        it is raised as the KeyboardInterrupt it was."""
        error, self._hook_error = self._hook_error, None
        if error is not None:
            raise error from None
        if runtime_error is not None and str(runtime_error).startswith("KeyboardInterrupt"):
            raise KeyboardInterrupt() from None


def _manifest_step(path):
    """The step the checkpoint in `path` holds, from its manifest (text, a
    line "step N": docs/checkpoints.md), or None without one (zd_model_load
    then says what is wrong)."""
    try:
        with open(os.path.join(path, "zerod-checkpoint.txt")) as f:
            for line in f:
                if line.startswith("step "):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _fit_shape(key, value, shape, what="load_state_dict"):
    """`value` in the shape of a parameter zerod holds: as it is, or, for a
    0-dim parameter, from shape (1,), which its masters in zerod's
    checkpoints have (zerod registers it as (1,): initialize()) and which
    torch's own load_state_dict takes for a 0-dim parameter too. Refuses
    anything else (another shape, not a tensor), naming the key and `what`
    refuses it."""
    if not isinstance(value, torch.Tensor):
        raise InvalidArgumentError(f"{what}: '{key}' is a {type(value).__name__}, not a tensor")
    got = tuple(value.shape)
    if got == shape:
        return value
    if shape == () and got == (1,):
        return value.reshape(())
    raise InvalidArgumentError(f"{what}: '{key}' has shape {got}, the model's is {shape}")


def _check_rest_shape(key, value, current):
    """Refuses, before anything is loaded, a value for a tensor torch holds
    (a buffer, a frozen parameter) that torch's load_state_dict would refuse
    after zerod's parameters were written: another shape (a 0-dim one takes
    shape (1,), as torch takes it)."""
    if not (isinstance(value, torch.Tensor) and isinstance(current, torch.Tensor)) or \
            torch.nn.parameter.is_lazy(current):
        return
    got, want = tuple(value.shape), tuple(current.shape)
    if got != want and not (want == () and got == (1,)):
        raise InvalidArgumentError(f"load_state_dict: '{key}' has shape {got}, the model's is {want}")


def _checkpoint_path(load_dir, tag):
    """The checkpoint load_checkpoint reads: load_dir/<tag>; without a tag,
    the tag load_dir/latest names (save_checkpoint writes it), or load_dir
    itself where it is a checkpoint (a manifest, no latest: `zerod ckpt
    reshard --to` and zd_model_save write such a directory)."""
    if tag is not None:
        return os.path.join(load_dir, str(tag))
    latest = os.path.join(load_dir, "latest")
    if os.path.isfile(latest):
        with open(latest) as f:
            return os.path.join(load_dir, f.read().strip())
    if os.path.isfile(os.path.join(load_dir, _ckpt_masters.MANIFEST)):
        return load_dir
    raise ZerodIOError(f"load_checkpoint: no checkpoint at {load_dir}: it has no 'latest' file naming a tag "
                       f"(save_checkpoint writes one) and no {_ckpt_masters.MANIFEST} of its own; pass tag=, or "
                       "the checkpoint's own directory")


# What one rank tells the others of a failed save (_raise_if_rank0_failed).
_REASON_BYTES = 1024


def _write_safetensors_atomically(path, tensors, metadata):
    """{name: CPU tensor} as a safetensors file (its format written here:
    zerod.torch does not need the safetensors package), through a temporary
    file synced and renamed over `path`. Widest elements first, so each
    tensor's bytes start at a multiple of its element size (the format
    leaves no gaps between them)."""
    order = sorted(tensors, key=lambda k: -tensors[k].element_size())
    header, at = {"__metadata__": metadata}, 0
    for k in order:
        t = tensors[k]
        n = t.numel() * t.element_size()
        header[k] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [at, at + n]}
        at += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned

    def write(f):
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for k in order:
            t = tensors[k]
            if t.numel():
                f.write(t.reshape(-1).view(torch.uint8).numpy().tobytes())

    _replace_atomically(path, write)


def _safetensors_header(path):
    """(header dict, the offset its data starts at) of a safetensors file."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n)), 8 + n


def _saved_tensors(path, step):
    """{state_dict key: tensor} of the torch_state.safetensors in `path`
    (committed or staged) saved with zerod's state of `step`, aliases
    included; refuses, before anything is loaded, where neither is."""
    for name in (_TORCH_TENSORS_STAGED, _TORCH_TENSORS):
        p = os.path.join(path, name)
        if not os.path.exists(p):
            continue
        header, data_at = _safetensors_header(p)
        meta = header.pop("__metadata__", {})
        if meta.get("zerod_step") != str(step):
            continue
        out = {}
        with open(p, "rb") as f:
            for key, t in header.items():
                begin, end = t["data_offsets"]
                dtype = _ST_TORCH[t["dtype"]]
                f.seek(data_at + begin)
                raw = bytearray(f.read(end - begin))
                out[key] = (torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)) \
                    .reshape(t["shape"])
        for alias, key in json.loads(meta.get("zerod_aliases", "{}")).items():
            out[alias] = out[key]
        return out
    raise InvalidStateError(
        f"load_checkpoint: {path} holds zerod's state of step {step} and its {_TORCH_STATE}, but no "
        f"{_TORCH_TENSORS} of that step: the buffers and frozen parameters saved with it are not there (files "
        "of another save copied in?); nothing was loaded")


def _replace_atomically(path, write):
    """write(f) into a temporary file beside `path`, synced and renamed over
    it: `path` is the old file or the whole new one."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _write_atomically(path, obj):
    """torch.save(obj) to `path`, atomically (_replace_atomically)."""
    _replace_atomically(path, lambda f: torch.save(obj, f))


def _storage_base(t):
    """The address where t's storage begins (0 for tensors without one)."""
    try:
        return t.data_ptr() - t.storage_offset() * t.element_size()
    except RuntimeError:
        return 0


def _map_tensors(obj, fn):
    """obj with fn applied to its tensors (in tuples, lists and dicts); obj
    itself when nothing changed."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (tuple, list)):
        new = [_map_tensors(o, fn) for o in obj]
        if all(a is b for a, b in zip(new, obj)):
            return obj
        return type(obj)(*new) if hasattr(obj, "_fields") else type(obj)(new)
    if isinstance(obj, dict):
        new = {k: _map_tensors(v, fn) for k, v in obj.items()}
        return obj if all(new[k] is obj[k] for k in obj) else type(obj)(new)
    return obj


def _tensors(args, kwargs):
    found = []
    _map_tensors((tuple(args), dict(kwargs)), lambda t: found.append(t) or t)
    return found
