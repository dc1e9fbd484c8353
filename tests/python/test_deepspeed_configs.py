"""DeepSpeed configs as users have them, against DeepSpeed 0.19 itself.

The corpus (deepspeed_configs/, one JSON file per config, CASES below says
where each shape comes from) is written from the configs public training
code ships and documents: DeepSpeed's examples, tutorials and docs, Hugging
Face Transformers, Accelerate and TRL, Lightning, and the fine-tuning tools
(LLaMA-Factory, FastChat, LLaVA, Alpaca, DeepSpeed-Chat, Megatron-DeepSpeed,
BLOOM); ZeRO 0-3, offload to cpu and nvme, fp16/bf16, every DeepSpeed
scheduler, "auto" everywhere, 1-bit Adam, keys that are redundant,
contradictory, deprecated or removed.

For every config, as the trainer would hand it over ("auto" filled in as
Hugging Face's integration fills it, hf_resolve; the trainer's own optimizer
where the config has none):
- DeepSpeed (deepspeed.initialize on the CPU, deepspeed_report.py) and
  `zerod check` agree on accept or refuse; where they do not, the case says
  so and why, and docs/integrations.md lists the reason (DELIBERATE: a
  feature zerod does not have; BEYOND: one DeepSpeed 0.19 dropped and zerod
  has); where both refuse, zerod's message names the key;
- where both accept, the job zerod runs has what DeepSpeed's engine holds:
  the lr of updates 0..LR_STEPS-1, batch sizes and accumulation, clipping,
  the fp16 loss scaler (down to how many overflows halve the scale), the
  optimizer (AdamW or Adam, betas, eps, weight decay, bias correction; SGD's
  momentum), the ZeRO stage and what is offloaded where.
Also: zerod's own "auto" resolution (zerod/_dsconfig.py, what zerod.deepspeed
and the Lightning and Accelerate integrations run) fills every key as
hf_resolve does; `zerod check` takes each accepted config as written, "auto"
and all; and DeepSpeed's batch-size rule for 1-8 ranks is zerod's.

Runs under the Python of build/venv (torch 2.x, DeepSpeed 0.19); ctest
reports it Skipped, with the reason, without it. `pytest -s` prints the
summary for docs/integrations.md.
"""
import copy
import inspect
import json
import math
import os
import re
import subprocess
import sys
import types

import pytest
import torch

from conftest import HERE, ROOT, ZEROD, reserved_port
from zerod import _dsconfig

CORPUS = os.path.join(HERE, "deepspeed_configs")
DOCS = os.path.join(ROOT, "docs", "integrations.md")
LR_STEPS = 48  # updates 0..47: past every warm-up, decay and cycle below but DeepSpeed's 1000-step defaults

# The trainer's values an "auto" is filled from: transformers'
# TrainingArguments, chosen unlike DeepSpeed's and zerod's defaults so that a
# value left at a default shows. A case overrides what its config fixes.
TRAINER = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "max_grad_norm": 0.5,
           "learning_rate": 3e-5, "adam_beta1": 0.9, "adam_beta2": 0.95, "adam_epsilon": 1e-7,
           "weight_decay": 0.01, "warmup_steps": 6, "num_training_steps": 40, "precision": None,
           "hidden_size": 16}

# zerod refuses what DeepSpeed accepts: a feature zerod does not have. Each
# text is in docs/integrations.md.
DELIBERATE = {
    "lamb": "Lamb, Lion, Adagrad, Muon and torch.optim's other optimizers: no zerod plugin runs them",
    "onecycle_momentum": "OneCycle with `cycle_momentum` (DeepSpeed's default): zerod's optimizer "
                         "hyperparameters are fixed for a job, so the betas cannot cycle",
    "activations": "`activation_checkpointing.partition_activations` or `cpu_checkpointing` true: zerod does "
                   "not hold activations",
    "zeropp": "ZeRO++ (`zero_quantized_weights`, `zero_quantized_gradients`, `zero_hpz_partition_size` > 1): "
              "not built",
    "unknown_key": "a key DeepSpeed does not read, such as a misspelling: DeepSpeed ignores it, zerod refuses "
                   "it and names the key it resembles",
    "other_modes": "`gradient_allreduce_op` \"sum\", `managed_gradient_accumulation` false, `torch_autocast` "
                   "enabled: zerod averages the ranks' gradients, ends each accumulation window itself and does not "
                   "autocast the forward",
}
# zerod accepts what DeepSpeed 0.19 refuses.
BEYOND = {
    "onebit_adam": "`OneBitAdam`: DeepSpeed 0.19 no longer has 1-bit Adam and refuses the type; zerod runs it "
                   "([onebit.md](onebit.md))",
}


class Case:
    """verdict: "agree" (both accept), "refuse" (both refuse; zerod names
    `key`), "deliberate" / "beyond" (a difference, `why` its entry above).
    trainer: what differs from TRAINER. cpu: DeepSpeed cannot build the
    engine on a CPU (an op it has only for GPUs); its config parser decides."""

    def __init__(self, source, verdict="agree", key=None, why=None, trainer=None, cpu=None):
        self.source, self.verdict, self.key, self.why, self.cpu = source, verdict, key, why, cpu
        self.trainer = dict(TRAINER, **(trainer or {}))


