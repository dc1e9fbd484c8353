"""Hugging Face's Trainer on zerod: a Trainer subclass.

    from transformers import TrainingArguments
    from zerod.transformers import ZerodTrainer as Trainer   # the changed line
    args = TrainingArguments(output_dir="out", deepspeed="ds_config.json", bf16=True,
                             gradient_accumulation_steps=4, save_steps=500)
    trainer = Trainer(model=model, args=args, train_dataset=dataset)
    trainer.train()                                       # or resume_from_checkpoint="out/checkpoint-500"

Why a subclass: the Trainer has no registry for training back-ends. With
TrainingArguments(deepspeed=...) it takes its DeepSpeed path, which is the
path a DeepSpeed config is written for: "auto" values filled from the
arguments (HfTrainerDeepSpeedConfig), the optimizer and scheduler from the
config's sections or from the arguments (DummyOptim/DummyScheduler), the
loss scaled for the accumulation window, checkpoints written by the
engine's save_checkpoint into checkpoint-N/ and read back by its
load_checkpoint on resume_from_checkpoint. ZerodTrainer keeps all of that
and changes only which engine Accelerate builds: where Accelerate's
_prepare_deepspeed calls deepspeed.initialize, zerod.deepspeed.initialize
runs, with the same resolved config and the same objects.

What it overrides, on the Trainer's Accelerator (made by the Trainer, then
given this module's subclass of it):
- _prepare_deepspeed: Accelerate's own, with deepspeed.initialize standing
  for zerod's during that call. A torch optimizer stays the torch optimizer
  (zero_force_ds_cpu_optimizer off: with offload Accelerate would swap it
  for DeepSpeedCPUAdam, which only picks DeepSpeed's kernel for the same
  update; zerod runs its own). Where the config has no "scheduler" the
  Trainer's scheduler (lr_scheduler_type, warmup) is made now and traced
  into zerod's job, since zerod runs the schedule itself; the Trainer steps
  the same object, so its logged lr is the one zerod applies.
- backward: zerod's backward, then its step after every micro-batch (zerod
  counts micro-batches at step; Accelerate's DeepSpeed wrapper steps only
  at the window's end). The Trainer passes scale_wrt_gas=False, as to
  DeepSpeed: its losses are already scaled for the window.
- unwrap_model and get_state_dict: the model, and its full fp32 weights
  from zerod at any ZeRO stage (so model.safetensors in every checkpoint,
  also at stage 3 where DeepSpeed needs
  stage3_gather_16bit_weights_on_model_save).

Needs DeepSpeed installed: TrainingArguments(deepspeed=...) and the
Trainer's DeepSpeed path import it (for its config class and logger); none
of its engine, zero.Init, ops or process groups is used. Importing this
module keeps transformers from registering the DeepSpeed config as its own
(is_deepspeed_zero3_enabled() is false in this process), so a model made
after a ZeRO-3 TrainingArguments (from_pretrained, from_config, model_init)
is not built inside deepspeed.zero.Init for DeepSpeed to partition: zerod
partitions it. One process: several
(torchrun, accelerate launch, mpirun, srun, `zerod run --nproc N`) are
refused by name.
An accumulation window must end where the Trainer ends it: an epoch whose
micro-batch count is not a multiple of gradient_accumulation_steps (the
Trainer ends a short window there) is refused when it happens.
"""
import os

import torch

from . import _schedules, default_client
from . import deepspeed as _zds
from .accelerate import _launcher
from .errors import InvalidArgumentError, InvalidStateError

try:
    from accelerate import Accelerator
    from transformers import Trainer
except ImportError as e:  # pragma: no cover
    raise ImportError(f"zerod.transformers needs Hugging Face Transformers and Accelerate "
                      f"(pip install transformers accelerate): {e}") from e

__all__ = ["ZerodTrainer"]


def _zerod_holds_the_deepspeed_config(hf_deepspeed_config):
    """Stands for transformers.integrations.deepspeed.set_hf_deepspeed_config,
    which every HfDeepSpeedConfig (TrainingArguments', Accelerate's plugin's)
    calls to make itself the config transformers' is_deepspeed_zero3_enabled()
    and deepspeed_config() read: it registers nothing. zerod reads the config
    from the Trainer's Accelerator; transformers registering a ZeRO-3 one
    would build every later model (from_pretrained, from_config, model_init)
    inside DeepSpeed's zero.Init, partitioned by DeepSpeed instead."""


