"""The same DeepSpeed config trains the same model under real DeepSpeed (from
PyPI, on the CPU) and under zerod through zerod.deepspeed, whose API the
training loop uses unchanged: the losses match step for step.

DeepSpeed runs every config in one subprocess (its import and process group
are paid once); zerod runs them here. Tolerances: fp32 every step within
1e-4 relative; bf16 within 2e-2 (bf16 rounding of the weights compounds).
The measured differences are printed (pytest -s) for docs/integrations.md.
"""
import json
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from conftest import reserved_port

STEPS = 12  # micro-batches

CONFIGS = {
    # stage 0, AdamW, log warm-up, clipping, accumulation
    "adamw_warmup_clip_gas2": {
        "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2, "gradient_clipping": 0.5,
        "optimizer": {"type": "AdamW", "params": {"lr": 2e-2, "betas": [0.9, 0.95], "weight_decay": 0.05}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4, "warmup_max_lr": 2e-2}},
        "steps_per_print": 100, "wall_clock_breakdown": False},
    # stage 2, Adam with L2 decay, linear warm-up then decay
    "adam_l2_stage2_warmupdecay": {
        "train_batch_size": 8, "train_micro_batch_size_per_gpu": 8,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "weight_decay": 0.01, "adam_w_mode": False}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 3, "total_num_steps": 12,
                                                           "warmup_max_lr": 1e-2, "warmup_type": "linear"}},
        "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e7, "overlap_comm": False,
                              "contiguous_gradients": True}},
    # stage 3, optimizer and parameters offloaded to the CPU, cosine
    "stage3_offload_cosine": {
        "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}},
        "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 12, "warmup_num_steps": 3,
                                                            "warmup_type": "linear"}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                              "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}},
    # stage 1, SGD with momentum, one cycle without momentum cycling
    "sgd_onecycle_stage1": {
        "train_micro_batch_size_per_gpu": 8, "zero_allow_untested_optimizer": True,
        "optimizer": {"type": "SGD", "params": {"lr": 5e-2, "momentum": 0.9}},
        "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-2, "cycle_max_lr": 5e-2,
                                                      "cycle_first_step_size": 4, "cycle_momentum": False,
                                                      "decay_lr_rate": 0.5, "decay_step_size": 2}},
        "zero_optimization": {"stage": 1}},
    # SGD without an lr: DeepSpeed's torch.optim.SGD takes its default
    "sgd_without_lr": {
        "train_micro_batch_size_per_gpu": 8, "optimizer": {"type": "SGD", "params": {"momentum": 0.9}}},
    # bf16 at stage 1
    "bf16_stage1": {
        "train_micro_batch_size_per_gpu": 8, "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "zero_optimization": {"stage": 1}},
}

# The trainer brings its own torch optimizer and LR scheduler (no "optimizer"
# or "scheduler" section): both sides are given the same objects' kind.
def _torch_adamw_lambda(model):
    opt = torch.optim.AdamW(model.parameters(), lr=2e-2, betas=(0.9, 0.99), weight_decay=0.1)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda t: min(1.0, (t + 1) / 4) * 0.9 ** t)


def _torch_sgd_step(model):
    opt = torch.optim.SGD(model.parameters(), lr=5e-2, momentum=0.9, nesterov=True)
    return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)


def _torch_adamw_cosine(model):
    """CosineAnnealingLR over 12 updates with T_max=3: T_max is half a period,
    after which torch's cosine rises again (DeepSpeed steps it on)."""
    opt = torch.optim.AdamW(model.parameters(), lr=2e-2, weight_decay=0.0)
    return opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=3, eta_min=1e-3)