GAS1 = {"gradient_accumulation_steps": 1}
CASES = {
    # Hugging Face Transformers: tests/deepspeed and the DeepSpeed integration docs.
    "hf_transformers_zero2.json": Case("transformers tests/deepspeed ds_config_zero2: all auto, fp16 dynamic keys, "
                                       "ZeRO-2 with the optimizer on the CPU", trainer={"precision": "fp16"}),
    "hf_transformers_zero3.json": Case("transformers tests/deepspeed ds_config_zero3: ZeRO-3, both offloaded to "
                                       "the CPU, hidden-size autos"),
    "hf_docs_zero3_bf16_warmupdecay.json": Case("transformers DeepSpeed docs: ZeRO-3 bf16 with WarmupDecayLR all "
                                                "auto", trainer={"precision": "bf16"}),
    "hf_docs_zero_infinity_nvme.json": Case("transformers DeepSpeed docs: ZeRO-Infinity, both on NVMe, aio block",
                                            trainer={"precision": "fp16"}),
    "hf_trainer_optimizer_zero2.json": Case("transformers docs: no optimizer section, the Trainer's AdamW",
                                            trainer={"precision": "bf16"}),
    "hf_zero3_offload_pipelined_checkpointing.json": Case(
        "Hugging Face fine-tuning recipes: ZeRO-3 with pipelined CPU offload and DeepSpeed's activation "
        "checkpointing block switched off", trainer={"precision": "bf16"}),
    # Accelerate: its tests' configs (the issue's) and its templates; TRL's accelerate configs.
    "accelerate_tests_zero2.json": Case("accelerate tests/deepspeed ds_config_zero2: AdamW with torch_adam and "
                                        "adam_w_mode true", trainer=dict(GAS1, precision="fp16")),
    "accelerate_tests_zero3.json": Case("accelerate tests/deepspeed ds_config_zero3",
                                        trainer=dict(GAS1, precision="bf16")),
    "accelerate_template_zero1.json": Case("accelerate deepspeed_config_templates zero_stage1: WarmupDecayLR auto",
                                           trainer=dict(GAS1, precision="bf16")),
    "accelerate_template_zero3_offload.json": Case("accelerate deepspeed_config_templates zero_stage3_offload",
                                                   trainer=dict(GAS1, precision="bf16")),
    "accelerate_plugin_zero3.json": Case("what Accelerate's DeepSpeedPlugin writes from `accelerate config` "
                                         "(zero_stage 3, offload none, nvme_path null)",
                                         trainer=dict(GAS1, max_grad_norm=1.0, precision="bf16")),
    "trl_accelerate_zero2_offload.json": Case("TRL examples/accelerate_configs deepspeed_zero2 with the optimizer "
                                              "offloaded, as the plugin writes it",
                                              trainer=dict(GAS1, max_grad_norm=1.0, precision="bf16")),
    # Lightning: its docs and what DeepSpeedStrategy writes.
    "lightning_docs_zero2_offload.json": Case("Lightning DeepSpeed docs: a custom config, ZeRO-2 offload, WarmupLR"),
    "lightning_docs_onebitadam.json": Case("Lightning DeepSpeed docs: OneBitAdam with cuda_aware", "beyond",
                                           why="onebit_adam"),
    "lightning_strategy_stage3_offload.json": Case("Lightning DeepSpeedStrategy(stage=3, offload_optimizer=True, "
                                                   "offload_parameters=True) as it writes its config"),
    "lightning_docs_activation_checkpointing.json": Case(
        "Lightning DeepSpeed docs: ZeRO-3 offload with partitioned, CPU-checkpointed activations", "deliberate",
        key="activation_checkpointing.partition_activations", why="activations"),
    # DeepSpeed: DeepSpeedExamples, tutorials and the config docs.
    "deepspeed_cifar_fp16.json": Case("DeepSpeedExamples cifar ds_config: Adam, WarmupLR, fp16 at stage 0"),
    "deepspeed_bert_lamb.json": Case("DeepSpeedExamples bing_bert: Lamb at batch 4096", "deliberate",
                                     key="optimizer.type", why="lamb", cpu="FusedLamb"),
    "deepspeed_onebit_adam_squad.json": Case("DeepSpeed 1-bit Adam tutorial (BingBertSQuAD)", "beyond",
                                             why="onebit_adam"),
    "deepspeed_zero_one_adam_bert.json": Case("DeepSpeed 0/1 Adam tutorial (BERT pre-training)", "refuse",
                                              key="optimizer.type"),
    "deepspeed_docs_onecycle.json": Case("DeepSpeed config docs: OneCycle with momentum cycling", "deliberate",
                                         key="scheduler.params.cycle_momentum", why="onecycle_momentum"),
    "deepspeed_onecycle_no_momentum.json": Case("DeepSpeed 1-Cycle tutorial, momentum cycling off, SGD"),
    "deepspeed_docs_lr_range_test.json": Case("DeepSpeed 1-Cycle tutorial: the LR range test"),
    "deepspeed_lr_range_test_staircase.json": Case("DeepSpeed config docs: LRRangeTest with the staircase"),
    "deepspeed_docs_warmup_cosine.json": Case("DeepSpeed config docs: WarmupCosineLR, linear warm-up"),
    "deepspeed_docs_warmup_decay_linear.json": Case("DeepSpeed config docs: WarmupDecayLR without warmup_max_lr"),
    "deepspeed_zero_offload_tutorial.json": Case("DeepSpeed ZeRO-Offload tutorial (Megatron GPT-2): max_grad_norm "
                                                 "in the optimizer's params", "refuse",
                                                 key="optimizer.params.max_grad_norm"),
    "deepspeed_zero_infinity_tutorial.json": Case("DeepSpeed ZeRO-Infinity tutorial: both on NVMe, fp16"),
    "deepspeed_docs_offload_ratio.json": Case("DeepSpeed config docs: ZeRO-3 partial offload (ratio 0.3)"),
    "deepspeed_chat_actor_stage3.json": Case("DeepSpeed-Chat get_train_ds_config, ZeRO-3, hybrid_engine off"),
    "deepspeed_chat_sft_stage2_offload.json": Case("DeepSpeed-Chat with --offload at ZeRO-2 (offload_param set "
                                                   "below stage 3)"),
    "megatron_deepspeed_gpt_bf16.json": Case("Megatron-DeepSpeed ds_config_gpt template, bf16, fp32 accumulation"),
    "megatron_deepspeed_curriculum.json": Case("Megatron-DeepSpeed: the old top-level curriculum_learning block",
                                               "refuse", key="curriculum_learning"),
    "bigscience_bloom_bf16.json": Case("BigScience BLOOM training ds_config: bf16, ZeRO 0"),
    "deepspeed_docs_monitors.json": Case("DeepSpeed config docs: flops profiler, tensorboard, wandb, csv, comms "
                                         "logger, checkpoint blocks"),
    "deepspeed_deprecated_cpu_offload.json": Case("DeepSpeed <0.5 style ZeRO-2: the deprecated cpu_offload flag"),
    "deepspeed_deprecated_zero3_keys.json": Case("deprecated ZeRO-3 keys (cpu_offload_param, "
                                                 "stage3_gather_fp16_weights_on_model_save) and the old bfloat16 "
                                                 "name"),
    "deepspeed_apex_amp.json": Case("old DeepSpeed examples: apex AMP", "refuse", key="amp"),
    "deepspeed_zeropp_tutorial.json": Case("DeepSpeed ZeRO++ tutorial", "deliberate",
                                           key="zero_optimization.zero_quantized_weights", why="zeropp",
                                           cpu="ZeRO++'s quantizer"),
    "deepspeed_0_19_8_keys_at_defaults.json": Case("DeepSpeed 0.19.8's newer top-level keys spelt out at their "
                                                   "defaults (torch_autocast off, managed accumulation, a mean "
                                                   "all-reduce, disable_allgather, expert-parallel group order)"),
    "deepspeed_0_19_8_other_modes.json": Case("DeepSpeed 0.19.8's other modes: a summed all-reduce, accumulation "
                                              "the trainer manages, torch_autocast on", "deliberate",
                                              key="gradient_allreduce_op", why="other_modes"),
    "hello_deepspeed_bert_stage1_offload.json": Case("DeepSpeedExamples HelloDeepSpeed: fp16, ZeRO-1 offload"),
    # Fine-tuning tools.
    "llama_factory_ds_z0.json": Case("LLaMA-Factory examples/deepspeed ds_z0_config", trainer={"precision": "fp16"}),
    "llama_factory_ds_z2_offload.json": Case("LLaMA-Factory ds_z2_offload_config", trainer={"precision": "bf16"}),
    "llama_factory_ds_z3_offload.json": Case("LLaMA-Factory ds_z3_offload_config", trainer={"precision": "bf16"}),
    "fastchat_zero2_offload.json": Case("FastChat playground deepspeed_config_s2", trainer={"precision": "fp16"}),
    "llava_zero3_offload.json": Case("LLaVA scripts/zero3_offload (DeepSpeed's own field name "
                                     "gather_16bit_weights_on_model_save)", trainer={"precision": "bf16"}),
    "alpaca_offload_opt_param.json": Case("Stanford Alpaca configs/default_offload_opt_param",
                                          trainer={"precision": "bf16"}),
    # Redundant, contradictory and mistaken keys, as copied configs carry them.
    "redundant_adamw_torch_adam.json": Case("AdamW with torch_adam and adam_w_mode true: redundant, accepted"),
    "contradictory_adamw_mode_false.json": Case("AdamW with adam_w_mode false: DeepSpeed runs AdamW (the type "
                                                "decides), and so does zerod, saying so"),
    "adam_l2_torch_adam.json": Case("Adam with adam_w_mode false and torch_adam: torch's Adam, L2 weight decay"),
    "torch_adamw_default_weight_decay.json": Case("AdamW with torch_adam and no weight_decay: DeepSpeed's "
                                                  "torch.optim.AdamW decays by its default, 0.01"),
    "warmuplr_leftover_total_steps.json": Case("WarmupLR with total_num_steps left over from WarmupDecayLR",
                                               "refuse", key="scheduler.params.total_num_steps"),
    "typo_gradient_clipping.json": Case("a misspelt gradient_clipping", "deliberate", key="gradient_cliping",
                                        why="unknown_key"),
    "sgd_lowercase_type.json": Case("\"type\": \"sgd\" (DeepSpeed takes torch.optim's name, SGD)", "refuse",
                                    key="optimizer.type"),
}