def _keep_deepspeed_zero3_from_transformers():
    # Rebinding is_deepspeed_zero3_enabled would not reach the modules that
    # imported it by name (modeling_utils, integrations.accelerate, many
    # models, imported lazily later); all of them read the one weak reference
    # set_hf_deepspeed_config sets. A config registered before this import
    # (TrainingArguments made first) is dropped.
    from transformers.integrations import deepspeed as hf_deepspeed

    hf_deepspeed.set_hf_deepspeed_config = _zerod_holds_the_deepspeed_config
    hf_deepspeed.unset_hf_deepspeed_config()


_keep_deepspeed_zero3_from_transformers()


class ZerodTrainer(Trainer):
    """A transformers.Trainer that trains on zerod with the DeepSpeed config
    of TrainingArguments(deepspeed=...).

    modules, client   as in zerod.torch.initialize.
    Every other argument is Trainer's.
    """

    def __init__(self, *args, modules=None, client=None, **kwargs):
        # Read by create_accelerator_and_postprocess, which Trainer.__init__ calls.
        self._zerod = dict(modules=modules, client=client)
        super().__init__(*args, **kwargs)

    def create_accelerator_and_postprocess(self):
        super().create_accelerator_and_postprocess()
        if not self.is_deepspeed_enabled:
            raise InvalidArgumentError(
                "ZerodTrainer trains with a DeepSpeed config: give TrainingArguments(deepspeed=\"ds_config.json\") "
                "(or a dict), as for the Trainer's DeepSpeed integration")
        # The launcher's variables, not only Accelerate's count: Accelerate
        # reads none of srun's and, without cpu=True, none of mpirun's, so it
        # saw one process while zerod joined the launcher's ranks, and each
        # Trainer trained on the whole dataset into the same checkpoint-N.
        who, world = _launcher()
        if os.environ.get("ZEROD_ENDPOINT") in ("embedded:", "embedded"):
            world = 1  # each process trains on its own, on purpose
        if self.accelerator.num_processes != 1 or world != 1:
            _refuse_several_processes(max(self.accelerator.num_processes, world),
                                      who if world != 1 else "the launcher")
        if not torch.distributed.is_initialized():
            # The Trainer's DeepSpeed path gathers what it logs over the process
            # group deepspeed.initialize would have made: one rank's here, over
            # gloo in memory. Only the Trainer's own gathers use it.
            torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
        # The Trainer builds its Accelerator by name inside this method; the
        # subclass below adds zerod's engine to that very object (its state
        # and the Trainer's references to it stay as they are).
        self.accelerator.__class__ = _ZerodDeepSpeedAccelerator
        self.accelerator._zerod_setup(self)

    @property
    def zerod_engine(self):
        """zerod's engine (a zerod.deepspeed.DeepSpeedEngine) once train() has
        prepared the model; None before."""
        return self.accelerator.zerod_engine

    def _zerod_trainer_scheduler(self, torch_optimizer):
        """The scheduler the Trainer would make after prepare (its
        create_scheduler: lr_scheduler_type, warmup), made now on the torch
        optimizer so zerod can trace it; the Trainer keeps and steps it."""
        return self.create_scheduler(num_training_steps=self.state.max_steps, optimizer=torch_optimizer)