def _nanogpt_lr(update, warmup=2, decay=6, max_lr=2e-2, min_lr=2e-3):
    """nanoGPT's get_lr(it): a linear warm-up, a cosine down to min_lr."""
    if update < warmup:
        return max_lr * (update + 1) / (warmup + 1)
    if update > decay:
        return min_lr
    ratio = (update - warmup) / (decay - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (max_lr - min_lr)


# A schedule the training loop writes into optimizer.param_groups, which
# DeepSpeed applies at its step: (config, the lr written before micro-batch
# s, or None for none).
HAND = {
    # nanoGPT's loop: each update's lr written before its window's micro-batches
    "hand_cosine_stage2_gas2": ({"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2,
                                 "optimizer": {"type": "AdamW", "params": {"lr": 2e-2, "weight_decay": 0.05}},
                                 "zero_optimization": {"stage": 2}},
                                lambda s: _nanogpt_lr(s // 2)),
    # one update's lr written under DeepSpeed's WarmupLR: its scheduler writes its own over it after the step
    "hand_under_warmuplr": (CONFIGS["adamw_warmup_clip_gas2"], lambda s: 1e-3 if s in (6, 7) else None),
}



def _adamw_left_at_a_quarter(model):
    """A torch AdamW whose LambdaLR the script made and never gives
    initialize() nor steps: its groups hold a quarter of the lr (the lr
    DeepSpeed's update reads), the optimizer's own kept as initial_lr."""
    opt = torch.optim.AdamW(model.parameters(), lr=2e-2, weight_decay=0.05)
    torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 0.25)
    return opt


# The same written into the param_groups of the torch optimizer the script
# gave initialize(), which DeepSpeed's optimizer steps with: (config, the
# optimizer of a model, the lr written before micro-batch s or None).
HAND_ON_OPTIMIZER = {
    "hand_cosine_on_torch_adamw_stage2_gas2": (
        {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 2}},
        lambda model: torch.optim.AdamW(model.parameters(), lr=2e-2, weight_decay=0.05),
        lambda s: _nanogpt_lr(s // 2)),
    "hand_on_torch_adamw_under_warmuplr": (
        {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2, "gradient_clipping": 0.5,
         "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4, "warmup_max_lr": 2e-2}}},
        lambda model: torch.optim.AdamW(model.parameters(), lr=2e-2, betas=(0.9, 0.95), weight_decay=0.05),
        lambda s: 1e-3 if s in (6, 7) else None),
    # the lr an unstepped scheduler left in the groups, then one written
    "lr_left_by_a_scheduler_then_written_stage1": (
        {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 1}},
        _adamw_left_at_a_quarter, lambda s: 3e-3 if s == 7 else None),
}

# model_parameters as parameter groups that set hyperparameters: DeepSpeed
# hands them to the optimizer the config's section makes, where they override
# the section's (and WarmupLR rises to the group's lr). (config, the groups
# of a model)
GROUPS = {
    "group_lr_under_warmuplr": ({"train_micro_batch_size_per_gpu": 8,
                                 "optimizer": {"type": "AdamW", "params": {"lr": 2e-2, "weight_decay": 0.0}},
                                 "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4,
                                                                              "warmup_type": "linear"}}},
                                lambda model: [{"params": list(model.parameters()), "lr": 1e-5}]),
    "no_decay_groups_under_decay": ({"train_micro_batch_size_per_gpu": 8,
                                     "optimizer": {"type": "AdamW", "params": {"lr": 2e-2, "weight_decay": 0.1}}},
                                    lambda model: [
                                        {"params": [p for n, p in model.named_parameters() if n.endswith("weight")],
                                         "weight_decay": 0.0},
                                        {"params": [p for n, p in model.named_parameters() if n.endswith("bias")],
                                         "weight_decay": 0.0}]),
}

CLIENT = {
    "torch_adamw_lambdalr_gas2": ({"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2,
                                   "zero_optimization": {"stage": 2}}, _torch_adamw_lambda),
    "torch_sgd_nesterov_steplr": ({"train_batch_size": 8, "zero_allow_untested_optimizer": True,
                                   "zero_optimization": {"stage": 1}}, _torch_sgd_step),
    "torch_adamw_cosine_past_t_max": ({"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 1}},
                                      _torch_adamw_cosine),
}

# model_parameters as model.named_parameters() yields them, (name, parameter)
# pairs, flat or in a group: DeepSpeed hands them to its optimizer, which
# torch >= 2.6 takes. (config of CONFIGS, the model_parameters of a model)
NAMED = {
    "named_parameters_stage1": ("sgd_onecycle_stage1", lambda model: model.named_parameters()),
    "named_parameters_stage3_offload": ("stage3_offload_cosine", lambda model: model.named_parameters()),
    "named_parameters_in_a_group": ("adamw_warmup_clip_gas2",
                                    lambda model: [{"params": list(model.named_parameters()), "weight_decay": 0.05}]),
}

DEEPSPEED = r'''
import json, os, sys, torch
for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": sys.argv[2], "RANK": "0", "WORLD_SIZE": "1",
             "LOCAL_RANK": "0"}.items():
    os.environ.setdefault(k, v)
import deepspeed
sys.path.insert(0, os.path.dirname(sys.argv[0]))
from test_deepspeed_side_by_side import (CONFIGS, CLIENT, GROUPS, HAND, HAND_ON_OPTIMIZER, LOADS, NAMED, make,
                                        train, train_applied, load_run, save_model, saved_16bit, loaders_by_route)
out = {}
for name, cfg in CONFIGS.items():
    model = make()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=dict(cfg))
    out[name] = train(engine, cfg)
for name, (cfg, build) in CLIENT.items():
    model = make()
    opt, sched = build(model)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=dict(cfg))
    out[name] = train(engine, cfg)
for name, (cfg, groups) in GROUPS.items():
    model = make()
    engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=groups(model), config=dict(cfg))
    out[name] = train_applied(engine, opt, cfg)
for name, (cfg_name, params) in NAMED.items():
    model = make()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params(model), config=dict(CONFIGS[cfg_name]))
    out[name] = train(engine, CONFIGS[cfg_name])
for name, (cfg, lr_at) in HAND.items():
    model = make()
    engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=dict(cfg))
    out[name] = train(engine, cfg, lr_at=lr_at, optimizer=opt)
for name, (cfg, build, lr_at) in HAND_ON_OPTIMIZER.items():
    model = make()
    opt = build(model)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=dict(cfg))
    out[name] = train(engine, cfg, lr_at=lr_at, optimizer=opt, group_lr=True)
model = make()
dataset = torch.utils.data.TensorDataset(torch.arange(40.0).view(20, 2))
engine, _, loader, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), training_data=dataset,
                                            config={"train_micro_batch_size_per_gpu": 4,
                                                    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
out["loader"] = [b[0][:, 0].tolist() for b in loader]
model = make()
dataset = torch.utils.data.TensorDataset(torch.arange(44.0).view(22, 2))
engine, _, loader, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), training_data=dataset,
                                            config={"train_micro_batch_size_per_gpu": 4, "dataloader_drop_last": True,
                                                    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
out["loader_drop_last"] = [len(loader)] + [b[0][:, 0].tolist() for b in loader]
out["loader_routes"] = loaders_by_route(deepspeed.initialize)
model = save_model()
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                       config=dict(CONFIGS["bf16_stage1"]))
d = os.path.join(os.path.dirname(sys.argv[1]), "save_16bit")
out["save_16bit"] = saved_16bit(engine, d)
out["loads"] = {}
for name in LOADS:
    d = os.path.join(os.path.dirname(sys.argv[1]), "load_" + name)
    out["loads"][name] = load_run(deepspeed.initialize, name, d)
json.dump(out, open(sys.argv[1], "w"))
'''


def first_column_negated(samples):
    """A collate_fn of its own (a list, not default_collate's tensors), so
    that a loader shows which collate_fn it batched with."""
    return [-float(s[0][0]) for s in samples]


def loaders_by_route(initialize):
    """What the loaders batch, the same calls under both: initialize()'s
    training loader with its collate_fn, and deepspeed_io() for routes
    "eval" (initialize()'s collate_fn) and "predict" (one given to it),
    which DeepSpeed reads in order where "train" shuffles."""
    dataset = torch.utils.data.TensorDataset(torch.arange(40.0).view(20, 2))
    engine, _, loader, _ = initialize(model=make(), training_data=dataset, collate_fn=first_column_negated,
                                      config={"train_micro_batch_size_per_gpu": 4,
                                              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
    try:
        return {"train": list(loader), "eval": list(engine.deepspeed_io(dataset, route="eval")),
                "predict": [b[0][:, 0].tolist() for b in engine.deepspeed_io(
                    dataset, route="predict", collate_fn=torch.utils.data.default_collate)]}
    finally:
        engine.destroy()


def make(extra_layer=False):
    torch.manual_seed(0)
    layers = [nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 4)]
    return nn.Sequential(*layers, *([nn.Tanh(), nn.Linear(4, 4)] if extra_layer else []))


def save_model():
    """make()'s model with buffers and a frozen parameter (a BatchNorm whose
    weight is frozen), for save_16bit_model."""
    model = nn.Sequential(make(), nn.BatchNorm1d(4))
    model[1].weight.requires_grad_(False)
    with torch.no_grad():
        model[1].running_mean.fill_(0.25)
    return model


def saved_16bit(engine, d):
    """What save_16bit_model writes, the same calls under both: its return
    values, the files, and each file's keys with their type and shape."""
    out = {"returned": [engine.save_16bit_model(d), engine.save_16bit_model(d, "no_frozen.bin",
                                                                           exclude_frozen_parameters=True),
                        engine.save_fp16_model(d, "old_name.bin")],
           "files": sorted(os.listdir(d))}
    for name in out["files"]:
        sd = torch.load(os.path.join(d, name), map_location="cpu", weights_only=True)
        out[name] = {k: [str(v.dtype), list(v.shape)] for k, v in sd.items()}
    return out


_TEACHER = torch.randn(16, 4, generator=torch.Generator().manual_seed(7)) / 4


def batch(step, dtype=torch.float32):
    """A learnable task (a fixed linear teacher), so that the loss falls."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(8, 16, generator=g)
    return x.to(dtype), torch.tanh(x @ _TEACHER)


def train(engine, cfg, steps=range(STEPS), lr_at=None, optimizer=None, group_lr=False):
    """The DeepSpeed loop, written once for both: each micro-batch's loss,
    and after its step() the engine's get_lr() and global_steps. With
    lr_at, the lr lr_at(s) is written into the optimizer's param_groups
    before micro-batch s (where it is not None), as a hand-written schedule
    does; with group_lr, what its param_groups[0]["lr"] holds after each
    step() is kept too."""
    dtype = torch.bfloat16 if cfg.get("bf16", {}).get("enabled") else torch.float32
    out = {"loss": [], "lr": [], "global_steps": []}
    if group_lr:
        out["group_lr"] = []
    for s in steps:
        if lr_at is not None and lr_at(s) is not None:
            for g in optimizer.param_groups:
                g["lr"] = lr_at(s)
        x, y = batch(s, dtype)
        loss = ((engine(x).float() - y) ** 2).mean()
        engine.backward(loss)
        engine.step()
        out["loss"].append(float(loss.detach()))
        out["lr"].append(float(engine.get_lr()[0]))
        out["global_steps"].append(int(engine.global_steps))
        if group_lr:
            out["group_lr"].append(float(optimizer.param_groups[0]["lr"]))
    return out


def train_applied(engine, optimizer, cfg):
    """train()'s loop, with what the optimizer's param_groups hold before each
    micro-batch's step: the lr that update applies, and the weight decay."""
    out = {"loss": [], "lr": [], "weight_decay": []}
    for s in range(STEPS):
        out["lr"].append(float(optimizer.param_groups[0]["lr"]))
        out["weight_decay"].append(float(optimizer.param_groups[0]["weight_decay"]))
        x, y = batch(s)
        loss = ((engine(x) - y) ** 2).mean()
        engine.backward(loss)
        engine.step()
        out["loss"].append(float(loss.detach()))
    return out


# load_checkpoint's flags, run the same way under DeepSpeed and zerod
# (load_run): 6 micro-batches under the first config, save_checkpoint, then a
# fresh engine of the second config (on a model whose weights are not the
# checkpoint's) loads it with the flags and trains 6 more.
ADAMW_STAGE1 = {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 1},
                "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}}}
LOADS = {
    # no lr schedule: the weights and DeepSpeed's counters, the optimizer fresh
    "no_optimizer_states": (ADAMW_STAGE1, ADAMW_STAGE1, {"load_optimizer_states": False}),
    # neither optimizer nor schedule: both start over, the counters go on
    "no_optimizer_or_scheduler_states": ("adam_l2_stage2_warmupdecay", "adam_l2_stage2_warmupdecay",
                                         {"load_optimizer_states": False, "load_lr_scheduler_states": False}),
    # the weights alone, into another optimizer, ZeRO stage and schedule
    "module_only_into_sgd": ("adamw_warmup_clip_gas2", "sgd_onecycle_stage1", {"load_module_only": True}),
    # the weights the model and the checkpoint both have (the model has a layer more)
    "module_only_not_strict": (ADAMW_STAGE1, ADAMW_STAGE1,
                               {"load_module_only": True, "load_module_strict": False, "extra_layer": True}),
}


def _cfg(c):
    return dict(CONFIGS[c] if isinstance(c, str) else c)


def load_run(initialize, name, ckpt_dir):
    """One LOADS case with DeepSpeed's initialize or zerod.deepspeed's: what
    load_checkpoint returned, the engine's counters right after it, and
    the 6 micro-batches after."""
    save_cfg, load_cfg, flags = _cfg(LOADS[name][0]), _cfg(LOADS[name][1]), dict(LOADS[name][2])
    extra_layer = flags.pop("extra_layer", False)
    model = make()
    engine, _, _, _ = initialize(model=model, model_parameters=model.parameters(), config=save_cfg)
    saved = train(engine, save_cfg, range(STEPS // 2))
    engine.save_checkpoint(ckpt_dir, client_state={"epoch": 3, "note": "half"})
    engine.destroy()
    model = make(extra_layer)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # not the checkpoint's values: load_checkpoint must bring them
    engine, _, _, _ = initialize(model=model, model_parameters=model.parameters(), config=load_cfg)
    path, client_state = engine.load_checkpoint(ckpt_dir, **flags)
    out = {"path": os.path.relpath(path, ckpt_dir), "client_state": client_state, "saved": saved,
           "after_load": [engine.global_steps, engine.global_samples, engine.skipped_steps]}
    out.update(train(engine, load_cfg, range(STEPS // 2, STEPS)))
    engine.destroy()
    # What JSON keeps of DeepSpeed's client_state (its bookkeeping holds tensors).
    out["client_state"] = {k: v for k, v in client_state.items() if isinstance(v, (int, str))}
    return out


@pytest.fixture(scope="module")
def deepspeed_losses(tmp_path_factory):
    d = tmp_path_factory.mktemp("ds")
    script = d / "run_ds.py"
    script.write_text(DEEPSPEED)
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, DS_ACCELERATOR="cpu", PYTHONPATH=here + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with reserved_port() as port:
        r = subprocess.run([sys.executable, str(script), str(d / "losses.json"), str(port)], env=env,
                           capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return json.loads((d / "losses.json").read_text())


def _compare(name, ours, theirs, tol):
    rel = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(ours["loss"], theirs["loss"])]
    print(f"\n{name}: max relative loss difference {max(rel):.2e} over {STEPS} micro-batches (tolerance {tol:g})")
    assert len(ours["loss"]) == len(theirs["loss"]) == STEPS
    assert sum(theirs["loss"][-3:]) < sum(theirs["loss"][:3]), \
        "DeepSpeed's loss did not fall: the comparison would prove little"
    for s, (a, b) in enumerate(zip(ours["loss"], theirs["loss"])):
        assert abs(a - b) <= tol * abs(b), f"{name} step {s}: zerod {a}, DeepSpeed {b}\nzerod {ours}\nDeepSpeed {theirs}"
    assert ours["global_steps"] == theirs["global_steps"], (ours["global_steps"], theirs["global_steps"])
    for s, (a, b) in enumerate(zip(ours["lr"], theirs["lr"])):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-12), f"{name} get_lr() after step {s}: zerod {ours['lr']}, " \
                                                           f"DeepSpeed {theirs['lr']}"


def _tolerance(cfg):
    return 2e-2 if cfg.get("bf16", {}).get("enabled") else 1e-4


@pytest.mark.parametrize("name", list(CONFIGS))
def test_same_config_same_losses(name, deepspeed_losses):
    import zerod.deepspeed as deepspeed

    cfg = CONFIGS[name]
    model = make()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=dict(cfg))
    try:
        ours = train(engine, cfg)
    finally:
        engine.close()
    _compare(name, ours, deepspeed_losses[name], _tolerance(cfg))


@pytest.mark.parametrize("name", list(NAMED))
def test_named_parameters_train_as_under_deepspeed(name, deepspeed_losses):
    """model_parameters=model.named_parameters(): (name, parameter) pairs,
    flat or as a group's "params", which DeepSpeed hands to its optimizer
    (torch >= 2.6 takes them). zerod takes them alike: the same losses and
    get_lr() as DeepSpeed's."""
    import zerod.deepspeed as deepspeed

    cfg_name, params = NAMED[name]
    cfg = CONFIGS[cfg_name]
    model = make()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params(model), config=dict(cfg))
    try:
        ours = train(engine, cfg)
    finally:
        engine.destroy()
    _compare(name, ours, deepspeed_losses[name], _tolerance(cfg))


@pytest.mark.parametrize("name", list(CLIENT))
def test_torch_optimizer_and_scheduler_same_losses(name, deepspeed_losses):
    """deepspeed.initialize(optimizer=torch..., lr_scheduler=torch...): zerod
    translates both (the scheduler traced into a table) and matches."""
    import zerod.deepspeed as deepspeed

    cfg, build = CLIENT[name]
    model = make()
    opt, sched = build(model)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=dict(cfg))
    try:
        ours = train(engine, cfg)
    finally:
        engine.close()
    _compare(name, ours, deepspeed_losses[name], 1e-4)


@pytest.mark.parametrize("name", list(GROUPS))
def test_parameter_groups_set_what_the_update_applies(name, deepspeed_losses):
    """model_parameters' groups set the lr (one group's 1e-5 where the config
    says 2e-2, under WarmupLR) or the weight decay (every group 0.0 where
    the config says 0.1): each update applies what DeepSpeed's applies, as
    param_groups say before it, and the losses are DeepSpeed's."""
    import zerod.deepspeed as deepspeed

    cfg, groups = GROUPS[name]
    model = make()
    engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=groups(model), config=dict(cfg))
    try:
        ours = train_applied(engine, opt, cfg)
    finally:
        engine.close()
    theirs = deepspeed_losses[name]
    assert ours["lr"] == pytest.approx(theirs["lr"], rel=1e-9, abs=1e-15), (ours["lr"], theirs["lr"])
    assert ours["weight_decay"] == theirs["weight_decay"]
    for s, (a, b) in enumerate(zip(ours["loss"], theirs["loss"])):
        assert abs(a - b) <= 1e-4 * abs(b), f"{name} step {s}: zerod {a}, DeepSpeed {b}"


@pytest.mark.parametrize("name", ["adamw_warmup_clip_gas2", "stage3_offload_cosine"])
def test_checkpoint_resume_is_exact(name, deepspeed_losses, tmp_path):
    """save_checkpoint half-way (at an accumulation boundary), a fresh model
    and engine load_checkpoint and train on: the losses equal an unbroken
    run's bit for bit, the client_state comes back, and both match DeepSpeed."""
    import zerod.deepspeed as deepspeed

    cfg = CONFIGS[name]
    half = STEPS // 2
    model = make()
    engine, _, _, sched = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=dict(cfg))
    try:
        first = train(engine, cfg, range(half))
        assert engine.save_checkpoint(str(tmp_path), client_state={"epoch": 3, "note": "half"})
        unbroken = train(engine, cfg, range(half, STEPS))
    finally:
        engine.close()
    assert (tmp_path / "latest").read_text() == f"global_step{first['global_steps'][-1]}"

    model = make()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # not the checkpoint's values: load_checkpoint must bring them
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=dict(cfg))
    try:
        path, client_state = engine.load_checkpoint(str(tmp_path))
        assert path == str(tmp_path / f"global_step{first['global_steps'][-1]}")
        assert client_state == {"epoch": 3, "note": "half"}
        assert engine.global_steps == first["global_steps"][-1]
        resumed = train(engine, cfg, range(half, STEPS))
    finally:
        engine.close()
    assert resumed == unbroken
    theirs = deepspeed_losses[name]
    joined = {k: first[k] + resumed[k] for k in first}
    _compare(name + " (resumed)", joined, theirs, _tolerance(cfg))


@pytest.mark.parametrize("name", list(LOADS))
def test_load_checkpoint_flags_as_deepspeed(name, deepspeed_losses, tmp_path):
    """load_checkpoint(load_optimizer_states=False / load_lr_scheduler_states=
    False / load_module_only=True / load_module_strict=False) loads what
    DeepSpeed's loads and leaves what it leaves: the counters right after
    the load, then the losses, get_lr() and global_steps of the 6
    micro-batches after, match DeepSpeed's; and both return the checkpoint
    they loaded and the client_state saved with it."""
    import zerod.deepspeed as deepspeed

    ours = load_run(deepspeed.initialize, name, str(tmp_path))
    theirs = deepspeed_losses["loads"][name]
    # DeepSpeed names its model-states file in the checkpoint's folder, zerod the folder.
    assert ours["path"] == os.path.dirname(theirs["path"]) == f"global_step{ours['saved']['global_steps'][-1]}"
    # DeepSpeed's client_state adds its own bookkeeping (ds_config, param_shapes, ...) to what was saved.
    assert ours["client_state"] == {"epoch": 3, "note": "half"}
    assert {k: theirs["client_state"][k] for k in ours["client_state"]} == ours["client_state"]
    assert ours["saved"]["global_steps"] == theirs["saved"]["global_steps"]
    assert ours["after_load"] == theirs["after_load"], (ours["after_load"], theirs["after_load"])
    assert ours["global_steps"] == theirs["global_steps"], (ours["global_steps"], theirs["global_steps"])
    for s, (a, b) in enumerate(zip(ours["lr"], theirs["lr"])):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-12), f"{name} get_lr() {s}: zerod {ours['lr']}, " \
                                                           f"DeepSpeed {theirs['lr']}"
    rel = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(ours["loss"], theirs["loss"])]
    print(f"\n{name}: max relative loss difference after the load {max(rel):.2e}")
    assert len(rel) == STEPS // 2 and max(rel) <= 1e-4, (ours["loss"], theirs["loss"])


