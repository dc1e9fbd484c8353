"""DeepSpeed configs on the Python side: "auto" values resolved from the
trainer (as Hugging Face's integration resolves them), DeepSpeed's batch-size
rule checked against the real rank count, and a torch optimizer written as
the config's "optimizer" section. The translation itself (config -> Lua job)
is zerod's C++ one (`zerod translate`), which refuses what it cannot run.
"""
import copy
import json
import math
import os
import re

from .errors import InvalidArgumentError

__all__ = ["load", "resolve", "optimizer_section", "optimizer_defaults", "check_param_groups", "job_text",
           "lr_schedule"]


def load(config):
    """A config dict from a dict (copied), a path to a JSON file, or JSON text."""
    if config is None:
        raise InvalidArgumentError("a DeepSpeed config is required: config=dict, a path to a JSON file, or "
                                   "args.deepspeed_config")
    if isinstance(config, dict):
        return copy.deepcopy(config)
    if isinstance(config, (str, os.PathLike)):
        text = os.fspath(config)
        if text.lstrip().startswith("{"):
            return json.loads(text)
        with open(text) as f:
            return json.load(f)
    raise InvalidArgumentError(f"config must be a dict or a path to a JSON file, got {type(config).__name__}")


def source_of(config):
    """(name, text) of the config as the user wrote it, for the translation's
    errors (located): a file's path and its text; JSON text with that text;
    a dict without (it has no lines)."""
    if isinstance(config, (str, os.PathLike)):
        text = os.fspath(config)
        if text.lstrip().startswith("{"):
            return "the DeepSpeed config", text
        with open(text) as f:
            return text, f.read()
    return "the DeepSpeed config", None


def line_of(text, path):
    """The line (from 1) of the dotted key `path` in the config's JSON text,
    found as `zerod check` finds it (each component after its parent's
    name); None where a component is not in the text (a key the trainer's
    values or a torch optimizer added)."""
    pos = 0
    for name in path.split("."):
        at = text.find(f'"{name}"', pos)
        if at < 0:
            return None
        pos = at
    return 1 + text.count("\n", 0, pos)


def located(message, names, source, text):
    """The translation's `message` about the resolved config it was given
    (each problem "NAME:LINE: key: why", NAME one of `names`, in a Lua job
    prefixed by the job's own line), with each problem placed where the
    user wrote the key: `source`:its line in `text`, or `source` and the
    key alone where the text does not have it (a dict, a key zerod added).
    The resolved text's lines are nowhere the user can see."""
    issue = re.compile(r"(?:\S+\.lua:\d+: )?(?:" + "|".join(map(re.escape, names)) + r"):\d+: ([^\s:]+): ")

    def place(m):
        line = line_of(text, m.group(1)) if text is not None else None
        return f"{source}{'' if line is None else f':{line}'}: {m.group(1)}: "
    return issue.sub(place, message)


def _is_auto(v):
    return isinstance(v, str) and v == "auto"


def _hidden_size(model):
    """The model's hidden size for the "auto" bucket sizes, as Hugging Face
    reads it (config.hidden_size, or the largest of config.hidden_sizes)."""
    cfg = getattr(model, "config", None)
    for name in ("hidden_size", "d_model", "n_embd"):
        v = getattr(cfg, name, None)
        if isinstance(v, int):
            return v
    sizes = getattr(cfg, "hidden_sizes", None)
    if sizes:
        return max(sizes)
    return None


