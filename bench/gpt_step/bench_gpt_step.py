"""Step time of the main job's GPT (examples/python/gpt.py) under plain
PyTorch and under zerod, in one run, as ratios to plain PyTorch.

    PYTHONPATH=bindings/python /usr/bin/python3 bench/gpt_step/bench_gpt_step.py [--steps 30] [--rounds 3]

Every process computes with one thread on 16 sequences of 64 characters per
step (a rank does the same work in every variant), and trains two copies of
the model side by side, one step each in turn: one with plain PyTorch
(torch.optim.AdamW; DistributedDataParallel over gloo when there are 2
ranks) and one through zerod. Taking turns step by step puts both under the
same load, so their ratio holds on a shared machine where absolute times
move by tens of percent. The variants:
  - zerod stage 0, embedded, against plain PyTorch in one process
  - zerod stage 3 under the daemon, 2 ranks, against PyTorch DDP
  - the same with the optimizer in the host tier (where this zerod accepts
    `offload`)
With --trace, the two stage-3 variants also run recording a trace of every
step (trace.steps covering the whole run): their ratio to the untraced
variant is what tracing costs.
A step is forward, backward, clipping and the optimizer step; a run reports
medians over its measured steps; the table gives the median ratio over the
rounds and the fastest step times seen. It prints measurements and asserts
nothing.
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

ADAMW = 'optimizer = { type = "adamw", lr = 2e-3, betas = {0.9, 0.99}, weight_decay = 0.01 }, gradient_clipping = 1.0'
STAGE3 = "zero = { stage = 3, param_persistence_threshold = 0 }"
VARIANTS = {  # name: (label, job script, ranks)
    # One optimizer thread, as the PyTorch side has.
    "stage0": ("zerod stage 0, embedded", f"return {{ {ADAMW}, zero = {{ stage = 0 }}, threads = 1 }}", 1),
    "stage3": ("zerod stage 3, daemon", f"return {{ {ADAMW}, {STAGE3} }}", 2),
    "stage3+offload": ("zerod stage 3 + optimizer on host, daemon",
                       f'return {{ {ADAMW}, {STAGE3}, offload = {{ optimizer = "host" }} }}', 2),
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30, help="measured steps of each side per run")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3, help="runs of every variant, taking turns")
    p.add_argument("--batch", type=int, default=16, help="sequences per rank")
    p.add_argument("--trace", action="store_true",
                   help="also the stage-3 variants recording a trace of every step (what tracing costs)")
    p.add_argument("--worker", metavar="JOB", help=argparse.SUPPRESS)
    return p.parse_args()


# -- a worker: one process (or one rank) timing both sides ---------------------

def worker(args):
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    import torch
    sys.path[:0] = [EXAMPLES, BINDINGS]
    import zerod.torch
    from gpt import GPT, Block, GPTConfig
    torch.set_num_threads(1)

    def gpt():
        torch.manual_seed(0)
        return GPT(GPTConfig(vocab_size=96, block_size=64, n_layer=4, n_head=4, n_embd=128))

    engine = zerod.torch.initialize(gpt(), job=args.worker, modules=[Block])
    rank, world = engine.rank, engine.world_size
    model = gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.99), weight_decay=0.01)
    if world > 1:
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=rank, world_size=world)
        ddp = torch.nn.parallel.DistributedDataParallel
        # gloo cannot broadcast the bool attention masks; every rank builds the same ones.
        ddp._set_params_and_buffers_to_ignore_for_model(model, [n for n, _ in model.named_buffers()])
        model = ddp(model)

    def torch_step(x, y):
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    def zerod_step(x, y):
        _, loss = engine(x, y)
        engine.backward(loss)
        engine.step()

    g = torch.Generator().manual_seed(1)
    mine = slice(rank * args.batch, (rank + 1) * args.batch)
    times = {"torch": [], "zerod": []}
    for i in range(args.warmup + args.steps):
        x = torch.randint(96, (args.batch * world, 64), generator=g)[mine]
        y = torch.randint(96, (args.batch * world, 64), generator=g)[mine]
        for side, step in (("torch", torch_step), ("zerod", zerod_step)):
            t0 = time.perf_counter()
            step(x, y)
            if i >= args.warmup:
                times[side].append(time.perf_counter() - t0)
    if rank == 0:
        print("RESULT " + json.dumps({side: statistics.median(t) for side, t in times.items()}))


# -- the driver ----------------------------------------------------------------

def offload_accepted():
    sys.path.insert(0, BINDINGS)
    import zerod
    with zerod.connect("embedded:") as client:
        try:
            client.create_model(script_text=VARIANTS["stage3+offload"][1])
            return True
        except zerod.ConfigError:
            return False


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(job, ranks, args):
    me = [sys.executable, os.path.abspath(__file__), "--steps", str(args.steps), "--warmup", str(args.warmup),
          "--batch", str(args.batch), "--worker", job]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [BINDINGS, os.environ.get("PYTHONPATH")])),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    if ranks > 1:
        me = [os.path.join(ROOT, "build", "bin", "zerod"), "run", "--nproc", str(ranks), "--no-prefix",
              "--job", job, "--"] + me
    p = subprocess.run(me, capture_output=True, text=True, env=env, timeout=900)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"{' '.join(me)} failed (exit {p.returncode}):\n{p.stdout}\n{p.stderr}")


def main():
    args = parse_args()
    if args.worker:
        return worker(args)
    with tempfile.TemporaryDirectory() as tmp:
        if args.trace:
            # Every step recorded: the rings wrap, as a long trace window's would.
            traced = f'trace = {{ path = "{tmp}/trace.json", steps = {{1, 1000000}} }}'
            for v in ("stage3", "stage3+offload"):
                label, job, ranks = VARIANTS[v]
                VARIANTS[v + "+trace"] = (label + ", traced", job[:-2] + ", " + traced + " }", ranks)
        variants = [v for v in VARIANTS if "stage3+offload" not in v or offload_accepted()]
        load = os.getloadavg()[0]
        results = {v: [] for v in variants}
        for _ in range(args.rounds):
            for v in variants:
                job = os.path.join(tmp, f"{v.replace('+', '_')}.lua")
                with open(job, "w") as f:
                    f.write(VARIANTS[v][1])
                results[v].append(run(job, VARIANTS[v][2], args))
    print(f"GPT of the main job (0.81M parameters), {args.batch} x 64 characters per rank and step, one thread per "
          f"rank; {args.rounds} rounds of {args.steps} steps per side; load average {load:.1f} -> "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'zerod':50} {'ranks':>5} {'PyTorch side':>14} {'step':>9} {'tokens/s':>9} {'zerod/PyTorch':>14}")
    for v in variants:
        label, _, ranks = VARIANTS[v]
        runs = results[v]
        ratio = statistics.median(r["zerod"] / r["torch"] for r in runs)
        best = min(r["zerod"] for r in runs)
        base = f"{min(r['torch'] for r in runs) * 1e3:.1f}ms " + ("DDP" if ranks > 1 else "")
        print(f"{label:50} {ranks:>5} {base:>14} {best * 1e3:>7.1f}ms {args.batch * ranks * 64 / best:>9.0f} "
              f"{ratio:>13.2f}x")


if __name__ == "__main__":
    main()