# DeepSpeed's batch-size rule for several ranks: (world, train_batch_size,
# micro-batch, accumulation), None where the config leaves it out.
BATCH_RULES = [(8, 64, 4, None), (8, 64, 4, 2), (8, 64, 4, 4), (3, 64, 4, None), (2, 32, None, 4),
               (4, None, 8, 2), (2, 16, None, None), (3, 16, None, None), (2, None, None, 4), (1, 12, 5, None)]


def has_auto(v):
    if isinstance(v, dict):
        return any(has_auto(x) for x in v.values())
    return v == "auto"


def hf_resolve(cfg, t, world=1):
    """transformers' HfTrainerDeepSpeedConfig.trainer_config_process and
    trainer_config_finalize (integrations/deepspeed.py), written down: each
    "auto" becomes the trainer's value; a value given that contradicts the
    trainer is an error (fill_match). Accelerate fills the same keys the same
    way. Returns a new dict."""
    cfg = copy.deepcopy(cfg)
    mismatches = []

    def fill(path, value, must_match=True):
        *parents, key = path.split(".")
        node = cfg
        for p in parents:
            node = node.get(p)
            if not isinstance(node, dict):
                return
        if node.get(key) == "auto":
            node[key] = value
        elif must_match and node.get(key) is not None and node[key] != value:
            mismatches.append(f"{path}={node[key]} vs the trainer's {value}")

    mbs, gas = t["per_device_train_batch_size"], t["gradient_accumulation_steps"]
    fill("train_micro_batch_size_per_gpu", mbs)
    fill("gradient_accumulation_steps", gas)
    fill("train_batch_size", world * mbs * gas)
    fill("gradient_clipping", t["max_grad_norm"])
    fill("optimizer.params.lr", t["learning_rate"])
    fill("optimizer.params.betas", [t["adam_beta1"], t["adam_beta2"]])
    fill("optimizer.params.eps", t["adam_epsilon"])
    fill("optimizer.params.weight_decay", t["weight_decay"])
    fill("scheduler.params.warmup_min_lr", 0, must_match=False)
    fill("scheduler.params.warmup_max_lr", t["learning_rate"])
    fill("fp16.enabled", t["precision"] == "fp16")
    fill("bf16.enabled", t["precision"] == "bf16")
    h = t["hidden_size"]
    fill("zero_optimization.reduce_bucket_size", h * h, must_match=False)
    if (cfg.get("zero_optimization") or {}).get("stage") == 3:
        fill("zero_optimization.stage3_prefetch_bucket_size", int(0.9 * h * h), must_match=False)
        fill("zero_optimization.stage3_param_persistence_threshold", 10 * h, must_match=False)
    fill("scheduler.params.total_num_steps", t["num_training_steps"])
    fill("scheduler.params.warmup_num_steps", t["warmup_steps"])
    if mismatches:
        raise ValueError("the config contradicts the trainer (Hugging Face refuses it): " + "; ".join(mismatches))
    return cfg


