"""Hugging Face Accelerate on zerod: an Accelerator subclass.

    from zerod.accelerate import ZerodAccelerator                  # changed line 1
    accelerator = ZerodAccelerator(gradient_accumulation_steps=2,  # changed line 2
                                   gradient_clipping=1.0, zero_stage=3, offload=True)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = loss_fn(model(x), y)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    accelerator.save_state("ckpt"); accelerator.load_state("ckpt")

Why a subclass: Accelerate has no registry for training back-ends; its own
(DeepSpeed, FSDP, Megatron-LM) are branches inside Accelerator.prepare,
backward, clip_grad_norm_ and save_state keyed on DistributedType, and a
DeepSpeedPlugin would make Accelerate import and drive DeepSpeed itself.
The methods the user's loop calls are the extension surface, so overriding
prepare/backward/clip_grad_norm_/unwrap_model/get_state_dict keeps
everything else Accelerate's (dataloader sharding, accumulate(), gather,
logging, save_state's RNG/sampler/scheduler state), and zerod's checkpoint
rides on Accelerate's public save/load-state pre-hooks (a "zerod" folder
inside the state directory).

What happens: prepare() hands the model to zerod.deepspeed.initialize with
a DeepSpeed-shaped config built from the Accelerator's settings (the torch
optimizer and LR scheduler translated: AdamW/Adam/SGD, step-based
schedulers, which zerod traces and runs itself; anything else refused
naming it). accelerator.backward(loss)
runs zerod's backward and step: zerod averages the window's micro-batches
and applies the update, clipped, at the window's end (checked to be where
Accelerate's accumulate() ends it). optimizer.step() then only records on
the torch optimizer that it stepped (what its LR scheduler checks) and
zero_grad() has nothing left to do; a loop that does not call it after a
window (accumulating by hand, skipping a step) is refused at its next
backward or save_state, since Accelerate would apply the update there.
scheduler.step() steps the user's torch scheduler as Accelerate's
AcceleratedScheduler does (once per process at an update, once with
split_batches, at every call with step_scheduler_with_optimizer=False), so
get_last_lr() reports what zerod applies (zerod runs the same schedule,
traced ahead of time stepped so). clip_grad_norm_ returns the norm zerod
measured; its max_norm must be the gradient_clipping given to the
constructor, since zerod clips inside its step; clip_grad_value_ is
refused (as Accelerate refuses it under DeepSpeed). The optimizer must
hold every parameter that requires grad, and only the model's
(zerod.deepspeed.initialize). An lr written into the optimizer's
param_groups other than by the prepared scheduler (a hand-written
schedule, a scheduler not given to prepare(), ReduceLROnPlateau, which
follows a metric and is not traced) is applied as torch would apply it:
zerod reads param_groups at each window's last backward and takes the lr
there (engine.set_lr) from the first that differs from its schedule's on.
Any other hyperparameter written there (weight_decay, betas: a weight-decay
schedule) is refused at the next backward, naming it: zerod takes them once,
at prepare(). optimizer.state_dict() and load_state_dict() are zerod's
optimizer state (engine.optimizer_state_dict()), for a checkpoint the loop
writes itself.
mixed_precision "no", "bf16" (autocast over zerod's fp32 parameters) and
"fp16" (autocast float16 over fp32 parameters, zerod's loss scaler in the
GradScaler's place with GradScalerKwargs' settings, see zerod._amp; on the
CPU too, where Accelerate's own fp16 is fp32) are supported. A window skipped for an overflow does not step the scheduler
(as Accelerate). One process, or the ranks of `zerod run --nproc N --
python train.py`, `accelerate launch`, mpirun or srun (without a GPU
Accelerate's multi-CPU mode, its collectives over gloo); Accelerate's
process count must be zerod's, or prepare() refuses.
"""
import os

import torch

from . import _amp, default_client
from ._schedules import mark_stepped, one_lr
from ._gloo import init_gloo
from . import deepspeed as _zds
from .errors import InvalidArgumentError, InvalidStateError