def _trained_checkpoint(deepspeed, cfg, path, steps=STEPS // 2):
    model = make()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=dict(cfg))
    try:
        train(engine, cfg, range(steps))
        engine.save_checkpoint(str(path))
        return engine.state_dict()
    finally:
        engine.close()


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_load_checkpoint_refuses_what_one_update_count_cannot_do(tmp_path):
    """zerod's lr schedule and its optimizer follow one count of updates:
    with a schedule configured, the optimizer state without the schedule
    (or the schedule without it) from a checkpoint of another count is
    refused, naming the flag and what to pass instead, and changes nothing;
    both, neither, or a checkpoint of this engine's count load."""
    import zerod.deepspeed as deepspeed
    from zerod.errors import InvalidArgumentError

    cfg = CONFIGS["adam_l2_stage2_warmupdecay"]
    _trained_checkpoint(deepspeed, cfg, tmp_path)
    engine, _, _, _ = deepspeed.initialize(model=make(), config=dict(cfg))
    try:
        before = engine.state_dict()
        with pytest.raises(InvalidArgumentError, match=r"load_optimizer_states=False\): .* Pass "
                                                       r"load_lr_scheduler_states=False too"):
            engine.load_checkpoint(str(tmp_path), load_optimizer_states=False)
        with pytest.raises(InvalidArgumentError, match=r"load_lr_scheduler_states=False\): .* pass "
                                                       r"load_optimizer_states=False as well"):
            engine.load_checkpoint(str(tmp_path), load_lr_scheduler_states=False)
        assert _same(engine.state_dict(), before) and engine.global_steps == 0
        engine.load_checkpoint(str(tmp_path), load_optimizer_states=False, load_lr_scheduler_states=False)
        assert engine.global_steps == STEPS // 2 and engine.applied_steps == 0
        assert not _same(engine.state_dict(), before)
        # At the checkpoint's own count the two agree: a flag alone loads.
        train(engine, cfg, range(STEPS // 2))
        engine.save_checkpoint(str(tmp_path / "again"))
        assert engine.applied_steps == STEPS // 2
        engine.load_checkpoint(str(tmp_path), load_lr_scheduler_states=False)
        assert engine.applied_steps == STEPS // 2 and engine.global_steps == STEPS // 2
    finally:
        engine.close()


def test_counters_carry_through_a_load_without_optimizer_state(tmp_path):
    """After load_optimizer_states=False DeepSpeed's counters go on from the
    checkpoint's while zerod's update count goes on from this engine's; a
    checkpoint saved then holds both, and loads whole with them."""
    import zerod.deepspeed as deepspeed

    cfg = ADAMW_STAGE1
    _trained_checkpoint(deepspeed, cfg, tmp_path / "a")
    engine, _, _, _ = deepspeed.initialize(model=make(), config=dict(cfg))
    try:
        engine.load_checkpoint(str(tmp_path / "a"), load_optimizer_states=False)
        train(engine, cfg, range(4))
        assert (engine.global_steps, engine.applied_steps, engine.global_samples) == (10, 4, 80)
        engine.save_checkpoint(str(tmp_path / "b"))
        saved = engine.state_dict()
    finally:
        engine.close()
    assert (tmp_path / "b" / "latest").read_text() == "global_step10"
    engine, _, _, _ = deepspeed.initialize(model=make(), config=dict(cfg))
    try:
        engine.load_checkpoint(str(tmp_path / "b"))
        assert (engine.global_steps, engine.applied_steps, engine.global_samples) == (10, 4, 80)
        assert _same(engine.state_dict(), saved)
    finally:
        engine.close()


def test_load_checkpoint_weights_alone_check_what_they_read(tmp_path):
    """load_module_only=True reads the weights from zerod's files itself
    (zd_model_load would bring the optimizer state, and refuses another
    optimizer's): each record against its CRC-32C, the model's keys as
    torch's load_state_dict checks them (load_module_strict) and its
    shapes; a refusal changes nothing."""
    import zerod.deepspeed as deepspeed
    from zerod import _ckpt_masters
    from zerod.errors import InvalidArgumentError, ShapeMismatchError, ZerodIOError

    saved = _trained_checkpoint(deepspeed, CONFIGS["adamw_warmup_clip_gas2"], tmp_path)
    sgd = CONFIGS["sgd_onecycle_stage1"]
    engine, _, _, _ = deepspeed.initialize(model=make(extra_layer=True), config=dict(sgd))
    try:
        with pytest.raises(InvalidArgumentError, match=r"missing keys \['6.weight', '6.bias'\].*"
                                                       "load_module_strict=False"):
            engine.load_checkpoint(str(tmp_path), load_module_only=True)
        with pytest.raises(InvalidArgumentError, match="only here: \\['6.bias', '6.weight'\\].*"
                                                       "load_optimizer_states=False"):
            engine.load_checkpoint(str(tmp_path), load_module_strict=False)
    finally:
        engine.close()
    model = make()
    model[2] = nn.Linear(64, 32)
    model[4] = nn.Linear(32, 4)
    engine, _, _, _ = deepspeed.initialize(model=model, config=dict(sgd))
    try:
        with pytest.raises(ShapeMismatchError, match=r"'2.weight': \(64, 64\) in the checkpoint, \(32, 64\)"):
            engine.load_checkpoint(str(tmp_path), load_module_only=True, load_module_strict=False)
    finally:
        engine.close()

    shard = next((tmp_path / f"global_step{STEPS // 4}").glob("*.zdshard"))
    data = bytearray(shard.read_bytes())
    data[32 + 17] ^= 0x10  # a bit of the first record
    shard.write_bytes(bytes(data))
    engine, _, _, _ = deepspeed.initialize(model=make(), config=dict(sgd))
    try:
        before = engine.state_dict()
        with pytest.raises(ZerodIOError, match="fails its checksum: the file is damaged"):
            engine.load_checkpoint(str(tmp_path), load_module_only=True)
        assert _same(engine.state_dict(), before)
        data[32 + 17] ^= 0x10
        shard.write_bytes(bytes(data))
        engine.load_checkpoint(str(tmp_path), load_module_only=True)
        assert _same(engine.state_dict(), saved)
    finally:
        engine.close()

    # A checkpoint zd_model_save wrote without zerod.torch has no torch_state.pt:
    # it loads either way, and a buffer keeps its value, with a warning (as
    # zerod.torch's load_checkpoint warns), load_module_strict or not.
    (tmp_path / f"global_step{STEPS // 4}" / "torch_state.pt").unlink()
    for flags in ({}, {"load_module_only": True}):
        model = make()
        model.register_buffer("seen", torch.full((2,), 7.0))
        engine, _, _, _ = deepspeed.initialize(model=model, config=dict(CONFIGS["adamw_warmup_clip_gas2"]))
        try:
            with pytest.warns(UserWarning, match="has no torch_state.pt .* 'seen' first"):
                assert engine.load_checkpoint(str(tmp_path), **flags)[1] == {}
            got = engine.state_dict()
            assert torch.equal(got.pop("seen"), torch.full((2,), 7.0)) and _same(got, saved)
        finally:
            engine.close()
    assert _ckpt_masters.crc32c(b"123456789") == 0xE3069283  # CRC-32C's check value
    blob = bytes(range(256)) * 40 + b"tail"  # long enough for the lanes, with runs left over
    want = 0xFFFFFFFF
    for b in blob:
        want ^= b
        for _ in range(8):
            want = (want >> 1) ^ (0x82F63B78 if want & 1 else 0)
    assert _ckpt_masters.crc32c(blob) == want ^ 0xFFFFFFFF


def test_load_checkpoint_without_latest_returns_none(tmp_path):
    import zerod.deepspeed as deepspeed

    model = make()
    engine, _, _, _ = deepspeed.initialize(model=model, config=dict(CONFIGS["bf16_stage1"], bf16={"enabled": False}))
    try:
        with pytest.warns(UserWarning, match="no 'latest'"):
            assert engine.load_checkpoint(str(tmp_path)) == (None, None)
    finally:
        engine.close()


@pytest.mark.parametrize("name", ["sgd_onecycle_stage1", "bf16_stage1"])
def test_destroy_leaves_the_trained_model(name):
    """engine.destroy() leaves the model the trained weights, as DeepSpeed's
    (its module holds them all along), in the type its parameters had:
    model.state_dict() saves them, model(x) runs, and the model can be
    initialized again (zerod's parameters were empty placeholders)."""
    import zerod.deepspeed as deepspeed

    cfg = dict(CONFIGS[name])
    model = make()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    train(engine, cfg, range(3))
    trained = engine.state_dict()
    engine.destroy()
    engine.destroy()  # a second call does nothing
    dtype = torch.bfloat16 if name.startswith("bf16") else torch.float32
    after = model.state_dict()
    assert list(after) == list(trained)
    for k, v in after.items():
        assert v.dtype == dtype and torch.equal(v, trained[k].to(dtype)), k
    x, _ = batch(0, dtype)
    assert model(x).shape == (8, 4)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    try:
        again = engine.state_dict()
        assert all(torch.equal(again[k].to(dtype), after[k]) for k in after)
    finally:
        engine.destroy()


def test_destroy_after_a_backward_without_its_step_closes_and_warns():
    """destroy() in the middle of a micro-batch (a backward() without its
    step(), as `finally: engine.destroy()` meets it when the step raised)
    cannot read the weights: it warns instead of raising, so the exception
    in flight is not hidden, and the engine is closed all the same (no live
    engine left to refuse the next initialize()); the parameters are left
    empty."""
    import zerod.deepspeed as deepspeed
    import zerod.torch as zt

    cfg = dict(CONFIGS["sgd_onecycle_stage1"])
    model = make()
    engine, _, _, _ = deepspeed.initialize(model=model, config=cfg)
    x, y = batch(0)
    engine.backward(((engine(x) - y) ** 2).mean())
    with pytest.warns(RuntimeWarning, match=r"destroy\(\): the trained weights could not be read back .* "
                                            r"a backward\(\) without its step\(\)"):
        engine.destroy()
    assert engine.zerod_model._handle is None
    # This engine, not the whole set: an engine another test of the process
    # left open stays live (its parameters' autograd hooks hold it, as they
    # hold DeepSpeed's ZeRO engines): close() or destroy() releases one.
    assert engine not in zt._LIVE_ENGINES
    assert all(p.numel() == 0 for p in model.parameters())
    engine.destroy()  # closed: nothing to do, nothing to warn


def test_destroy_reads_one_parameter_at_a_time(monkeypatch):
    """destroy() converts each full fp32 master into the parameter's own
    type as it reads it, then lets it go: at stage 3 a model that only fits
    partitioned must not need all its fp32 masters at once."""
    import weakref

    import zerod.deepspeed as deepspeed

    cfg = dict(CONFIGS["bf16_stage1"], zero_optimization={"stage": 3})
    model = make()
    engine, _, _, _ = deepspeed.initialize(model=model, config=cfg)
    train(engine, cfg, range(2))
    expected = engine.state_dict()
    masters, read = [], engine.zerod_model.param_read

    def read_and_check_the_earlier_ones_are_gone(pid, dtype):
        assert all(m() is None for m in masters), "an earlier parameter's fp32 master is still held"
        value = read(pid, dtype)
        masters.append(weakref.ref(value))
        return value
    monkeypatch.setattr(engine.zerod_model, "param_read", read_and_check_the_earlier_ones_are_gone)
    engine.destroy()
    assert len(masters) == len(list(model.parameters()))
    for k, v in model.state_dict().items():
        assert v.dtype == torch.bfloat16 and torch.equal(v, expected[k].to(torch.bfloat16)), k


def test_a_model_a_live_engine_holds_is_refused():
    """A second initialize() of a model whose engine is live (its parameters
    are empty placeholders) is refused naming the parameter and destroy()."""
    import zerod.deepspeed as deepspeed
    import zerod.torch as zt
    from zerod.errors import InvalidArgumentError

    cfg = dict(CONFIGS["sgd_onecycle_stage1"])
    model = make()
    engine, _, _, _ = deepspeed.initialize(model=model, config=cfg)
    try:
        with pytest.raises(InvalidArgumentError, match=r"parameter '0.weight' is held by a live zerod engine .* "
                                                       r"call its destroy\(\) first"):
            deepspeed.initialize(model=model, config=cfg)
    finally:
        engine.destroy()
    engine = zt.initialize(model, job_text='return { optimizer = { type = "sgd", lr = 0.1 } }')
    try:
        with pytest.raises(InvalidArgumentError, match=r"parameter '0.weight' is held by a live zerod engine .* "
                                                       r"close\(\) it first"):
            deepspeed.initialize(model=model, config=cfg)
    finally:
        engine.close()


def test_a_scheduler_without_a_length_is_traced_as_far_as_told():
    """LambdaLR (ExponentialLR, ...) says nothing of how long it runs: zerod
    traces its lr for DEFAULT_HORIZON updates and says so, naming how to give
    the length; lr_steps= gives it, and the last value holds after."""
    import warnings

    import zerod.deepspeed as deepspeed
    from zerod import _schedules

    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(UserWarning, match=r"LambdaLR has no length zerod can read .* for the first 50000 updates .* "
                                         r"lr_steps=N"):
        values = _schedules.trace(torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 0.5 ** min(t, 3)))
    assert len(values) == _schedules.DEFAULT_HORIZON == 50000 and values[-1] == 0.1 * 0.5 ** 3
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_steps=6, config={"train_batch_size": 8},
                                               lr_scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 0.5 ** t))
    try:
        assert not [w for w in said if "has no length" in str(w.message)], [str(w.message) for w in said]
        assert engine._lr_values == [0.1 * 0.5 ** t for t in range(6)]
        assert engine._lr_of(100) == 0.1 * 0.5 ** 5
    finally:
        engine.close()