def trainer_optimizer(t):
    """The trainer's own optimizer for a config without one (the Trainer's
    AdamW, one parameter group): its hyperparameters, and the config section
    zerod.deepspeed writes for it (zerod/_dsconfig.optimizer_section)."""
    spec = {"lr": t["learning_rate"], "betas": [t["adam_beta1"], t["adam_beta2"]], "eps": t["adam_epsilon"],
            "weight_decay": t["weight_decay"]}
    opt = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters(), lr=spec["lr"], betas=tuple(spec["betas"]),
                            eps=spec["eps"], weight_decay=spec["weight_decay"])
    return spec, _dsconfig.optimizer_section(opt)


def with_nvme_dir(cfg, nvme):
    """The machine's NVMe folder for the configs' "/local_nvme"."""
    z = cfg.get("zero_optimization") or {}
    for k in ("offload_optimizer", "offload_param"):
        if isinstance(z.get(k), dict) and z[k].get("nvme_path"):
            z[k]["nvme_path"] = nvme
    return cfg


def zerod_check(path, world=1, lr_steps=LR_STEPS):
    """`zerod check`: its verdict, its resolved settings and its lr per step."""
    r = subprocess.run([ZEROD, "check", path, "--world-size", str(world), "--lr-steps", str(lr_steps)],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        assert r.returncode == 1 and r.stderr, f"zerod check {path}: exit {r.returncode}\n{r.stdout}{r.stderr}"
        return {"verdict": "refuse", "error": r.stderr}
    settings, lrs, part = {}, [], None
    for line in r.stdout.splitlines():
        if line in ("resolved settings:", "plugins:") or line.startswith("learning rate"):
            part = line.split()[0]
            continue
        if part == "resolved" and " = " in line:
            text, _ = line.rsplit("  (", 1)
            key, value = text.split(" = ", 1)
            settings[key.strip()] = value.strip()
        elif part == "learning" and line.strip():
            lrs.append(float(line.split(": ")[1]))
    return {"verdict": "accept", "settings": settings, "lr": lrs}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every case through DeepSpeed (one process) and zerod check."""
    d = tmp_path_factory.mktemp("configs")
    nvme = d / "nvme"
    nvme.mkdir()
    work = {"cases": {}, "batch_rules": {}}
    ours = {}
    for name, case in CASES.items():
        raw = json.load(open(os.path.join(CORPUS, name)))
        cfg = with_nvme_dir(hf_resolve(raw, case.trainer) if has_auto(raw) else copy.deepcopy(raw), str(nvme))
        spec, zcfg = None, copy.deepcopy(cfg)
        if "optimizer" not in cfg:
            spec, zcfg["optimizer"] = trainer_optimizer(case.trainer)
        work["cases"][name] = {"config": cfg, "client_optimizer": spec, "lr_steps": LR_STEPS}
        path = d / name
        path.write_text(json.dumps(zcfg, indent=2))
        ours[name] = dict(zerod_check(str(path)), config=zcfg)
    for i, (world, tbs, mbs, gas) in enumerate(BATCH_RULES):
        cfg = {k: v for k, v in (("train_batch_size", tbs), ("train_micro_batch_size_per_gpu", mbs),
                                 ("gradient_accumulation_steps", gas)) if v is not None}
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-3}}
        work["batch_rules"][str(i)] = {"config": cfg, "world": world}
    (d / "in.json").write_text(json.dumps(work))
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    with reserved_port() as port:
        r = subprocess.run([sys.executable, os.path.join(HERE, "deepspeed_report.py"), str(d / "in.json"),
                            str(d / "out.json"), str(port)], env=env, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    theirs = json.loads((d / "out.json").read_text())
    return {"ds": theirs["cases"], "zerod": ours, "batch": theirs["batch_rules"], "dir": d}


def test_the_corpus_is_whole():
    files = sorted(f for f in os.listdir(CORPUS) if f.endswith(".json"))
    assert len(files) >= 30, f"{len(files)} configs: the corpus should hold at least 30"
    assert files == sorted(CASES), "every config in deepspeed_configs/ has its case here, and no case is missing: " \
        f"{sorted(set(files) ^ set(CASES))}"
    for name, case in CASES.items():
        assert case.source and case.verdict in ("agree", "refuse", "deliberate", "beyond"), name
        assert case.verdict == "agree" or case.key or case.verdict == "beyond", name
        assert (case.why in DELIBERATE) == (case.verdict == "deliberate"), name
        assert (case.why in BEYOND) == (case.verdict == "beyond"), name


def test_every_difference_is_documented():
    text = open(DOCS).read()
    for why, reason in {**DELIBERATE, **BEYOND}.items():
        assert reason in text, f"docs/integrations.md does not give the reason for '{why}': {reason}"
    used = {c.why for c in CASES.values() if c.why}
    assert used == set(DELIBERATE) | set(BEYOND), "a listed difference no config in the corpus shows, or the reverse"


def test_the_keys_whose_auto_is_unresolved_are_the_translated_ones():
    """zerod/_dsconfig.resolve refuses an "auto" left in a key the
    translation reads: its list is the translated table of
    docs/integrations.md (docs.deepspeed_keys holds that table to
    scripting/ds_keys.cpp)."""
    text = open(DOCS).read()
    table = text[text.index("| DeepSpeed key | zerod |"):text.index("| accepted and ignored | why |")]
    translated = set(re.findall(r"^\| `([^`]+)` \|", table, re.M))
    assert len(translated) > 50, translated
    assert _dsconfig._TRANSLATED_KEYS == translated, \
        f"only in _dsconfig: {sorted(_dsconfig._TRANSLATED_KEYS - translated)}, only in the docs' table: " \
        f"{sorted(translated - _dsconfig._TRANSLATED_KEYS)}"


def _deepspeed_accepts(ds, case, name):
    if ds["verdict"] == "accept-config":
        assert case.cpu, f"{name}: DeepSpeed could not build the engine on the CPU, which the case does not " \
                         f"expect: {ds['error']}"
        return True
    assert not case.cpu, f"{name}: the case says DeepSpeed cannot build {case.cpu} on the CPU, but it did"
    return ds["verdict"] == "accept"


@pytest.mark.parametrize("name", sorted(CASES))
def test_deepspeed_and_zerod_agree(name, results):
    case, ds, zd = CASES[name], results["ds"][name], results["zerod"][name]
    ds_ok, zd_ok = _deepspeed_accepts(ds, case, name), zd["verdict"] == "accept"
    said = f"\nDeepSpeed: {ds.get('error', 'accepts')}\nzerod: {zd.get('error', 'accepts')}"
    if case.verdict == "agree":
        assert ds_ok and zd_ok, f"{name}: both should accept it{said}"
        mismatches = compare(ds["hp"], zd)
        assert not mismatches, f"{name}: the job zerod runs differs from DeepSpeed's engine:\n  " + \
            "\n  ".join(mismatches)
    elif case.verdict == "refuse":
        assert not ds_ok and not zd_ok, f"{name}: both should refuse it{said}"
        assert re.search(r":\d+: " + re.escape(case.key) + r"\b", zd["error"]), \
            f"{name}: zerod's refusal should name {case.key} with its line{said}"
    elif case.verdict == "deliberate":
        assert ds_ok and not zd_ok, f"{name}: DeepSpeed accepts it and zerod refuses it on purpose{said}"
        assert re.search(r":\d+: " + re.escape(case.key) + r"\b", zd["error"]), \
            f"{name}: zerod's refusal should name {case.key}{said}"
    else:  # beyond
        assert not ds_ok and zd_ok, f"{name}: DeepSpeed 0.19 refuses it and zerod runs it{said}"


def _num(text):
    return float(text)


def _list(text):
    return [float(x) for x in text.strip("{}").split(",")]


def _close(a, b):
    return a == b or (a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15))


def compare(ds, zd):
    """Every mismatch between what DeepSpeed's engine holds and zerod's job."""
    s, out = zd["settings"], []

    def want(what, ours, theirs, same=None):
        if not (same or (lambda a, b: a == b))(ours, theirs):
            out.append(f"{what}: zerod {ours!r}, DeepSpeed {theirs!r}")

    want("ZeRO stage", int(s["zero.stage"]), ds["stage"])
    want("gradient_accumulation_steps", int(s["gradient_accumulation_steps"]), ds["gradient_accumulation_steps"])
    want("gradient_clipping", _num(s["gradient_clipping"]), float(ds["gradient_clipping"]), _close)
    want("precision", s["precision"].strip('"'), ds["precision"])
    # The batch sizes zerod.deepspeed's engine reports (it applies the rule in
    # Python; zerod's job holds the accumulation, checked above).
    b = copy.deepcopy(zd["config"])
    _dsconfig._batch_rule(b, 1)
    want("train_batch_size", b["train_batch_size"], ds["train_batch_size"])
    want("train_micro_batch_size_per_gpu", b["train_micro_batch_size_per_gpu"], ds["micro_batch"])
    # The optimizer.
    o = ds["optimizer"]
    want("optimizer type", s["optimizer.type"].strip('"'), o["type"])
    if o["type"] == "sgd":
        for k in ("momentum", "dampening", "weight_decay"):
            want(f"optimizer.{k}", _num(s[f"optimizer.{k}"]), o[k], _close)
        want("optimizer.nesterov", s["optimizer.nesterov"] == "true", o["nesterov"])
    elif o["type"] in ("adam", "adamw"):
        want("optimizer.betas", _list(s["optimizer.betas"]), o["betas"],
             lambda a, b: len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b)))
        want("optimizer.eps", _num(s["optimizer.eps"]), o["eps"], _close)
        want("optimizer.weight_decay", _num(s["optimizer.weight_decay"]), o["weight_decay"], _close)
        want("optimizer.bias_correction", s["optimizer.bias_correction"] == "true", bool(o["bias_correction"]))
    # The lr of every update.
    want("lr of updates 0..", zd["lr"], ds["lr"],
         lambda a, b: len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b)))
    # Where the state lives.
    tier = {'"device"': "none", '"host"': "cpu", '"nvme"': "nvme"}
    off = ds["offload"]
    # (zerod check prints the offload keys only for a job with an offload table.)
    want("offload.optimizer", tier[s.get("offload.optimizer", '"device"')], off["optimizer"])
    want("offload.params", tier[s.get("offload.params", '"device"')], off["params"])
    if off["optimizer"] != "none":
        want("offload.ratio", _num(s["offload.ratio"]), off["ratio"], _close)
    if "cpu" in (off["optimizer"], off["params"]):
        want("offload.host.pin", s["offload.host.pin"] == "true", off["pin"])
    # The partitioner's sizes, where the config gives them.
    cfg_zero = zd["config"].get("zero_optimization") or {}
    given = lambda *keys: any(isinstance(cfg_zero.get(k), (int, float)) for k in keys)  # noqa: E731
    if ds["stage"] >= 2 and given("reduce_bucket_size"):
        want("zero.reduce_bucket_size", _num(s["zero.reduce_bucket_size"]), ds["reduce_bucket_size"], _close)
    for key, ds_key in (("prefetch_bucket_size", "stage3_prefetch_bucket_size"),
                        ("param_persistence_threshold", "stage3_param_persistence_threshold"),
                        ("max_live_parameters", "stage3_max_live_parameters")):
        if ds["stage"] == 3 and given(key, ds_key):
            want(f"zero.{key}", _num(s[f"zero.{key}"]), ds["zero3"][key], _close)
    # fp16's loss scaler.
    if ds["precision"] == "fp16":
        ls = ds["loss_scale"]
        dynamic = _num(s["fp16.loss_scale"]) == 0
        want("dynamic loss scaling", dynamic, ls["dynamic"])
        if dynamic:
            want("initial loss scale", 2.0 ** int(s["fp16.initial_scale_power"]), float(ls["scale"]))
            want("fp16.loss_scale_window", int(s["fp16.loss_scale_window"]), ls["window"])
            want("fp16.min_loss_scale", _num(s["fp16.min_loss_scale"]), float(ls["min"]))
            want("overflows that halve the scale (hysteresis)", int(s["fp16.hysteresis"]), ls["overflows_to_halve"])
            want("fp16.consecutive_hysteresis", s["fp16.consecutive_hysteresis"] == "true",
                 bool(ls["consecutive_hysteresis"]))
            want("fp16.raise_error_at_min_scale", s["fp16.raise_error_at_min_scale"] == "true",
                 bool(ls["raises_at_min"]))
        else:
            want("static loss scale", _num(s["fp16.loss_scale"]), float(ls["scale"]))
    return out


AUTO_CASES = sorted(n for n in CASES if has_auto(json.load(open(os.path.join(CORPUS, n)))))


@pytest.mark.parametrize("name", AUTO_CASES)
def test_auto_is_resolved_as_hugging_face_resolves_it(name):
    """zerod's own resolution (zerod/_dsconfig.resolve: zerod.deepspeed,
    the Lightning and Accelerate integrations) fills every "auto" that
    Hugging Face fills, with the same value."""
    t = CASES[name].trainer
    raw = json.load(open(os.path.join(CORPUS, name)))
    theirs = hf_resolve(raw, t)
    precision = {"fp16": "16-mixed", "bf16": "bf16-mixed", None: "32-true"}[t["precision"]]
    ours = _dsconfig.resolve(
        copy.deepcopy(raw), world_size=1, model=types.SimpleNamespace(config=types.SimpleNamespace(
            hidden_size=t["hidden_size"])), micro_batch=t["per_device_train_batch_size"],
        grad_accum=t["gradient_accumulation_steps"], grad_clip=t["max_grad_norm"], lr=t["learning_rate"],
        betas=(t["adam_beta1"], t["adam_beta2"]), eps=t["adam_epsilon"], weight_decay=t["weight_decay"],
        total_steps=t["num_training_steps"], warmup_steps=t["warmup_steps"], precision=precision)

    def autos(v, path=""):
        if isinstance(v, dict):
            for k, x in v.items():
                yield from autos(x, f"{path}.{k}" if path else k)
        elif v == "auto":
            yield path

    def at(cfg, path):
        for p in path.split("."):
            cfg = cfg[p]
        return cfg

    filled = [p for p in autos(raw) if at(theirs, p) != "auto"]
    assert filled, f"{name}: Hugging Face fills none of its \"auto\" values"
    wrong = [f"{p}: zerod {at(ours, p)!r}, Hugging Face {at(theirs, p)!r}" for p in filled
             if at(ours, p) != at(theirs, p)]
    assert not wrong, f"{name}: " + "; ".join(wrong)


@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c.verdict in ("agree", "beyond")))
def test_zerod_check_takes_the_config_as_written(name):
    """A user runs `zerod check` on the config file itself, "auto" values
    and all (the trainer integration fills them in later): accepted."""
    r = zerod_check(os.path.join(CORPUS, name), lr_steps=2)
    assert r["verdict"] == "accept", f"{name}: {r.get('error')}"


@pytest.mark.parametrize("i", range(len(BATCH_RULES)))
def test_batch_rule_for_several_ranks(i, results, tmp_path):
    world, tbs, mbs, gas = BATCH_RULES[i]
    ds = results["batch"][str(i)]
    cfg = {k: v for k, v in (("train_batch_size", tbs), ("train_micro_batch_size_per_gpu", mbs),
                             ("gradient_accumulation_steps", gas)) if v is not None}
    cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-3}}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    zd = zerod_check(str(tmp_path / "c.json"), world=world, lr_steps=0)
    assert zd["verdict"] == ds["verdict"], f"{cfg} at {world} ranks: zerod {zd.get('error', 'accepts')}, " \
                                           f"DeepSpeed {ds.get('error', 'accepts')}"
    if ds["verdict"] == "accept":
        assert int(zd["settings"]["gradient_accumulation_steps"]) == ds["gas"], (cfg, world, ds)
    else:
        assert "train_batch_size" in zd["error"], zd["error"]


@pytest.mark.parametrize("given", [{"train_micro_batch_size_per_gpu": 4},
                                   {"train_batch_size": 8},
                                   {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4}])
@pytest.mark.parametrize("gas", [0, -2, 1.5, True])
def test_accumulation_steps_below_one_or_not_whole_are_refused(given, gas, tmp_path):
    """gradient_accumulation_steps 0 is refused, as DeepSpeed asserts and
    `zerod check` says, not run as 1 (what "not given" means); so are a
    negative, a fraction and a boolean (DeepSpeed takes True as 1 and runs
    1.5 into a train_batch_size of 6.0; zerod check refuses both)."""
    import zerod.deepspeed
    from deepspeed.runtime.config import DeepSpeedConfig
    from zerod.errors import InvalidArgumentError

    cfg = dict(given, gradient_accumulation_steps=gas, optimizer={"type": "AdamW", "params": {"lr": 1e-3}})
    if gas == 0 and "train_batch_size" not in given:
        with pytest.raises(AssertionError, match="has to be greater than 0"):
            DeepSpeedConfig(cfg)
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    zd = zerod_check(str(tmp_path / "c.json"), lr_steps=0)
    assert zd["verdict"] == "refuse" and "gradient_accumulation_steps" in zd["error"], zd
    with pytest.raises(InvalidArgumentError, match=r"gradient_accumulation_steps must be a whole number >= 1, got "
                                                   + re.escape(repr(gas))):
        zerod.deepspeed.initialize(model=torch.nn.Linear(4, 2), config=copy.deepcopy(cfg))


@pytest.mark.parametrize("scheduler", [False, True])
def test_a_config_files_errors_name_its_lines(scheduler, tmp_path):
    """zerod.deepspeed translates the config it resolved (sorted, "auto"
    filled in), which the user never sees: each problem is placed at the
    line of the user's file where the key is, as `zerod check` places it;
    a dict's by its key alone. With a torch scheduler the config is inside
    a Lua job, whose own line is not the user's either."""
    import zerod.deepspeed
    from zerod.errors import ConfigError

    path = tmp_path / "my.json"
    path.write_text('{\n  "train_batch_size": 4,\n\n  "gradient_cliping": 1.0,\n'
                    '  "zero_optimization": {"stage": 1, "bogus": 2}\n}\n')
    wrong = [f"{path}:4: gradient_cliping: is not a DeepSpeed key zerod knows",
             f"{path}:5: zero_optimization.bogus: is not a DeepSpeed key zerod knows"]
    check = zerod_check(str(path), lr_steps=0)
    assert all(w in check["error"] for w in wrong), check["error"]

    def refusal(config):
        model = torch.nn.Linear(4, 2)
        kw = {}
        if scheduler:
            kw["optimizer"] = opt = torch.optim.SGD(model.parameters(), lr=0.1)
            kw["lr_scheduler"] = torch.optim.lr_scheduler.StepLR(opt, 2)
        with pytest.raises(ConfigError) as e:
            zerod.deepspeed.initialize(model=model, config=config, lr_steps=4, **kw)
        return e.value.message
    said = refusal(str(path))
    assert all(w in said for w in wrong) and ".lua:" not in said, said
    said = refusal(json.loads(path.read_text()))
    assert "the DeepSpeed config: gradient_cliping: is not" in said and \
        "the DeepSpeed config: zero_optimization.bogus: is not" in said and not re.search(r":\d+: ", said), said