try:
    from accelerate import Accelerator
    from accelerate.scheduler import AcceleratedScheduler
    from accelerate.utils import convert_to_fp32
except ImportError as e:  # pragma: no cover
    raise ImportError(f"zerod.accelerate needs Hugging Face Accelerate (pip install accelerate): {e}") from e

__all__ = ["ZerodAccelerator"]

_STATE_FOLDER = "zerod"


class ZerodAccelerator(Accelerator):
    """An Accelerator whose prepared model trains on zerod.

    gradient_clipping   the global-norm clip zerod applies (0: none); the
                        loop's clip_grad_norm_ must ask for the same value.
    zero_stage          0-3 (default 3).
    offload             the optimizer state (and at stage 3 the parameter
                        shards) in the host tier, as "zerod_stage_3_offload".
    config              a DeepSpeed config (dict or JSON path) instead;
                        the Accelerator's settings fill in what it leaves out.
    modules, client     as in zerod.torch.initialize.
    lr_steps            the updates of the run, for an LR scheduler without a
                        length of its own (LambdaLR, ExponentialLR, ...):
                        zerod traces its lr that far (default 50,000).
    Every other argument is Accelerator's.
    """

    def __init__(self, *args, gradient_clipping=0.0, zero_stage=3, offload=False, config=None, modules=None,
                 client=None, lr_steps=None, **kwargs):
        joined = _join_zerod_ranks() or _join_launcher_ranks(client)  # under zerod run, mpirun, srun
        launched = int(os.environ.get("WORLD_SIZE") or "1") > 1  # under accelerate launch / torchrun
        if (joined or launched) and not torch.cuda.is_available():
            kwargs.setdefault("cpu", True)  # Accelerate's multi-CPU mode
        super().__init__(*args, **kwargs)
        # The ranks of `zerod run`, or of `accelerate launch` (torchrun's
        # variables: the ranks start their node's daemon at prepare()).
        # mpirun's and srun's count is zerod's, told to Accelerate above
        # (1 with ZEROD_ENDPOINT=embedded:); prepare() checks it.
        who, world = _launcher()
        if who.startswith(("zerod run", "torchrun")) and self.num_processes != world:
            raise InvalidArgumentError(
                f"ZerodAccelerator: Accelerate sees {self.num_processes} process(es), {who} started {world}; "
                "start the ranks with `accelerate launch --num_processes N` or `zerod run --nproc N -- python "
                "train.py`")
        if self.mixed_precision not in ("no", "bf16", "fp16"):
            raise InvalidArgumentError(f"ZerodAccelerator: mixed_precision={self.mixed_precision!r} is not "
                                       "supported (\"no\", \"bf16\" and \"fp16\" are)")
        self._zerod_scaling = None
        if self.mixed_precision == "fp16":
            # zerod's loss scaler takes the GradScaler's place with its
            # settings (zerod._amp): Accelerate's own (made on a GPU) must not
            # scale too. Accelerate has no fp16 autocast on the CPU and trains
            # in fp32 there; zerod runs autocast on every device.
            handler = self.scaler_handler.to_kwargs() if self.scaler_handler is not None else {}
            self._zerod_scaling = (_amp.grad_scaler_settings(self.scaler) if self.scaler is not None else
                                   {**_amp.GRAD_SCALER_DEFAULTS, **handler})
            _amp.fp16_section("ZerodAccelerator", **self._zerod_scaling)  # refused here, not at prepare()
            self.scaler = None
            self.native_amp = True
        self._zerod = dict(clip=float(gradient_clipping or 0.0), stage=zero_stage, offload=offload, config=config,
                           modules=modules, client=client, lr_steps=lr_steps)
        self._zerod_forget_prepared()
        self.register_save_state_pre_hook(self._save_zerod)
        self.register_load_state_pre_hook(self._load_zerod)

    def _zerod_forget_prepared(self):
        """What prepare() sets, as before it: at construction and after free_memory()."""
        self.zerod_engine = None
        self._zerod_last = None
        self._zerod_unstepped = False  # a backward ended a window, optimizer.step() has not come yet
        self._zerod_scheduler = None
        self._zerod_micro = 0  # accelerator.backward() calls
        self._zerod_torch_opt = None  # the user's torch optimizer, whose param_groups _zerod_follow_lr reads
        self._zerod_hyperparameters = None  # its other hyperparameters as prepare() took them
        self._zerod_traced = False  # zerod runs the prepared scheduler's schedule (traced)

    def free_memory(self, *objects):
        """Accelerate's (clear() calls it too), which destroys DeepSpeed's
        engine before it lets the prepared objects go: zerod's engine is
        destroyed alike, the trained weights back in the model and zerod's
        model freed, and prepare() may run again. Dropping the prepared
        objects alone would not free it: the model's parameters hold the
        engine through their autograd hooks, and the client its zerod model.
        Every rank calls it (destroy() reads the weights collectively)."""
        engine = self.zerod_engine
        self._zerod_forget_prepared()
        if engine is not None:
            engine.destroy()
        return super().free_memory(*objects)

    # -- prepare ------------------------------------------------------------

    def prepare(self, *args, device_placement=None):
        is_model = [isinstance(a, torch.nn.Module) for a in args]
        if not any(is_model):
            return super().prepare(*args, device_placement=device_placement)
        models = [a for a, m in zip(args, is_model) if m]
        opts = [a for a in args if isinstance(a, torch.optim.Optimizer)]
        scheds = [a for a in args if isinstance(a, torch.optim.lr_scheduler.LRScheduler)]
        if self.zerod_engine is not None or len(models) != 1 or len(opts) > 1 or len(scheds) > 1:
            raise InvalidArgumentError("ZerodAccelerator.prepare: zerod trains one model with one optimizer and at "
                                       "most one LR scheduler, prepared once")
        if not opts:
            raise InvalidArgumentError("ZerodAccelerator.prepare: give the optimizer together with the model "
                                       "(zerod runs it)")
        others = [a for a in args if a is not models[0] and a is not opts[0] and (not scheds or a is not scheds[0])]
        prepared = super().prepare(*others, device_placement=device_placement) if others else ()
        prepared = list(prepared) if isinstance(prepared, (list, tuple)) and len(others) != 1 else [prepared]
        loaders = [p for p in prepared if isinstance(p, torch.utils.data.DataLoader)]

        model, opt = models[0], opts[0]
        self._zerod_require_one_process_each()
        _zds.refuse_cycled_momentum(opt, "ZerodAccelerator", "prepare()")
        model.to(self.device)
        # ReduceLROnPlateau follows a metric: not traced, it writes its lr
        # into param_groups, which _zerod_follow_lr hands to zerod.
        traced = [s for s in scheds if not isinstance(s, torch.optim.lr_scheduler.ReduceLROnPlateau)]
        self._zerod_traced = bool(traced)
        engine = _zds.initialize(model=model, optimizer=opt, lr_scheduler=self._zerod_stepped(traced),
                                 config=self._zerod_config(loaders), modules=self._zerod["modules"],
                                 client=self._zerod["client"], lr_steps=self._zerod["lr_steps"], _placement=None,
                                 param_dtype=torch.float32 if self.mixed_precision == "fp16" else None)[0]
        self.zerod_engine = engine
        self._zerod_torch_opt = opt
        self._zerod_hyperparameters = _zds.TorchHyperparameters(opt, "ZerodAccelerator", "prepare()")
        wrapped = {id(model): _ZerodModel(model, engine, self),
                   id(opt): _ZerodOptimizer(opt, self)}
        if scheds:
            sched = self._zerod_scheduler = _ZerodScheduler(scheds[0], wrapped[id(opt)], self)
            wrapped[id(scheds[0])] = sched
            self._schedulers.append(sched)  # its state goes into save_state
        it = iter(prepared)
        out = [wrapped[id(a)] if id(a) in wrapped else next(it) for a in args]
        return out[0] if len(out) == 1 else tuple(out)

    def _zerod_require_one_process_each(self):
        """zerod's ranks are Accelerate's processes, one each: otherwise each
        of Accelerate's processes would train on the whole dataset while
        zerod averaged their gradients as the ranks of one job (a launcher
        whose variables neither reads alike)."""
        client = self._zerod["client"] or default_client()
        if client.world_size != self.num_processes:
            raise InvalidArgumentError(
                f"ZerodAccelerator.prepare: zerod joined this process as rank {client.rank} of "
                f"{client.world_size}, but Accelerate sees {self.num_processes} process(es) (process "
                f"{self.process_index}); start the ranks with `zerod run --nproc N -- python train.py`, "
                "`accelerate launch --num_processes N`, mpirun or srun, or say how many run with ZEROD_RANK, "
                "ZEROD_WORLD_SIZE, ZEROD_LOCAL_RANK and ZEROD_LOCAL_WORLD_SIZE")

    def _zerod_stepped(self, scheds):
        """The user's scheduler as Accelerate steps it (AcceleratedScheduler),
        for zerod to trace: with step_scheduler_with_optimizer (the default),
        at every update num_processes times (each process's batch counts as
        one of the one-process run's, so the schedule's length in batches
        holds; OneCycleLR stops at its total_steps), or once with
        split_batches; without it, at every scheduler.step() call, which
        zerod takes to be after every micro-batch's backward (as Accelerate's
        examples call it, and checked in backward())."""
        if not scheds:
            return None
        if not self.step_scheduler_with_optimizer:
            gas = self.gradient_accumulation_steps
            return _zds._schedules.Stepped(scheds[0], per=gas, offset=gas - 1)
        if self.split_batches:
            return _zds._schedules.Stepped(scheds[0])
        return _zds._schedules.Stepped(scheds[0], per=self.num_processes)

    def _zerod_config(self, loaders):
        z = self._zerod
        if z["config"] is not None:
            cfg = _zds._dsconfig.load(z["config"])
        else:
            zero = {"stage": z["stage"]}
            if z["offload"]:
                zero["offload_optimizer"] = {"device": "cpu"}
                if z["stage"] == 3:
                    zero["offload_param"] = {"device": "cpu"}
            cfg = {"zero_optimization": zero}
        for key, value in (("gradient_accumulation_steps", self.gradient_accumulation_steps),
                           ("gradient_clipping", z["clip"])):
            if key in cfg and cfg[key] not in ("auto", value):
                raise InvalidArgumentError(f"ZerodAccelerator: the config's {key} is {cfg[key]!r}, the "
                                           f"Accelerator's is {value!r}; set it in one place")
            cfg[key] = value
        if self._zerod_scaling is not None:
            _amp.fill_fp16(cfg, _amp.fp16_section("ZerodAccelerator", **self._zerod_scaling))
        # Each rank's micro-batch, as Accelerate's DeepSpeed path takes it: a
        # prepared loader's total_batch_size is the batch of all processes
        # (batch_size x processes, or with split_batches the batch that is
        # split), so one rank's share is that over the processes.
        total = getattr(loaders[0], "total_batch_size", None) if loaders else None
        if cfg.get("train_micro_batch_size_per_gpu", "auto") == "auto":
            cfg["train_micro_batch_size_per_gpu"] = max(1, total // self.num_processes) if total else 1
        return cfg

    # -- the loop -----------------------------------------------------------

    def backward(self, loss, **kwargs):
        """zerod's backward and step: Accelerate does not divide the loss by
        the accumulation steps here, zerod averages the window itself."""
        if self.zerod_engine is None:
            return super().backward(loss, **kwargs)
        if kwargs:
            raise InvalidArgumentError(f"ZerodAccelerator.backward: {sorted(kwargs)} are not supported")
        self._zerod_require_stepped("accelerator.backward()")
        self._zerod_hyperparameters.check()
        if self.sync_gradients:
            self._zerod_follow_lr()
        if self._zerod_scheduler is not None:
            self._zerod_scheduler._check_per_micro_batch()
        self.zerod_engine.backward(loss)
        r = self._zerod_last = self.zerod_engine.step()
        self._zerod_micro += 1
        self._zerod_unstepped = r.boundary
        if r.boundary != bool(self.sync_gradients):
            raise InvalidStateError(
                f"zerod {'ended' if r.boundary else 'did not end'} an accumulation window where Accelerate "
                f"{'did not' if r.boundary else 'did'} (gradient_accumulation_steps="
                f"{self.gradient_accumulation_steps}; a dataloader whose length is not a multiple of it ends a "
                "window early, which zerod cannot): make the epoch a multiple, and run every micro-batch "
                "inside accelerator.accumulate(model)")

    def _zerod_require_stepped(self, what):
        """zerod applies each window's update inside accelerator.backward();
        the loop's optimizer.step() stands for it. A loop that did not call
        it after a window's last backward (its own accumulation, `if (i + 1)
        % N == 0: optimizer.step()`, or a skipped step) would train
        otherwise under Accelerate: refused at the next backward or
        save_state."""
        if self._zerod_unstepped:
            raise InvalidStateError(
                f"{what} after a backward that ended an accumulation window without optimizer.step() in "
                "between: zerod applied that window's update inside accelerator.backward() (where Accelerate "
                "leaves it to optimizer.step()), so a loop that steps the optimizer less often than every "
                "window, or skips a step, would train differently here. Accumulate with "
                f"ZerodAccelerator(gradient_accumulation_steps=N) (it is {self.gradient_accumulation_steps}) "
                "and `with accelerator.accumulate(model):` around each micro-batch, calling optimizer.step() "
                "after every accelerator.backward()")

    def _zerod_follow_lr(self):
        """The lr of the window this backward ends, as torch's optimizer.step()
        would read it: what the optimizer's param_groups hold now. While they
        hold the prepared scheduler's lr (without one, the lr zerod's job
        applies), zerod runs its own schedule; once the loop writes another
        (a hand-written schedule, `for g in optimizer.param_groups: g["lr"] =
        ...`; a scheduler not given to prepare(); ReduceLROnPlateau), zerod
        takes the lr written there (engine.set_lr, from this update on) and
        follows param_groups from then on. One lr for every group: zerod's
        optimizer has one."""
        opt, engine = self._zerod_torch_opt, self.zerod_engine
        if engine._runs_schedule():
            sched = self._zerod_scheduler
            got = [g["lr"] for g in opt.param_groups]
            want = (sched.scheduler.get_last_lr() if sched is not None and self._zerod_traced else
                    engine.get_lr() * len(got))
            if len(got) == len(want) and all(_zds._same(a, b) for a, b in zip(got, want)):
                return
        engine._follow_lr(one_lr(opt, "ZerodAccelerator"))

    def clip_grad_value_(self, parameters, clip_value):
        """Refused, as Accelerate refuses it under DeepSpeed: zerod holds the
        gradients (torch's .grad is empty) and clips by the global norm
        inside its step."""
        if self.zerod_engine is None:
            return super().clip_grad_value_(parameters, clip_value)
        raise InvalidArgumentError(
            "ZerodAccelerator does not support clip_grad_value_ (as Accelerate under DeepSpeed): zerod clips by "
            "the global norm inside its step; use ZerodAccelerator(gradient_clipping=...) and clip_grad_norm_")

    def clip_grad_norm_(self, parameters, max_norm, norm_type=2):
        """The global norm zerod measured (before clipping) at the update
        this window's backward applied; zerod clipped to the constructor's
        gradient_clipping, which max_norm must equal."""
        if self.zerod_engine is None:
            return super().clip_grad_norm_(parameters, max_norm, norm_type)
        if norm_type != 2:
            raise InvalidArgumentError("ZerodAccelerator.clip_grad_norm_: zerod clips by the L2 norm")
        if float(max_norm) != self._zerod["clip"]:
            raise InvalidArgumentError(
                f"clip_grad_norm_(max_norm={max_norm}) but ZerodAccelerator(gradient_clipping="
                f"{self._zerod['clip']}): zerod clips inside its step, so say the value to the constructor")
        r = self._zerod_last
        return torch.tensor(r.grad_norm) if r is not None and r.boundary else None

    def unwrap_model(self, model, keep_fp32_wrapper=True, keep_torch_compile=True):
        if isinstance(model, _ZerodModel):
            return model.module
        return super().unwrap_model(model, keep_fp32_wrapper, keep_torch_compile)

    def get_state_dict(self, model, unwrap=True):
        """Full fp32 values (zerod's masters), as with any other model."""
        if isinstance(model, _ZerodModel) or (self.zerod_engine is not None and model is self.zerod_engine.module):
            return self.zerod_engine.state_dict()
        return super().get_state_dict(model, unwrap)

    # -- save_state / load_state (Accelerate's pre-hooks) -------------------

    def _save_zerod(self, models, weights, output_dir):
        if self.zerod_engine is not None:
            self._zerod_require_stepped("save_state()")
            self.zerod_engine.save_checkpoint(os.path.join(os.fspath(output_dir), _STATE_FOLDER), tag="checkpoint",
                                              client_state={"accelerate_step": self.step})

    def _load_zerod(self, models, input_dir):
        if self.zerod_engine is not None:
            path = os.path.join(os.fspath(input_dir), _STATE_FOLDER)
            if not os.path.isdir(path):
                raise InvalidArgumentError(f"load_state: {input_dir} holds no zerod state ('{_STATE_FOLDER}' folder); "
                                           "it was not saved by a ZerodAccelerator")
            self.zerod_engine.load_checkpoint(path, tag="checkpoint")
            self._zerod_unstepped = False
            if self._zerod_scheduler is not None:
                self._zerod_scheduler._base = None  # its state is loaded after this hook


def _join_zerod_ranks():
    """Under `zerod run --nproc N` (N > 1): the environment Accelerate reads
    for a multi-CPU run (RANK, WORLD_SIZE, LOCAL_RANK, ...) from zerod's, and
    the gloo process group Accelerate's own collectives (gather, the
    dataloader's sharding, wait_for_everyone) use, its rendezvous a file
    beside the daemon's private socket, or MASTER_ADDR:MASTER_PORT on
    several nodes (zerod/_gloo.py). zerod's gradients never go through
    it: the daemon reduces them. LOCAL_WORLD_SIZE is this node's ranks
    (ZEROD_LOCAL_WORLD_SIZE), as torchrun sets it: less than WORLD_SIZE on
    several nodes."""
    world = int(os.environ.get("ZEROD_WORLD_SIZE", "1"))
    if world <= 1:
        return False
    if torch.distributed.is_initialized():
        return True
    rank = int(os.environ["ZEROD_RANK"])
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=os.environ.get("ZEROD_LOCAL_RANK", "0"),
                      LOCAL_WORLD_SIZE=os.environ.get("ZEROD_LOCAL_WORLD_SIZE", str(world)))
    init_gloo(rank, world, "accelerate")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    return True