def test_a_cosine_without_a_length_is_traced_past_its_t_max(monkeypatch):
    """CosineAnnealingLR has no length zerod can read, but a horizon shorter
    than its T_max would freeze its lr mid-descent: it is traced to T_max at
    least (DEFAULT_HORIZON made 10 here, T_max 20), equal to torch's at
    every update, and no further than ESTIMATE_LIMIT, saying so."""
    from zerod import _schedules

    monkeypatch.setattr(_schedules, "DEFAULT_HORIZON", 10)

    def cosine():
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        return opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=20, eta_min=1e-3)
    opt, sched = cosine()
    with pytest.warns(UserWarning, match=r"CosineAnnealingLR has no length .* for the first 21 updates"):
        values = _schedules.trace(sched)
    expected = []
    for _ in range(21):
        expected.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert values == pytest.approx(expected, rel=1e-12, abs=0)
    monkeypatch.setattr(_schedules, "ESTIMATE_LIMIT", 15)
    with pytest.warns(UserWarning, match=r"for the first 15 updates"):
        assert len(_schedules.trace(cosine()[1])) == 15


def test_refusals_name_what_is_unsupported():
    import zerod.deepspeed as deepspeed
    from zerod.errors import InvalidArgumentError

    model = make()
    with pytest.raises(InvalidArgumentError, match="Adagrad has no zerod equivalent"):
        deepspeed.initialize(model=model, optimizer=torch.optim.Adagrad(model.parameters()),
                             config={"train_batch_size": 8})
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(InvalidArgumentError, match="ReduceLROnPlateau"):
        deepspeed.initialize(model=model, optimizer=opt, config={"train_batch_size": 8},
                             lr_scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau(opt))
    with pytest.raises(InvalidArgumentError, match="train_batch_size 10 is not"):
        deepspeed.initialize(model=model, optimizer=opt, config={"train_batch_size": 10,
                                                                 "train_micro_batch_size_per_gpu": 4})
    with pytest.raises(InvalidArgumentError, match="model_parameters leaves out '0.weight'"):
        deepspeed.initialize(model=model, model_parameters=list(model.parameters())[1:], optimizer=opt,
                             config={"train_batch_size": 8})