def test_contradictory_adam_w_mode_is_said():
    """AdamW with adam_w_mode false: DeepSpeed's engine runs AdamW (the
    type decides, _configure_basic_optimizer); zerod does the same (the
    agreement test holds it to DeepSpeed's optimizer) and says so in the job."""
    r = subprocess.run([ZEROD, "translate", os.path.join(CORPUS, "contradictory_adamw_mode_false.json")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "optimizer.params.adam_w_mode: false is ignored with type AdamW, as DeepSpeed ignores it" in r.stdout
    assert 'type = "adamw"' in r.stdout



# OneCycle's staircase (cycle_first/second_stair_count > 0; 0 is the ramp):
# even and uneven halves, the second count left to default to the first's,
# one half stepped and the other not, and a decay after the cycle.
ONE_CYCLES = [
    {"cycle_first_step_size": 4, "cycle_first_stair_count": 2},
    {"cycle_first_step_size": 3, "cycle_second_step_size": 7, "cycle_first_stair_count": 3,
     "cycle_second_stair_count": 5},
    {"cycle_first_step_size": 10, "cycle_second_step_size": 6, "cycle_first_stair_count": 0,
     "cycle_second_stair_count": 4, "decay_lr_rate": 0.5, "decay_step_size": 3},
    {"cycle_first_step_size": 7, "cycle_second_step_size": 5, "cycle_first_stair_count": 7},
    {"cycle_first_step_size": 6, "cycle_first_stair_count": 0, "decay_lr_rate": 0.1, "decay_step_size": 4},
]


@pytest.mark.parametrize("i", range(len(ONE_CYCLES)))
def test_one_cycle_stairs_are_deepspeeds(i, tmp_path):
    """The lr of every update under DeepSpeed's own OneCycle class, under
    the job `zerod check` runs, and from get_lr()'s twin (_dsconfig), equal
    to the bit: a stair is a floor()."""
    from deepspeed.runtime.lr_schedules import OneCycle
    params = dict(ONE_CYCLES[i], cycle_min_lr=1e-3, cycle_max_lr=1e-2, cycle_momentum=False)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.5)
    sched = OneCycle(opt, **params)
    theirs = [opt.param_groups[0]["lr"]]
    for _ in range(LR_STEPS - 1):
        sched.step()  # DeepSpeed's engine steps it after every update
        theirs.append(opt.param_groups[0]["lr"])
    cfg = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "SGD", "params": {"lr": 0.5}},
           "scheduler": {"type": "OneCycle", "params": params}}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    zd = zerod_check(str(tmp_path / "c.json"))
    assert zd["verdict"] == "accept", zd["error"]
    assert zd["lr"] == theirs, f"zerod's job:\n{zd['lr']}\nDeepSpeed's OneCycle:\n{theirs}"
    twin = _dsconfig.lr_schedule(cfg)
    assert [twin(t) for t in range(LR_STEPS)] == theirs


