"""DeepSpeed's API over zerod: a DeepSpeed training script runs on zerod with
its import changed.

    import zerod.deepspeed as deepspeed          # was: import deepspeed
    engine, optimizer, loader, scheduler = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config="ds_config.json", training_data=dataset)
    for x, y in loader:
        loss = loss_fn(engine(x), y)
        engine.backward(loss)
        engine.step()                             # every micro-batch, as with DeepSpeed

The config is translated by zerod's own translation (`zerod translate`):
what it cannot run is refused naming the key; keys that only tune
DeepSpeed's internals are accepted and ignored (docs/integrations.md). A
torch optimizer or LR scheduler given to initialize() is translated too
(Adam, AdamW, SGD; any step-based scheduler), or refused naming what zerod
lacks. Under `zerod run` each rank is a DeepSpeed rank: the same script runs
unchanged on several ranks.
"""
import operator
import os
import sys
import warnings

import torch

from . import _ckpt_masters, _dsconfig, _schedules, default_client
from ._schedules import one_lr
from . import torch as _zt
from .errors import ConfigError, InvalidArgumentError, InvalidStateError, ShapeMismatchError

__all__ = ["initialize", "DeepSpeedEngine", "init_distributed", "add_config_arguments", "zero"]

# The names the translation's errors give the resolved config: the job's
# name where the job is the JSON, and zerod.deepspeed()'s own (zerod_lib.cpp)
# inside the Lua job that adds a traced lr schedule.
_JSON_JOB, _LUA_JOB, _CONFIG_IN_LUA = "ds_config.json", "ds_job.lua", "the DeepSpeed config"


def init_distributed(*args, **kwargs):
    """DeepSpeed's: zerod's ranks are connected by the daemon already."""
    return None