@pytest.mark.parametrize("name", ["adamw_warmup_clip_gas2", "stage3_offload_cosine"])
def test_two_ranks_under_zerod_run(name, deepspeed_losses, tmp_path):
    """The same DeepSpeed loop as the ranks of `zerod run --nproc 2`, each on
    half of every batch: the mean of the two ranks' losses is DeepSpeed's
    loss on the whole batch (one rank), step for step."""
    from conftest import ZEROD, rank_env

    cfg = CONFIGS[name]
    job = tmp_path / "ds_config.json"
    half_cfg = dict(cfg, train_micro_batch_size_per_gpu=4)
    half_cfg.pop("train_batch_size", None)
    job.write_text(json.dumps(half_cfg))
    here = os.path.dirname(os.path.abspath(__file__))
    cmd = [ZEROD, "run", "--nproc", "2", "--job", str(job), "--", sys.executable,
           os.path.join(here, "ds_rank.py"), name]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
                       env=rank_env())
    assert p.returncode == 0, p.stdout[-4000:]
    per_rank = {0: {}, 1: {}}
    for line in p.stdout.splitlines():
        if line.startswith("[rank ") and "] loss " in line:
            r = int(line[6])
            _, s, v, _, lr, _, steps = line.split("] ", 1)[1].split()
            per_rank[r][int(s)] = (float(v), float(lr), int(steps))
    assert len(per_rank[0]) == len(per_rank[1]) == STEPS, p.stdout[-4000:]
    theirs = deepspeed_losses[name]
    ours = {"loss": [(per_rank[0][s][0] + per_rank[1][s][0]) / 2 for s in range(STEPS)],
            "lr": [per_rank[0][s][1] for s in range(STEPS)],
            "global_steps": [per_rank[0][s][2] for s in range(STEPS)]}
    _compare(name + " (2 ranks)", ours, theirs, _tolerance(cfg))