@pytest.mark.parametrize("warmup,total", [(1, 2), (5, 3), (4, 10)])
def test_warmup_decay_with_a_short_total_is_deepspeeds(warmup, total, tmp_path):
    """WarmupDecayLR with total_num_steps at or below the warm-up (which
    DeepSpeed raises to at least 2): DeepSpeed warns and holds the minimum
    after the warm-up; zerod refused the config. Every update's lr equal to
    the bit, through `zerod check` and get_lr()'s twin."""
    from deepspeed.runtime.lr_schedules import WarmupDecayLR
    params = {"warmup_min_lr": 1e-4, "warmup_max_lr": 1e-2, "warmup_num_steps": warmup,
              "total_num_steps": total, "warmup_type": "linear"}
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.5)
    sched = WarmupDecayLR(opt, **params)
    theirs = [opt.param_groups[0]["lr"]]
    for _ in range(11):
        sched.step()
        theirs.append(opt.param_groups[0]["lr"])
    cfg = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "SGD", "params": {"lr": 0.5}},
           "scheduler": {"type": "WarmupDecayLR", "params": params}}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    zd = zerod_check(str(tmp_path / "c.json"), lr_steps=12)
    assert zd["verdict"] == "accept", zd["error"]
    assert zd["lr"] == theirs, f"zerod's job:\n{zd['lr']}\nDeepSpeed's WarmupDecayLR:\n{theirs}"
    twin = _dsconfig.lr_schedule(cfg)
    assert [twin(t) for t in range(12)] == theirs