class _ZerodDeepSpeedAccelerator(Accelerator):
    """The Trainer's Accelerator, with zerod's engine where DeepSpeed's would be."""

    zerod_engine = None

    def _zerod_setup(self, trainer):
        self._zerod_trainer = trainer
        self._zerod_torch_optimizer = None  # the Trainer's, when its scheduler steps on it

    def _prepare_deepspeed(self, *args):
        import deepspeed

        self.deepspeed_plugin.deepspeed_config["zero_force_ds_cpu_optimizer"] = False
        # Accelerate resolves the config and wraps the engine it gets back
        # (DeepSpeedEngineWrapper, DeepSpeedOptimizerWrapper, ...) in this one
        # method, calling deepspeed.initialize by its module attribute: zerod's
        # stands in for that call only.
        real = deepspeed.initialize
        deepspeed.initialize = self._zerod_initialize
        try:
            return super()._prepare_deepspeed(*args)
        finally:
            deepspeed.initialize = real

    def _zerod_initialize(self, model=None, config_params=None, model_parameters=None, optimizer=None,
                          lr_scheduler=None, **kwargs):
        unknown = {k: v for k, v in kwargs.items() if v is not None}
        if unknown:
            raise InvalidArgumentError(f"ZerodTrainer: deepspeed.initialize was given {sorted(unknown)}, which zerod "
                                       "does not take (model parallelism or sequence parallelism)")
        if self.zerod_engine is not None:
            raise InvalidStateError("ZerodTrainer: the model is on zerod already (one train() per ZerodTrainer)")
        _refuse_deepspeed_partitioned(model)
        trainer = self._zerod_trainer
        client = trainer._zerod["client"] or default_client()
        if client.world_size != 1:  # a launcher whose variables the Trainer's check did not read
            _refuse_several_processes(client.world_size, "the launcher zerod joined them from")
        # Traced one past the last update: the lr the Trainer logs after it.
        steps = trainer.state.max_steps + 1 if trainer.state.max_steps else None
        if lr_scheduler is not None and not isinstance(lr_scheduler, torch.optim.lr_scheduler.LRScheduler):
            # The Trainer's own scheduler over the config's optimizer (a config
            # with "optimizer" but no "scheduler"): traced for max_steps updates.
            make = lr_scheduler
            lr_scheduler = lambda opt: _schedules.Stepped(make(opt), steps=steps)  # noqa
        elif lr_scheduler is None and isinstance(optimizer, torch.optim.Optimizer) and \
                "scheduler" not in config_params:
            # No scheduler anywhere yet: the Trainer makes its own after prepare.
            lr_scheduler = _schedules.Stepped(trainer._zerod_trainer_scheduler(optimizer), steps=steps)
            self._zerod_torch_optimizer = optimizer
        engine, opt, _, sched = _zds.initialize(
            model=model, model_parameters=model_parameters, optimizer=optimizer, lr_scheduler=lr_scheduler,
            config=config_params, modules=trainer._zerod["modules"], client=trainer._zerod["client"],
            _placement=trainer.args.device)  # where the Trainer puts the batches; DeepSpeed's engine places the model
        self.zerod_engine = engine
        return engine, opt, None, sched

    def backward(self, loss, **kwargs):
        engine = self.zerod_engine
        if engine is None:
            return super().backward(loss, **kwargs)
        scale_wrt_gas = kwargs.pop("scale_wrt_gas", True)
        if kwargs:
            raise InvalidArgumentError(f"ZerodTrainer: backward({sorted(kwargs)}) is not supported")
        engine.backward(loss, scale_wrt_gas=scale_wrt_gas)
        r = engine.step()
        if r.boundary and self._zerod_torch_optimizer is not None:
            # zerod applied the update the torch optimizer stands for: its LR
            # scheduler's check that the optimizer stepped first (a warning
            # that the schedule skips a value) holds.
            self._zerod_torch_optimizer._opt_called = True
        if r.boundary != bool(self.sync_gradients):
            raise InvalidStateError(
                f"zerod {'ended' if r.boundary else 'did not end'} an accumulation window where the Trainer "
                f"{'did not' if r.boundary else 'did'} (gradient_accumulation_steps="
                f"{engine.gradient_accumulation_steps()}): the Trainer ends a short window at the end of an epoch "
                "whose micro-batch count is not a multiple of it, which zerod cannot; make each epoch's batch "
                "count a multiple (the dataset's size or per_device_train_batch_size)")

    def unwrap_model(self, model, keep_fp32_wrapper=True, keep_torch_compile=True):
        if self.zerod_engine is not None and model is self.zerod_engine:
            return model.module
        return super().unwrap_model(model, keep_fp32_wrapper, keep_torch_compile)

    def get_state_dict(self, model, unwrap=True):
        """The full fp32 weights zerod holds (any stage): what save_model
        writes (tied weights share a tensor, so the file holds them once, as
        DeepSpeed's stage 3 and the plain Trainer write them)."""
        engine = self.zerod_engine
        if engine is not None and (model is engine or model is engine.module):
            return engine.state_dict()
        return super().get_state_dict(model, unwrap)


def _refuse_several_processes(processes, who):
    raise InvalidArgumentError(
        f"ZerodTrainer runs in one process (this is one of {processes}, started by {who}): torchrun, accelerate "
        "launch, mpirun, srun and `zerod run --nproc N` are not supported with Hugging Face's Trainer yet "
        "(each process would train the Trainer on the whole dataset, all writing the same checkpoints)")


def _refuse_deepspeed_partitioned(model):
    """A model built inside deepspeed.zero.Init has DeepSpeed's partitions
    for parameters (empty tensors with ds_id, ds_numel), which zerod cannot
    register."""
    for name, p in model.named_parameters():
        if hasattr(p, "ds_id") or hasattr(p, "ds_numel"):
            raise InvalidArgumentError(
                f"ZerodTrainer: parameter '{name}' was partitioned by DeepSpeed (it has ds_id/ds_numel): the model "
                "was built inside deepspeed.zero.Init, as from_pretrained and from_config do after a ZeRO-3 "
                "TrainingArguments made before zerod.transformers was imported; import zerod.transformers first "
                "(transformers then leaves the model whole for zerod to partition)")