def resolve(cfg, *, world_size, model=None, micro_batch=None, grad_accum=None, grad_clip=None, lr=None,
            betas=None, eps=None, weight_decay=None, total_steps=None, warmup_steps=None, precision=None):
    """Fills in every "auto" the trainer can answer and applies DeepSpeed's
    batch-size rule for `world_size` ranks (setting gradient_accumulation_steps).
    An "auto" nothing answers is an error naming the key. Returns cfg."""
    unresolved = []

    def fill(section, key, value, path):
        if section is None or not _is_auto(section.get(key)):
            return
        if value is None:
            unresolved.append(path)
        else:
            section[key] = value

    fill(cfg, "train_micro_batch_size_per_gpu", micro_batch, "train_micro_batch_size_per_gpu")
    fill(cfg, "gradient_accumulation_steps", grad_accum, "gradient_accumulation_steps")
    fill(cfg, "gradient_clipping", grad_clip, "gradient_clipping")
    if _is_auto(cfg.get("train_batch_size")):
        mbs, gas = cfg.get("train_micro_batch_size_per_gpu"), cfg.get("gradient_accumulation_steps")
        cfg["train_batch_size"] = mbs * (gas if gas is not None else 1) * world_size if isinstance(mbs, int) \
            else None
        if cfg["train_batch_size"] is None:
            unresolved.append("train_batch_size")
    for sec, flag in (("fp16", "16"), ("bf16", "bf16")):
        s = cfg.get(sec)
        if isinstance(s, dict) and _is_auto(s.get("enabled")):
            s["enabled"] = bool(precision and precision.startswith(flag)) if precision is not None else None
            if s["enabled"] is None:
                unresolved.append(f"{sec}.enabled")
    opt = cfg.get("optimizer")
    if isinstance(opt, dict) and isinstance(opt.get("params"), dict):
        p = opt["params"]
        for key, value in (("lr", lr), ("betas", list(betas) if betas else None), ("eps", eps),
                           ("weight_decay", weight_decay)):
            fill(p, key, value, f"optimizer.params.{key}")
    sched = cfg.get("scheduler")
    if isinstance(sched, dict) and isinstance(sched.get("params"), dict):
        p = sched["params"]
        fill(p, "warmup_min_lr", 0, "scheduler.params.warmup_min_lr")
        fill(p, "warmup_max_lr", lr, "scheduler.params.warmup_max_lr")
        fill(p, "warmup_num_steps", warmup_steps, "scheduler.params.warmup_num_steps")
        fill(p, "total_num_steps", total_steps, "scheduler.params.total_num_steps")
    zero = cfg.get("zero_optimization")
    if isinstance(zero, dict):
        hidden = _hidden_size(model) if model is not None else None
        for key, f in (("reduce_bucket_size", lambda h: h * h),
                       ("stage3_prefetch_bucket_size", lambda h: int(0.9 * h * h)),
                       ("stage3_param_persistence_threshold", lambda h: 10 * h)):
            fill(zero, key, f(hidden) if hidden else None, f"zero_optimization.{key}")
    # What no trainer value answers (a scheduler's warmup_type, cos_min_ratio,
    # OneCycle's bounds): the translation would run its default, or no
    # schedule at all, where DeepSpeed fails on the text "auto".
    unresolved += [path for path in _autos(cfg) if path in _TRANSLATED_KEYS and path not in unresolved]
    if unresolved:
        raise InvalidArgumentError(
            "DeepSpeed config: \"auto\" cannot be resolved for " + ", ".join(unresolved) +
            " (nothing the trainer gave says what it should be; write a value)")
    _batch_rule(cfg, world_size)
    return cfg