def test_training_data_loader_matches(deepspeed_losses):
    """initialize(training_data=...) returns a loader of the micro-batch
    size in DeepSpeed's order (its DistributedSampler, shuffled, seed 0),
    batched with initialize()'s collate_fn; deepspeed_io() for evaluation
    and prediction reads in order, as DeepSpeed's."""
    import zerod.deepspeed as deepspeed

    model = make()
    dataset = torch.utils.data.TensorDataset(torch.arange(40.0).view(20, 2))
    engine, _, loader, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), training_data=dataset,
        config={"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
    try:
        ours = [b[0][:, 0].tolist() for b in loader]
    finally:
        engine.close()
    assert ours == deepspeed_losses["loader"]
    assert len(ours) == 5 and all(len(b) == 4 for b in ours)

    # 22 samples: DeepSpeed's dataloader_drop_last leaves out the short sixth batch.
    dataset = torch.utils.data.TensorDataset(torch.arange(44.0).view(22, 2))
    engine, _, loader, _ = deepspeed.initialize(
        model=make(), training_data=dataset,
        config={"train_micro_batch_size_per_gpu": 4, "dataloader_drop_last": True,
                "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
    try:
        ours = [len(loader)] + [b[0][:, 0].tolist() for b in loader]
    finally:
        engine.close()
    assert ours == deepspeed_losses["loader_drop_last"]
    assert ours[0] == 5 and len(ours) == 6

    # initialize()'s collate_fn batches every loader given none; "eval" and
    # "predict" read the dataset in order.
    ours, theirs = loaders_by_route(deepspeed.initialize), deepspeed_losses["loader_routes"]
    assert ours == theirs, (ours, theirs)
    assert ours["eval"] == [[-2.0 * i for i in range(b, b + 4)] for b in range(0, 20, 4)]
    assert ours["train"] != ours["eval"] and sorted(sum(ours["train"], [])) == sorted(sum(ours["eval"], []))
    assert ours["predict"] == [[2.0 * i for i in range(b, b + 4)] for b in range(0, 20, 4)]


def test_script_helpers():
    import argparse

    import zerod.deepspeed as deepspeed

    args = deepspeed.add_config_arguments(argparse.ArgumentParser()).parse_args(
        ["--deepspeed", "--deepspeed_config", "ds.json"])
    assert args.deepspeed and args.deepspeed_config == "ds.json"
    with deepspeed.zero.Init():
        model = make()
    engine, _, _, _ = deepspeed.initialize(args=argparse.Namespace(deepspeed_config=None), model=model,
                                           config_params=dict(CONFIGS["sgd_onecycle_stage1"]))
    try:
        assert engine.zero_optimization_stage() == 1
    finally:
        engine.close()


def test_the_fp16_loss_scale_follows_deepspeeds_dynamic_loss_scaler(monkeypatch):
    """A DeepSpeed config's dynamic loss scale changes on the updates
    DeepSpeed's own DynamicLossScaler changes it (0.19: its stable interval
    leaves out the update itself, so it doubles an update later than torch's
    GradScaler, which zerod followed for DeepSpeed configs too): the class
    fed the same overflows gives the same scale after every step."""
    from deepspeed.runtime.fp16 import loss_scaler
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler
    import zerod.deepspeed
    monkeypatch.setattr(loss_scaler.dist, "get_rank", lambda *a, **k: 0)  # its overflow message asks (no group here)
    cfg = {"train_micro_batch_size_per_gpu": 8, "fp16": {"enabled": True, "initial_scale_power": 4,
                                                          "loss_scale_window": 2, "hysteresis": 1},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 1}}
    engine, _, _, _ = zerod.deepspeed.initialize(model=make(), config=cfg)
    theirs = DynamicLossScaler(init_scale=16.0, scale_window=2, min_scale=1.0, delayed_shift=1,
                               consecutive_hysteresis=False, raise_error_at_min_scale=False)
    ours, want = [], []
    for s in range(9):
        x, y = batch(s)
        if s == 5:
            x[0, 0] = float("inf")  # an overflow: the step is skipped and the scale halved
        skipped = engine.skipped_steps
        loss = ((engine(x.half()).float() - y) ** 2).mean()
        engine.backward(loss)
        engine.step()
        theirs.update_scale(engine.skipped_steps > skipped)
        ours.append(float(engine.cur_scale))
        want.append(float(theirs.cur_scale))
        # DeepSpeed counts a skipped step in global_steps and global_samples
        # (not in the lr schedule's position).
        assert (engine.global_steps, engine.global_samples) == (s + 1, 8 * (s + 1))
    assert ours == want, (ours, want)
    assert engine.skipped_steps == 1 and engine.applied_steps == 8
    assert max(ours) > 16.0, "the scale grew (else this test shows nothing)"


def test_backward_returns_the_loss_as_deepspeed_scales_it():
    """DeepSpeed's backward returns the loss divided by the accumulation
    steps (scale_wrt_gas=True), as it is scaled for the window; as given
    with scale_wrt_gas=False."""
    import zerod.deepspeed
    cfg = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    engine, _, _, _ = zerod.deepspeed.initialize(model=make(), config=cfg)
    x, y = batch(0)
    loss = ((engine(x) - y) ** 2).mean()
    assert torch.equal(engine.backward(loss), loss / 2)
    engine.step()
    loss = ((engine(x) - y) ** 2).mean()
    assert torch.equal(engine.backward(loss, scale_wrt_gas=False), loss)
    engine.step()


def test_load_checkpoint_weights_alone_take_a_modules_extra_state(tmp_path):
    """load_module_only=True with a module that has extra state: the dict
    has no shape to compare; it goes to set_extra_state, as torch's
    load_state_dict gives it."""
    import zerod.deepspeed as deepspeed
    from models import WithExtraState

    cfg = CONFIGS["adamw_warmup_clip_gas2"]
    model = nn.Sequential(nn.Linear(16, 8), WithExtraState(8, 4))
    engine, _, _, _ = deepspeed.initialize(model=model, config=dict(cfg))
    try:
        model[1].version = 4
        engine.save_checkpoint(str(tmp_path))
        saved = engine.state_dict()
    finally:
        engine.close()
    fresh = nn.Sequential(nn.Linear(16, 8), WithExtraState(8, 4))
    engine, _, _, _ = deepspeed.initialize(model=fresh, config=dict(CONFIGS["sgd_onecycle_stage1"]))
    try:
        engine.load_checkpoint(str(tmp_path), load_module_only=True)
        assert fresh[1].version == 4
        got = engine.state_dict()
        assert [k for k in got if torch.is_tensor(got[k])] == [k for k in saved if torch.is_tensor(saved[k])]
        assert all(torch.equal(got[k], saved[k]) for k in got if torch.is_tensor(got[k]))
    finally:
        engine.close()


def test_save_16bit_model_writes_what_deepspeed_writes(deepspeed_losses, tmp_path):
    """save_16bit_model (and save_fp16_model, its old name): the same files,
    keys, types and shapes as DeepSpeed's (bf16 parameters, buffers as they
    are, a frozen parameter left out with exclude_frozen_parameters), and
    the values zerod holds, in the parameters' type (the module's own
    parameters are empty placeholders under zerod)."""
    import zerod.deepspeed as deepspeed

    model = save_model()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=dict(CONFIGS["bf16_stage1"]))
    try:
        ours = saved_16bit(engine, str(tmp_path))
        state = engine.state_dict()
    finally:
        engine.close()
    theirs = deepspeed_losses["save_16bit"]
    assert ours == theirs, (ours, theirs)
    assert "1.weight" not in ours["no_frozen.bin"] and ours["pytorch_model.bin"]["0.0.weight"][0] == "torch.bfloat16"
    written = torch.load(tmp_path / "pytorch_model.bin", weights_only=True)
    for k, v in written.items():
        assert torch.equal(v, state[k].to(v.dtype)), k
    assert float(written["1.running_mean"][0]) == 0.25


def test_engine_answers_deepspeeds_other_calls():
    """DeepSpeedEngine's no_sync (refused: zerod reduces the window itself),
    set_gradient_accumulation_boundary (accepted where it agrees with
    zerod's count), get_global_grad_norm (the last window's), and an attribute the engine lacks read from the module,
    as DeepSpeed's __getattr__ does (none read before the engine is set
    up, so no recursion)."""
    import zerod.deepspeed as deepspeed
    from zerod.errors import InvalidArgumentError, InvalidStateError

    model = make()
    model.note, model.config = "the module's", "the module's config"
    model.double_it = lambda v: 2 * v
    cfg = dict(CONFIGS["adamw_warmup_clip_gas2"])  # 2 micro-batches per window
    engine, _, _, _ = deepspeed.initialize(model=model, config=cfg)
    try:
        assert engine.note == "the module's" and engine.double_it(3) == 6 and engine.training
        assert engine.config["gradient_accumulation_steps"] == 2  # the engine's own first, as DeepSpeed's
        with pytest.raises(AttributeError, match="'DeepSpeedEngine' object has no attribute 'nothing_here'"):
            engine.nothing_here
        with pytest.raises(InvalidArgumentError, match=r"no_sync\(\) is not supported by zerod"):
            with engine.no_sync():
                pass
        norms = []
        for s in range(4):
            boundary = s % 2 == 1
            with pytest.raises(InvalidStateError, match=r"zerod ends a window at the step\(\) of its last micro-batch "
                                                        r"\(gradient_accumulation_steps=2\)"):
                engine.set_gradient_accumulation_boundary(not boundary)
            engine.set_gradient_accumulation_boundary(boundary)
            assert engine.is_gradient_accumulation_boundary() == boundary
            x, y = batch(s)
            engine.backward(((engine(x) - y) ** 2).mean())
            r = engine.step()
            assert r.boundary == boundary
            # The last window's norm, None before the first (DeepSpeed's at ZeRO 1-2).
            if boundary:
                assert r.grad_norm > 0 and engine.get_global_grad_norm() == r.grad_norm
                norms.append(r.grad_norm)
            else:
                assert engine.get_global_grad_norm() == (norms[-1] if norms else None)
        assert len(norms) == 2 and norms[0] != norms[1]
    finally:
        engine.close()
    bare = deepspeed.DeepSpeedEngine.__new__(deepspeed.DeepSpeedEngine)
    with pytest.raises(AttributeError):
        bare.module
    assert not hasattr(bare, "note")


@pytest.mark.parametrize("name", list(HAND))
def test_a_hand_written_lr_trains_as_under_deepspeed(name, deepspeed_losses):
    """An lr the loop writes into optimizer.param_groups (nanoGPT's `for g in
    optimizer.param_groups: g["lr"] = get_lr(it)`), which DeepSpeed applies
    at its step, zerod applies too (engine.set_lr, zd_model_set_lr): the
    same losses, and get_lr() after every step, as DeepSpeed's. Under
    DeepSpeed's own scheduler a written lr holds for one update, as there."""
    import zerod.deepspeed as deepspeed

    cfg, lr_at = HAND[name]
    model = make()
    engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=dict(cfg))
    try:
        ours = train(engine, cfg, lr_at=lr_at, optimizer=opt)
    finally:
        engine.close()
    _compare(name, ours, deepspeed_losses[name], 1e-4)


