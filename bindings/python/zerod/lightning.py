"""PyTorch Lightning on zerod: a Strategy, registered under names that
mirror Lightning's DeepSpeed ones.

    import zerod.lightning                      # registers the strategies
    trainer = Trainer(strategy="zerod_stage_3_offload", precision="bf16-mixed",
                      gradient_clip_val=1.0, accumulate_grad_batches=4, max_steps=1000)
    trainer = Trainer(strategy=zerod.lightning.ZerodStrategy(job="job.lua"))

Lightning's flags drive zerod: the LightningModule's configure_optimizers
(torch AdamW/Adam/SGD and any step-based LR scheduler, interval "step" or
"epoch") becomes a DeepSpeed-shaped config that zerod.deepspeed translates
(the same translation as `zerod translate`), with gradient_clip_val and
accumulate_grad_batches; what zerod cannot run is refused naming it. With
job=, the Lua job script says all of that instead and the Trainer's
clipping and accumulation flags must stay unset.

How it runs: every forward goes through the zerod engine (training,
validation, test and predict steps), so stage 3's gather/release hooks run.
Lightning keeps its own bookkeeping (global_step counts optimizer updates, as
under "ddp"): each micro-batch's backward is engine.backward(loss,
scale_wrt_gas=False) (Lightning has divided the loss by the accumulation
steps already) followed by engine.step(), which applies the update at the
end of each accumulation window; the window zerod closes is checked to be
the one Lightning closes. The user's torch optimizer is never stepped: zerod
applies the update (its lr schedule is the user's scheduler, traced ahead of
time as Lightning steps it, frequency included; Lightning still steps the
torch scheduler, so LearningRateMonitor shows the same values). An lr
written into the optimizer's param_groups other than by that scheduler (a
warm-up in optimizer_step, ReduceLROnPlateau, which follows a metric and is
not traced) is applied as under "ddp": zerod reads param_groups at each
backward and takes the lr there (engine.set_lr) from the first that differs
from its schedule's on. Any other hyperparameter written there (a
weight-decay schedule) is refused at the next backward, naming it: zerod
takes them once, when fit() sets up.

Checkpoints are directories in zerod's format (docs/checkpoints.md) holding
Lightning's loops and callbacks as the client state, as Lightning's DeepSpeed
strategy writes them; ModelCheckpoint and Trainer.fit(ckpt_path=...) use them.
After fit/validate (zerod's model freed, the weights back in torch)
trainer.save_checkpoint writes Lightning's ordinary file instead. Callbacks
that need what zerod holds (GradientAccumulationScheduler, the weight
averaging ones) and manual optimization are refused by name.

Precision: "32-true"; "bf16-mixed" (autocast over zerod's fp32 parameters,
as Lightning's own bf16-mixed); "16-mixed" (autocast float16 over fp32
parameters, zerod's loss scaler in the GradScaler's place and with its
settings, see zerod._amp); "bf16-true" and "16-true" (16-bit parameters,
fp32 masters in zerod; "16-true" with loss scaling). The others are refused.
A step skipped for an overflow does not advance zerod's lr schedule (as
DeepSpeed and Accelerate); Lightning still steps the torch scheduler, so
after an overflow LearningRateMonitor runs one step ahead.

Ranks: one process (devices=1); the ranks of `zerod run --nproc N -- python
train.py`, on one node or on each of several (zerod starts and connects
them; Lightning launches none); or, without `zerod run`, ranks another
launcher started, each where Lightning's own cluster environment says, in
its order (torchrun, Slurm, LSF, MPI, else Lightning's own launcher
starting Trainer(devices=N)), which start their node's daemon
(docs/daemon.md). Trainer(devices=D, num_nodes=K) is D ranks on each node,
D*K in the job; under `zerod run` devices may also be the job's rank count
with num_nodes=1. Another layout is refused on every rank before it
connects. Lightning's own collectives run over gloo.
"""
import os
import sys

import torch

from . import default_client
from . import _amp
from ._schedules import mark_stepped, one_lr
from ._gloo import init_gloo
from . import deepspeed as _zds
from . import torch as _zt
from .errors import InvalidArgumentError

try:
    import lightning.pytorch as pl
    from lightning.fabric.plugins.environments import ClusterEnvironment, MPIEnvironment, SLURMEnvironment
    from lightning.fabric.utilities.distributed import _init_dist_connection, _sync_ddp_if_available
    from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher
    from lightning.pytorch.strategies import ParallelStrategy, StrategyRegistry
    from lightning.pytorch.plugins.precision import Precision, MixedPrecision, HalfPrecision
    from lightning.pytorch.core.optimizer import _init_optimizers_and_lr_schedulers, _MockOptimizer
    from lightning.pytorch.callbacks import GradientAccumulationScheduler, StochasticWeightAveraging
    from lightning.pytorch.trainer import call
    from lightning.pytorch.utilities.exceptions import MisconfigurationException, _TunerExitException
    from lightning.pytorch.utilities.model_helpers import is_overridden
    from lightning.pytorch.utilities.rank_zero import rank_zero_only, rank_zero_warn
    from lightning_utilities.core.rank_zero import rank_zero_only as utils_rank_zero_only
except ImportError as e:  # pragma: no cover - said plainly where it happens
    raise ImportError(f"zerod.lightning needs PyTorch Lightning 2.x (pip install lightning): {e}") from e

try:  # Lightning 2.5 and later
    from lightning.pytorch.callbacks import WeightAveraging
except ImportError:  # pragma: no cover
    WeightAveraging = None

__all__ = ["ZerodStrategy"]

_HELD_BY_ZEROD = ("it reads and writes the LightningModule's parameters between steps, and while zerod holds them "
                  "they are empty tensors in torch")