def add_config_arguments(parser):
    """DeepSpeed's: --deepspeed, --deepspeed_config (read by initialize(args=...))."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations (zerod.deepspeed)")
    group.add_argument("--deepspeed", default=False, action="store_true", help="Enable DeepSpeed (zerod)")
    group.add_argument("--deepspeed_config", default=None, type=str, help="DeepSpeed json configuration file.")
    return parser


class _ZeroNamespace:
    """deepspeed.zero: Init() is accepted and does nothing (zerod partitions
    the parameters when initialize() registers them; the model is built
    whole on each rank first)."""

    class Init:
        def __init__(self, module=None, *args, enabled=True, **kwargs):
            self.module = module

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    @staticmethod
    def GatheredParameters(*args, **kwargs):
        raise InvalidArgumentError(
            "deepspeed.zero.GatheredParameters is not supported by zerod: read full values with "
            "engine.state_dict(), write them with engine.load_state_dict()")


zero = _ZeroNamespace()


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None,
               lr_scheduler=None, distributed_port=None, mpu=None, dist_init_required=None, collate_fn=None,
               config=None, mesh_param=None, config_params=None, *, modules=None, client=None, param_dtype=None,
               lr_steps=None, _placement="deepspeed"):
    """DeepSpeed's initialize(): returns (engine, optimizer, training_dataloader,
    lr_scheduler). zerod's own keywords: `modules` chooses the zerod modules,
    as in zerod.torch.initialize; `param_dtype` is the type the model's
    parameters are registered in (default: float16 with fp16 enabled,
    bfloat16 with bf16, else as they are). torch.float32 with fp16 enabled is
    autocast's mixed precision: fp32 parameters, zerod's loss scaling (what
    Lightning's "16-mixed" and Accelerate's "fp16" run on). `lr_steps` is
    how many updates the run has, for a torch lr_scheduler without a length
    of its own (LambdaLR, ExponentialLR, ...): zerod traces its lr that far
    (default 50,000, with a warning) and keeps the last value after.
    `_placement` is the integrations' (zerod.lightning, zerod.accelerate,
    zerod.transformers): None where they placed the model themselves, a
    torch.device where it is to go; a script's call places it as DeepSpeed
    does (_place_as_deepspeed)."""
    if model is None:
        raise InvalidArgumentError("initialize: model is required")
    if mpu is not None or mesh_param is not None:
        raise InvalidArgumentError("initialize: model parallelism (mpu, mesh_param) is not supported by zerod; "
                                   "it partitions data-parallel state only")
    if config is None:
        config = config_params
    if config is None and args is not None:
        config = getattr(args, "deepspeed_config", None)
    cfg = _dsconfig.load(config)
    client = client or default_client()
    world = client.world_size

    trainable = [p for p in model.parameters() if p.requires_grad]
    if model_parameters is not None:
        model_parameters = list(model_parameters)
        # With an optimizer given, its own groups are checked (a callable's
        # are made from these); without, the config's section takes them,
        # and what they set overrides the section's, as in DeepSpeed.
        agreed = _check_model_parameters(model, trainable, model_parameters,
                                         None if optimizer is not None else _dsconfig.optimizer_defaults(cfg))
        if agreed:
            _dsconfig.take_param_groups(cfg, agreed, "model_parameters")

    torch_opt = None
    if optimizer is not None:
        if "optimizer" in cfg:
            raise InvalidArgumentError("initialize: both an optimizer and a config \"optimizer\" section were given; "
                                       "give one")
        torch_opt = optimizer if isinstance(optimizer, torch.optim.Optimizer) else \
            optimizer(model_parameters if model_parameters is not None else trainable)
        _check_optimizer_parameters(model, torch_opt)
        cfg["optimizer"] = _dsconfig.optimizer_section(torch_opt)
    # A script's own call hands its torch optimizer to DeepSpeed, whose
    # optimizer then steps with that object's param_groups: zerod follows what
    # the script writes there (_Optimizer). The integrations (_placement
    # theirs) read their torch optimizer's groups themselves.
    scripts_optimizer = torch_opt if optimizer is not None and _placement == "deepspeed" else None
    if scripts_optimizer is not None:
        refuse_cycled_momentum(scripts_optimizer, "zerod.deepspeed", "initialize()")
    lr_values = None
    if lr_scheduler is not None:
        if "scheduler" in cfg:
            raise InvalidArgumentError("initialize: both an lr_scheduler and a config \"scheduler\" section were "
                                       "given; give one")
        if not isinstance(lr_scheduler, (torch.optim.lr_scheduler.LRScheduler, _schedules.Stepped)):
            if torch_opt is None:
                torch_opt = _stand_in_optimizer(cfg)
            lr_scheduler = lr_scheduler(torch_opt)
        lr_values = _schedules.trace(lr_scheduler, steps=lr_steps)

    opt_params = cfg.get("optimizer", {}).get("params", {}) if isinstance(cfg.get("optimizer"), dict) else {}
    micro = getattr(training_data, "batch_size", None)
    _dsconfig.resolve(cfg, world_size=world, model=model, micro_batch=micro,
                      lr=opt_params.get("lr") if not _dsconfig._is_auto(opt_params.get("lr")) else None)
    dtype = torch.float16 if _enabled(cfg, "fp16") else torch.bfloat16 if _enabled(cfg, "bf16") else None
    if param_dtype is not None:
        if param_dtype not in (torch.float32, dtype):
            raise InvalidArgumentError(f"initialize: param_dtype={param_dtype} with this config's precision "
                                       f"({dtype or torch.float32}); parameters are registered in it or in float32")
        dtype = param_dtype
    if _placement == "deepspeed":
        _place_as_deepspeed(model, client)
    elif _placement is not None:
        _place_on(model, torch.device(_placement))
    text = _dsconfig.job_text(cfg, _schedules.lua_table(lr_values) if lr_values else None)
    data_before = {id(p): p.data for p in model.parameters()}
    try:
        engine = _zt.initialize(model, job_text=text, job_name=_JSON_JOB if lr_values is None else _LUA_JOB,
                                modules=modules, dtype=dtype, client=client, engine_class=DeepSpeedEngine)
    except ConfigError as e:
        # The translation read the resolved config zerod wrote; its lines
        # are moved to where the user wrote each key, as `zerod check` says.
        where = _dsconfig.located(e.message, (_JSON_JOB, _CONFIG_IN_LUA), *_dsconfig.source_of(config))
        if where == e.message:
            raise
        raise ConfigError(where) from None
    try:
        engine._configure(cfg, lr_values, collate_fn, scripts_optimizer)
        loader = None
        if training_data is not None:
            loader = engine.deepspeed_io(training_data)
    except BaseException:
        _close_and_give_back(engine, data_before)
        raise
    return engine, engine.optimizer, loader, engine.lr_scheduler


def _close_and_give_back(engine, data):
    """The engine closed, and the model's parameters given the tensors in
    `data` (by id), where the engine had swapped them for empty ones: the
    ones they held before (an engine initialize() cannot return: the model
    is as initialize() found it), or the trained values (destroy()). The
    model is then whole, to use or to initialize again; a parameter `data`
    lacks stays empty (destroy() that could not read the weights)."""
    try:
        engine.close()
    finally:
        for s in engine._slots:
            if id(s.param) in data:
                s.param.data = data[id(s.param)]


def _place_as_deepspeed(model, client):
    """DeepSpeed's engine moves the model to its rank's GPU itself (a script
    written for it never calls model.cuda()); so does this, where torch sees
    a GPU and the model is all on the CPU: GPU local_rank modulo the GPUs,
    the one the daemon serves the rank on (docs/devices.md), made current.
    DS_ACCELERATOR=cpu keeps it on the CPU, as it keeps DeepSpeed there; a
    model the script placed itself stays where it is."""
    if os.environ.get("DS_ACCELERATOR", "").lower() == "cpu" or not torch.cuda.is_available():
        return
    _place_on(model, torch.device("cuda", client.info.local_rank % torch.cuda.device_count()))


def _place_on(model, device):
    """A model all on the CPU to `device` (a GPU made current); else as it is."""
    tensors = list(model.parameters()) + list(model.buffers())
    if device.type != "cuda" or not tensors or any(t.device.type != "cpu" for t in tensors):
        return
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    model.to(device)


def _stand_in_optimizer(cfg):
    """What an lr_scheduler callable is built on when the config's "optimizer"
    section is the optimizer: DeepSpeed hands it the optimizer it made from
    that section (Hugging Face's Trainer does this with a config that has an
    "optimizer" but no "scheduler"). A scheduler reads only the lr of its
    groups, so a torch optimizer of one placeholder parameter at the section's
    lr stands in; zerod traces the schedule on it."""
    opt = cfg.get("optimizer")
    lr = opt.get("params", {}).get("lr", 1e-3) if isinstance(opt, dict) else None
    if lr is None or _dsconfig._is_auto(lr):
        raise InvalidArgumentError("initialize: an lr_scheduler callable needs the optimizer it schedules: give "
                                   "optimizer= too, or a config \"optimizer\" section with its lr")
    return torch.optim.SGD([torch.zeros(1)], lr=float(lr))


def _enabled(cfg, section):
    s = cfg.get(section)
    return isinstance(s, dict) and bool(s.get("enabled"))


def _check_model_parameters(model, trainable, given, defaults):
    """zerod trains every parameter with requires_grad: model_parameters must
    be exactly those, with one group's worth of hyperparameters where they
    configure the optimizer (`defaults`: what a key a group leaves out is;
    None where they do not). The model's frozen parameters among them
    (model.parameters() with part of the model frozen) are left out first,
    as DeepSpeed's optimizer leaves them: they never have a gradient.
    Returns the hyperparameters the groups agree on where they configure
    the optimizer (check_param_groups'), else None."""
    names = {id(p): n for n, p in model.named_parameters()}
    agreed = None

    def trained(params):
        return [p for p in _tensors_of(params) if getattr(p, "requires_grad", True) or id(p) not in names]
    if given and isinstance(given[0], dict):
        given = [dict(g, params=trained(g["params"] if isinstance(g["params"], (list, tuple)) else
                                        [g["params"]] if isinstance(g["params"], torch.Tensor) else
                                        list(g["params"])))
                 for g in given]
        given = [g for g in given if g["params"]]
        if defaults is not None and given:
            agreed = _dsconfig.check_param_groups(given, "model_parameters", defaults)
        given = [p for g in given for p in g["params"]]
    else:
        given = trained(given)
    want, got = {id(p) for p in trainable}, {id(p): p for p in given}
    for pid in want - set(got):
        raise InvalidArgumentError(
            f"initialize: model_parameters leaves out '{names[pid]}', which requires grad; zerod trains every "
            "parameter with requires_grad=True (freeze it with requires_grad_(False) instead)")
    for pid in set(got) - want:
        what = (f"'{names[pid]}'" if pid in names else
                f"a parameter of shape {tuple(got[pid].shape)} that is not the model's")
        raise InvalidArgumentError(f"initialize: model_parameters holds {what}, which is not a trainable parameter "
                                   "of the model (zerod trains the model's own parameters only)")
    return agreed


def _tensors_of(params):
    """The parameters of a list model_parameters gives, flat or as a group's
    "params": tensors, or (name, tensor) pairs as model.named_parameters()
    yields them, which DeepSpeed 0.19 hands to its torch optimizer and
    torch >= 2.6 takes (keeping the names as the group's param_names)."""
    return [p[1] if _is_named(p) else p for p in params]


def _is_named(entry):
    return isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str)