# Every key zerod's translation reads: scripting/ds_keys.cpp's translated
# rows, the first table of docs/integrations.md (test_deepspeed_configs.py
# holds the two equal). An "auto" left in one of these after resolve() is
# unresolved; one in a key the translation ignores
# (stage3_gather_16bit_weights_on_model_save in Accelerate's templates)
# changes nothing zerod runs.
_TRANSLATED_KEYS = frozenset(
    ["train_batch_size", "train_micro_batch_size_per_gpu", "dataloader_drop_last", "gradient_accumulation_steps",
     "gradient_clipping", "optimizer.type", "scheduler.type", "data_types.grad_accum_dtype",
     "gradient_allreduce_op"] +
    ["optimizer.params." + k for k in ("lr", "betas", "eps", "weight_decay", "bias_correction", "adam_w_mode",
                                       "torch_adam", "momentum", "dampening", "nesterov", "freeze_step")] +
    ["scheduler.params." + k for k in (
        "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "total_num_steps", "warmup_min_ratio",
        "cos_min_ratio", "cycle_min_lr", "cycle_max_lr", "cycle_first_step_size", "cycle_second_step_size",
        "cycle_first_stair_count", "cycle_second_stair_count", "decay_lr_rate", "decay_step_size",
        "lr_range_test_min_lr", "lr_range_test_step_size", "lr_range_test_step_rate", "lr_range_test_staircase")] +
    ["fp16." + k for k in ("enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                           "consecutive_hysteresis", "min_loss_scale", "zerod_window_rule")] +
    ["bf16.enabled", "bfloat16.enabled"] +
    ["zero_optimization." + k for k in (
        "stage", "reduce_bucket_size", "stage3_param_persistence_threshold", "param_persistence_threshold",
        "stage3_max_live_parameters", "max_live_parameters", "stage3_prefetch_bucket_size", "prefetch_bucket_size",
        "offload_optimizer.device", "offload_optimizer.nvme_path", "offload_optimizer.pin_memory",
        "offload_optimizer.ratio", "offload_optimizer.buffer_count", "offload_param.device",
        "offload_param.nvme_path", "offload_param.pin_memory", "cpu_offload", "cpu_offload_param")])


def _autos(cfg, path=""):
    """The dotted path of every "auto" value in cfg."""
    for k, v in cfg.items():
        key = f"{path}.{k}" if path else str(k)
        if isinstance(v, dict):
            yield from _autos(v, key)
        elif _is_auto(v):
            yield key


def _batch_rule(cfg, world):
    """DeepSpeed's runtime/config.py rule: two of train_batch_size,
    train_micro_batch_size_per_gpu and gradient_accumulation_steps give the
    third; all three must agree with the rank count."""
    _check_batch_numbers(cfg)
    tbs, mbs = cfg.get("train_batch_size"), cfg.get("train_micro_batch_size_per_gpu")
    gas = cfg.get("gradient_accumulation_steps")
    if tbs is not None and mbs is not None and gas is not None:
        if tbs != mbs * gas * world:
            raise InvalidArgumentError(
                f"DeepSpeed config: train_batch_size {tbs} is not train_micro_batch_size_per_gpu {mbs} x "
                f"gradient_accumulation_steps {gas} x {world} rank(s) (DeepSpeed checks the same)")
    elif tbs is not None and mbs is not None:
        gas, rest = divmod(tbs, mbs * world)
        if rest or gas < 1:
            raise InvalidArgumentError(f"DeepSpeed config: train_batch_size {tbs} is not a multiple of "
                                       f"train_micro_batch_size_per_gpu {mbs} x {world} rank(s)")
        cfg["gradient_accumulation_steps"] = gas
    elif tbs is not None:
        gas = gas if gas is not None else 1
        mbs, rest = divmod(tbs, gas * world)
        if rest or mbs < 1:
            raise InvalidArgumentError(f"DeepSpeed config: train_batch_size {tbs} is not a multiple of "
                                       f"gradient_accumulation_steps {gas} x {world} rank(s)")
        cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"] = mbs, gas
    elif mbs is not None:
        cfg["gradient_accumulation_steps"] = gas = gas if gas is not None else 1
        cfg["train_batch_size"] = mbs * gas * world
    else:
        raise InvalidArgumentError("DeepSpeed config: give train_batch_size or train_micro_batch_size_per_gpu "
                                   "(DeepSpeed requires one of them)")


def _check_batch_numbers(cfg):
    """Each batch key given is a whole number >= 1, as DeepSpeed asserts
    (and `zerod check` says): a 0 taken for "not given" would run another
    batch than the config's. The accumulation steps first: a train_batch_size
    filled in from them follows their mistake."""
    for key in ("gradient_accumulation_steps", "train_micro_batch_size_per_gpu", "train_batch_size"):
        v = cfg.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 1 or v != int(v):
            raise InvalidArgumentError(f"DeepSpeed config: {key} must be a whole number >= 1, got {v!r}")


# torch.optim hyperparameters zerod's plugins take, per class name, with
# what must hold for the others (a differing value is refused).
_TORCH_OPTIMIZERS = {
    "AdamW": ("AdamW", ("lr", "betas", "eps", "weight_decay")),
    "Adam": ("Adam", ("lr", "betas", "eps", "weight_decay")),
    "SGD": ("SGD", ("lr", "momentum", "dampening", "weight_decay", "nesterov")),
}
_MUST_BE = {"amsgrad": False, "maximize": False, "capturable": False, "differentiable": False}
_KERNEL_ONLY = ("foreach", "fused")  # which torch kernel runs: nothing for zerod
# Written into the groups by torch LR schedulers (their own bookkeeping; the
# schedule itself is traced by zerod._schedules).
_SCHEDULER_KEYS = ("initial_lr", "max_lr", "min_lr", "base_lr", "base_momentum", "max_momentum", "name")
# The hyperparameters an optimizer zerod runs reads from its groups (the
# translated ones, torch's switches): one written into a group that did not
# hold it is meant to change the update, where another key (a training
# loop's own, timm's lr_scale) is the loop's bookkeeping.
OPTIMIZER_KEYS = frozenset([k.split(".", 2)[2] for k in _TRANSLATED_KEYS if k.startswith("optimizer.params.")] +
                           list(_MUST_BE) + ["decoupled_weight_decay"])
# A group's bookkeeping, which no optimizer's update reads: the schedulers'
# keys, and the names torch >= 2.6 writes into each group of an optimizer
# made from model.named_parameters() (different in every group by nature).
GROUP_BOOKKEEPING = ("params", "param_names") + _SCHEDULER_KEYS


# What zerod's translation runs for an optimizer key a DeepSpeed config
# leaves out, per type (lower case): DeepSpeed 0.19's own defaults (FusedAdam
# and DeepSpeedCPUAdam for Adam and AdamW, 1-bit Adam, torch.optim.SGD),
# which scripting/ds_config.cpp writes out where zerod's plugins differ.
_DS_DEFAULTS = {
    "adam": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0, "bias_correction": True},
    "sgd": {"lr": 1e-3, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0, "nesterov": False},
}
_DS_DEFAULTS["adamw"] = _DS_DEFAULTS["onebitadam"] = _DS_DEFAULTS["adam"]
# torch.optim.AdamW's default weight decay. With "torch_adam": true DeepSpeed
# builds torch.optim.AdamW where the update decouples weight decay (type
# AdamW, or Adam without adam_w_mode false), which decays by this where the
# config gives no weight_decay; torch.optim.Adam (adam_w_mode false) by 0.
_TORCH_ADAMW_WEIGHT_DECAY = 0.01
_UNSET = object()


def _builds_torch_adamw(kind, params):
    """Whether DeepSpeed 0.19 builds torch.optim.AdamW for an optimizer section
    of type `kind` (lower case) with `params` (engine.py,
    get_optimizer_configuration: torch_adam, and AdamW unless the type is
    Adam with adam_w_mode false)."""
    return kind in ("adam", "adamw") and params.get("torch_adam") is True and \
        (kind == "adamw" or bool(params.get("adam_w_mode", True)))


def optimizer_defaults(cfg):
    """The value each optimizer key has where a parameter group leaves it
    out, for a config's "optimizer" section: the section's, else the type's
    default; {} without a section ("auto" values are not known yet)."""
    opt = cfg.get("optimizer")
    if not isinstance(opt, dict):
        return {}
    kind = str(opt.get("type", "")).lower()
    out = dict(_DS_DEFAULTS.get(kind, {}))
    params = opt.get("params") if isinstance(opt.get("params"), dict) else {}
    if _builds_torch_adamw(kind, params):
        out["weight_decay"] = _TORCH_ADAMW_WEIGHT_DECAY
    for k, v in params.items():
        if _is_auto(v):
            out.pop(k, None)
        else:
            out[k] = v
    return out


def _same(a, b):
    """Equal hyperparameter values: a tuple and a list of the same numbers
    (torch's betas, the config's), a one-element tensor and its number."""
    def plain(v):
        if hasattr(v, "item") and getattr(v, "numel", lambda: 1)() == 1:
            return v.item()
        if isinstance(v, (tuple, list)):
            return [plain(x) for x in v]
        return v
    return plain(a) == plain(b)


def check_param_groups(groups, what, defaults=None):
    """One set of hyperparameters for every trainable parameter (zerod's
    optimizer plugins take one); otherwise an error naming the key and the
    groups. A key a group leaves out has the optimizer's value there
    (`defaults`, where known): Megatron's usual groups, [{"params": decay},
    {"params": no_decay, "weight_decay": 0.0}], differ unless the optimizer's
    weight_decay is 0. Returns group 0's values, with any others set alike."""
    groups = list(groups)
    if not groups:
        raise InvalidArgumentError(f"{what} has no parameters")
    defaults = defaults or {}
    first = {k: v for k, v in groups[0].items() if k not in GROUP_BOOKKEEPING}
    keys = []
    for g in groups:
        keys += [k for k in g if k not in keys and k not in GROUP_BOOKKEEPING and k not in _KERNEL_ONLY]
    for k in keys:
        values = [g.get(k, defaults.get(k, _UNSET)) for g in groups]
        if all(v is not _UNSET for v in values) and all(_same(v, values[0]) for v in values[1:]):
            if k not in first:
                first[k] = values[0]
            continue
        # The first group unlike group 0; where group 0 leaves the key to a
        # default not known here, the first that sets it.
        if values[0] is _UNSET:
            i = next(j for j, v in enumerate(values) if v is not _UNSET)
        else:
            i = next(j for j, v in enumerate(values) if v is _UNSET or not _same(v, values[0]))

        def says(j):
            if k in groups[j]:
                return f"group {j} has {k}={groups[j][k]!r}"
            if values[j] is not _UNSET:
                return f"group {j} leaves it to the optimizer's {k}={values[j]!r}"
            return f"group {j} leaves it to the optimizer's default"
        raise InvalidArgumentError(
            f"{what}: parameter {says(i)}, {says(0)}; zerod applies one set of optimizer hyperparameters to every "
            f"parameter (use one group, or set {k} alike in every group, e.g. weight decay on all parameters)")
    return first


# The hyperparameters a parameter group of model_parameters may set, per
# optimizer type (lower case): what the optimizer DeepSpeed builds reads
# from its groups and zerod's plugin for the type takes.
_GROUP_KEYS = {
    "adam": ("lr", "betas", "eps", "weight_decay", "bias_correction"),
    "sgd": ("lr", "momentum", "dampening", "weight_decay", "nesterov"),
}
_GROUP_KEYS["adamw"] = _GROUP_KEYS["onebitadam"] = _GROUP_KEYS["adam"]


def _plain(v):
    """A group's value as the JSON config holds it: a one-element tensor as
    its number, torch's betas tuple as a list."""
    if hasattr(v, "item") and getattr(v, "numel", lambda: 1)() == 1:
        return v.item()
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    return v


def take_param_groups(cfg, agreed, what):
    """Writes the hyperparameters that parameter groups set (`agreed`: what
    check_param_groups returned for them) into the config's "optimizer"
    section, before resolve() and the translation read it: DeepSpeed hands
    the groups to the optimizer it builds, where a group's value wins over
    the section's, and its scheduler starts from the groups' lr. A key the
    optimizer type does not take is an error naming it (zerod would train
    without it); torch's switches (amsgrad, ...) are accepted off, its kernel
    choice (foreach, fused) ignored. Without a section, or of a type the
    translation refuses, nothing is written."""
    opt = cfg.get("optimizer")
    if not isinstance(opt, dict):
        return
    kind = str(opt.get("type", ""))
    keys = _GROUP_KEYS.get(kind.lower())
    if keys is None:
        return
    taken = {}
    for k, v in agreed.items():
        if k in keys:
            taken[k] = _plain(v)
        elif k in _KERNEL_ONLY or (k in _MUST_BE and _same(v, _MUST_BE[k])):
            continue
        else:
            raise InvalidArgumentError(
                f"{what}: the parameter groups set {k}={v!r}, which the {kind} optimizer does not take (its "
                f"groups' hyperparameters are {', '.join(keys)}); zerod would train without it: leave it out")
    if taken:
        params = opt.get("params")
        opt["params"] = dict(params if isinstance(params, dict) else {}, **taken)


def optimizer_section(optimizer):
    """The DeepSpeed config "optimizer" section for a torch.optim optimizer
    (Adam, AdamW, SGD); anything else, or an option zerod's plugins do not
    have, is an error naming it."""
    name = type(optimizer).__name__
    if name not in _TORCH_OPTIMIZERS:
        raise InvalidArgumentError(
            f"torch optimizer {name} has no zerod equivalent (zerod runs torch.optim.AdamW, Adam and SGD as its "
            "adamw, adam and sgd plugins)")
    ds_type, keys = _TORCH_OPTIMIZERS[name]
    hp = check_param_groups(optimizer.param_groups, f"torch.optim.{name}")
    # torch >= 2.6 writes decoupled_weight_decay into every Adam/AdamW group:
    # True is AdamW's own rule, and Adam(decoupled_weight_decay=True) is AdamW.
    decoupled = hp.pop("decoupled_weight_decay", name == "AdamW")
    if name in ("Adam", "AdamW"):
        name = ds_type = "AdamW" if decoupled else "Adam"
    for k, want in _MUST_BE.items():
        if k in hp and bool(hp[k]) != want:
            raise InvalidArgumentError(f"torch.optim.{name}({k}={hp[k]!r}) is not supported: zerod's {name} "
                                       f"plugin has no {k}")
    for k, v in hp.items():
        # An option torch grows later is accepted only while it is off.
        if k not in keys and k not in _MUST_BE and k not in _KERNEL_ONLY and v not in (None, False, 0):
            raise InvalidArgumentError(f"torch.optim.{name}({k}={v!r}) has no zerod equivalent")
    params = {}
    for k in keys:
        # An LR scheduler made on the optimizer has set the groups' lr to its
        # first value (0 at the start of a warm-up) and kept the optimizer's
        # own as initial_lr.
        v = optimizer.param_groups[0].get("initial_lr", hp.get(k)) if k == "lr" else hp.get(k)
        if hasattr(v, "item"):  # a tensor lr
            v = v.item()
        if k == "betas":
            v = list(v)
        params[k] = v
    if name == "Adam":
        params["adam_w_mode"] = False  # torch's Adam adds weight decay to the gradient (L2)
    return {"type": ds_type, "params": params}


def job_text(cfg, lr_lua=None):
    """The job for a resolved config: the JSON itself, or, when the trainer
    brings its own schedule (a torch scheduler, written as Lua), a Lua job
    built on zerod.deepspeed(json) with that `lr`."""
    text = json.dumps(_json_numbers(cfg), indent=2, sort_keys=True, allow_nan=False)
    if lr_lua is None:
        return text
    level = 1
    while "]" + "=" * level + "]" in text:
        level += 1
    eq = "=" * level
    return (f"local zerod = require(\"zerod\")\nlocal job = zerod.deepspeed([{eq}[\n{text}\n]{eq}])\n"
            f"job.lr = {lr_lua}\nreturn job\n")


def _json_numbers(cfg, path=""):
    """cfg with only numbers JSON has (zerod reads the config as JSON; Python
    writes inf and nan as Infinity and NaN, which JSON lacks). Accelerate's
    DeepSpeed plugin sets steps_per_print to inf ("never print"): that key
    only tunes DeepSpeed's progress log, so it is left out. Any other
    non-finite number is an error naming its key."""
    if isinstance(cfg, dict):
        out = {}
        for k, v in cfg.items():
            key = f"{path}.{k}" if path else str(k)
            if isinstance(v, float) and not math.isfinite(v):
                if key == "steps_per_print":
                    continue
                raise InvalidArgumentError(f"DeepSpeed config: {key} is {v}, which a JSON config cannot hold")
            out[k] = _json_numbers(v, key)
        return out
    if isinstance(cfg, list):
        return [_json_numbers(v, f"{path}[{i}]") for i, v in enumerate(cfg)]
    if isinstance(cfg, float) and not math.isfinite(cfg):
        raise InvalidArgumentError(f"DeepSpeed config: {path} holds {cfg}, which a JSON config cannot hold")
    return cfg


def lr_schedule(cfg):
    """The lr of every update, as a function of the update's index, for a
    resolved config's "scheduler" section (or the optimizer's constant lr):
    what engine.get_lr() reports for the next update, as DeepSpeed's does.
    zerod itself runs the translated Lua (scripting/ds_config.cpp,
    zerod_lib.lua); these are the same formulas, DeepSpeed's
    runtime/lr_schedules.py, and the side-by-side test holds both to
    DeepSpeed's get_lr(). Update 0 runs at the lr the scheduler set when it
    was made and update t at its value for iteration t - 1."""
    # The optimizer's lr, or its type's default as the translation writes it
    # (zerod's default optimizer, adamw, has DeepSpeed's 1e-3 too).
    base = float(optimizer_defaults(cfg).get("lr", 1e-3))
    sched = cfg.get("scheduler")
    if not isinstance(sched, dict):
        return lambda t: base
    kind, p = sched.get("type"), dict(sched.get("params") or {})

    def gamma(t, w, kind):
        if t >= w:
            return 1.0
        if kind == "log":
            return 1.0 if w < 2 else (1.0 / math.log(w)) * math.log(t + 1)
        return t / w

    if kind in ("WarmupLR", "WarmupDecayLR"):
        # WarmupLR's maximum defaults to the optimizer's lr; WarmupDecayLR
        # hands WarmupLR its own default, 0.001.
        lo = float(p.get("warmup_min_lr", 0.0))
        hi = float(p.get("warmup_max_lr", base if kind == "WarmupLR" else 1e-3))
        w, wt = max(2, int(p.get("warmup_num_steps", 1000))), p.get("warmup_type", "log")
        total = int(p.get("total_num_steps", 0))

        def f(t):
            if kind == "WarmupLR" or t < w:
                return lo + (hi - lo) * gamma(t, w, wt)
            return lo + (hi - lo) * (max(0, total - t) / max(1, total - w))  # DeepSpeed's max(1.0, ...)
        first = lo
    elif kind == "WarmupCosineLR":
        w, wt = max(2, int(p.get("warmup_num_steps", 1000))), p.get("warmup_type", "log")
        total, wmin, cmin = int(p["total_num_steps"]), float(p.get("warmup_min_ratio", 0.0)), \
            float(p.get("cos_min_ratio", 1e-4))
        inv = 1.0 / math.log(w)

        def f(t):
            if t < w:
                r = inv * math.log(t + 1) if wt == "log" else t / w
                return base * (wmin + r * (1.0 - wmin))
            progress = min(1.0, (t - w + 1) / max(1, total - w))
            return base * max(0.0, cmin + (1.0 - cmin) * ((1 + math.cos(math.pi * progress)) / 2))
        first = 0.0
    elif kind == "OneCycle":
        lo, hi = float(p["cycle_min_lr"]), float(p["cycle_max_lr"])
        n1 = int(p.get("cycle_first_step_size", 2000))
        n2 = int(p.get("cycle_second_step_size", n1))
        rate, every = float(p.get("decay_lr_rate", 0.0)), int(p.get("decay_step_size", 0))
        s1 = int(p.get("cycle_first_stair_count", 0))
        s2 = int(p["cycle_second_stair_count"]) if p.get("cycle_second_stair_count") is not None else s1
        total, ratio = n1 + n2, n1 / (n1 + n2)

        def one_cycle(t):
            # zerod.one_cycle's steps, DeepSpeed's _get_scale_factor's
            # operations: a stair is a floor(), which one last bit can move.
            if t <= total:
                x = 1 + t / total - math.floor(1 + t / total)
                f, stairs = (x / ratio, s1) if x <= ratio else ((x - 1) / (ratio - 1), s2)
                if stairs > 0:
                    c = t % total
                    f = math.floor(c * stairs / n1 if c <= n1 else (total - c) * stairs / n2) / stairs
                return lo + (hi - lo) * f
            if rate == 0 or every == 0:
                return lo
            return lo / (1 + rate * ((t - total) / every))
        return one_cycle  # not delayed: its step t is DeepSpeed's t - 1 already
    elif kind == "LRRangeTest":
        lo, size = float(p.get("lr_range_test_min_lr", 1e-3)), int(p.get("lr_range_test_step_size", 2000))
        rate, stair = float(p.get("lr_range_test_step_rate", 1.0)), bool(p.get("lr_range_test_staircase", False))
        # Not delayed either: min_lr when made, then its value after t steps.
        return lambda t: lo * (1 + rate * (math.floor(t / size) if stair else t / size))
    else:
        return lambda t: base  # refused by the translation before it gets here

    return lambda t: first if t == 0 else f(t - 1)