# The launchers that start a script's processes, each by the variable that
# says how many, in the order libzerod believes them
# (libzerod/src/launcher_env.cpp): the first that says more than one.
_LAUNCHERS = (("zerod run", "ZEROD_WORLD_SIZE"), ("mpirun (Open MPI)", "OMPI_COMM_WORLD_SIZE"),
              ("torchrun (or accelerate launch, DeepSpeed's launcher)", "WORLD_SIZE"),
              ("srun (Slurm)", "SLURM_STEP_NUM_TASKS"), ("an MPI launcher (PMI)", "PMI_SIZE"))


def _launcher():
    """(who, how many processes) of the launcher that started this process
    as one of several; ("one process", 1) when none did."""
    for who, size in _LAUNCHERS:
        n = os.environ.get(size, "")
        if n.isdigit() and int(n) > 1:
            return who, int(n)
    return "one process", 1


def _join_launcher_ranks(client):
    """Under mpirun, srun or a PMI launcher (not torchrun, whose variables
    Accelerate reads itself, nor `zerod run`: _join_zerod_ranks): the
    environment Accelerate reads for a multi-CPU run (RANK, WORLD_SIZE,
    LOCAL_RANK, LOCAL_WORLD_SIZE), which Accelerate does not take from srun
    and under mpirun only with cpu=True, and the gloo process group of its
    own collectives (zerod/_gloo.py says where the ranks meet). Without them
    Accelerate saw one process and trained each rank on the whole dataset.
    zerod connects first, reading the launcher's variables as libzerod does
    (launcher_env.cpp, srun's job and step included): torchrun's names set
    before would be read as torchrun's launch."""
    who, world = _launcher()
    if world <= 1 or who.startswith(("zerod run", "torchrun")):
        return False
    if torch.distributed.is_initialized():
        return True
    client = client or default_client()
    if client.world_size <= 1:
        return False  # ZEROD_ENDPOINT=embedded: each process on its own, on purpose
    local_world = _launcher_ranks_on_this_node(who) or client.world_size
    os.environ.update(RANK=str(client.rank), WORLD_SIZE=str(client.world_size),
                      LOCAL_RANK=str(client.info.local_rank), LOCAL_WORLD_SIZE=str(local_world))
    init_gloo(client.rank, client.world_size, "accelerate")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    return True


