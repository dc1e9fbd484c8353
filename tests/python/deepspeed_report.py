"""What DeepSpeed itself makes of DeepSpeed configs: each one through
deepspeed.initialize on the CPU (one rank, a small model), and what the
engine it built holds, read back from the engine and the objects it made.
test_deepspeed_configs.py runs this in a process of its own (DeepSpeed's
import and process group are paid once) and compares zerod with it.

    python deepspeed_report.py IN.json OUT.json PORT

IN: {"cases": {name: {"config": {...}, "client_optimizer": null | {lr, betas,
eps, weight_decay}, "lr_steps": N}}, "batch_rules": {name: {"config": {...},
"world": N}}}. OUT: for each case {"verdict": "accept" | "refuse" |
"accept-config", "error": ..., "hp": {...}}; for each batch rule {"verdict",
"error", "train_batch_size", "micro", "gas"}.

"accept-config": the engine cannot be built on this CPU (an op DeepSpeed
has only for GPUs: FusedLamb, ZeRO++'s quantizer), so the verdict is
DeepSpeed's config parser's (DeepSpeedConfig) and its optimizer check.
"""
import copy
import json
import os
import sys

CPU_ONLY = "had not been implemented on CPU backend"


def main(inp, out, port):
    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": "0", "WORLD_SIZE": "1",
                 "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(k, v)
    import deepspeed
    import torch

    work = json.load(open(inp))
    deepspeed.init_distributed(dist_backend="gloo")
    report = {"cases": {}, "batch_rules": {}}
    for name, case in work["cases"].items():
        report["cases"][name] = run_case(deepspeed, torch, case)
    for name, rule in work["batch_rules"].items():
        report["batch_rules"][name] = batch_rule(rule)
    json.dump(report, open(out, "w"), indent=1, sort_keys=True)


def make_model(torch):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def offloads_optimizer(cfg):
    z = cfg.get("zero_optimization") or {}
    o = z.get("offload_optimizer") or {}
    return z.get("stage", 0) >= 1 and (o.get("device", "none") != "none" or z.get("cpu_offload") is True)


def client_optimizer(torch, spec, model, cfg):
    """The trainer's own optimizer, for a config without an "optimizer"
    section: torch's AdamW, or with the optimizer offloaded DeepSpeed's CPU
    Adam in AdamW mode (DeepSpeed refuses another one there unless
    zero_force_ds_cpu_optimizer is false; Accelerate and DeepSpeed-Chat make
    the same swap)."""
    if spec is None:
        return None
    kw = dict(lr=spec["lr"], betas=tuple(spec["betas"]), eps=spec["eps"], weight_decay=spec["weight_decay"])
    if offloads_optimizer(cfg) and cfg.get("zero_force_ds_cpu_optimizer", True):
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        return DeepSpeedCPUAdam(model.parameters(), adamw_mode=True, **kw)
    return torch.optim.AdamW(model.parameters(), **kw)


def run_case(deepspeed, torch, case):
    cfg = copy.deepcopy(case["config"])
    model = make_model(torch)
    try:
        opt = client_optimizer(torch, case.get("client_optimizer"), model, cfg)
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), optimizer=opt,
                                               config=cfg)
    except Exception as e:  # DeepSpeed refuses with many exception types
        error = f"{type(e).__name__}: {e}"
        if CPU_ONLY in str(e):
            return config_only(torch, case["config"], error)
        return {"verdict": "refuse", "error": error}
    try:
        return {"verdict": "accept", "hp": engine_report(torch, engine, case["lr_steps"])}
    finally:
        engine.destroy()


def config_only(torch, cfg, cpu_error):
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS, DeepSpeedConfig
    try:
        parsed = DeepSpeedConfig(copy.deepcopy(cfg))
    except Exception as e:
        return {"verdict": "refuse", "error": f"{type(e).__name__}: {e}"}
    name = parsed.optimizer_name
    # DeepSpeedEngine._is_supported_optimizer, which initialize asserts.
    if name is not None and name not in DEEPSPEED_OPTIMIZERS and getattr(torch.optim, name, None) is None:
        return {"verdict": "refuse", "error": f"AssertionError: {name} is not a supported DeepSpeed Optimizer"}
    return {"verdict": "accept-config", "error": cpu_error}


def engine_report(torch, engine, lr_steps):
    stage = engine.zero_optimization_stage()
    hp = {
        "stage": stage,
        "train_batch_size": engine.train_batch_size(),
        "micro_batch": engine.train_micro_batch_size_per_gpu(),
        "gradient_accumulation_steps": engine.gradient_accumulation_steps(),
        "gradient_clipping": engine.gradient_clipping(),
        "precision": "fp16" if engine.fp16_enabled() else "bf16" if engine.bfloat16_enabled() else "fp32",
        "optimizer": optimizer_report(torch, engine.basic_optimizer),
        "offload": offload_report(engine.optimizer, stage),
    }
    z = engine._config.zero_config
    if stage == 3:
        hp["zero3"] = {"prefetch_bucket_size": z.prefetch_bucket_size,
                       "param_persistence_threshold": z.param_persistence_threshold,
                       "max_live_parameters": z.max_live_parameters}
    if stage >= 2:
        hp["reduce_bucket_size"] = z.reduce_bucket_size
    # The lr of update t: the optimizer's after the scheduler was made, then
    # after each of its steps (engine.step() steps it once per update).
    lrs = [engine.get_lr()[0]]
    for _ in range(lr_steps - 1):
        if engine.lr_scheduler is not None:
            engine.lr_scheduler.step()
        lrs.append(engine.get_lr()[0])
    hp["lr"] = lrs
    if engine.fp16_enabled():
        hp["loss_scale"] = loss_scale_report(engine.optimizer, stage)
    return hp


