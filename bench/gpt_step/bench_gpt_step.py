"""Step time of the main job's GPT (examples/python/gpt.py) under zerod, plain
PyTorch and DeepSpeed, in one run, as ratios.

    scripts/python-venv.sh        # once: build/venv with torch 2.x and DeepSpeed 0.19.x
    PYTHONPATH=bindings/python build/venv/bin/python bench/gpt_step/bench_gpt_step.py \\
        [--size main|100m] [--steps 30] [--rounds 3]

Every rank process computes with one thread (torch.set_num_threads(1),
OMP_NUM_THREADS=1: DeepSpeed's CPU Adam and PyTorch's kernels) and trains
up to three copies of the same model, one step each in turn, on the same
batches: one through zerod, one with plain PyTorch (torch.optim.AdamW;
DistributedDataParallel over gloo when there are 2 ranks) and one under
DeepSpeed ZeRO-3 (gloo, DS_ACCELERATOR=cpu; each Block a leaf module, so
DeepSpeed gathers per Block as zerod does, and overlap_comm at DeepSpeed's
default). zerod's optimizer runs on one thread per rank too (`threads =
1`). Taking turns step by step puts every side under the same load, so the
ratios hold on a shared machine where
absolute times move by tens of percent. The variants:
  - zerod stage 0, embedded, against plain PyTorch in one process
  - zerod stage 3 under the daemon, 2 ranks, against DDP and DeepSpeed ZeRO-3
  - the same with the optimizer state in host memory (DeepSpeed:
    offload_optimizer cpu, i.e. DeepSpeedCPUAdam)
  - the same with the optimizer state on NVMe (DeepSpeed: offload_optimizer
    nvme, its aio swapper), both in a directory under --nvme-dir
With --trace, the stage-3 variants without and with the host optimizer also
run recording a trace of every step (trace.steps covering the whole run):
their ratio to the untraced variant is what tracing costs.
A step is forward, backward, clipping at 1.0 and AdamW (lr 2e-3, betas
0.9/0.99, weight decay 0.01). A run reports each side's median step and
rank 0's loss at the first and the last measured step; the table gives the
median ratio over the rounds and the fastest step times seen. DeepSpeed
runs only where it imports (the venv); elsewhere its columns say why not.
It prints measurements and asserts nothing.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
EXAMPLES = os.path.join(ROOT, "examples", "python")
BINDINGS = os.path.join(ROOT, "bindings", "python")
VENV_PYTHON = os.path.join(ROOT, "build", "venv", "bin", "python")

SIZES = {  # name: GPTConfig arguments
    "main": dict(vocab_size=96, block_size=64, n_layer=4, n_head=4, n_embd=128),
    "100m": dict(vocab_size=96, block_size=64, n_layer=14, n_head=12, n_embd=768),
}
ADAMW = 'optimizer = { type = "adamw", lr = 2e-3, betas = {0.9, 0.99}, weight_decay = 0.01 }, gradient_clipping = 1.0'
STAGE3 = "zero = { stage = 3, param_persistence_threshold = 0 }, threads = 1"
VARIANTS = {  # name: (label, job script, ranks, DeepSpeed offload_optimizer device or None)
    "stage0": ("stage 0, embedded", f"return {{ {ADAMW}, zero = {{ stage = 0 }}, threads = 1 }}", 1, None),
    "stage3": ("stage 3, daemon", f"return {{ {ADAMW}, {STAGE3} }}", 2, "none"),
    "stage3+host": ("stage 3 + optimizer on host", f'return {{ {ADAMW}, {STAGE3}, offload = {{ optimizer = "host" }} }}',
                    2, "cpu"),
    "stage3+nvme": ("stage 3 + optimizer on NVMe",
                    f'return {{ {ADAMW}, {STAGE3}, offload = {{ optimizer = "nvme", nvme_path = "@NVME@" }} }}', 2,
                    "nvme"),
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=sorted(SIZES), default="main", help="the GPT: the main job's, or ~100M parameters")
    p.add_argument("--steps", type=int, default=None, help="measured steps of each side per run (main 30, 100m 3)")
    p.add_argument("--warmup", type=int, default=None, help="main 5, 100m 1")
    p.add_argument("--rounds", type=int, default=None, help="runs of every variant, taking turns (main 3, 100m 1)")
    p.add_argument("--batch", type=int, default=None, help="sequences of 64 per rank (main 16, 100m 4)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS))
    p.add_argument("--nvme-dir", default="/var/tmp", help="where both NVMe offloads put their files")
    p.add_argument("--no-deepspeed", action="store_true")
    p.add_argument("--trace", action="store_true",
                   help="also the stage-3 variants recording a trace of every step (what tracing costs)")
    p.add_argument("--worker", metavar="JOB", help=argparse.SUPPRESS)
    p.add_argument("--ds", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    big = a.size == "100m"
    for name, main, large in (("steps", 30, 3), ("warmup", 5, 1), ("rounds", 3, 1), ("batch", 16, 4)):
        if getattr(a, name) is None:
            setattr(a, name, large if big else main)
    return a


# -- a worker: one process (or one rank) timing every side ---------------------

def ds_config(args, offload, nvme_dir):
    # overlap_comm left to DeepSpeed's default (True at stage 3 in 0.19.x),
    # as a user's config would leave it.
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0}
    if offload == "cpu":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    elif offload == "nvme":
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": nvme_dir, "pin_memory": False}
    return {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.99], "eps": 1e-8, "weight_decay": 0.01}},
        "zero_optimization": zero,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def worker(args):
    import torch
    sys.path[:0] = [EXAMPLES, BINDINGS]
    import zerod.torch
    from gpt import GPT, Block, GPTConfig
    torch.set_num_threads(1)

    def gpt():
        torch.manual_seed(0)
        return GPT(GPTConfig(**SIZES[args.size]))

    engine = zerod.torch.initialize(gpt(), job=args.worker, modules=[Block])
    rank, world = engine.rank, engine.world_size
    model = gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.99), weight_decay=0.01)
    ds = None
    if world > 1:
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=rank, world_size=world)
        ddp = torch.nn.parallel.DistributedDataParallel
        # gloo cannot broadcast the bool attention masks; every rank builds the same ones.
        ddp._set_params_and_buffers_to_ignore_for_model(model, [n for n, _ in model.named_buffers()])
        model = ddp(model)
        if args.ds:
            import deepspeed
            os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                              LOCAL_WORLD_SIZE=str(world))
            cfg = json.loads(args.ds)
            # Gather per Block, as zerod does (modules=[Block] above): without
            # leaf modules ZeRO-3 gathers each Block's submodules one by one.
            ds_model = gpt()
            deepspeed.utils.set_z3_leaf_modules(ds_model, [Block])
            ds, _, _, _ = deepspeed.initialize(model=ds_model, config=cfg, dist_init_required=False)

    def torch_step(x, y):
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    def zerod_step(x, y):
        _, loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        return loss

    def ds_step(x, y):
        _, loss = ds(x, y)
        ds.backward(loss)
        ds.step()
        return loss

    sides = [("torch", torch_step), ("zerod", zerod_step)] + ([("deepspeed", ds_step)] if ds else [])
    g = torch.Generator().manual_seed(1)
    mine = slice(rank * args.batch, (rank + 1) * args.batch)
    times = {s: [] for s, _ in sides}
    losses = {s: [] for s, _ in sides}
    vocab = SIZES[args.size]["vocab_size"]
    for i in range(args.warmup + args.steps):
        x = torch.randint(vocab, (args.batch * world, 64), generator=g)[mine]
        y = torch.randint(vocab, (args.batch * world, 64), generator=g)[mine]
        for side, step in sides:
            t0 = time.perf_counter()
            loss = step(x, y)
            t1 = time.perf_counter()
            if i >= args.warmup:
                times[side].append(t1 - t0)
                losses[side].append(float(loss))
    if rank == 0:
        print("RESULT " + json.dumps({s: {"step": statistics.median(times[s]), "loss0": losses[s][0],
                                          "loss1": losses[s][-1]} for s, _ in sides}))


# -- the driver ----------------------------------------------------------------

def deepspeed_status(python):
    """None when DeepSpeed imports in `python`, else why not."""
    if not os.path.exists(python):
        return f"{python} not found (make it with scripts/python-venv.sh)"
    p = subprocess.run([python, "-c", "import deepspeed, sys; sys.stdout.write(deepspeed.__version__)"],
                       capture_output=True, text=True, env=dict(os.environ, DS_ACCELERATOR="cpu"), timeout=300)
    if p.returncode != 0:
        return f"deepspeed does not import in {python}: " + (p.stderr.strip().splitlines() or ["?"])[-1]
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(job, ranks, args, ds):
    me = [sys.executable, os.path.abspath(__file__), "--size", args.size, "--steps", str(args.steps), "--warmup",
          str(args.warmup), "--batch", str(args.batch), "--worker", job] + (["--ds", ds] if ds else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [BINDINGS, os.environ.get("PYTHONPATH")])),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    if ranks > 1:
        me = [os.path.join(ROOT, "build", "bin", "zerod"), "run", "--nproc", str(ranks), "--no-prefix",
              "--job", job, "--"] + me
    p = subprocess.run(me, capture_output=True, text=True, env=env, timeout=3600)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"{' '.join(me)} failed (exit {p.returncode}):\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}")


def main():
    args = parse_args()
    if args.worker:
        return worker(args)
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
    if args.trace:
        # Every step recorded: the rings wrap, as a long trace window's would.
        # DeepSpeed is not run again beside the traced variants.
        for v in ("stage3", "stage3+host"):
            if v in variants:
                label, text, ranks, _ = VARIANTS[v]
                traced = 'trace = { path = "@TRACE@", steps = {1, 1000000} }'
                VARIANTS[v + "+trace"] = (label + ", traced", text[:-2] + ", " + traced + " }", ranks, None)
                variants.append(v + "+trace")
    why_no_ds = "--no-deepspeed" if args.no_deepspeed else deepspeed_status(sys.executable)
    import torch
    sys.path[:0] = [EXAMPLES]
    from gpt import GPT, GPTConfig
    params = sum(p.numel() for p in GPT(GPTConfig(**SIZES[args.size])).parameters())
    load = os.getloadavg()[0]
    results = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory(dir=args.nvme_dir,
                                                                           prefix="zerod-gpt-step-") as nvme:
        for _ in range(args.rounds):
            for v in variants:
                label, text, ranks, offload = VARIANTS[v]
                zdir, ddir = os.path.join(nvme, "zerod"), os.path.join(nvme, "deepspeed")
                os.makedirs(zdir, exist_ok=True)
                os.makedirs(ddir, exist_ok=True)
                job = os.path.join(tmp, f"{v.replace('+', '_')}.lua")
                with open(job, "w") as f:
                    f.write(text.replace("@NVME@", zdir).replace("@TRACE@", os.path.join(tmp, f"{v}.json")))
                ds = json.dumps(ds_config(args, offload, ddir)) if offload and not why_no_ds else None
                results[v].append(run(job, ranks, args, ds))
    print(f"GPT {args.size} ({params / 1e6:.2f}M parameters), {args.batch} x 64 characters per rank and step, one "
          f"thread per rank on every side (zerod's optimizer too); {args.rounds} round(s) of {args.steps} steps per "
          f"side; torch {torch.__version__}; load average {load:.1f} -> {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores")
    if why_no_ds:
        print(f"DeepSpeed: not run: {why_no_ds}")
    else:
        import deepspeed
        print(f"DeepSpeed {deepspeed.__version__}, ZeRO-3 over gloo, DS_ACCELERATOR=cpu, gathering per Block "
              f"(set_z3_leaf_modules, as zerod's modules=[Block]), overlap_comm at its default; NVMe files under "
              f"{args.nvme_dir}")
    print(f"{'zerod':30} {'ranks':>5} {'zerod':>9} {'PyTorch':>13} {'DeepSpeed':>10} {'zerod/PyT':>9} "
          f"{'zerod/DS':>8}  loss first -> last (rank 0): zerod | PyTorch | DeepSpeed")
    for v in variants:
        label, _, ranks, offload = VARIANTS[v]
        runs = results[v]
        best = {s: min(r[s]["step"] for r in runs) for s in runs[0]}
        ratio_t = statistics.median(r["zerod"]["step"] / r["torch"]["step"] for r in runs)
        has_ds = "deepspeed" in runs[0]
        ratio_d = statistics.median(r["zerod"]["step"] / r["deepspeed"]["step"] for r in runs) if has_ds else None
        last = runs[-1]

        def loss(s):
            return f"{last[s]['loss0']:.4f} -> {last[s]['loss1']:.4f}" if s in last else "n/a"
        torch_label = f"{best['torch'] * 1e3:.1f}ms" + (" DDP" if ranks > 1 else "")
        ds_label = f"{best['deepspeed'] * 1e3:.1f}ms" if has_ds else ("n/a" if offload is None else "not run")
        print(f"{label:30} {ranks:>5} {best['zerod'] * 1e3:>7.1f}ms {torch_label:>13} {ds_label:>10} "
              f"{ratio_t:>8.2f}x {(f'{ratio_d:.2f}x' if ratio_d else '-'):>8}  "
              f"{loss('zerod')} | {loss('torch')} | {loss('deepspeed')}")


if __name__ == "__main__":
    main()