@pytest.mark.parametrize("name", list(HAND_ON_OPTIMIZER))
def test_an_lr_written_into_the_scripts_torch_optimizer_trains_as_under_deepspeed(name, deepspeed_losses):
    """initialize(optimizer=torch_opt): DeepSpeed's optimizer steps with
    torch_opt's own param_groups, so an lr the script writes there (or an lr
    a scheduler it never gave initialize() left there) applies, and under
    DeepSpeed's scheduler it holds for one update. zerod follows those
    groups too: the same losses and get_lr() after every step, and the
    groups hold the lr DeepSpeed's hold after each step (its scheduler
    writes its own there)."""
    import zerod.deepspeed as deepspeed

    cfg, build, lr_at = HAND_ON_OPTIMIZER[name]
    model = make()
    opt = build(model)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=dict(cfg))
    try:
        ours = train(engine, cfg, lr_at=lr_at, optimizer=opt, group_lr=True)
    finally:
        engine.close()
    theirs = deepspeed_losses[name]
    _compare(name, ours, theirs, 1e-4)
    assert ours["group_lr"] == pytest.approx(theirs["group_lr"], rel=1e-6, abs=1e-12), (ours, theirs)


def test_a_written_lr_comes_back_with_load_checkpoint(tmp_path):
    """The lr a loop wrote once (no schedule: it holds, as in DeepSpeed) is
    in the checkpoint: a fresh engine that loads it reports it (get_lr())
    and trains on at it, bit for bit with the unbroken run."""
    import zerod.deepspeed as deepspeed

    cfg = ADAMW_STAGE1
    half = STEPS // 2
    engine, opt, _, _ = deepspeed.initialize(model=make(), config=dict(cfg))
    try:
        first = train(engine, cfg, range(half), lr_at=lambda s: 3e-3 if s == 2 else None, optimizer=opt)
        assert first["lr"][2:] == [3e-3] * (half - 2)
        engine.save_checkpoint(str(tmp_path))
        unbroken = train(engine, cfg, range(half, STEPS))
    finally:
        engine.close()
    model = make()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    engine, opt, _, _ = deepspeed.initialize(model=model, config=dict(cfg))
    try:
        assert engine.get_lr() == [1e-2]
        engine.load_checkpoint(str(tmp_path))
        assert engine.get_lr() == [3e-3] and opt.param_groups[0]["lr"] == 3e-3
        resumed = train(engine, cfg, range(half, STEPS))
    finally:
        engine.close()
    assert resumed == unbroken


def test_other_hyperparameters_written_into_param_groups_are_refused():
    """Reading param_groups follows the schedule, and writing the lr zerod
    applies anyway changes nothing; a hyperparameter other than the lr
    written there is refused at the next step(), naming it: zerod takes
    them once, at initialize()."""
    import zerod.deepspeed as deepspeed
    from zerod.errors import InvalidArgumentError

    cfg = dict(CONFIGS["adamw_warmup_clip_gas2"])
    engine, opt, _, _ = deepspeed.initialize(model=make(), config=cfg)
    try:
        seen = []
        for s in range(6):
            seen.append(opt.param_groups[0]["lr"])
            assert seen[-1] == engine.get_lr()[0]
            for g in opt.param_groups:
                g["lr"] = engine.get_lr()[0]  # what zerod applies: nothing changes
            x, y = batch(s)
            engine.backward(((engine(x) - y) ** 2).mean())
            engine.step()
        assert opt.param_groups[0]["lr"] == engine.get_lr()[0] > 0 and len(set(seen)) == 2, seen  # warming up
        assert engine._trainer_lr is None, "the lr zerod applies anyway was not set"
        opt.param_groups[0]["weight_decay"] = 0.5
        with pytest.raises(InvalidArgumentError, match=r"\['weight_decay'\] was changed from 0.05 to 0.5"):
            engine.step()
        opt.param_groups[0]["weight_decay"] = 0.05
        opt.param_groups[0]["lr"] = "fast"
        with pytest.raises(InvalidArgumentError, match=r"param_groups\[0\]\['lr'\] was set to 'fast'; an lr is a "
                                                       r"number"):
            engine.step()
    finally:
        engine.close()