def _check_optimizer_parameters(model, optimizer):
    """zerod trains every parameter with requires_grad=True. A torch
    optimizer given without model_parameters (Accelerate's prepare,
    Lightning's configure_optimizers, a script's initialize(optimizer=...))
    that leaves some of them out would have them left as they are under
    torch and DeepSpeed (its step never reaches them) and trained here:
    refused, naming them. Freezing them is the same training with less work
    (no gradient is computed for them). Parameters the optimizer holds that
    are not the model's are refused too: nothing would ever update them."""
    held = [p for g in optimizer.param_groups for p in g["params"]]
    ours = {id(p) for p in model.parameters()}
    extra = [p for p in {id(p): p for p in held}.values() if id(p) not in ours]
    if extra:
        # A learnable loss temperature, a second model's weights: zerod holds
        # the model's parameters and applies the update itself, so these
        # would keep their values (DeepSpeed would train them).
        shapes = ", ".join(str(tuple(p.shape)) for p in extra[:4]) + \
            (f" and {len(extra) - 4} more" if len(extra) > 4 else "")
        raise InvalidArgumentError(
            f"initialize: the optimizer holds {len(extra)} parameter(s) that are not the model's (shapes {shapes}). "
            "zerod trains the parameters of the model it is given (it holds them and applies the update), so "
            "these would never be updated: make them part of the model (an nn.Parameter attribute of it or of "
            "one of its submodules, so that model.parameters() yields them), or leave them out of the optimizer")
    held = {id(p) for p in held}
    left = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in held]
    if left:
        shown = ", ".join(f"'{n}'" for n in left[:4]) + (f" and {len(left) - 4} more" if len(left) > 4 else "")
        raise InvalidArgumentError(
            f"initialize: the optimizer leaves out {len(left)} parameter(s) that require grad ({shown}). torch "
            "and DeepSpeed would never update them, but zerod trains every parameter with requires_grad=True: "
            "freeze them with requires_grad_(False) (e.g. the module's .requires_grad_(False)) before this "
            "call, or give them to the optimizer")