def _launcher_ranks_on_this_node(who):
    """How many of the launcher's ranks run on this node, as libzerod reads
    it; 0 when the launcher does not say."""
    if who.startswith("srun"):
        return _slurm_tasks_on_this_node()
    n = os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE" if who.startswith("mpirun") else "MPI_LOCALNRANKS", "")
    return int(n) if n.isdigit() else 0


def _slurm_tasks_on_this_node():
    """SLURM_STEP_TASKS_PER_NODE ("2(x3),1": the step's nodes in order) at
    this node's index, SLURM_NODEID."""
    node = os.environ.get("SLURM_NODEID", "")
    if not node.isdigit():
        return 0
    at = 0
    for part in os.environ.get("SLURM_STEP_TASKS_PER_NODE", "").split(","):
        tasks, _, times = part.partition("(x")
        if not tasks.isdigit():
            return 0
        at += int(times.rstrip(")")) if times.rstrip(")").isdigit() else 1
        if int(node) < at:
            return int(tasks)
    return 0


class _ZerodModel(torch.nn.Module):
    """What prepare() returns for the model: calls go through zerod's engine
    (under autocast with mixed_precision="bf16")."""

    def __init__(self, module, engine, accelerator):
        super().__init__()
        self.module = module
        object.__setattr__(self, "_engine", engine)
        object.__setattr__(self, "_accelerator", accelerator)

    def forward(self, *args, **kwargs):
        with self._accelerator.autocast():
            out = self._engine(*args, **kwargs)
        # As Accelerate's prepared models under autocast: 16-bit outputs
        # come back as fp32, so the loss outside is computed in fp32.
        return convert_to_fp32(out) if self._accelerator.mixed_precision != "no" else out

    def state_dict(self, *args, **kwargs):
        return self._engine.state_dict()

    def load_state_dict(self, state_dict, strict=True):
        return self._engine.load_state_dict(state_dict, strict=strict)