def optimizer_report(torch, opt):
    from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam
    g = opt.param_groups[0]
    if isinstance(opt, torch.optim.SGD):
        return {"type": "sgd", "momentum": g["momentum"], "dampening": g["dampening"], "nesterov": g["nesterov"],
                "weight_decay": g["weight_decay"]}
    if isinstance(opt, torch.optim.AdamW):  # before Adam: torch's AdamW is an Adam
        kind = "adamw"
    elif isinstance(opt, torch.optim.Adam):
        kind = "adamw" if g.get("decoupled_weight_decay") else "adam"
    elif isinstance(opt, (FusedAdam, DeepSpeedCPUAdam)):
        kind = "adamw" if opt.adam_w_mode else "adam"
    else:
        return {"type": type(opt).__name__}
    return {"type": kind, "class": type(opt).__name__, "betas": list(g["betas"]), "eps": g["eps"],
            "weight_decay": g["weight_decay"], "bias_correction": g.get("bias_correction", True)}


def offload_report(opt, stage):
    """Where the optimizer state and the parameters went, from the ZeRO
    optimizer DeepSpeed built (stage 3: DeepSpeedZeroOptimizer_Stage3's
    offload_* fields; stages 1-2: cpu_offload, DeepSpeed's only tier there;
    stage 0 offloads nothing)."""
    if stage == 3:
        pins = ([opt.offload_optimizer_pin_memory] if opt.offload_optimizer else []) + \
            ([opt.offload_param_pin_memory] if opt.offload_param else [])
        return {"optimizer": ("nvme" if opt.swap_optimizer else "cpu") if opt.offload_optimizer else "none",
                "params": ("nvme" if opt.params_in_nvme_and_cpu else "cpu") if opt.offload_param else "none",
                "ratio": opt.partial_offload, "pin": any(pins) if pins else None}
    if stage in (1, 2):
        # bf16 at stage 1 without offload runs DeepSpeed's BF16_Optimizer,
        # which never offloads (engine._do_optimizer_sanity_check).
        cpu = getattr(opt, "cpu_offload", False)
        return {"optimizer": "cpu" if cpu else "none", "params": "none", "ratio": 1.0,
                "pin": opt.cpu_offload_pin_memory if cpu else None}
    return {"optimizer": "none", "params": "none", "ratio": 1.0, "pin": None}


def loss_scale_report(opt, stage):
    """The scaler's settings, how many overflows in a row it takes to halve
    the scale, found by feeding it overflows (its hysteresis), and whether
    an overflow at the minimum scale raises."""
    if stage == 0:  # FP16_Optimizer or its unfused twin: a LossScaleConfig, which never raises
        c = opt.loss_scale_config
        out = {"dynamic": c.dynamic_loss_scale, "scale": c.cur_scale, "window": c.scale_window,
               "min": c.min_loss_scale, "consecutive_hysteresis": False, "raises_at_min": False}

        def overflow():
            opt._update_scale(True)
            return c.cur_scale
    else:
        s = opt.loss_scaler
        out = {"dynamic": s.dynamic, "scale": s.cur_scale, "window": getattr(s, "scale_window", None),
               "min": getattr(s, "min_scale", None),
               "consecutive_hysteresis": getattr(s, "consecutive_hysteresis", False),
               "raises_at_min": getattr(s, "raise_error_at_min_scale", False)}

        def overflow():
            s.update_scale(True)
            return s.cur_scale
    start = out["scale"]
    out["overflows_to_halve"] = None
    if out["dynamic"]:
        for n in range(1, 11):
            if overflow() < start:
                out["overflows_to_halve"] = n
                break
    return out


def batch_rule(rule):
    """DeepSpeed's batch-size rule for `world` ranks: DeepSpeedConfig with a
    data-parallel group of that size (it reads the size from `mpu`)."""
    from deepspeed.runtime.config import DeepSpeedConfig

    class Mpu:
        def get_data_parallel_world_size(self):
            return rule["world"]

    try:
        c = DeepSpeedConfig(copy.deepcopy(rule["config"]), mpu=Mpu())
    except Exception as e:
        return {"verdict": "refuse", "error": f"{type(e).__name__}: {e}"}
    return {"verdict": "accept", "train_batch_size": c.train_batch_size, "micro": c.train_micro_batch_size_per_gpu,
            "gas": c.gradient_accumulation_steps}


if __name__ == "__main__":
    main(*sys.argv[1:4])