class DeepSpeedEngine(_zt.Engine):
    """zerod.torch's Engine with DeepSpeed's DeepSpeedEngine methods."""

    def _configure(self, cfg, lr_values, collate_fn=None, scripts_optimizer=None):
        self.config = cfg
        # DeepSpeed's: initialize()'s collate_fn, what deepspeed_io() batches
        # with where it is given none.
        self.collate_fn = collate_fn
        self._lr_values = lr_values
        self._micro_steps = 0
        self.skipped_steps = 0
        self._grad_norm = None  # the last window's (get_global_grad_norm)
        # DeepSpeed's counters beyond zerod's own: a checkpoint loaded without
        # its optimizer state brings its global_steps and global_samples but
        # leaves zerod's update count (the optimizer's and the schedule's) as
        # it was; and global_samples counts the batch size each step had.
        self._steps_offset = 0
        self._samples_offset = 0
        opt = cfg.get("optimizer") if isinstance(cfg.get("optimizer"), dict) else {}
        self._lr_of = ((lambda t: lr_values[min(t, len(lr_values) - 1)]) if lr_values
                       else _dsconfig.lr_schedule(cfg))
        self.lr_scheduler = _Scheduler(self) if (lr_values or cfg.get("scheduler")) else None
        self.optimizer = _Optimizer(self, opt.get("type", "AdamW"), _dsconfig.optimizer_defaults(cfg),
                                    scripts_optimizer)

    # -- DeepSpeed's calls ------------------------------------------------------

    def backward(self, loss, retain_graph=False, scale_wrt_gas=True, **kwargs):
        """DeepSpeed's: the micro-batch's loss. zerod averages the window's
        micro-batches itself, as DeepSpeed does by scaling with 1/GAS. With
        scale_wrt_gas=False the caller has scaled the loss for the window
        already (Hugging Face's Trainer does) and DeepSpeed sums the window's
        gradients: zerod's average of GAS times each loss is that sum."""
        self.optimizer.check_unwritten()
        gas = 1 if scale_wrt_gas else self.gradient_accumulation_steps()
        super().backward(loss * gas if gas != 1 else loss, retain_graph=retain_graph)
        # DeepSpeed returns the loss as it scaled it for the window.
        return loss / self.gradient_accumulation_steps() if scale_wrt_gas else loss

    def parameters(self, recurse=True):
        """The module's (DeepSpeed's engine is the module's nn.Module wrapper).
        Outside their module's forward zerod's parameters are empty tensors."""
        return self.module.parameters(recurse)

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        return self.module.named_parameters(prefix, recurse, remove_duplicate)

    def compile(self, backend=None, compile_kwargs=None, schedule=None, compiled_autograd_enabled=False):
        """DeepSpeed's: compiles the module in place (torch's
        nn.Module.compile, as DeepSpeed's engine does), which forward()
        then calls; Accelerate calls it for TrainingArguments(torch_compile=
        True) and a dynamo backend. zerod's hooks stay outside what the
        compiler traces as they stand outside the module. `backend` None is
        torch.compile's default; DeepCompile (a schedule, compiled autograd)
        is refused."""
        if schedule is not None or compiled_autograd_enabled:
            raise InvalidArgumentError("DeepSpeedEngine.compile: DeepCompile (schedule=, compiled_autograd_enabled=) "
                                       "is not supported by zerod; torch.compile of the module is")
        if not hasattr(torch.nn.Module, "compile"):
            raise RuntimeError("compile is not supported in your version of PyTorch.")
        if self.is_compiled:
            return
        kwargs = dict(compile_kwargs or {})
        if backend is not None:
            kwargs["backend"] = backend
        self.module.compile(**kwargs)
        self._is_compiled = True

    @property
    def is_compiled(self):
        """DeepSpeed's: whether compile() ran."""
        return self.__dict__.get("_is_compiled", False)

    def step(self, lr_kwargs=None):
        self.optimizer.check_unwritten()
        r = super().step()
        self._micro_steps += 1
        if r.skipped:
            self.skipped_steps += 1
        if r.boundary:
            self._grad_norm = r.grad_norm
            self._after_boundary(r)
            self.optimizer.show_next_lr()
        return r

    def _after_boundary(self, r):
        """The lr of the next update, where a script wrote one."""
        if self._trainer_lr is _zt._UNKNOWN_LR:
            # A resumed model (a snapshot, a kept model) restored whatever lr
            # had been set: the update says which, so get_lr() says it too.
            scheduled = self._lr_of(r.step - 1 if r.applied else r.step)
            self._trainer_lr = None if _same(r.lr, scheduled) else r.lr
        elif r.applied and self.lr_scheduler is not None and self.optimizer.lr_written:
            # Under a schedule DeepSpeed's scheduler steps after the update
            # and writes its lr over the one the script wrote into
            # param_groups, which so applied to that update only: the next
            # takes the schedule's (set, as zerod holds a set lr until the
            # next).
            self.set_lr(self._lr_of(self.applied_steps))

    def is_gradient_accumulation_boundary(self):
        """True when the next step() ends an accumulation window."""
        return (self._micro_steps + 1) % self.gradient_accumulation_steps() == 0

    def set_gradient_accumulation_boundary(self, is_boundary):
        """DeepSpeed's override of where a window ends, accepted where it says
        what zerod's count says: zerod ends a window at every
        gradient_accumulation_steps-th step(), one step() per micro-batch,
        so `is_boundary` must be is_gradient_accumulation_boundary().
        DeepSpeed's other use of it (backward() on every micro-batch of a
        window and one step() at its end) is refused: zerod's step() ends
        each micro-batch."""
        want = self.is_gradient_accumulation_boundary()
        if bool(is_boundary) != want:
            gas = self.gradient_accumulation_steps()
            raise InvalidStateError(
                f"set_gradient_accumulation_boundary({is_boundary!r}) before micro-batch "
                f"{self._micro_steps % gas + 1} of an accumulation window of {gas}, whose step() "
                f"{'ends' if want else 'does not end'} the window: zerod ends a window at the step() of its "
                f"last micro-batch (gradient_accumulation_steps={gas}), and step() comes after every micro-batch's "
                "backward(); a window of several backward() calls and one step() is not supported. Call backward() "
                "and step() on every micro-batch and drop set_gradient_accumulation_boundary()")

    def no_sync(self):
        """DeepSpeed's context that skips the gradient all-reduce of the
        backward() calls inside it (ZeRO 0-1, accumulating by hand): refused,
        zerod accumulates a window's gradients and reduces them itself."""
        raise InvalidArgumentError(
            "engine.no_sync() is not supported by zerod: zerod accumulates the gradients of an accumulation "
            "window's micro-batches itself and decides when they are reduced across ranks, so there is no "
            "per-backward reduction to turn off. Accumulate with gradient_accumulation_steps in the config and call "
            "backward() and step() on every micro-batch (zerod applies the update at the window's last step())")

    def save_16bit_model(self, save_dir, save_filename="pytorch_model.bin", exclude_frozen_parameters=False):
        """DeepSpeed's: torch.save of the module's state_dict into
        save_dir/save_filename, each parameter zerod holds in the type the
        module's parameters have (16-bit with fp16 or bf16 enabled, as
        DeepSpeed's module holds them; float32 otherwise), buffers as they
        are, on the CPU; with exclude_frozen_parameters the frozen
        parameters left out. At every ZeRO stage (DeepSpeed's stage 3 writes
        it only with stage3_gather_16bit_weights_on_model_save and returns
        False otherwise). Every rank calls it (the reads are collectives);
        rank 0 writes. Returns True."""
        state = self.state_dict()  # collective: before anything that may differ between ranks
        own = self.module.state_dict(keep_vars=True)
        frozen = {n for n, p in self.module.named_parameters() if not p.requires_grad} \
            if exclude_frozen_parameters else set()
        out, cast = {}, {}
        for key, value in state.items():
            if key in frozen:
                continue
            s = self._slot_of.get(id(own.get(key)))
            if s is not None:
                # One tensor per zerod parameter: tied keys stay one tensor, as in DeepSpeed's file.
                if s.pid not in cast:
                    cast[s.pid] = value.to(s.param.dtype)
                value = cast[s.pid]
            elif isinstance(value, torch.Tensor):
                value = value.detach().cpu()
            out[key] = value
        if self.rank == 0:
            os.makedirs(os.fspath(save_dir), exist_ok=True)
            torch.save(out, os.path.join(os.fspath(save_dir), save_filename))
        return True

    def save_fp16_model(self, save_dir, save_filename="pytorch_model.bin"):
        """DeepSpeed's older name of save_16bit_model."""
        return self.save_16bit_model(save_dir, save_filename)

    def __getattr__(self, name):
        """DeepSpeed's: an attribute the engine does not have is the module's
        (engine.generate, engine.gradient_checkpointing_enable(), ...). Only
        called where ordinary lookup failed; the module is read from the
        instance's own dict, so an engine not yet set up (or being copied)
        answers AttributeError instead of recursing."""
        module = self.__dict__.get("module") if not (name.startswith("__") and name.endswith("__")) else None
        if module is not None:
            try:
                return getattr(module, name)
            except AttributeError:
                pass
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def gradient_accumulation_steps(self):
        return int(self.config["gradient_accumulation_steps"])

    def train_micro_batch_size_per_gpu(self):
        return int(self.config["train_micro_batch_size_per_gpu"])

    def train_batch_size(self):
        return int(self.config["train_batch_size"])

    def zero_optimization_stage(self):
        z = self.config.get("zero_optimization")
        return int(z.get("stage", 0)) if isinstance(z, dict) else 0

    @property
    def global_steps(self):
        """DeepSpeed's: optimizer steps taken, an fp16 step skipped for an
        overflow included (DeepSpeed counts it; the lr schedule and the
        optimizer's own count do not: applied_steps)."""
        # (0 while the base class sets up)
        return self.applied_steps + self.__dict__.get("skipped_steps", 0) + self.__dict__.get("_steps_offset", 0)

    @property
    def applied_steps(self):
        """Updates applied (what the lr schedule and bias correction follow)."""
        return super().global_steps

    @property
    def global_samples(self):
        return self.global_steps * self.train_batch_size() + self._samples_offset

    @property
    def micro_steps(self):
        return self._micro_steps

    @property
    def global_rank(self):
        return self.rank

    @property
    def local_rank(self):
        return self.zerod_model.client.info.local_rank

    @property
    def dp_world_size(self):
        return self.world_size

    def get_lr(self):
        """[lr]: the lr of the next update, as DeepSpeed's (its scheduler has
        stepped past the update just applied): the schedule's, or the one
        written into optimizer.param_groups (set_lr) once one was."""
        if isinstance(self._trainer_lr, float):
            return [self._trainer_lr]
        return [self._lr_of(self.applied_steps)]

    def get_global_grad_norm(self):
        """DeepSpeed's: the gradient norm of the last window's update (None
        before the first), unchanged by the micro-batches of the next
        window until its last."""
        return self._grad_norm

    def was_step_applied(self):
        return bool(self.last_step and self.last_step.applied)

    @property
    def cur_scale(self):
        return self.last_step.loss_scale if self.last_step else self.zerod_model.loss_scale()

    def zero_grad(self):
        """DeepSpeed's: zerod starts every window's gradients at zero itself."""

    def destroy(self):
        """DeepSpeed's: ends the engine, and the model keeps the trained
        weights (DeepSpeed's module holds them all along), in the type and on
        the device its parameters had: to save with model.state_dict(), to
        run, or to initialize again. Every rank calls it (the reads are
        collectives). They are read one parameter at a time: beyond the model
        itself, one full fp32 master is held at once (at stage 3 each rank
        then holds the whole model, where DeepSpeed's destroy leaves the
        parameters partitioned: docs/integrations.md).

        The engine is closed whatever happens. Where the weights cannot be
        read (in the middle of a micro-batch, a broken engine, a failed read,
        or an exception in flight on several ranks, whose peers may never
        join the reads) the parameters are left empty with a warning instead
        of raising: `finally: engine.destroy()` must not hide the exception
        that brought it there. A second call does nothing."""
        if self.zerod_model._handle is None:
            return
        trained, why = {}, self._why_the_weights_stay_behind()
        try:
            if why is None:
                trained = self._trained_weights()
        except Exception as e:
            why = f"reading them failed ({type(e).__name__}: {e})"
        finally:
            _close_and_give_back(self, trained)
        if why is not None:
            warnings.warn(f"destroy(): the trained weights could not be read back from zerod ({why}); the model's "
                          f"{len(self._slots)} parameter(s) zerod held are left empty (0 elements): load them from "
                          "a checkpoint", RuntimeWarning, stacklevel=2)

    def _why_the_weights_stay_behind(self):
        """Why destroy() cannot read the trained weights, or None when it can."""
        if self._broken:
            return self._broken
        if self._phase == "forward":
            self._drop_forward("destroy()")  # nothing of a lone forward is in zerod yet
        if self._phase != "idle":
            return "destroy() came in the middle of a micro-batch: a backward() without its step()"
        if sys.exc_info()[1] is not None and self.world_size > 1:
            return "an exception is in flight, and reading them would wait for the other ranks"
        return None

    def _trained_weights(self):
        """{id(parameter): its trained value in the parameter's own type and
        device}, converted as each is read, so that no more than one full
        fp32 master is held at once (tied parameters share one value)."""
        by_pid, out = {}, {}
        for s in self._slots:
            if s.pid not in by_pid:
                by_pid[s.pid] = self._full_value(s, {}).to(device=s.placeholder.device, dtype=s.placeholder.dtype)
            out[id(s.param)] = by_pid[s.pid]
        return out

    def dataloader_drop_last(self):
        """DeepSpeed's: the config's dataloader_drop_last (default false)."""
        return bool(self.config.get("dataloader_drop_last", False))

    def deepspeed_io(self, dataset, batch_size=None, route="train", pin_memory=True, data_sampler=None,
                     collate_fn=None, num_local_io_workers=None):
        """DeepSpeed's: a DataLoader of this rank's share (a DistributedSampler
        over the ranks, shuffled as DeepSpeed's is for route "train", in
        order for "eval" and "predict"), batched with `collate_fn`, else
        initialize()'s, and dropping a last short batch where the config's
        dataloader_drop_last says so."""
        if data_sampler is None:
            data_sampler = torch.utils.data.distributed.DistributedSampler(
                dataset, num_replicas=self.world_size, rank=self.rank, shuffle=route not in ("eval", "predict"))
        return torch.utils.data.DataLoader(dataset, batch_size=batch_size or self.train_micro_batch_size_per_gpu(),
                                           sampler=data_sampler,
                                           collate_fn=collate_fn if collate_fn is not None else self.collate_fn,
                                           num_workers=num_local_io_workers or 0,
                                           drop_last=self.dataloader_drop_last())

    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True,
                        exclude_frozen_parameters=False):
        """DeepSpeed's: save_dir/<tag> and save_dir/latest (zerod's format:
        docs/checkpoints.md); frozen parameters are always kept (they are
        rank 0's torch state)."""
        state = dict(client_state or {})
        state["zerod_deepspeed"] = {"skipped_steps": self.skipped_steps, "global_steps": self.global_steps,
                                    "global_samples": self.global_samples}
        return super().save_checkpoint(save_dir, tag=tag, client_state=state, save_latest=save_latest)

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True, load_optimizer_states=True,
                        load_lr_scheduler_states=True, load_module_only=False, custom_load_fn=None):
        """DeepSpeed's: loads load_dir/<tag> (default: what load_dir/latest
        names) and returns (that directory, the client_state saved with it),
        or (None, None) with a warning when no tag is given and load_dir has
        no `latest`. Its flags as DeepSpeed 0.19's (docs/integrations.md):

        load_module_only=True   the weights (and buffers) alone: the optimizer
            state, the lr schedule and the step counters stay as they are
            here, whatever optimizer or ZeRO stage saved the checkpoint.
        load_optimizer_states=False   the weights, and DeepSpeed's counters
            (global_steps, global_samples, skipped_steps) from the checkpoint;
            the optimizer state stays as it is here.
        load_lr_scheduler_states=False   the lr schedule stays as it is here.
        load_module_strict=False   parameters and buffers the checkpoint or
            the model lacks are left out instead of refused.

        zerod's lr schedule and its optimizer (Adam's bias correction, 1-bit
        Adam's phases) follow one count of updates, where DeepSpeed's
        scheduler and optimizer keep a count each: loading the one without the
        other, where a schedule is configured and the checkpoint's count is
        not this engine's, is refused naming the flag and what to pass
        instead. Every check is made before anything changes."""
        if custom_load_fn is not None:
            raise InvalidArgumentError(
                "load_checkpoint(custom_load_fn=...) is not supported by zerod: zerod holds the module's "
                "parameters (outside its forward they are empty tensors), so a function cannot copy the "
                "checkpoint's state_dict into them; load with load_checkpoint(), or give the values to "
                "engine.load_state_dict()")
        self._require_between_steps("load_checkpoint()")
        gas = self.gradient_accumulation_steps()
        if self._micro_steps % gas:
            raise InvalidStateError(f"load_checkpoint() after micro-batch {self._micro_steps % gas} of an "
                                    f"accumulation window of {gas}: call it after the window's last step()")
        path = None
        if tag is None:
            latest = os.path.join(os.fspath(load_dir), "latest")
            if os.path.isfile(latest):
                with open(latest) as f:
                    tag = f.read().strip()
            elif os.path.isfile(os.path.join(os.fspath(load_dir), _ckpt_masters.MANIFEST)):
                # A checkpoint's own directory (`zerod ckpt reshard --to`
                # writes one without a 'latest' beside it), as zerod.torch
                # loads it.
                path = os.fspath(load_dir)
            else:
                warnings.warn(f"load_checkpoint: {load_dir} has no 'latest' file and no tag was given: "
                              "nothing loaded")
                return None, None
        if path is None:
            path = os.path.join(os.fspath(load_dir), str(tag))
        manifest = _ckpt_masters.read_manifest(path)
        extra = self._torch_state(path, manifest.step)
        client_state = dict(extra["client_state"]) if extra else {}
        counters = client_state.pop("zerod_deepspeed", {})
        rest = extra["module_rest"] if extra else None
        sources = self._checkpoint_sources(path, manifest, rest, load_module_strict)
        weights_only = load_module_only or not load_optimizer_states
        if not load_module_only:
            self._check_one_update_count(manifest.step, load_optimizer_states, load_lr_scheduler_states)
        theirs, mine = {n for n, _ in manifest.params}, {s.name for s in self._slots}
        if not weights_only and theirs != mine:
            raise InvalidArgumentError(
                f"load_checkpoint: {path} holds zerod's state of other parameters than this model's (only there: "
                f"{sorted(theirs - mine)}, only here: {sorted(mine - theirs)}), and zerod loads optimizer state "
                "only into the parameters it was saved from; load the weights alone with "
                "load_optimizer_states=False (or load_module_only=True)")

        if weights_only:
            kept = [k for k, t in self.module.state_dict(keep_vars=True).items()
                    if id(t) not in self._slot_of and k not in sources]
            if extra is None and kept:
                warnings.warn(f"load_checkpoint: {path} has no {_zt._TORCH_STATE} (zd_model_save wrote it "
                              f"without zerod.torch): {len(kept)} tensor(s) zerod does not hold (buffers, frozen "
                              f"parameters; '{kept[0]}' first) keep their current values, and client_state is {{}}")
            masters = _ckpt_masters.read_masters(path, manifest, {n for kind, n in sources.values()
                                                                  if kind == "master"})
            self.load_state_dict({key: torch.from_numpy(masters[n]) if kind == "master" else rest[n]
                                  for key, (kind, n) in sources.items()}, strict=False)
        else:
            super().load_checkpoint(load_dir, tag=tag)
        if load_module_only:
            return path, client_state
        # DeepSpeed's counters come from the checkpoint (one saved without
        # zerod.deepspeed: its update count, none skipped); its micro_steps
        # do not (nor here: this engine's are at a window's end, as there).
        self.skipped_steps = counters.get("skipped_steps", 0)
        self._steps_offset = 0
        self._steps_offset = counters.get("global_steps", manifest.step + self.skipped_steps) - self.global_steps
        self._samples_offset = 0
        self._samples_offset = counters.get("global_samples", self.global_samples) - self.global_samples
        self.optimizer.show_next_lr()  # DeepSpeed's load restores its groups' lr too
        return path, client_state

    def _checkpoint_sources(self, path, manifest, rest, strict):
        """{state_dict key of the module: ("master", parameter name) or
        ("rest", key of torch_state.pt's module_rest)}: where the checkpoint
        in `path` holds each. Missing and unexpected keys are refused when
        `strict` (as torch's load_state_dict refuses them), and a shape that
        differs always, naming them; nothing has changed then. `rest` is
        None for a checkpoint without torch_state.pt (zd_model_save's
        without zerod.torch): the tensors zerod does not hold keep their
        values then, as zerod.torch's load_checkpoint keeps them."""
        shapes = dict(manifest.params)
        sources, used, missing, wrong = {}, set(), [], []
        for key, t in self.module.state_dict(keep_vars=True).items():
            s = self._slot_of.get(id(t))
            name = s.name if s is not None else key
            if name in shapes:
                source, shape = ("master", name), tuple(shapes[name])
            elif rest is not None and key in rest:
                source = ("rest", key)
                if not (torch.is_tensor(rest[key]) and torch.is_tensor(t)):
                    # A module's extra state (get_extra_state): no shape;
                    # its set_extra_state takes it as torch's load does.
                    used.add(source)
                    sources[key] = source
                    continue
                shape = tuple(rest[key].shape)
            else:
                if s is not None or rest is not None:
                    missing.append(key)
                continue
            used.add(source)
            mine = tuple(t.shape) if s is None else s.shape
            if (shape or (1,)) != (mine or (1,)):
                wrong.append(f"'{key}': {shape} in the checkpoint, {mine} in the model")
            sources[key] = source
        unexpected = [n for n in shapes if ("master", n) not in used] + \
            [k for k in rest or () if ("rest", k) not in used]
        if wrong:
            raise ShapeMismatchError(f"load_checkpoint: {path} does not fit the model: " + "; ".join(wrong))
        if strict and (missing or unexpected):
            raise InvalidArgumentError(
                f"load_checkpoint: {path} does not hold this model's state_dict (missing keys {missing}, "
                f"unexpected keys {unexpected}); with load_module_strict=False the keys both have are loaded "
                "and the rest left out")
        return sources

    def _check_one_update_count(self, saved, load_optimizer_states, load_lr_scheduler_states):
        """zerod's lr schedule and its optimizer step on one count of updates;
        DeepSpeed's scheduler and optimizer can be loaded apart. Where a
        schedule is configured and the checkpoint's count (`saved`) is not
        this engine's, loading one without the other is what zerod cannot
        do: refused, naming the flag and what to pass instead."""
        here = self.applied_steps
        if self.lr_scheduler is None or load_optimizer_states == load_lr_scheduler_states or saved == here:
            return
        name = self.zerod_model.optimizer_info().name
        if not load_optimizer_states:
            raise InvalidArgumentError(
                f"load_checkpoint(load_optimizer_states=False): DeepSpeed would go on with this engine's optimizer "
                f"state (at update {here}) under the checkpoint's lr schedule (at update {saved}), but zerod's lr "
                f"schedule and its optimizer ({name}) follow one count of updates. Pass "
                f"load_lr_scheduler_states=False too (the schedule then goes on from update {here} with the "
                f"optimizer, as DeepSpeed's does), or load the optimizer state as well")
        raise InvalidArgumentError(
            f"load_checkpoint(load_lr_scheduler_states=False): DeepSpeed would keep this engine's lr schedule (at "
            f"update {here}) with the checkpoint's optimizer state (at update {saved}), but zerod's lr schedule "
            f"and its optimizer ({name}) follow one count of updates. Load the schedule too, or pass "
            f"load_optimizer_states=False as well (the weights alone: the optimizer and the schedule go on from "
            f"update {here})")