class _ZerodOptimizer:
    """What prepare() returns for the optimizer: zerod applied the update in
    accelerator.backward(); this answers what loops ask of an optimizer."""

    def __init__(self, optimizer, accelerator):
        self.optimizer = optimizer
        self._accelerator = accelerator

    @property
    def param_groups(self):
        return self.optimizer.param_groups  # the lr the user's scheduler sets

    @property
    def defaults(self):
        return self.optimizer.defaults

    def step(self, closure=None):
        if closure is not None:
            raise InvalidArgumentError("optimizer.step(closure) is not supported by zerod")
        if self._accelerator.sync_gradients and self._accelerator._zerod_last is None:
            raise InvalidStateError("optimizer.step() before any accelerator.backward(loss): zerod applies the "
                                    "update in backward")
        if self._accelerator.sync_gradients:
            mark_stepped(self.optimizer)
            self._accelerator._zerod_unstepped = False

    def zero_grad(self, set_to_none=True):
        """zerod starts every window's gradients at zero itself."""

    def state_dict(self):
        """zerod's optimizer state (engine.optimizer_state_dict(): full fp32
        values, the update count), for a checkpoint the loop writes itself
        (torch.save({"optimizer": optimizer.state_dict(), ...})); every
        rank calls it where the state is partitioned. save_state() never
        calls it (this wrapper is not among Accelerate's optimizers): zerod's
        checkpoint, written by its pre-hook, holds the state there."""
        return self._accelerator.zerod_engine.optimizer_state_dict()

    def load_state_dict(self, state_dict):
        """What state_dict() returned, into zerod's optimizer (a torch
        optimizer's state_dict is refused: zerod never stepped one)."""
        _zds._refuse_torch_format(state_dict, "optimizer.load_state_dict")
        self._accelerator.zerod_engine.load_optimizer_state_dict(state_dict)

    @property
    def step_was_skipped(self):
        r = self._accelerator._zerod_last
        return bool(r is not None and r.skipped)