def test_param_groups_hold_every_hyperparameter_in_force_and_refuse_writes():
    """A config section that gives the lr alone: param_groups hold every
    hyperparameter the update runs with (the type's DeepSpeed defaults, as
    DeepSpeed's optimizer's groups hold them), so a weight_decay or betas
    written there changes a value and is refused at the next step(), and so
    is a hyperparameter added to a group; a key no optimizer reads (a loop's
    own bookkeeping) is the loop's. In the torch optimizer the script gave
    initialize(), whose groups DeepSpeed's optimizer steps with, a
    hyperparameter other than the lr written is refused as well."""
    import zerod.deepspeed as deepspeed
    from zerod.errors import InvalidArgumentError

    def one_step(engine, s=0):
        x, y = batch(s)
        engine.backward(((engine(x) - y) ** 2).mean())
        engine.step()

    cfg = {"train_micro_batch_size_per_gpu": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}}
    engine, opt, _, _ = deepspeed.initialize(model=make(), config=dict(cfg))
    try:
        group = opt.param_groups[0]
        assert {k: v for k, v in group.items() if k != "params"} == {
            "lr": 1e-2, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0, "bias_correction": True}
        group["weight_decay"] = 0.0  # the value in force: nothing changes
        group["lr_scale"] = 0.5      # the loop's own key
        one_step(engine)
        group["weight_decay"] = 0.1
        with pytest.raises(InvalidArgumentError, match=r"param_groups\[0\]\['weight_decay'\] was changed from 0.0 "
                                                       r"to 0.1, but zerod takes the optimizer's hyperparameters once"):
            engine.step()  # refused before anything runs
        group["weight_decay"] = 0.0
        group["betas"] = (0.5, 0.5)
        with pytest.raises(InvalidArgumentError, match=r"\['betas'\] was changed from \[0.9, 0.999\] to \(0.5, 0.5\)"):
            engine.step()  # refused before anything runs
        group["betas"] = (0.9, 0.999)
        group["amsgrad"] = True
        with pytest.raises(InvalidArgumentError, match=r"\['amsgrad'\] was set to True"):
            engine.step()  # refused before anything runs
    finally:
        engine.close()

    model = make()
    torch_opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch_opt, config={"train_batch_size": 8})
    try:
        one_step(engine)
        for g in torch_opt.param_groups:
            g["weight_decay"] = 0.0
        said = (r"zerod.deepspeed: optimizer.param_groups\[0\]\['weight_decay'\] was changed from 0.05 to 0.0, but "
                r"zerod takes the optimizer's hyperparameters other than the lr once, at initialize\(\)")
        with pytest.raises(InvalidArgumentError, match=said):
            engine.step()  # refused before anything runs
    finally:
        engine.close()


# zerod runs the update in engine.step(), not the torch optimizer's step():
# torch's scheduler, stepped by the script, warns that it never saw one.
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before `optimizer.step\\(\\)`")
def test_a_momentum_cycling_scheduler_not_given_is_refused_at_initialize():
    """A OneCycleLR made on the script's torch optimizer with
    cycle_momentum=True (its default) but not given to initialize() cycles
    the betas DeepSpeed's optimizer steps with, which zerod takes once:
    refused at initialize(), saying cycle_momentum=False (not at the second
    backward as a changed betas, whose value at initialize() was already
    the schedule's max_momentum); with cycle_momentum=False it trains."""
    import zerod.deepspeed as deepspeed
    from zerod.errors import InvalidArgumentError

    model = make()
    torch_opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.optim.lr_scheduler.OneCycleLR(torch_opt, max_lr=1e-2, total_steps=20)
    with pytest.raises(InvalidArgumentError, match=r"zerod.deepspeed: optimizer.param_groups\[0\] holds "
                                                   r"max_momentum/base_momentum: a OneCycleLR or CyclicLR .* at "
                                                   r"initialize\(\); .*pass cycle_momentum=False"):
        deepspeed.initialize(model=model, optimizer=torch_opt, config={"train_batch_size": 8})

    model = make()
    torch_opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.OneCycleLR(torch_opt, max_lr=1e-2, total_steps=20, cycle_momentum=False)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch_opt, config={"train_batch_size": 8})
    try:
        for s in range(3):
            x, y = batch(s)
            engine.backward(((engine(x) - y) ** 2).mean())
            engine.step()
            sched.step()
        assert engine.global_steps == 3
    finally:
        engine.close()


def test_a_betas_change_is_refused_naming_cycle_momentum():
    """betas or momentum changed in the groups is what a cycling
    OneCycleLR/CyclicLR does: the refusal says cycle_momentum=False; another
    key's keeps its own words."""
    from zerod.deepspeed import TorchHyperparameters
    from zerod.errors import InvalidArgumentError

    opt = torch.optim.AdamW(make().parameters(), lr=1e-2, betas=(0.9, 0.95))
    watch = TorchHyperparameters(opt, "test", "initialize()")
    opt.param_groups[0]["betas"] = (0.85, 0.95)
    with pytest.raises(InvalidArgumentError, match=r"\['betas'\] was changed from \(0.9, 0.95\) to \(0.85, 0.95\).*"
                                                   r"cycle_momentum=True.*pass cycle_momentum=False"):
        watch.check()
    opt.param_groups[0]["betas"] = (0.9, 0.95)
    opt.param_groups[0]["weight_decay"] = 0.5
    with pytest.raises(InvalidArgumentError, match=r"DINO's weight-decay schedule") as refused:
        watch.check()
    assert "cycle_momentum" not in str(refused.value)


class _Said(float):
    """A hyperparameter that counts how often it is said as written."""
    said = 0

    def __repr__(self):
        _Said.said += 1
        return float.__repr__(self)


def test_hyperparameter_check_says_values_only_when_refusing():
    """check() runs at every backward: while nothing changed it compares
    plain values and says none as written (a repr of every key of every
    group cost 2.8 ms a backward with 400 groups); a change is still said
    with both values."""
    from zerod.deepspeed import TorchHyperparameters
    from zerod.errors import InvalidArgumentError

    model = make()
    opt = torch.optim.SGD([{"params": [p]} for p in model.parameters()], lr=1e-2, momentum=_Said(0.9),
                          weight_decay=_Said(0.01))
    opt.param_groups[1]["weight_decay"] = torch.tensor(0.01)  # compared as its number
    watch = TorchHyperparameters(opt, "test", "initialize()")
    _Said.said = 0
    for _ in range(3):
        watch.check()
    assert _Said.said == 0
    opt.param_groups[2]["weight_decay"] = 0.02
    with pytest.raises(InvalidArgumentError, match=r"param_groups\[2\]\['weight_decay'\] was changed from 0.01 to "
                                                   r"0.02"):
        watch.check()


def test_load_state_dict_of_a_torch_optimizers_state_is_refused_naming_both_formats():
    """optimizer.load_state_dict() takes what optimizer.state_dict() returned
    (zerod's format); a torch optimizer's state_dict is refused saying so,
    not taken for an optimizer of another name."""
    import zerod.deepspeed as deepspeed
    from zerod.errors import InvalidArgumentError

    model = make()
    torch_opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    theirs = torch_opt.state_dict()
    engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=torch_opt, config={"train_batch_size": 8})
    try:
        with pytest.raises(InvalidArgumentError, match=r"optimizer.load_state_dict: this is a torch optimizer's "
                                                       r"state_dict .*Pass what optimizer.state_dict\(\)"):
            opt.load_state_dict(theirs)
        opt.load_state_dict(opt.state_dict())
    finally:
        engine.close()


def test_optimizer_parameters_outside_the_model_are_refused():
    """A parameter the optimizer holds that is not the model's (a learnable
    loss temperature) would never be updated by zerod, which trains the
    model's parameters: refused, naming how many and their shapes (torch and
    DeepSpeed would train it)."""
    import zerod.deepspeed as deepspeed
    from zerod.errors import InvalidArgumentError

    model = make()
    temperature = nn.Parameter(torch.ones(()))
    opt = torch.optim.AdamW(list(model.parameters()) + [temperature], lr=0.1)
    with pytest.raises(InvalidArgumentError, match=r"the optimizer holds 1 parameter\(s\) that are not the model's "
                                                   r"\(shapes \(\)\).*make them part of the model"):
        deepspeed.initialize(model=model, optimizer=opt, config={"train_batch_size": 8})
    with pytest.raises(InvalidArgumentError, match=r"model_parameters holds a parameter of shape \(\) that is not "
                                                   r"the model's"):
        deepspeed.initialize(model=model, model_parameters=list(model.parameters()) + [temperature],
                             config=dict(CONFIGS["adamw_warmup_clip_gas2"]))


def test_tracing_shares_the_owner_of_a_bound_lr_lambda():
    """LambdaLR(opt, owner.method) holds the owner (a LightningModule: the
    whole model): tracing copies the scheduler, and must not copy it (an
    owner whose copy fails, or costs the model's memory)."""
    from zerod import _schedules

    class Owner(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.warm_steps = nn.Linear(4, 4), 4

        def __deepcopy__(self, memo):
            raise AssertionError("the lr_lambda's owner was copied")

        def warm(self, step):
            return min(1.0, (step + 1) / self.warm_steps)

    owner = Owner()
    opt = torch.optim.SGD(owner.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, [owner.warm])
    assert _schedules.trace(sched, steps=6) == [0.1 * min(1.0, (t + 1) / 4) for t in range(6)]
    chained = torch.optim.lr_scheduler.SequentialLR(
        opt, [torch.optim.lr_scheduler.LambdaLR(opt, owner.warm), torch.optim.lr_scheduler.ConstantLR(opt, 0.5)],
        milestones=[3])
    values = _schedules.trace(chained, steps=6)
    want = []
    for _ in range(6):  # the user's own scheduler, untouched by the trace
        want.append(opt.param_groups[0]["lr"])
        opt.step()
        chained.step()
    assert values == want and len(set(want)) > 2, (values, want)