_MISSING = object()


def _same(a, b):
    """Equal hyperparameter values (a list and a tuple of the same numbers
    too; a one-element tensor lr against its number)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except (TypeError, ValueError, RuntimeError):
        return False


class TorchHyperparameters:
    """The hyperparameters other than the lr that a torch optimizer's step
    reads from its param_groups (the keys of its defaults, the kernel choice
    aside), as zerod took them (`when`: initialize(), prepare(), fit()'s
    start). zerod's optimizer takes them once and has no call that changes
    them during training (only the lr: engine.set_lr), where torch and
    DeepSpeed read them at every step: a loop that writes one there (DINO's
    weight-decay schedule, betas changed mid-run) would train on with the
    old value. check() refuses that, naming the group, the key and both
    values (`who`: the integration)."""

    def __init__(self, optimizer, who, when):
        self._optimizer, self._who, self._when = optimizer, who, when
        self._keys = [k for k in optimizer.defaults if k != "lr" and k not in _dsconfig._KERNEL_ONLY]
        # check() runs at every backward: a group whose values are the very
        # objects taken, each immutable (a float, a tuple of floats), is
        # unchanged at the cost of an identity test per key; any other is
        # compared by plain value, and said as written (repr) only when
        # refused. A repr per key per group cost milliseconds a backward with
        # hundreds of groups.
        self._taken_objects = [self._objects(g) for g in optimizer.param_groups]
        self._immutable = [all(map(_immutable, objects)) for objects in self._taken_objects]
        self._taken = [self._plain_values(g) for g in optimizer.param_groups]
        self._taken_said = [{k: _said(g, k) for k in self._keys} for g in optimizer.param_groups]

    def _objects(self, group):
        return [group.get(k, _MISSING) for k in self._keys]

    def _plain_values(self, group):
        """{key: its value as a plain number or list}: a tensor or tuple
        written in place of its number or list is the same value."""
        return {k: _dsconfig._plain(group[k]) if k in group else _MISSING for k in self._keys}

    def check(self):
        groups = self._optimizer.param_groups
        if len(groups) != len(self._taken):
            raise InvalidArgumentError(
                f"{self._who}: the optimizer had {len(self._taken)} parameter group(s) at {self._when} and has "
                f"{len(groups)} now; zerod trains the parameters and hyperparameters it took at {self._when}")
        for i, group in enumerate(groups):
            if self._immutable[i] and all(map(operator.is_, self._objects(group), self._taken_objects[i])):
                continue
            now, taken = self._plain_values(group), self._taken[i]
            for key in self._keys:
                if not _same(now[key], taken[key]):
                    self._refuse_change(i, key, self._taken_said[i][key], _said(group, key))

    def _refuse_change(self, i, key, was, now):
        if key in _CYCLED_KEYS:
            # The schedule that writes these is torch's cyclic one, made on
            # the optimizer but not given to zerod: say its switch.
            why = f"a schedule of {key} (OneCycleLR's or CyclicLR's cycle_momentum=True, their default) is not " \
                  f"supported; keep {key} at the value it had at {self._when} ({_schedules.CYCLED_MOMENTUM_FIX})"
        else:
            why = f"a schedule of {key} (DINO's weight-decay schedule, say) is not supported; keep {key} at the " \
                  f"value it had at {self._when}"
        raise InvalidArgumentError(
            f"{self._who}: optimizer.param_groups[{i}][{key!r}] was changed from {was} to {now}, but zerod takes "
            f"the optimizer's hyperparameters other than the lr once, at {self._when}, and has no call that "
            f"changes them during training (the lr alone follows param_groups): {why}")


_IMMUTABLE_SCALARS = (float, int, bool, str, type(None))


def _immutable(value):
    """A value that cannot change while the group holds the same object."""
    if type(value) is tuple:
        return all(map(_immutable, value))
    return value is _MISSING or type(value) in _IMMUTABLE_SCALARS


def _said(group, key):
    return repr(group[key]) if key in group else "(removed)"


# The hyperparameters torch's cyclic schedulers (OneCycleLR, CyclicLR) step
# with cycle_momentum=True, their default, and the keys they keep in the
# groups to do so; zerod's traced schedule refuses them in the same words
# (zerod._schedules.trace).
_CYCLED_KEYS = ("betas", "momentum")
_CYCLED_MARKS = ("max_momentum", "base_momentum")


def refuse_cycled_momentum(optimizer, who, when):
    """A OneCycleLR or CyclicLR with cycle_momentum=True made on the
    optimizer (its max_momentum/base_momentum in the groups) changes the
    momentum/betas at every step, which zerod takes once: refused at `when`,
    naming the switch, not at the second backward as a changed value."""
    for i, group in enumerate(optimizer.param_groups):
        marks = [k for k in _CYCLED_MARKS if k in group]
        if marks:
            raise InvalidArgumentError(
                f"{who}: optimizer.param_groups[{i}] holds {'/'.join(marks)}: a OneCycleLR or CyclicLR made on this "
                f"optimizer with cycle_momentum=True (their default) changes its momentum/betas at every step, but "
                f"zerod takes them once, at {when}; {_schedules.CYCLED_MOMENTUM_FIX}")


def _refuse_torch_format(state_dict, what):
    """A torch optimizer's state_dict ("state" by parameter index,
    "param_groups") given where zerod's is expected: refused naming both
    formats (its Adam moments are a torch optimizer's, which zerod never
    stepped)."""
    if isinstance(state_dict, dict) and "param_groups" in state_dict and "optimizer" not in state_dict:
        raise InvalidArgumentError(
            f"{what}: this is a torch optimizer's state_dict (\"state\" by parameter index and \"param_groups\"), "
            "and zerod's optimizer state is its own: {\"optimizer\": name, \"step\": updates applied, \"state\": "
            "{parameter name: {slot: tensor}}}. Pass what optimizer.state_dict() (engine.optimizer_state_dict()) "
            "returned here, or save and load with the checkpoint calls")


class _Optimizer:
    """What initialize() returns as the optimizer: zerod runs the update
    inside engine.step(), so this only answers what scripts ask of it.

    `defaults` are the hyperparameters zerod's optimizer runs (the config
    section's, else the type's DeepSpeed defaults), which param_groups show
    as DeepSpeed's optimizer's groups hold them. `client` is the torch
    optimizer a script gave initialize() (DeepSpeed's client optimizer),
    whose param_groups DeepSpeed's optimizer steps with (the same dicts): an
    lr written there applies as one written here, its lr follows the
    schedule, and any other hyperparameter written there is refused
    (TorchHyperparameters)."""

    def __init__(self, engine, kind, defaults, client=None):
        self._engine = engine
        self.kind = kind
        self.defaults = dict(defaults)
        self._groups = None  # the one group, the same dict every time
        self._shown = None   # {key: what zerod last put there}
        self._lr_written = False
        self._client = client
        if client is not None:
            self._client_hyperparameters = TorchHyperparameters(client, "zerod.deepspeed", "initialize()")
            # What the script's groups hold is compared with the lr zerod
            # applies first: a torch scheduler made on the optimizer but not
            # given to initialize() has set another there, which applies.
            self._client_lr = engine.get_lr()[0]
            if engine.lr_scheduler is not None:
                self.show_next_lr()  # DeepSpeed's scheduler writes its first lr there when made

    @property
    def param_groups(self):
        """[one group]: the optimizer's hyperparameters and the lr of the next
        update (get_lr()). The same dict every time, so that a value a script
        writes into it (nanoGPT's `for g in optimizer.param_groups: g["lr"] =
        lr`) stays there to be read: the next backward() or step() hands an
        lr written there to zerod (check_unwritten), which applies it from
        that window's update on, as DeepSpeed applies it."""
        lr = self._engine.get_lr()[0]
        if self._groups is None:
            group = dict(self.defaults, lr=lr)
            group["params"] = [s.param for s in self._engine._slots]
            self._groups = [group]
            self._shown = {k: v for k, v in group.items() if k != "params"}
        elif self._untouched_lr():
            self._groups[0]["lr"] = self._shown["lr"] = lr  # untouched: follows the schedule
        return self._groups

    def _untouched_lr(self):
        return _same(self._groups[0].get("lr", _MISSING), self._shown["lr"])

    def check_unwritten(self):
        """Takes an lr written into param_groups since zerod put one there (a
        hand-written schedule), here or in the script's torch optimizer:
        zerod applies it from the next boundary on, in place of its schedule,
        until one is written again (engine.set_lr, zd_model_set_lr), as
        DeepSpeed applies what param_groups hold at its step. Refuses any
        other hyperparameter written there, changed or added: zerod takes
        them once, at initialize(), so it would train with other values than
        the script asked for. A key no optimizer reads (a loop's own
        bookkeeping) is the script's."""
        if self._client is not None:
            self._client_hyperparameters.check()
            self._check_client_lr()
        if self._groups is None:
            return
        group, lr = self._groups[0], self._engine.get_lr()[0]
        added = [k for k in group if k not in self._shown and k in _dsconfig.OPTIMIZER_KEYS]
        for key in list(self._shown) + added:
            shown, now = self._shown.get(key, _MISSING), group.get(key, _MISSING)
            if _same(now, shown):
                continue
            if key == "lr" and _same(now, lr):
                self._shown["lr"] = lr
                continue
            if key == "lr":
                self._take_lr(now)
                continue
            was = "was set to" if shown is _MISSING else f"was changed from {shown!r} to"
            raise InvalidArgumentError(
                f"optimizer.param_groups[0][{key!r}] {was} {'(removed)' if now is _MISSING else repr(now)}, but "
                "zerod takes the optimizer's hyperparameters once, at initialize(), and does not read param_groups: "
                "set them in the config's \"optimizer\" section or on the torch optimizer given to initialize()")

    def _check_client_lr(self):
        """An lr the script wrote into its torch optimizer's groups (one for
        every group: zerod's optimizer has one) since zerod showed one there."""
        if all(_same(g["lr"], self._client_lr) for g in self._client.param_groups):
            return
        value = one_lr(self._client, "zerod.deepspeed")
        self._client_lr = value
        if _same(value, self._engine.get_lr()[0]):
            return  # the lr zerod applies anyway
        self._set_written_lr(value)
        if self._groups is not None and self._untouched_lr():
            self._groups[0]["lr"] = self._shown["lr"] = value

    @property
    def lr_written(self):
        """Whether the script wrote an lr into param_groups (and zerod took it)."""
        return self._lr_written

    def _take_lr(self, lr):
        """An lr the script wrote here: a number zerod applies from the next
        boundary on, shown in the torch optimizer's groups too (DeepSpeed's
        optimizer's groups are that optimizer's)."""
        try:
            value = float(lr)
        except (TypeError, ValueError, RuntimeError):
            raise InvalidArgumentError(f"optimizer.param_groups[0]['lr'] was set to {lr!r}; an lr is a number "
                                       "(or a one-element tensor)") from None
        self._set_written_lr(value)
        self._shown["lr"] = value
        self._show_client_lr(value)

    def _set_written_lr(self, value):
        self._engine.set_lr(value)
        self._lr_written = True

    def show_next_lr(self):
        """The lr of the next update into the script's torch optimizer's
        groups, where DeepSpeed's scheduler (after an update, when made) and
        its load_checkpoint write it; nothing without one."""
        if self._client is not None:
            self._show_client_lr(self._engine.get_lr()[0])

    def _show_client_lr(self, value):
        if self._client is None:
            return
        for g in self._client.param_groups:
            if torch.is_tensor(g["lr"]):
                g["lr"].fill_(value)  # a tensor lr stays one, as torch's schedulers keep it
            else:
                g["lr"] = value
        self._client_lr = value

    def state_dict(self):
        return self._engine.optimizer_state_dict()

    def load_state_dict(self, sd):
        _refuse_torch_format(sd, "optimizer.load_state_dict")
        self._engine.load_optimizer_state_dict(sd)

    def zero_grad(self, set_to_none=True):
        """zerod starts every window's gradients at zero itself."""

    @property
    def overflow(self):
        """DeepSpeed's fp16 optimizers': whether the last update was skipped
        (a non-finite gradient), which Accelerate reads as step_was_skipped."""
        last = self._engine.last_step
        return bool(last is not None and last.skipped)

    def step(self, closure=None):
        raise InvalidArgumentError("call engine.step(): zerod applies the optimizer there (as DeepSpeed does)")


class _Scheduler:
    """What initialize() returns as the lr_scheduler: the job's schedule runs
    inside zerod, advanced by engine.step(), as DeepSpeed advances its own."""

    def __init__(self, engine):
        self._engine = engine

    def step(self, *args, **kwargs):
        """engine.step() advances the schedule; nothing to do here."""

    def get_lr(self):
        return self._engine.get_lr()

    def get_last_lr(self):
        return self._engine.get_lr()

    def state_dict(self):
        return {"last_batch_iteration": self._engine.applied_steps - 1}

    def load_state_dict(self, sd):
        """The schedule's position is the optimizer's step (load_checkpoint)."""