class _ZerodScheduler(AcceleratedScheduler):
    """What prepare() returns for the LR scheduler: zerod runs the schedule
    (traced from this scheduler as Accelerate steps it: _zerod_stepped;
    ReduceLROnPlateau is not traced, zerod takes the lr it writes);
    the user's torch scheduler is stepped alongside by Accelerate's own
    wrapper, so its get_last_lr() is the lr zerod applies next: at an
    update num_processes times (once with split_batches), not after a
    window skipped for an overflow (the optimizer's step_was_skipped: zerod's
    schedule did not advance either), and with step_scheduler_with_optimizer
    False at every call."""

    def __init__(self, scheduler, optimizer, accelerator):
        super().__init__(scheduler, optimizer, step_with_optimizer=accelerator.step_scheduler_with_optimizer,
                         split_batches=accelerator.split_batches)
        self._accelerator = accelerator
        # (scheduler.last_epoch, micro-batches) where the count starts; None
        # after load_state (taken at the next backward, the state loaded).
        self._base = (scheduler.last_epoch, accelerator._zerod_micro)

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        # The torch optimizer's lr as its restored state would hold it
        # (load_state restores the scheduler; zerod's checkpoint, not
        # Accelerate, holds the optimizer state).
        for g, lr in zip(self.scheduler.optimizer.param_groups, self.scheduler.get_last_lr()):
            g["lr"] = lr

    def _check_per_micro_batch(self):
        """With step_scheduler_with_optimizer=False zerod traced one
        scheduler.step() after every micro-batch's backward: before each
        backward the scheduler has stepped once per micro-batch so far. (A
        scheduler zerod did not trace, ReduceLROnPlateau, steps as it will:
        zerod takes the lr it writes.)"""
        if self.step_with_optimizer or not self._accelerator._zerod_traced:
            return
        micro = self._accelerator._zerod_micro
        if self._base is None:
            self._base = (self.scheduler.last_epoch, micro)
        stepped, micro = self.scheduler.last_epoch - self._base[0], micro - self._base[1]
        if stepped != micro:
            raise InvalidStateError(
                f"ZerodAccelerator(step_scheduler_with_optimizer=False): the LR scheduler stepped {stepped} "
                f"time(s) in {micro} micro-batch(es); zerod runs the schedule as a function of the update "
                "count, traced with scheduler.step() called once after every accelerator.backward(). Call it so, "
                "or leave step_scheduler_with_optimizer at True (Accelerate then steps it at each update)")