@pytest.mark.parametrize("kind", ["SGD", "Adam", "AdamW"])
def test_an_optimizer_without_lr_runs_at_deepspeeds_default(kind, tmp_path):
    """DeepSpeed hands the section's params to the optimizer it builds
    (torch.optim.SGD; FusedAdam or DeepSpeedCPUAdam): without an lr, theirs.
    zerod's job runs it and get_lr()'s twin reports it."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam
    classes = [torch.optim.SGD] if kind == "SGD" else [FusedAdam, DeepSpeedCPUAdam]
    want = {inspect.signature(c).parameters["lr"].default for c in classes}
    assert len(want) == 1, want
    want = want.pop()
    params = {"momentum": 0.9} if kind == "SGD" else {"weight_decay": 0.01}
    cfg = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": kind, "params": params}}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    zd = zerod_check(str(tmp_path / "c.json"), lr_steps=3)
    assert zd["verdict"] == "accept", zd["error"]
    assert _num(zd["settings"]["optimizer.lr"]) == want and zd["lr"] == [want] * 3
    assert _dsconfig.lr_schedule(cfg)(5) == want

def test_summary(results):
    """The counts docs/integrations.md gives (printed with pytest -s)."""
    ds_ok = sum(_deepspeed_accepts(results["ds"][n], CASES[n], n) for n in CASES)
    zd_ok = sum(results["zerod"][n]["verdict"] == "accept" for n in CASES)
    by = {v: sorted(n for n, c in CASES.items() if c.verdict == v) for v in ("agree", "refuse", "deliberate", "beyond")}
    print(f"\n{len(CASES)} configs: DeepSpeed 0.19 accepts {ds_ok} and refuses {len(CASES) - ds_ok}; "
          f"zerod accepts {zd_ok} and refuses {len(CASES) - zd_ok}")
    for v, names in by.items():
        print(f"  {v}: {len(names)}: {', '.join(names)}")
    assert ds_ok == len(by["agree"]) + len(by["deliberate"])
    assert zd_ok == len(by["agree"]) + len(by["beyond"])


def test_parameter_names_in_groups_are_bookkeeping():
    """torch >= 2.6 puts the parameters' names into each group of an
    optimizer made from model.named_parameters() (param_names), different
    in every group by nature, and DeepSpeed takes such an optimizer: zerod
    takes it as the same optimizer made from model.parameters(), one group or
    several alike, and model_parameters groups that carry names too."""
    import zerod.deepspeed as zds

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))

    def named_groups(m):
        named = list(m.named_parameters())
        return [{"params": [p for n, p in named if n.endswith(end)], "param_names": [n for n, _ in named
                                                                                     if n.endswith(end)]}
                for end in ("weight", "bias")]

    plain = _dsconfig.optimizer_section(torch.optim.AdamW(model().parameters(), lr=1e-2))
    named = torch.optim.AdamW(model().named_parameters(), lr=1e-2)
    if "param_names" not in named.param_groups[0]:
        pytest.skip(f"torch {torch.__version__} keeps no param_names in its groups")
    assert _dsconfig.optimizer_section(named) == plain
    assert _dsconfig.optimizer_section(torch.optim.AdamW(named_groups(model()), lr=1e-2)) == plain
    m = model()
    engine = zds.initialize(model=m, optimizer=torch.optim.AdamW(named_groups(m), lr=1e-2),
                            config={"train_batch_size": 2})[0]
    try:
        assert engine.config["optimizer"] == plain
    finally:
        engine.close()
    cfg = {"train_batch_size": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}}}
    m = model()
    engine = zds.initialize(model=m, model_parameters=named_groups(m), config=cfg)[0]
    engine.close()