# Callbacks that cannot work while zerod holds the training state: refused by
# name when fit() sets up, before anything runs.
_REFUSED_CALLBACKS = tuple((cls, why) for cls, why in (
    (GradientAccumulationScheduler,
     "zerod's accumulation window is fixed when fit() sets the engine up (from Trainer(accumulate_grad_batches=...)), "
     "so a schedule that changes it between epochs would have zerod apply updates where Lightning accumulates (as "
     "Lightning refuses it for its DeepSpeed strategy); set Trainer(accumulate_grad_batches=...) instead"),
    (StochasticWeightAveraging, _HELD_BY_ZEROD),
    (WeightAveraging, _HELD_BY_ZEROD),
) if cls is not None)


class _ZerodEnvironment(ClusterEnvironment):
    """The ranks `zerod run` started (ZEROD_RANK, ZEROD_WORLD_SIZE,
    ZEROD_LOCAL_RANK); one process otherwise. zerod creates the processes:
    Lightning launches none."""

    @property
    def creates_processes_externally(self):
        return True

    @property
    def main_address(self):
        return "127.0.0.1"

    @property
    def main_port(self):
        return 0

    @staticmethod
    def detect():
        return "ZEROD_RANK" in os.environ

    def world_size(self):
        return int(os.environ.get("ZEROD_WORLD_SIZE", "1"))

    def set_world_size(self, size):
        pass

    def global_rank(self):
        return int(os.environ.get("ZEROD_RANK", "0"))

    def set_global_rank(self, rank):
        pass

    def local_rank(self):
        return int(os.environ.get("ZEROD_LOCAL_RANK", "0"))

    def node_rank(self):
        # Each node's `zerod run` is another node (0 on every one ran
        # prepare_data_per_node=False's prepare_data on each): its ranks are
        # numbered node by node, the same count on each
        # (ZEROD_LOCAL_WORLD_SIZE), unless ZEROD_NODE_RANK says.
        if os.environ.get("ZEROD_NODE_RANK", "").isdigit():
            return int(os.environ["ZEROD_NODE_RANK"])
        return self.global_rank() // (_ranks_on_this_node(self) or self.world_size())


def _ranks_on_this_node(env):
    """How many ranks the launcher says it started on this node; None where
    it says nothing (Lightning's own launcher starts Trainer(devices=N))."""
    if not env.creates_processes_externally:
        return None
    if isinstance(env, _ZerodEnvironment):
        names = ("ZEROD_LOCAL_WORLD_SIZE",)
    elif isinstance(env, SLURMEnvironment):
        return _slurm_tasks_on_this_node()
    elif isinstance(env, MPIEnvironment):
        names = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")
    else:  # torchrun's (TorchElastic), or ranks started by hand with LOCAL_RANK
        names = ("LOCAL_WORLD_SIZE",)
    for name in names:
        if os.environ.get(name, "").isdigit() and int(os.environ[name]) > 0:
            return int(os.environ[name])
    return None


def _slurm_tasks_on_this_node():
    """srun's tasks on this node: SLURM_STEP_TASKS_PER_NODE reads "2(x3),1"
    for the step's nodes in order, SLURM_NODEID picks this node's (as
    libzerod reads it); else --ntasks-per-node."""
    spec, node = os.environ.get("SLURM_STEP_TASKS_PER_NODE", ""), os.environ.get("SLURM_NODEID", "")
    if spec and node.isdigit():
        at = 0
        for part in spec.split(","):
            count, _, times = part.partition("(x")
            at += int(times.rstrip(")") or 1)
            if int(node) < at:
                return int(count)
    per_node = os.environ.get("SLURM_NTASKS_PER_NODE", "")
    return int(per_node) if per_node.isdigit() else None


def _launcher_name(env):
    if isinstance(env, _ZerodEnvironment):
        return "`zerod run`"
    return {"TorchElasticEnvironment": "torchrun", "SLURMEnvironment": "srun (Slurm)", "MPIEnvironment": "MPI",
            "LSFEnvironment": "LSF", "LightningEnvironment": "Lightning's launcher"}.get(
                type(env).__name__, type(env).__name__)


