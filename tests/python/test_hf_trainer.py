"""zerod.transformers.ZerodTrainer against Hugging Face's Trainer with real
DeepSpeed 0.19 (both from PyPI), on the CPU: the user's script, written once,
runs under transformers.Trainer and under ZerodTrainer -- the class the only
change -- with TrainingArguments(deepspeed=<the same config file>), on a
small GPT-2 and a small Llama built from their configs (no download).

Each run trains 12 updates of 2 micro-batches (gradient accumulation) and
saves a checkpoint every 6 (save_steps): ZeRO stage 2 with the optimizer on
the host and stage 3 with optimizer and parameters there, fp32 and bf16, the
config's optimizer and scheduler ("auto" filled by the Trainer), the
Trainer's own optimizer and scheduler, and each with the other's. The loss,
learning rate and gradient norm the Trainer logs after every update, the
loss of evaluate() and the weights of the last checkpoint match DeepSpeed's
(losses: fp32 within 1e-4 relative, bf16 within 2e-2,
python.deepspeed_side_by_side's tolerances), and resume_from_checkpoint at
update 6 goes on bit for bit. The measured differences are printed
(pytest -s) for docs/integrations.md.

DeepSpeed runs every reference in one subprocess (its process group and
import paid once); zerod runs them here.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing is downloaded: models are built from their configs

from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,  # noqa: E402
                          TrainerCallback, TrainingArguments)

from conftest import reserved_port  # noqa: E402
from models import CHARS, TOKENS  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BLOCK = 32
N_SAMPLES = 96         # 24 micro-batches of 4: one epoch, a multiple of the accumulation
UPDATES, SAVE_AT = 12, 6

# As Hugging Face's DeepSpeed docs write them: every value the Trainer knows
# is "auto", and the same file serves fp32 (bf16=False) and bf16 (bf16=True).
ZERO2_OFFLOAD = {
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                  "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "allgather_partitions": True, "allgather_bucket_size": 2e8, "overlap_comm": True,
                          "reduce_scatter": True, "reduce_bucket_size": "auto", "contiguous_gradients": True},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": False,
}
ZERO3_OFFLOAD = {
    "fp16": ZERO2_OFFLOAD["fp16"],
    "bf16": {"enabled": "auto"},
    "optimizer": ZERO2_OFFLOAD["optimizer"],
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                       "warmup_num_steps": "auto", "total_num_steps": "auto"}},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "offload_param": {"device": "cpu", "pin_memory": True}, "overlap_comm": True,
                          "contiguous_gradients": True, "sub_group_size": 1e9, "reduce_bucket_size": "auto",
                          "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
                          "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
                          "stage3_gather_16bit_weights_on_model_save": True},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": False,
}
# Neither optimizer nor scheduler: the Trainer's own (torch AdamW, its
# lr_scheduler_type with warm-up), handed to the engine.
ZERO2_OFFLOAD_TRAINER_OPTIMIZER = {k: v for k, v in ZERO2_OFFLOAD.items() if k not in ("optimizer", "scheduler")}
# The config's optimizer, the Trainer's scheduler (DeepSpeed builds it on
# the optimizer it made from the config).
ZERO3_OFFLOAD_TRAINER_SCHEDULER = {k: v for k, v in ZERO3_OFFLOAD.items() if k != "scheduler"}
# The Trainer's optimizer, the config's scheduler.
ZERO3_OFFLOAD_TRAINER_OPTIMIZER = {k: v for k, v in ZERO3_OFFLOAD.items() if k != "optimizer"}

# name: (config, model, bf16, TrainingArguments beyond the common ones)
RUNS = {
    "zero2_offload_gpt2": (ZERO2_OFFLOAD, "gpt2", False, {}),
    "zero3_offload_llama": (ZERO3_OFFLOAD, "llama", False, {}),
    "zero2_offload_llama_bf16": (ZERO2_OFFLOAD, "llama", True, {}),
    "zero3_offload_gpt2_bf16": (ZERO3_OFFLOAD, "gpt2", True, {}),
    "zero2_offload_trainer_optimizer_gpt2": (ZERO2_OFFLOAD_TRAINER_OPTIMIZER, "gpt2", False,
                                             {"lr_scheduler_type": "cosine", "weight_decay": 0.0}),
    "zero3_offload_trainer_optimizer_gpt2": (ZERO3_OFFLOAD_TRAINER_OPTIMIZER, "gpt2", False, {"weight_decay": 0.0}),
    "zero3_offload_trainer_scheduler_llama": (ZERO3_OFFLOAD_TRAINER_SCHEDULER, "llama", False,
                                              {"lr_scheduler_type": "cosine_with_min_lr",
                                               "lr_scheduler_kwargs": {"min_lr": 1e-3}}),
}

DEEPSPEED = r'''
import json, os, sys
for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": sys.argv[2], "RANK": "0", "WORLD_SIZE": "1",
             "LOCAL_RANK": "0"}.items():
    os.environ.setdefault(k, v)
sys.path.insert(0, os.path.dirname(sys.argv[0]))
from transformers import Trainer
from test_hf_trainer import RUNS, train
out = {name: train(name, os.path.join(sys.argv[3], name), Trainer) for name in RUNS}
json.dump(out, open(sys.argv[1], "w"))
'''


def make_model(kind):
    torch.manual_seed(0)
    if kind == "gpt2":
        return GPT2LMHeadModel(GPT2Config(vocab_size=len(CHARS), n_positions=BLOCK, n_embd=32, n_layer=2, n_head=2,
                                          bos_token_id=0, eos_token_id=0))
    return LlamaForCausalLM(LlamaConfig(vocab_size=len(CHARS), hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                        max_position_embeddings=BLOCK, bos_token_id=0, eos_token_id=0,
                                        pad_token_id=0))


class Windows(torch.utils.data.Dataset):
    """Windows of the Zen of Python, as token ids: a causal LM learns them."""

    def __init__(self, n=N_SAMPLES, stride=37):
        self.n, self.stride = n, stride

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        start = (i * self.stride) % (len(TOKENS) - BLOCK)
        ids = TOKENS[start:start + BLOCK]
        return {"input_ids": ids, "labels": ids}


class Logs(TrainerCallback):
    """What the Trainer logs after every update."""

    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.logs.append({"step": state.global_step, "loss": logs["loss"], "lr": logs["learning_rate"],
                              "grad_norm": logs["grad_norm"]})


def _reset():
    """Accelerate's state is a process-wide singleton, the Trainer's
    DeepSpeed config is kept in a module global, and Accelerate's DeepSpeed
    plugin leaves ACCELERATE_USE_DEEPSPEED and its settings in the
    environment (where the next TrainingArguments would find a DeepSpeed
    plugin): each run starts from none."""
    from accelerate.state import AcceleratorState
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    AcceleratorState._reset_state(True)
    unset_hf_deepspeed_config()
    for key in [k for k in os.environ if k.startswith(("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_DEEPSPEED_"))]:
        del os.environ[key]


def train(name, out_dir, trainer_class, resume=None, **trainer_kwargs):
    """The user's script: run `name` of RUNS under `trainer_class` into
    out_dir (resuming from a checkpoint of it), returning what was logged."""
    config, kind, bf16, extra = RUNS[name]
    extra = dict(extra)
    weight_decay = extra.pop("weight_decay", 0.01)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "ds_config.json")
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
    _reset()
    args = TrainingArguments(output_dir=out_dir, deepspeed=path, use_cpu=True, bf16=bf16, seed=0,
                             per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=UPDATES,
                             learning_rate=1e-2, warmup_steps=3, weight_decay=weight_decay, adam_beta2=0.99,
                             max_grad_norm=1.0, logging_steps=1, save_strategy="steps", save_steps=SAVE_AT,
                             per_device_eval_batch_size=8, report_to="none", disable_tqdm=True, **extra)
    logs = Logs()
    trainer = trainer_class(model=make_model(kind), args=args, train_dataset=Windows(),
                            eval_dataset=Windows(16, stride=11), callbacks=[logs], **trainer_kwargs)
    trainer.train(resume_from_checkpoint=resume)
    return {"logs": logs.logs, "global_step": trainer.state.global_step,
            "eval_loss": trainer.evaluate()["eval_loss"]}


@pytest.fixture(scope="module")
def deepspeed_runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("deepspeed")
    script = d / "run_ds.py"
    script.write_text(DEEPSPEED)
    env = dict(os.environ, DS_ACCELERATOR="cpu", PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with reserved_port() as port:
        r = subprocess.run([sys.executable, str(script), str(d / "logs.json"), str(port), str(d)], env=env,
                           capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-6000:]
    runs = json.loads((d / "logs.json").read_text())
    runs["_dir"] = str(d)
    return runs


def _compare(name, ours, theirs, tol):
    o, t = ours["logs"], theirs["logs"]
    eval_rel = abs(ours["eval_loss"] - theirs["eval_loss"]) / theirs["eval_loss"]
    assert eval_rel <= tol, f"{name} evaluate(): zerod {ours['eval_loss']}, DeepSpeed {theirs['eval_loss']}"
    assert [x["step"] for x in t] == list(range(1, UPDATES + 1)), t
    assert [x["step"] for x in o] == [x["step"] for x in t]
    loss_rel = [abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(o, t)]
    norm_rel = [abs(a["grad_norm"] - b["grad_norm"]) / abs(b["grad_norm"]) for a, b in zip(o, t)]
    print(f"\n{name}: max relative difference over {UPDATES} updates: loss {max(loss_rel):.2e} "
          f"(tolerance {tol:g}), grad norm {max(norm_rel):.2e}; evaluate() {eval_rel:.2e}")
    assert sum(b["loss"] for b in t[-3:]) < 0.9 * sum(b["loss"] for b in t[:3]), \
        "DeepSpeed's loss did not fall: the comparison would prove little"
    for a, b in zip(o, t):
        assert abs(a["loss"] - b["loss"]) <= tol * abs(b["loss"]), f"{name} update {b['step']}: zerod {a}, " \
                                                                    f"DeepSpeed {b}\nzerod {o}\nDeepSpeed {t}"
        assert a["lr"] == pytest.approx(b["lr"], rel=1e-6, abs=1e-12), f"{name} lr: zerod {o}, DeepSpeed {t}"
    # The global norm before clipping, which shows a gradient scaled wrongly
    # (the accumulation window's) at once. In bf16 it is held while the warm-up
    # keeps both models the same to bf16's precision (3 updates): later it
    # follows the weights, whose bf16 roundings part (printed only).
    for a, b in zip(o, t) if tol <= 1e-4 else zip(o[:3], t[:3]):
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-3 * abs(b["grad_norm"]), \
            f"{name} grad norm at update {b['step']}: zerod {o}, DeepSpeed {t}"


# torch warns that a schedule skips its first value when its scheduler steps
# before its optimizer ever did: the Trainer's scheduler on the torch
# optimizer zerod stands for must not be told so.
@pytest.mark.filterwarnings("error:Detected call of `lr_scheduler.step\\(\\)` before")
@pytest.mark.parametrize("name", list(RUNS))
def test_same_losses_and_resume_bit_for_bit(name, deepspeed_runs, tmp_path):
    from safetensors.torch import load_file

    from zerod.transformers import ZerodTrainer

    bf16 = RUNS[name][2]
    out = str(tmp_path / "out")
    ours = train(name, out, ZerodTrainer)
    _compare(name, ours, deepspeed_runs[name], 2e-2 if bf16 else 1e-4)

    # save_steps: DeepSpeed's checkpoint layout, with zerod's files in it.
    for step in (SAVE_AT, UPDATES):
        ck = tmp_path / "out" / f"checkpoint-{step}"
        assert (ck / "latest").read_text() == f"global_step{step}"
        for f in ("trainer_state.json", "rng_state.pth", "model.safetensors", f"global_step{step}"):
            assert (ck / f).exists(), f
    # The weights the last checkpoint holds are the model DeepSpeed trained.
    theirs = load_file(os.path.join(deepspeed_runs["_dir"], name, f"checkpoint-{UPDATES}", "model.safetensors"))
    mine = load_file(str(tmp_path / "out" / f"checkpoint-{UPDATES}" / "model.safetensors"))
    # DeepSpeed below stage 3 hands save_pretrained copies of tied weights
    # (it keeps both names); zerod, like DeepSpeed's stage 3 and the plain
    # Trainer, the tied tensor itself (written once).
    assert set(mine) ^ set(theirs) <= {"lm_head.weight"}, set(mine) ^ set(theirs)
    common = sorted(set(mine) & set(theirs))
    diff = sum(float((mine[k].float() - theirs[k].float()).norm()) ** 2 for k in common) ** 0.5
    rel = diff / sum(float(theirs[k].float().norm()) ** 2 for k in common) ** 0.5
    print(f"{name}: weights after {UPDATES} updates differ by {rel:.2e} (relative L2 norm)")
    assert rel <= (2e-2 if bf16 else 1e-4)

    # resume_from_checkpoint at update 6, in a new Trainer and engine: the
    # same logs as the unbroken run, bit for bit, and the same weights.
    again = train(name, out, ZerodTrainer, resume=str(tmp_path / "out" / f"checkpoint-{SAVE_AT}"))
    assert again["logs"] == ours["logs"][SAVE_AT:]
    assert again["eval_loss"] == ours["eval_loss"]
    assert again["global_step"] == UPDATES
    resumed = load_file(str(tmp_path / "out" / f"checkpoint-{UPDATES}" / "model.safetensors"))
    assert all(torch.equal(resumed[k], mine[k]) for k in mine)


def _args(tmp_path, config, **kw):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    _reset()
    base = dict(output_dir=str(tmp_path / "out"), use_cpu=True, per_device_train_batch_size=4,
                gradient_accumulation_steps=2, max_steps=3, report_to="none", disable_tqdm=True, save_strategy="no")
    base.update(kw)
    return TrainingArguments(deepspeed=str(path) if config is not None else None, **base)


def test_refusals(tmp_path, monkeypatch):
    from zerod.errors import InvalidArgumentError, InvalidStateError
    from zerod.transformers import ZerodTrainer

    # Without a DeepSpeed config there is nothing to say how to train.
    with pytest.raises(InvalidArgumentError, match=r"TrainingArguments\(deepspeed="):
        ZerodTrainer(model=make_model("gpt2"), args=_args(tmp_path, None), train_dataset=Windows())
    # Several processes are refused by name, not trained as one each.
    monkeypatch.setenv("ZEROD_WORLD_SIZE", "2")
    with pytest.raises(InvalidArgumentError, match="runs in one process"):
        ZerodTrainer(model=make_model("gpt2"), args=_args(tmp_path, ZERO2_OFFLOAD), train_dataset=Windows())
    monkeypatch.delenv("ZEROD_WORLD_SIZE")
    # The Trainer's own AdamW decays weights but not biases and norms: two
    # sets of hyperparameters, where zerod's optimizer takes one.
    trainer = ZerodTrainer(model=make_model("gpt2"), args=_args(tmp_path, ZERO2_OFFLOAD_TRAINER_OPTIMIZER,
                                                                 weight_decay=0.1), train_dataset=Windows())
    with pytest.raises(InvalidArgumentError, match="parameter group 1 has weight_decay=0.0"):
        trainer.train()
    # An epoch of 5 micro-batches with windows of 2: the Trainer ends a short
    # window at the epoch's end, which zerod cannot.
    trainer = ZerodTrainer(model=make_model("gpt2"), args=_args(tmp_path, ZERO2_OFFLOAD), train_dataset=Windows(20))
    with pytest.raises(InvalidStateError, match="gradient_accumulation_steps=2"):
        trainer.train()
    # A model DeepSpeed partitioned (built inside deepspeed.zero.Init, its
    # parameters marked with ds_id) is refused by name, not registered empty.
    model = make_model("gpt2")
    model.transformer.wte.weight.ds_id = 0
    trainer = ZerodTrainer(model=model, args=_args(tmp_path, ZERO3_OFFLOAD), train_dataset=Windows())
    with pytest.raises(InvalidArgumentError, match=r"'transformer\.wte\.weight'.*deepspeed\.zero\.Init"):
        trainer.train()


# One rank of a launcher's, each in a folder of its own (its ds_config.json).
LAUNCHED_TASK = r'''
import os, sys
from pathlib import Path
from test_hf_trainer import ZERO2_OFFLOAD, Windows, _args, make_model
from zerod.transformers import ZerodTrainer
rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("SLURM_PROCID") or "0"
folder = Path(sys.argv[1]) / f"rank{rank}"
folder.mkdir()
ZerodTrainer(model=make_model("gpt2"), args=_args(folder, ZERO2_OFFLOAD), train_dataset=Windows())
print("ZerodTrainer made")
'''


def test_srun_tasks_are_refused_naming_srun(tmp_path):
    """Task 0 of a 2-task srun step (srun's variables, as Slurm sets them:
    Slurm does not install here). Accelerate reads none of them and saw one
    process while zerod joined the tasks as its 2 ranks: each Trainer
    trained on the whole dataset, both writing checkpoint-N into one
    folder. Refused when the Trainer is made, naming srun."""
    script = tmp_path / "srun_task.py"
    script.write_text(LAUNCHED_TASK)
    env = {k: v for k, v in os.environ.items()  # nothing of an enclosing launcher or zerod run
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "SLURM_")) and k not in (
               "ZEROD_ENDPOINT", "ZEROD_RANK", "ZEROD_WORLD_SIZE", "ZEROD_LOCAL_RANK", "ZEROD_LOCAL_WORLD_SIZE",
               "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env.update(PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""), SLURM_JOB_ID="4244",
               SLURM_STEP_ID="0", SLURM_STEP_NUM_TASKS="2", SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0",
               SLURM_STEP_TASKS_PER_NODE="2")
    r = subprocess.run([sys.executable, str(script), str(tmp_path)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode != 0 and "ZerodTrainer made" not in r.stdout, r.stdout + r.stderr[-4000:]
    assert "ZerodTrainer runs in one process (this is one of 2, started by srun (Slurm))" in r.stderr, \
        r.stderr[-4000:]


def test_mpirun_ranks_are_refused_naming_mpirun(tmp_path):
    """The 2 ranks of `mpirun -np 2` (Open MPI): with use_cpu=True Accelerate
    reads mpirun's variables and joins them over gloo, and zerod would join
    them as its 2 ranks, so each Trainer would train on the whole dataset
    into the same checkpoint-N. Refused when the Trainer is made, naming
    mpirun."""
    from test_launchers import launch_env, mpirun_two

    script = tmp_path / "mpirun_rank.py"
    script.write_text(LAUNCHED_TASK)
    env = launch_env(tmp_path)
    with reserved_port() as port:  # Accelerate's gloo rendezvous: its default port is a fixed 29500
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        r = subprocess.run(mpirun_two(env, "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS") +
                           [sys.executable, str(script), str(tmp_path)],
                           env=env, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "ZerodTrainer made" not in out, out[-4000:]
    # mpirun stops the other rank once one has failed: it may not get to say so too.
    assert "ZerodTrainer runs in one process (this is one of 2, started by mpirun (Open MPI))" in out, out[-4000:]


def test_train_refuses_a_client_joined_as_one_of_several_ranks(tmp_path):
    """train()'s own check, where the Trainer was made in a process no
    launcher's variables (nor Accelerate) call one of several, but the
    zerod client it is given joined this process as rank 0 of 2: refused
    when train() would hand the model to zerod, naming the count."""
    from zerod.errors import InvalidArgumentError
    from zerod.transformers import ZerodTrainer

    class JoinedAsOneOfTwo:  # what zerod's client says
        rank, world_size = 0, 2

    trainer = ZerodTrainer(model=make_model("gpt2"), args=_args(tmp_path, ZERO2_OFFLOAD), train_dataset=Windows(),
                           client=JoinedAsOneOfTwo())
    with pytest.raises(InvalidArgumentError, match=r"ZerodTrainer runs in one process \(this is one of 2, started "
                                                   r"by the launcher zerod joined them from\)"):
        trainer.train()
    assert trainer.zerod_engine is None


def test_torch_compile(tmp_path):
    """TrainingArguments(torch_compile=True): Accelerate calls the engine's
    compile() (DeepSpeed's DeepSpeedEngine.compile), which compiles the
    module in place; it trains as the eager module does (without dropout,
    whose random numbers the compiled graph draws otherwise; measured: the
    same losses to 1e-7)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from zerod.transformers import ZerodTrainer

    def model():
        torch.manual_seed(0)
        return GPT2LMHeadModel(GPT2Config(vocab_size=len(CHARS), n_positions=BLOCK, n_embd=32, n_layer=2, n_head=2,
                                          bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                                          attn_pdrop=0.0))

    losses = {}
    for compiled in (False, True):
        logs = Logs()
        trainer = ZerodTrainer(model=model(), args=_args(tmp_path, ZERO2_OFFLOAD, logging_steps=1,
                                                         torch_compile=compiled),
                               train_dataset=Windows(), callbacks=[logs])
        trainer.train()
        assert trainer.zerod_engine.is_compiled == compiled
        assert (trainer.zerod_engine.module._compiled_call_impl is not None) == compiled
        losses[compiled] = [x["loss"] for x in logs.logs]
    assert len(losses[True]) == 3 and losses[True] == pytest.approx(losses[False], rel=1e-5)


def test_from_pretrained_after_training_arguments_zero3(tmp_path):
    """Hugging Face's ZeRO-3 docs (and run_clm.py) make TrainingArguments
    before the model, so that from_pretrained and from_config build it
    inside deepspeed.zero.Init, partitioned by DeepSpeed. zerod partitions
    the model itself: with ZerodTrainer imported, transformers sees no
    ZeRO-3 of its own, and models loaded in that order -- before training,
    after it in the same process, and in model_init -- are whole torch
    modules that train as one built before the arguments."""
    from transformers import AutoModelForCausalLM

    from zerod.transformers import ZerodTrainer

    saved = tmp_path / "gpt2"
    make_model("gpt2").save_pretrained(saved)

    def whole(model):
        assert not [n for n, p in model.named_parameters() if hasattr(p, "ds_id")], "partitioned by DeepSpeed"
        return model

    def losses(args, **model_or_init):
        logs = Logs()
        ZerodTrainer(args=args, train_dataset=Windows(), callbacks=[logs], **model_or_init).train()
        return [x["loss"] for x in logs.logs]

    expected = losses(_args(tmp_path, ZERO3_OFFLOAD, logging_steps=1), model=make_model("gpt2"))
    assert len(expected) == 3

    args = _args(tmp_path, ZERO3_OFFLOAD, logging_steps=1)
    loaded = whole(GPT2LMHeadModel.from_pretrained(saved))
    torch.manual_seed(0)  # make_model's initialisation
    built = whole(AutoModelForCausalLM.from_config(loaded.config))
    assert losses(args, model=loaded) == expected
    # A Trainer per TrainingArguments (Accelerate's state is made once).
    assert losses(_args(tmp_path, ZERO3_OFFLOAD, logging_steps=1), model=built) == expected
    # After a run, in the same process (Accelerate's DeepSpeed plugin is
    # the selected one now), and in model_init, which the Trainer calls with
    # its Accelerator made.
    whole(GPT2LMHeadModel.from_pretrained(saved))
    assert losses(_args(tmp_path, ZERO3_OFFLOAD, logging_steps=1),
                  model_init=lambda: whole(GPT2LMHeadModel.from_pretrained(saved))) == expected


def test_resume_from_deepspeed_checkpoint_names_ckpt_import(deepspeed_runs, tmp_path):
    """resume_from_checkpoint on a checkpoint DeepSpeed's engine wrote (not
    zerod's) is refused with the command that converts it."""
    from zerod.errors import ZerodError
    from zerod.transformers import ZerodTrainer

    name = "zero3_offload_llama"
    theirs = os.path.join(deepspeed_runs["_dir"], name, f"checkpoint-{SAVE_AT}")
    with pytest.raises(ZerodError, match="ckpt import"):
        train(name, str(tmp_path / "out"), ZerodTrainer, resume=theirs)
