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
  each match one unit for its whole subtree. Units that share a Parameter
  (weight tying) are merged into one zerod module, resident whenever either
  runs.
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
- Recomputation. A forward inside the backward (activation checkpointing)
  begins the module's backward instead of a forward, so what the
  recomputation saves stays resident until the backward has used it. After
  a reentrant checkpoint's no_grad forward, the recomputation is what
  counts the module's parameters, so the module still ends early.
- The model's own state_dict() and load_state_dict() go through zerod
  (hooks on the model), as engine.state_dict() and load_state_dict() do.
"""
import ctypes
import os
import warnings
from collections import OrderedDict

import numpy as np
import torch

from . import _lib, default_client, name_job_for_node_daemon
from . import _ckpt_masters
from . import _structs as S
from ._modules import plan_modules
from .constants import Dtype, MemKind, Tier
from .errors import InvalidArgumentError, InvalidStateError, check
from .views import torch_at

__all__ = ["initialize", "Engine"]

_ZD_DTYPE = {torch.float32: Dtype.F32, torch.bfloat16: Dtype.BF16, torch.float16: Dtype.F16}
# Tensors cached per parameter and address; more than this many distinct
# addresses for one parameter means the pool is not reusing them: start over.
_CACHE_LIMIT = 8
# What torch holds outside zerod in a checkpoint (save_checkpoint), and the
# name it has until zerod's part of the save is whole.
_TORCH_STATE = "torch_state.pt"
# Engine._trainer_lr of a resumed model: zerod restored whatever lr was set.
_UNKNOWN_LR = object()
_TORCH_STATE_STAGED = "torch_state.next.pt"


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
              connects where the environment says (the daemon under
              `zerod run`, else embedded).
    job_name  the name errors give `job_text` (e.g. "ds_config.json").
    engine_class  the Engine subclass to make (the integrations' own).

    Every rank must call it with the same model structure; rank 0's initial
    values are used: of the trainable parameters, which zerod holds, and of
    the frozen parameters and buffers, which stay in torch and which rank 0
    sends to the others (as DDP does when it wraps a model).
    """
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
                zmodel.register_param(pname, group_name, tuple(p.shape) or (1,), _ZD_DTYPE[p.dtype],
                                      init=p.detach())
        zmodel.finalize()
        _broadcast_rest(model, {id(p) for _, _, params in plan for _, p in params}, client)
        return (engine_class or Engine)(model, zmodel, plan, device)
    except BaseException:
        zmodel.close()
        raise


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
            side = client.create_model(script_text=_BROADCAST_JOB, script_name="zerod.torch broadcast",
                                       device="cpu")
            try:
                pid = side.register_param(f"rest{k}", "rest", (buf.numel() // 4,), Dtype.F32,
                                          init=buf.view(torch.float32).numpy() if send else None)
                side.finalize()
                got = torch.from_numpy(side.param_read(pid, Dtype.F32)).view(torch.uint8)
            finally:
                side.close()
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

    __slots__ = ("name", "mid", "units", "slots", "depth", "in_backward", "ran", "pending")

    def __init__(self, name, mid, units):
        self.name, self.mid, self.units = name, mid, units
        self.slots = []
        self.depth = 0            # nesting of its forwards now running
        self.in_backward = False
        self.ran = False          # ran a forward with gradients in this micro-batch
        self.pending = 0          # parameters whose gradient has not arrived yet


class _Saved:
    """A saved tensor that is a view of a parameter, kept as where it sits."""

    __slots__ = ("slot", "size", "stride", "offset")

    def __init__(self, slot, t):
        self.slot, self.size, self.stride, self.offset = slot, t.size(), t.stride(), t.storage_offset()


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
                self._handles.append(u.register_forward_hook(self._post_hook(g)))
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
        self._hooks_active += 1
        self._hook_error = None
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                out = self.module(*args, **kwargs)
        except BaseException as e:
            self._abort_forward()
            if isinstance(e, RuntimeError):
                self._raise_hook_error(e)
            raise
        finally:
            self._hooks_active -= 1
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
        self._hook_error = None
        self._backward_began = False
        self._in_backward = True
        self._hooks_active += 1
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
        unexpected_keys."""
        self._require_between_steps("load_state_dict()")
        own = self.module.state_dict(keep_vars=True)
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        if strict and (missing or unexpected):
            raise InvalidArgumentError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        written = set()
        for key, current in own.items():
            s = self._slot_of.get(id(current))
            if key not in state_dict or s is None or s.pid in written:
                continue
            value = state_dict[key]
            if tuple(value.shape) != s.shape:
                raise InvalidArgumentError(f"load_state_dict: '{key}' has shape {tuple(value.shape)}, "
                                           f"the model's is {s.shape}")
            self.zerod_model.param_write(s.pid, value.detach().to(torch.float32))
            written.add(s.pid)
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
        for key, s in given:  # every shape first: a refusal changes nothing
            value = state_dict[key]
            if tuple(value.shape) != s.shape:
                raise InvalidArgumentError(f"load_state_dict: '{key[len(prefix):]}' has shape "
                                           f"{tuple(value.shape)}, the model's is {s.shape}")
        written = set()
        for key, s in given:
            if s.pid not in written:
                self.zerod_model.param_write(s.pid, state_dict[key].detach().to(torch.float32))
                written.add(s.pid)
            # What torch then copies into the (empty) parameter: nothing.
            state_dict[key] = s.placeholder

    def optimizer_state_dict(self):
        """The optimizer's state for a checkpoint: {"optimizer": name, "step":
        updates applied, "state": {parameter key: {slot name: tensor}}}, full
        fp32 values. Like state_dict(), every rank must call it when the state
        is partitioned (ZeRO stage >= 1 on several ranks)."""
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
        Adam restarts at zero."""
        self._require_between_steps("load_optimizer_state_dict()")
        info = self.zerod_model.optimizer_info()
        if state_dict.get("optimizer") != info.name:
            raise InvalidArgumentError(f"load_optimizer_state_dict: the checkpoint is of optimizer "
                                       f"'{state_dict.get('optimizer')}', this model runs '{info.name}'")
        own = self.module.state_dict(keep_vars=True)
        for key, slots in state_dict["state"].items():
            s = self._slot_of.get(id(own.get(key)))
            if s is None:
                raise InvalidArgumentError(f"load_optimizer_state_dict: '{key}' is not a parameter zerod holds")
            for i, name in enumerate(info.slot_names):
                if name not in slots:
                    raise InvalidArgumentError(f"load_optimizer_state_dict: '{key}' has no '{name}'")
                self.zerod_model.optimizer_state_write(s.pid, i, slots[name].detach().to(torch.float32))
        self.zerod_model.set_step(int(state_dict["step"]))

    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True):
        """DeepSpeed's: writes a checkpoint into save_dir/<tag> (default
        "global_step<N>") and names it in save_dir/latest. zerod writes the
        masters and optimizer state (each rank its shard, docs/checkpoints.md);
        rank 0 adds what torch holds outside zerod (buffers, frozen
        parameters) and client_state in torch_state.pt. Every rank calls it,
        between steps."""
        self._require_between_steps("save_checkpoint()")
        tag = str(tag) if tag is not None else f"global_step{self.global_steps}"
        path = os.path.join(os.fspath(save_dir), tag)
        step = self.zerod_model.optimizer_info().step
        if self.rank == 0:
            # Staged before zerod's save, whose manifest (renamed into place
            # last) is the commit: a save that fails or is killed before it
            # leaves no checkpoint, or in a reused directory (Lightning's
            # last.ckpt, Accelerate's save_state) the old one whole, and the
            # old torch_state.pt beside it. The step says which zerod state
            # each file belongs to (load_checkpoint picks by it).
            extra = {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v
                     for k, v in self.module.state_dict(keep_vars=True).items() if id(v) not in self._slot_of}
            os.makedirs(path, exist_ok=True)
            _write_atomically(os.path.join(path, _TORCH_STATE_STAGED),
                              {"module_rest": extra, "client_state": client_state or {}, "step": step})
        self.zerod_model.save(path)
        if self.rank == 0:
            os.replace(os.path.join(path, _TORCH_STATE_STAGED), os.path.join(path, _TORCH_STATE))
        if self.rank == 0 and save_latest:
            tmp = os.path.join(os.fspath(save_dir), "latest.tmp")
            with open(tmp, "w") as f:
                f.write(tag)
            os.replace(tmp, os.path.join(os.fspath(save_dir), "latest"))
        return True

    def load_checkpoint(self, load_dir, tag=None):
        """DeepSpeed's: loads load_dir/<tag> (default: what load_dir/latest
        names) and returns (its path, the client_state saved with it). It
        loads at any world size and ZeRO stage. Every rank calls it, between
        steps. A checkpoint that zd_model_save wrote without zerod.torch (C,
        Rust, a snapshot) has no torch_state.pt: the module's buffers and
        frozen parameters then keep their values (with a warning, where the
        module has any) and client_state is {}."""
        self._require_between_steps("load_checkpoint()")
        if tag is None:
            with open(os.path.join(os.fspath(load_dir), "latest")) as f:
                tag = f.read().strip()
        path = os.path.join(os.fspath(load_dir), str(tag))
        # Read and checked first: a refusal, like zd_model_load's, changes nothing.
        step = _manifest_step(path)
        extra = self._torch_state(path, step) if step is not None else None
        self.zerod_model.load(path)
        # zd_model_load restored the loss scale with the step: backward()
        # multiplies by it and zerod divides by its own, so they must agree.
        self._loss_scale = self.zerod_model.loss_scale()
        self.last_step = None
        self._resumed_step = self.zerod_model.optimizer_info().step
        # And the lr the trainer had set, if any (the manifest's lr line).
        self._trainer_lr = _ckpt_masters.read_manifest(path).lr
        own = self.module.state_dict(keep_vars=True)
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
        import) belongs to the directory's one checkpoint."""
        found = []
        for name in (_TORCH_STATE_STAGED, _TORCH_STATE):
            p = os.path.join(path, name)
            if not os.path.exists(p):
                continue
            # Tensors and the caller's client state (Lightning's holds loops
            # and callbacks), so not weights-only.
            extra = torch.load(p, weights_only=False)
            if extra.get("step", step) == step:
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
            if id(p) not in self._slot_of and p.requires_grad:
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
            with torch.inference_mode(False):
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
        def hook(module, inputs):
            if self._in_backward:
                self._recompute_begin(g)
                return
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
        return hook

    def _post_hook(self, g):
        def hook(module, inputs, output):
            if self._in_backward:  # a recomputation: the module stays begun until its backward ends
                return None
            g.depth -= 1
            if g.depth:
                return None
            # An output that is a view of a parameter would outlive the
            # parameter's residency: hand out a copy instead.
            out = _map_tensors(output, self._copy_if_parameter)
            check(_lib.zd_forward_end(self._h, g.mid))
            self._release(g)
            return out if out is not output else None
        return hook

    def _copy_if_parameter(self, t):
        return t.clone() if _storage_base(t) in self._resident else t

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
        # the module again. torch's non-reentrant checkpoint keeps what the
        # recomputation saves (views of the parameters included) in its own
        # saved-tensor hooks, which stand before ours: they must stay valid
        # until the module's backward has used them, so the module is
        # resident from here through its backward (one backward pair, not a
        # forward pair of its own). The recomputation may also stop part way
        # (torch's early stop raises out of the module), leaving no forward
        # to end.
        try:
            if not g.in_backward:
                self._backward_begin(g)
            if not g.ran and torch.is_grad_enabled():
                # The reentrant checkpoint (Hugging Face's default) ran the
                # first forward under no_grad, so backward() counted none of
                # the module's parameters; this recomputation's own backward
                # delivers their gradients: count them now, so the module
                # ends when they have arrived, not when backward() returns.
                g.ran = True
                g.pending = len(g.slots)
        except BaseException as e:
            self._hook_error = e
            raise

    def _backward_end(self, g):
        g.in_backward = False
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
            if self._resident:
                s = self._resident.get(_storage_base(t))
                if s is not None:
                    # A view of another dtype cannot be rebuilt from the parameter.
                    return _Saved(s, t) if t.dtype == s.param.dtype else t.clone()
            return t
        except BaseException as e:
            self._hook_error = e
            raise

    def _unpack(self, x):
        try:
            if type(x) is not _Saved:
                return x
            s = x.slot
            if not s.ptr:
                self._backward_begin(s.group)
            return s.param.data.as_strided(x.size, x.stride, x.offset)
        except BaseException as e:
            self._hook_error = e
            raise

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


def _write_atomically(path, obj):
    """torch.save(obj) to `path` through a temporary file beside it, synced
    and renamed over it: `path` is the old file or the whole new one."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


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