class ZerodStrategy(ParallelStrategy):
    """A Lightning Strategy whose parameters, gradients and optimizer state
    zerod holds.

    job                 a Lua job script (path); it then says the optimizer,
                        schedule, clipping and accumulation.
    config              a DeepSpeed config (dict or JSON path) to start from
                        instead; Lightning's flags fill in the rest.
    stage, offload_optimizer, offload_parameters
                        the ZeRO stage and CPU offload, as in Lightning's
                        DeepSpeedStrategy (used without job/config).
    modules             which submodules are zerod modules (zerod.torch).
    client              a zerod.Client (default: the process's shared one).
    """

    strategy_name = "zerod"

    def __init__(self, job=None, config=None, stage=3, offload_optimizer=False, offload_parameters=False,
                 modules=None, client=None, accelerator=None, checkpoint_io=None, precision_plugin=None,
                 parallel_devices=None):
        # Under `zerod run` zerod started the ranks. Else None: Lightning
        # picks the environment as for "ddp", in its own order (torchrun,
        # Slurm, LSF, MPI, else its own launcher starting Trainer(devices=N)),
        # so that every rank's place is the one its launcher gave it (a
        # LightningEnvironment forced here made both nodes of an srun job
        # global rank 0).
        env = _ZerodEnvironment() if _ZerodEnvironment.detect() else None
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                         cluster_environment=env, checkpoint_io=checkpoint_io,
                         precision_plugin=precision_plugin)
        self._num_nodes = 1  # the Trainer's num_nodes, set by its connector
        if job is not None and config is not None:
            raise InvalidArgumentError("ZerodStrategy: give job= (a Lua job script) or config= (a DeepSpeed "
                                       "config), not both")
        if stage not in (0, 1, 2, 3):
            raise InvalidArgumentError(f"ZerodStrategy: stage must be 0, 1, 2 or 3, got {stage!r}")
        self.job = os.fspath(job) if job is not None else None
        self._config = config
        self.stage = stage
        self.offload_optimizer = offload_optimizer
        self.offload_parameters = offload_parameters
        self.modules = modules
        self._client = client
        self.engine = None
        self.engine_config = None
        self._last = None
        self._scaling = None  # the GradScaler's settings under "16-mixed"
        self._user_scaler = None  # the precision plugin's GradScaler, set aside while zerod scales the loss
        self._weights_left_empty = False  # teardown could not read the trained weights back
        self._evaluating = False  # set up for validate/test/predict (no optimizer of the user's)
        # (torch optimizer, the scheduler zerod traced or None, its lrs at
        # set-up, the scheduler whose lr a restore writes back or None): _follow_lr
        self._lr_watch = None
        # The torch optimizer's other hyperparameters as zerod took them: a
        # change is refused at the next backward (_zds.TorchHyperparameters).
        self._hyperparameters = None
        self._outer_exc = None  # an exception being handled where fit() was called: not this run's failure

    # -- where things run ---------------------------------------------------

    @property
    def root_device(self):
        acc = type(self.accelerator).__name__ if self.accelerator is not None else "CPUAccelerator"
        if acc == "CUDAAccelerator":
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    @property
    def is_distributed(self):
        return self.world_size > 1

    def model_to_device(self):
        self.model.to(self.root_device)

    def _dist(self):
        return self.world_size > 1 and torch.distributed.is_initialized()

    def reduce(self, tensor, group=None, reduce_op="mean"):
        if isinstance(tensor, torch.Tensor) and self._dist():
            return _sync_ddp_if_available(tensor, group, reduce_op=reduce_op)
        return tensor

    def barrier(self, name=None):
        if self._dist():
            torch.distributed.barrier()

    def broadcast(self, obj, src=0):
        if not self._dist():
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src)
        return box[0]

    @property
    def num_nodes(self):
        return self._num_nodes

    @num_nodes.setter
    def num_nodes(self, num_nodes):
        self._num_nodes = num_nodes

    @property
    def distributed_sampler_kwargs(self):
        # Every rank of the job, as "ddp" splits the data (ParallelStrategy's
        # default counts this node's devices alone: across nodes every node
        # would read the same samples).
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def _outside_zerod_run(self):
        return not isinstance(self.cluster_environment, _ZerodEnvironment)

    def _configure_launcher(self):
        if self._outside_zerod_run() and not self.cluster_environment.creates_processes_externally \
                and len(self.parallel_devices or [None]) > 1:
            self._launcher = _SubprocessScriptLauncher(self.cluster_environment, len(self.parallel_devices),
                                                       self.num_nodes)

    def set_world_ranks(self):
        """This process's place, as "ddp" sets it: Lightning's own launcher
        numbers its processes node by node; the other environments (zerod
        run, torchrun, Slurm, ...) say it themselves and ignore this."""
        if self.cluster_environment is None:
            return
        processes = len(self.parallel_devices or [None])
        self.cluster_environment.set_global_rank(self.node_rank * processes + self.local_rank)
        self.cluster_environment.set_world_size(self.num_nodes * processes)
        rank_zero_only.rank = utils_rank_zero_only.rank = self.global_rank

    def _refuse_a_layout_the_launch_does_not_have(self):
        """Trainer(devices=D, num_nodes=K) against the ranks the launcher
        started, from the environment alone, before this rank connects or
        meets another: every rank of a launch sees the same numbers, so every
        one refuses (where one went on it would wait for the others in a
        collective until torch's 30-minute timeout). D is the ranks on each
        node and D*K the job's (Lightning refuses a D above a GPU node's
        GPUs); under `zerod run`, D may be the job's rank count with K 1."""
        devices, nodes, world = len(self.parallel_devices or [None]), self.num_nodes, self.world_size
        here = _ranks_on_this_node(self.cluster_environment)
        if devices * nodes == world and here in (None, devices):
            return
        if not self._outside_zerod_run() and devices == world and nodes == 1:
            return
        per_node = here or max(1, world // max(1, nodes))
        counted = f"{world} ranks" + (f", {here} on this node" if here is not None else "")
        under_zerod_run_on_several_nodes = not self._outside_zerod_run() and per_node != world
        also = f", or Trainer(devices={world}) with num_nodes=1" if under_zerod_run_on_several_nodes else ""
        raise MisconfigurationException(
            f"ZerodStrategy: Trainer(devices={devices}, num_nodes={nodes}) makes {devices * nodes} rank(s), "
            f"{devices} on each node, but {_launcher_name(self.cluster_environment)} started {counted} (this is "
            f"rank {self.global_rank}); devices is the ranks on each node and num_nodes the nodes: use "
            f"Trainer(devices={per_node}, num_nodes={max(1, world // per_node)}){also}")

    def _connect_as_the_launchers_rank(self):
        """Ranks that another launcher started (Lightning's own, torchrun,
        srun, ...): their place in the job, as the cluster environment says
        it, told to libzerod (ZEROD_RANK, ..., ZEROD_NODE_RANK), which starts
        the node's daemon for them."""
        if self.world_size <= 1 or self._client is not None or os.environ.get("ZEROD_ENDPOINT"):
            return
        here = _ranks_on_this_node(self.cluster_environment) or len(self.parallel_devices or [None])
        names = dict(ZEROD_RANK=str(self.global_rank), ZEROD_WORLD_SIZE=str(self.world_size),
                     ZEROD_LOCAL_RANK=str(self.local_rank), ZEROD_LOCAL_WORLD_SIZE=str(here),
                     ZEROD_NODE_RANK=str(self.node_rank))
        before = {k: os.environ.get(k) for k in names}
        os.environ.update(names)
        try:
            self._client = default_client()
        finally:  # the process's environment as it was (this process may make another Trainer)
            for k, v in before.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def setup_environment(self):
        # Everything that can refuse this rank comes before the first
        # collective (the process group below), which would wait for ranks
        # that never come until torch's 30-minute timeout.
        self.set_world_ranks()
        self._refuse_a_layout_the_launch_does_not_have()
        if self._outside_zerod_run():
            self._connect_as_the_launchers_rank()
        client = self._client or default_client()
        self._client = client
        if (client.rank, client.world_size) != (self.global_rank, self.world_size):
            raise MisconfigurationException(
                f"ZerodStrategy: this process is rank {self.global_rank} of {self.world_size} as "
                f"{_launcher_name(self.cluster_environment)} started it, but its zerod client is rank {client.rank} "
                f"of {client.world_size}; the client must be this rank of the same job (client=, ZEROD_ENDPOINT)")
        if self.world_size > 1:
            # Lightning's own collectives (logging with sync_dist, barriers,
            # broadcasts) over gloo: outside `zerod run` at the launcher's
            # MASTER_ADDR/MASTER_PORT, as "ddp" meets; else where
            # zerod/_gloo.py says (init_gloo does nothing once one runs).
            if self._outside_zerod_run() and not torch.distributed.is_initialized():
                _init_dist_connection(self.cluster_environment, "gloo")
            init_gloo(self.global_rank, self.world_size, "lightning")
        super().setup_environment()

    # -- set-up -------------------------------------------------------------

    @property
    def restore_checkpoint_after_setup(self):
        return True  # the engine must exist to load into

    @property
    def handles_gradient_accumulation(self):
        # Lightning decides when a window ends (global_step counts updates, as
        # under "ddp"); zerod is told every micro-batch and must agree.
        return False

    @property
    def lightning_restore_optimizer(self):
        return False  # zerod's checkpoint holds the optimizer state

    def setup(self, trainer):
        self.accelerator.setup(trainer)
        if trainer.state.fn == "fit":
            self._refuse_callbacks(trainer)
        precision = getattr(self.precision_plugin, "precision", "32-true")
        plugin = type(self.precision_plugin)
        ok = ((plugin is Precision and precision == "32-true") or
              (plugin is MixedPrecision and precision in ("bf16-mixed", "16-mixed")) or
              (plugin is HalfPrecision and precision in ("bf16-true", "16-true")))
        if not ok:
            raise MisconfigurationException(
                f"ZerodStrategy does not run precision={precision!r} ({plugin.__name__}); it runs \"32-true\", "
                "\"16-mixed\", \"bf16-mixed\", \"16-true\" and \"bf16-true\"")
        self._scaling = None
        if precision == "16-mixed":
            # zerod's loss scaler takes the GradScaler's place, with its
            # settings (zerod._amp); Lightning's must not scale the loss too.
            # The user's GradScaler is set aside, not dropped: every set-up
            # (a fit after validate, a second fit) takes its settings, and
            # teardown puts it back.
            if self.precision_plugin.scaler is not None:
                self._user_scaler = self.precision_plugin.scaler
            self._scaling = _amp.grad_scaler_settings(self._user_scaler)
            self.precision_plugin.scaler = None
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        self._evaluating = trainer.state.fn != "fit"
        self._lr_watch = None
        self._outer_exc = sys.exc_info()[1]
        if trainer.state.fn == "fit":
            self.optimizers, self.lr_scheduler_configs = _init_optimizers_and_lr_schedulers(self.lightning_module)
            self._init_engine(trainer, precision)
        else:
            self.optimizers, self.lr_scheduler_configs = [], []
            self._init_engine(trainer, precision, evaluating=True)
        self.setup_precision_plugin()

    @staticmethod
    def _refuse_callbacks(trainer):
        for callback in trainer.callbacks:
            for cls, why in _REFUSED_CALLBACKS:
                if isinstance(callback, cls):
                    raise MisconfigurationException(
                        f"ZerodStrategy does not support the {type(callback).__name__} callback: {why}")

    def setup_precision_plugin(self):
        # Lightning's plugins wrap nothing here: the autocast context of
        # bf16-mixed is all they bring (train_step_context).
        pass

    def _init_engine(self, trainer, precision, evaluating=False):
        module = self.lightning_module
        if not evaluating and not module.automatic_optimization:
            # Otherwise the first manual_backward fails far from the cause
            # ("backward() without a forward"): zerod's update runs inside
            # Lightning's optimizer closure (optimizer_step below).
            raise MisconfigurationException(
                "ZerodStrategy does not support manual optimization (automatic_optimization=False): zerod applies "
                "the update inside Lightning's automatic optimization (the optimizer closure's backward and step); "
                "return the loss from training_step and leave automatic_optimization=True")
        if is_overridden("backward", module, pl.LightningModule):
            rank_zero_warn("ZerodStrategy: LightningModule.backward is overridden but not called; zerod runs "
                           "the backward (engine.backward)")
        if is_overridden("configure_gradient_clipping", module, pl.LightningModule):
            raise MisconfigurationException(
                "ZerodStrategy: configure_gradient_clipping is overridden, but zerod clips inside its step; use "
                "Trainer(gradient_clip_val=...) (norm clipping)")
        algorithm = getattr(trainer.gradient_clip_algorithm, "value", trainer.gradient_clip_algorithm)
        if algorithm not in (None, "norm"):
            raise MisconfigurationException(
                f"ZerodStrategy: gradient_clip_algorithm={algorithm!r} is not supported; "
                "zerod clips by the global norm")
        if self.job is not None:
            if trainer.accumulate_grad_batches != 1 or trainer.gradient_clip_val:
                raise MisconfigurationException(
                    "ZerodStrategy(job=...): the job script sets gradient accumulation and clipping; leave "
                    "Trainer(accumulate_grad_batches=..., gradient_clip_val=...) unset")
            if self.lr_scheduler_configs:
                rank_zero_warn("ZerodStrategy(job=...): configure_optimizers' LR scheduler is not used; the job "
                               "script's lr schedule is")
            elif len(self.optimizers) == 1:
                self._watch_lr(self.optimizers[0], None, None)
            dtype = {"bf16-true": torch.bfloat16, "16-true": torch.float16}.get(precision)
            self.engine = _zt.initialize(module, job=self.job, modules=self.modules, dtype=dtype,
                                         client=self._client)
            if precision.startswith("16-") and self.engine.zerod_model.loss_scale() == 1.0:
                raise MisconfigurationException(
                    f"ZerodStrategy(job=...): precision={precision!r} needs loss scaling, which the job script "
                    "leaves off; say precision = \"fp16\" in it (its fp16 table sets the scaler)")
            return
        cfg = self._ds_config(trainer, precision)
        opt = sched = None
        if not evaluating:
            if len(self.optimizers) != 1 or len(self.lr_scheduler_configs) > 1:
                raise MisconfigurationException(
                    f"ZerodStrategy: configure_optimizers gave {len(self.optimizers)} optimizer(s) and "
                    f"{len(self.lr_scheduler_configs)} scheduler(s); zerod runs one optimizer and at most one "
                    "scheduler")
            opt = self._optimizer_for_zerod(cfg)
            config = self.lr_scheduler_configs[0] if self.lr_scheduler_configs else None
            if config is not None and "scheduler" in cfg:
                raise MisconfigurationException(
                    "ZerodStrategy: configure_optimizers returned an LR scheduler and the DeepSpeed config has a "
                    "\"scheduler\" section; give the schedule in one place")
            # ReduceLROnPlateau follows a metric: not traced, it writes its lr
            # into param_groups, which _follow_lr hands to zerod.
            traced = config is not None and not config.reduce_on_plateau
            if opt is not None:
                # Before the trace: a momentum-cycling scheduler is refused
                # in the words zerod.deepspeed and Accelerate use.
                self._watch_lr(opt, config.scheduler if traced else None,
                               config.scheduler if config is not None else None)
            if traced:
                sched = self._traced_scheduler(trainer, config)
        elif "optimizer" not in cfg:
            cfg["optimizer"] = {"type": "SGD", "params": {"lr": 1e-3}}  # evaluation only: never applied
        self.engine = _zds.initialize(model=module, optimizer=opt, lr_scheduler=sched, config=cfg,
                                      modules=self.modules, client=self._client, _placement=None,
                                      param_dtype=torch.float32 if precision.endswith("-mixed") else None)[0]
        self.engine_config = self.engine.config  # the DeepSpeed config zerod ran, "auto" resolved

    def _optimizer_for_zerod(self, cfg):
        """configure_optimizers' optimizer for zerod.deepspeed, or None
        where it returned none (Lightning's _MockOptimizer stands in) and the
        config's "optimizer" section says it, as Lightning's DeepSpeed
        strategy takes the config's optimizer."""
        opt = self.optimizers[0]
        if isinstance(opt, _MockOptimizer):
            if "optimizer" not in cfg:
                raise MisconfigurationException(
                    "ZerodStrategy: configure_optimizers returned no optimizer and there is no DeepSpeed config "
                    "\"optimizer\" section; zerod needs one of them to train")
            return None
        if "optimizer" in cfg:
            raise MisconfigurationException(
                f"ZerodStrategy: configure_optimizers returned an optimizer ({type(opt).__name__}) and the DeepSpeed "
                "config has an \"optimizer\" section; give it in one place (configure_optimizers returning None "
                "takes the config's)")
        return opt

    def _ds_config(self, trainer, precision):
        if self._config is not None:
            cfg = _zds._dsconfig.load(self._config)
        else:
            zero = {"stage": self.stage}
            if self.offload_optimizer:
                zero["offload_optimizer"] = {"device": "cpu"}
            if self.offload_parameters:
                zero["offload_param"] = {"device": "cpu"}
            cfg = {"zero_optimization": zero}
        for key, value in (("gradient_accumulation_steps", trainer.accumulate_grad_batches),
                           ("gradient_clipping", float(trainer.gradient_clip_val or 0.0))):
            if key in cfg and cfg[key] not in ("auto", value):
                raise MisconfigurationException(
                    f"ZerodStrategy: the config's {key} is {cfg[key]!r}, the Trainer's is {value!r}; set it in one "
                    "place (the Trainer's flag)")
            cfg[key] = value
        # "auto" as Hugging Face's integration resolves it, from the Trainer:
        # the micro-batch from the train dataloader (as Lightning's DeepSpeed
        # strategy picks it), bf16 from precision="bf16-true" (bf16-mixed is
        # autocast over fp32 parameters, DeepSpeed's bf16 is bf16 weights),
        # fp16 (loss scaling) from "16-mixed" and "16-true".
        wants = {"fp16": precision in ("16-mixed", "16-true"), "bf16": precision == "bf16-true"}
        for sec, flag in wants.items():
            section = cfg.get(sec)
            if isinstance(section, dict) and section.get("enabled") == "auto":
                section["enabled"] = flag
            has = isinstance(section, dict) and bool(section.get("enabled"))
            if has != flag and (has or sec in cfg):  # a section the config leaves out is filled in below
                which = "\"16-mixed\" or \"16-true\"" if sec == "fp16" else "\"bf16-true\""
                raise MisconfigurationException(
                    f"ZerodStrategy: the config's {sec}.enabled is {has}, Trainer(precision={precision!r}) says "
                    f"otherwise; use precision={which} with an {sec} config (or \"auto\")")
        if wants["bf16"]:
            cfg["bf16"] = {"enabled": True}
        if wants["fp16"]:
            # The scale schedule: the config's own keys, else the GradScaler's
            # ("16-mixed"), else torch's GradScaler defaults ("16-true").
            _amp.fill_fp16(cfg, _amp.fp16_section("ZerodStrategy", **(self._scaling or _amp.GRAD_SCALER_DEFAULTS)))
        mbs = cfg.get("train_micro_batch_size_per_gpu")
        if mbs == "auto" or (mbs is None and cfg.get("train_batch_size") in (None, "auto")):
            cfg["train_micro_batch_size_per_gpu"] = self._loader_batch_size(trainer)
        return cfg

    @staticmethod
    def _loader_batch_size(trainer):
        source = trainer.fit_loop._data_source
        if source.is_defined():
            sampler = getattr(source.dataloader(), "batch_sampler", None)
            if getattr(sampler, "batch_size", None):
                return int(sampler.batch_size)
        return 1  # bookkeeping only, as Lightning's DeepSpeed strategy

    def _traced_scheduler(self, trainer, config):
        """The torch scheduler, stepping as Lightning will step it, for
        zerod.deepspeed to trace. Lightning's rule (its training epoch
        loop's _update_learning_rates): interval "epoch" steps it at the end
        of every `frequency`-th epoch; interval "step" after each update
        whose last batch, counted from 1 within the epoch, is a multiple of
        `frequency` (the batch, not the update: with accumulate_grad_batches
        A, after the k-th update of an epoch when k*A is a multiple of the
        frequency, the count starting again each epoch)."""
        freq, accumulate = max(1, int(config.frequency)), trainer.accumulate_grad_batches
        steps = self._updates_of_the_run(trainer)
        if config.interval not in ("step", "epoch"):
            raise MisconfigurationException(f"ZerodStrategy: LR scheduler interval {config.interval!r}")
        if config.interval == "step" and accumulate % freq == 0:
            return _zds._schedules.Stepped(config.scheduler, 1, steps)  # every update's last batch is a multiple
        trainer.fit_loop.setup_data()
        batches = trainer.num_training_batches
        if batches == float("inf") or batches <= 0:
            raise MisconfigurationException(
                f"ZerodStrategy: an LR scheduler with interval={config.interval!r} and frequency={freq} (with "
                f"accumulate_grad_batches={accumulate}) steps where Lightning counts the batches of an epoch, so "
                "zerod needs the number of batches per epoch: use a sized train dataloader"
                + (", or interval=\"step\"" if config.interval == "epoch" else
                   ", or a frequency that divides accumulate_grad_batches (1 steps it at every update)"))
        batches = int(batches)
        per_epoch = -(-batches // accumulate)
        if config.interval == "epoch":
            return _zds._schedules.Stepped(config.scheduler, per_epoch * freq, steps)

        def when(t):  # after update t (from 0): the epoch's k-th update ends at batch min(k*A, batches)
            return min((t % per_epoch + 1) * accumulate, batches) % freq == 0
        return _zds._schedules.Stepped(config.scheduler, steps=steps, when=when)

    @staticmethod
    def _updates_of_the_run(trainer):
        """How far to trace a scheduler without a length of its own
        (LambdaLR, ExponentialLR, transformers' warm-up schedules): max_steps,
        else the updates max_epochs makes (estimated_stepping_batches, one
        more as Hugging Face's integration counts); None where neither is
        finite (an iterable dataset, max_epochs=-1), and zerod.deepspeed
        then traces its default horizon and says so."""
        if trainer.max_steps and trainer.max_steps > 0:
            return trainer.max_steps
        estimated = trainer.estimated_stepping_batches
        if isinstance(estimated, int) and estimated > 0:
            limit = _zds._schedules.ESTIMATE_LIMIT
            if estimated + 1 > limit:
                rank_zero_warn(
                    f"ZerodStrategy: the run makes {estimated} updates (max_epochs={trainer.max_epochs} over "
                    f"{trainer.num_training_batches} batches, accumulate_grad_batches="
                    f"{trainer.accumulate_grad_batches}); zerod traces the LR scheduler's first {limit} and keeps "
                    "the last value after that. Set Trainer(max_steps=N) to trace the run's real length")
                return limit
            return estimated + 1
        return None

    def _watch_lr(self, optimizer, traced, scheduler):
        # zerod takes the optimizer's hyperparameters other than the lr once,
        # here: a OneCycleLR/CyclicLR cycling its momentum (returned by
        # configure_optimizers or stepped by the module) is refused now,
        # saying cycle_momentum=False, not at a later backward as a changed betas.
        _zds.refuse_cycled_momentum(optimizer, "ZerodStrategy", "the start of fit()")
        self._lr_watch = (optimizer, traced, [g["lr"] for g in optimizer.param_groups], scheduler)
        self._hyperparameters = _zds.TorchHyperparameters(optimizer, "ZerodStrategy", "the start of fit()")

    def on_train_start(self):
        super().on_train_start()
        self._refuse_checkpoints_inside_a_window(self.lightning_module.trainer)
        if self._lr_watch is not None and self._lr_watch[3] is not None:
            # The torch optimizer's lr as its restored state would hold it
            # after fit(ckpt_path=...): Lightning restored the scheduler, and
            # zerod's checkpoint (not Lightning) holds the optimizer state.
            opt, _, _, sched = self._lr_watch
            for g, lr in zip(opt.param_groups, sched.get_last_lr()):
                g["lr"] = lr

    @staticmethod
    def _refuse_checkpoints_inside_a_window(trainer):
        """Validation every val_check_batch batches where that is not a
        multiple of accumulate_grad_batches ends inside a window, and a
        checkpoint callback saving there (ModelCheckpoint at validation end)
        would meet zerod holding half a window's gradients, which its
        checkpoint cannot: refused before the first batch."""
        every, accumulate = trainer.val_check_batch, trainer.accumulate_grad_batches
        if (not trainer.checkpoint_callbacks or not trainer.enable_validation or not isinstance(every, int)
                or every % accumulate == 0):
            return
        if trainer.check_val_every_n_epoch is not None and every >= trainer.num_training_batches:
            # Validation at the epoch's end only (val_check_interval=1.0, the
            # default, makes every == the epoch's batches): an epoch that ends
            # inside a window is refused where it ends (optimizer_step), and a
            # run that stops first (max_steps) never gets there.
            return
        raise MisconfigurationException(
            f"ZerodStrategy: Trainer(val_check_interval={trainer.val_check_interval!r}) validates every {every} "
            f"batches, inside an accumulation window of accumulate_grad_batches={accumulate}, and "
            f"{type(trainer.checkpoint_callbacks[0]).__name__} saves there, which zerod cannot (the window's "
            "gradients are half accumulated in zerod); make val_check_interval a multiple of accumulate_grad_batches")

    def _follow_lr(self):
        """The lr of the update this backward's window ends in, as torch's
        optimizer.step() would read it under "ddp": what the torch
        optimizer's param_groups hold now. While they hold the lr of zerod's
        schedule (the one it traced from configure_optimizers' scheduler, or
        the job script's), zerod runs that schedule; once the loop writes
        another (a warm-up in optimizer_step or training_step,
        ReduceLROnPlateau), zerod takes it (engine.set_lr, from this window's
        update on) and follows param_groups from then on. One lr for every
        group: zerod's optimizer has one. Another hyperparameter written
        there (weight_decay, betas) is refused: zerod has no call that
        changes it during training."""
        if self._lr_watch is None:
            return
        self._hyperparameters.check()
        opt, traced, base, _ = self._lr_watch
        if self.engine._runs_schedule():
            got = [g["lr"] for g in opt.param_groups]
            # Without a traced scheduler: the lr zerod's job applies (a torch
            # scheduler made on the optimizer leaves another in the groups).
            want = (traced.get_last_lr() if traced is not None else
                    self.engine.get_lr() * len(got) if isinstance(self.engine, _zds.DeepSpeedEngine) else base)
            if len(got) == len(want) and all(_zds._same(a, b) for a, b in zip(got, want)):
                return
        self.engine._follow_lr(one_lr(opt, "ZerodStrategy"))

    # -- one micro-batch ----------------------------------------------------

    def _through_engine(self, name, *args, **kwargs):
        if self.engine is None:
            raise MisconfigurationException("ZerodStrategy: the zerod engine is not set up")
        return self._forward_redirection(self.engine, self.lightning_module, name, *args, **kwargs)

    def training_step(self, *args, **kwargs):
        with self.precision_plugin.train_step_context():
            return self._through_engine("training_step", *args, **kwargs)

    def validation_step(self, *args, **kwargs):
        with self.precision_plugin.val_step_context():
            return self._through_engine("validation_step", *args, **kwargs)

    def test_step(self, *args, **kwargs):
        with self.precision_plugin.test_step_context():
            return self._through_engine("test_step", *args, **kwargs)

    def predict_step(self, *args, **kwargs):
        with self.precision_plugin.predict_step_context():
            return self._through_engine("predict_step", *args, **kwargs)

    def backward(self, closure_loss, optimizer, *args, **kwargs):
        module = self.lightning_module
        self._follow_lr()
        closure_loss = self.precision_plugin.pre_backward(closure_loss, module)  # on_before_backward hooks
        if isinstance(self.engine, _zds.DeepSpeedEngine):
            # Lightning has divided the loss by accumulate_grad_batches (its
            # closure's normalize), and zerod averages the window's
            # micro-batches too: scale_wrt_gas=False, as for a loss scaled for
            # the window, gives the mean over the window once.
            self.engine.backward(closure_loss, scale_wrt_gas=False)
        else:
            # job=: the Trainer's accumulate_grad_batches is 1 (checked at
            # set-up), so Lightning left the loss as it is.
            self.engine.backward(closure_loss)
        self._last = self.engine.step()
        self._refuse_an_update_lightning_does_not_make(module.trainer)
        return self.precision_plugin.post_backward(closure_loss, module)  # on_after_backward hooks

    def _refuse_an_update_lightning_does_not_make(self, trainer):
        """zerod's window is fixed at set-up; Lightning's follows
        trainer.accumulate_grad_batches, which something may change during
        fit. zerod ending a window (applying an update) where Lightning
        accumulates would go on silently otherwise, an update every few
        micro-batches; optimizer_step checks the other way round."""
        if self._last.boundary and trainer.fit_loop._should_accumulate():
            raise MisconfigurationException(
                "ZerodStrategy: zerod ended an accumulation window (and applied an update) where Lightning "
                f"accumulates (accumulate_grad_batches is now {trainer.accumulate_grad_batches}): zerod's window "
                "is fixed when fit() sets it up, so accumulate_grad_batches must not change during fit (a "
                "callback setting trainer.accumulate_grad_batches)")

    def optimizer_step(self, optimizer, closure, model=None, **kwargs):
        """Lightning's update: the closure runs the micro-batch, whose
        engine.step() applied the update (the window's last micro-batch)."""
        self._last = None
        result = closure()
        if self._last is None:
            raise MisconfigurationException("ZerodStrategy: training_step returned no loss (skipping a "
                                            "backward is not supported: zerod counts every micro-batch)")
        trainer = self.lightning_module.trainer
        if not self._last.boundary:
            raise MisconfigurationException(
                f"ZerodStrategy: Lightning ends an accumulation window where zerod does not (an epoch of "
                f"{trainer.num_training_batches} batches is not a multiple of accumulate_grad_batches="
                f"{trainer.accumulate_grad_batches}, or the job script's accumulation differs); make the epoch "
                "length a multiple")
        # The update is applied: the torch optimizer's scheduler would warn
        # at its step() that it came before optimizer.step().
        mark_stepped(optimizer)
        # Called for the hooks' sake; the update is already applied (zerod
        # holds the gradients: torch's param.grad is empty here).
        call._call_callback_hooks(trainer, "on_before_optimizer_step", optimizer)
        call._call_lightning_module_hook(trainer, "on_before_optimizer_step", optimizer)
        return result

    # -- checkpoints --------------------------------------------------------

    def lightning_module_state_dict(self):
        if self.engine is None:
            # After fit/validate: teardown put the weights back in torch.
            self._require_weights_in_torch()
            return super().lightning_module_state_dict()
        # zerod holds the weights: they go into the checkpoint directory in
        # zerod's format, not into Lightning's dictionary.
        return {}

    def _require_weights_in_torch(self):
        if self._weights_left_empty:
            raise MisconfigurationException(
                "ZerodStrategy: the trained weights could not be read back from zerod when fit ended (see its "
                "warning), so there is nothing to save; save with ModelCheckpoint during fit")

    def optimizer_state(self, optimizer):
        return {}

    def save_checkpoint(self, checkpoint, filepath, storage_options=None):
        if self.engine is None:
            # After fit/validate (teardown freed zerod's model and put the
            # weights back in torch): Lightning's ordinary checkpoint file, as
            # the base strategy writes it. It holds no optimizer state (zerod's
            # went with its model).
            self._require_weights_in_torch()
            if self.is_global_zero:
                self.checkpoint_io.save_checkpoint(checkpoint, filepath, storage_options=storage_options)
            return
        if storage_options is not None:
            raise TypeError("ZerodStrategy.save_checkpoint: storage_options is not supported (zerod writes the "
                            "checkpoint directory itself)")
        filepath = self.broadcast(os.fspath(filepath))  # every rank writes its shard into rank 0's path
        state = {k: v for k, v in checkpoint.items() if k not in ("state_dict", "optimizer_states")}
        self.engine.save_checkpoint(filepath, tag="checkpoint", client_state=state)

    def load_checkpoint(self, checkpoint_path, weights_only=None):
        path = os.fspath(checkpoint_path)
        if not os.path.isdir(os.path.join(path, "checkpoint")):
            raise MisconfigurationException(
                f"ZerodStrategy: {path} is not a zerod checkpoint directory (one ModelCheckpoint wrote under "
                "this strategy holds a 'checkpoint' folder)")
        if self._evaluating and isinstance(self.engine, _zds.DeepSpeedEngine):
            # validate/test/predict(ckpt_path=...): the weights alone. The
            # engine's optimizer is a stand-in (set-up outside fit has none of
            # the user's), into which the checkpoint's optimizer state would
            # not load.
            _, client_state = self.engine.load_checkpoint(path, tag="checkpoint", load_module_only=True)
        else:
            _, client_state = self.engine.load_checkpoint(path, tag="checkpoint")
        return client_state

    def load_model_state_dict(self, checkpoint, strict=True):
        pass  # load_checkpoint put the weights into zerod

    def load_optimizer_state_dict(self, checkpoint):
        pass  # and the optimizer state

    def teardown(self):
        engine, self.engine = self.engine, None
        self._lr_watch = None
        if self._user_scaler is not None:
            self.precision_plugin.scaler = self._user_scaler  # as the user gave it ("16-mixed" set it aside)
        try:
            if engine is not None:
                self._give_back_weights(engine)
        finally:
            super().teardown()

    def _give_back_weights(self, engine):
        """The parameters go back into torch (as other strategies leave the
        trained model usable), then zerod's model is freed, whatever happens.
        After a failure (Lightning tears down while its exception is in
        flight) the engine may be unusable (a backward that did not finish)
        or the other ranks elsewhere than in the collective reads: the
        weights are then left behind with a warning, and the user's
        exception goes on as it was."""
        exc = sys.exc_info()[1]
        failing = exc is not None and exc is not self._outer_exc and not isinstance(exc, _TunerExitException)
        self._outer_exc = None
        state, why = None, None
        try:
            if engine._broken:
                why = engine._broken
            elif failing and engine.world_size > 1:
                why = "the run failed, and reading them back would wait for the other ranks"
            else:
                state = engine.state_dict()
        except Exception as e:
            why = f"{type(e).__name__}: {e}"
            if not failing:
                raise
        finally:
            slots = list(engine._slots)
            try:
                engine.close()
            except Exception as e:
                if not failing and state is not None:
                    raise
                rank_zero_warn(f"ZerodStrategy: closing zerod's model failed ({type(e).__name__}: {e})")
        if state is None:
            self._weights_left_empty = True
            rank_zero_warn(
                f"ZerodStrategy: the trained weights could not be read back from zerod ({why}); the "
                f"LightningModule's {len(slots)} parameter(s) zerod held are left empty (0 elements): load them "
                "from a checkpoint (ModelCheckpoint)")
            return
        self._weights_left_empty = False
        with torch.no_grad():
            for s in slots:
                s.param.data = torch.empty(s.shape, dtype=s.param.dtype, device=s.param.device)
        own = self.lightning_module.state_dict(keep_vars=True)
        with torch.no_grad():
            for k, v in state.items():
                if k in own and isinstance(v, torch.Tensor):  # not a module's get_extra_state()
                    own[k].copy_(v)

    @classmethod
    def register_strategies(cls, registry):
        registry.register("zerod", cls, description="zerod, ZeRO stage 3 (the default)", override=True, stage=3)
        for stage in (1, 2, 3):
            registry.register(f"zerod_stage_{stage}", cls, description=f"zerod, ZeRO stage {stage}", override=True,
                              stage=stage)
        registry.register("zerod_stage_2_offload", cls, description="zerod, ZeRO stage 2, optimizer on the CPU",
                          override=True, stage=2, offload_optimizer=True)
        registry.register("zerod_stage_3_offload", cls,
                          description="zerod, ZeRO stage 3, optimizer and parameters on the CPU",
                          override=True, stage=3, offload_optimizer=True, offload_parameters=True)


ZerodStrategy.register_strategies(StrategyRegistry)
