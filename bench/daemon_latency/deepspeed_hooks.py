"""DeepSpeed's counterpart of a zd_forward_begin + zd_forward_end pair, for
bench_daemon_latency to print beside zerod's.

A pair gives one module its parameters for a forward and takes them back.
In DeepSpeed ZeRO-3 the same work is done by the hooks the engine puts on
every module: the pre-forward hook fetches (all-gathers) the module's
partitioned parameters, the post-forward hook releases them. So the figure
is the time those hooks add to one module's forward: a module holding one
fp32 parameter of --numel elements (as the bench's "block" holds "w"), its
forward a scalar add (nothing to time in itself), timed from a forward
pre-hook put in front of DeepSpeed's to a forward hook put behind them,
under deepspeed.initialize (world size 1, gloo on the CPU and NCCL on a
GPU, an SGD optimizer as the bench's job has,
stage3_param_persistence_threshold 0 as the bench's
param_persistence_threshold = 0, so the parameter is gathered every
forward) against the same span of the bare module, forwards of the two
taken in turn so that both see the same machine. Per stage: the median and
the 99th percentile of the wrapped spans, each less the bare spans' median
(the forward's own cost), in microseconds. Stage 0 puts no hooks on the
module: its figure is the noise, about nothing.

What the engine does once per forward besides (the root module's hooks, its
forward wrapper) is not per module and not in the figure; the line
"stageN_forward" gives it: engine(x) less model(x), the whole call.

Prints "deepspeed <version> torch <version> device <device> backend <name>"
(the process group's), then per stage
"stage<N> median_us <X> p99_us <Y> bare_median_us <B>" and
"stage<N>_forward median_us <X> p99_us <Y>". Exits 3, saying why on stderr,
when DeepSpeed cannot be imported or cannot run here.

    python deepspeed_hooks.py [--numel 4096] [--iters 20000] [--warmup 200] [--stages 0,3] [--device cpu]
"""
import argparse
import contextlib
import io
import logging
import os
import socket
import statistics
import sys
import time


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--numel", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--stages", default="0,3")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    return ap.parse_args()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def one_rank_environment(device):
    """What a launcher would set for rank 0 of 1 (deepspeed.initialize reads
    it), and the accelerator DeepSpeed should take."""
    os.environ.setdefault("DS_ACCELERATOR", device)
    for k, v in {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                 "LOCAL_WORLD_SIZE": "1"}.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("MASTER_PORT", free_port())


def make_model(torch, numel, device):
    """A root holding the one module whose parameters a pair would give:
    DeepSpeed hooks the root once per forward and the block once per module."""

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(numel, device=device))

        def forward(self, x):
            return x + self.w[0]

    class Root(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            return self.block(x)

    return Root()


class Span:
    """The time from before every forward pre-hook on `module` to after every
    forward hook on it, in microseconds, one sample a forward. Put on after
    deepspeed.initialize, so DeepSpeed's hooks fall inside."""

    def __init__(self, module):
        self.samples, self._t0 = [], 0.0
        module.register_forward_pre_hook(self._start, prepend=True)
        module.register_forward_hook(self._stop)

    def _start(self, module, args):
        self._t0 = time.perf_counter()

    def _stop(self, module, args, output):
        self.samples.append((time.perf_counter() - self._t0) * 1e6)


def ds_config(stage):
    zero = {"stage": stage}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 0
    # torch's SGD is outside DeepSpeed's tested list for ZeRO; the forward
    # hooks timed here are the same whatever the optimizer.
    return {"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero, "zero_allow_untested_optimizer": True,
            "steps_per_print": 1 << 30, "wall_clock_breakdown": False}


def p99(xs):
    return sorted(xs)[int(len(xs) * 0.99)]


def measure(deepspeed, torch, args, stage):
    """(per-module figures, whole-forward figures) at `stage`."""
    device = torch.device(args.device)
    bare = make_model(torch, args.numel, device)
    wrapped = make_model(torch, args.numel, device)
    opt = torch.optim.SGD(wrapped.parameters(), lr=1e-3)
    with contextlib.redirect_stdout(io.StringIO()):  # its banner would break the bench's lines
        engine, _, _, _ = deepspeed.initialize(model=wrapped, optimizer=opt, config=ds_config(stage),
                                               dist_init_required=False)
    bare_span, ds_span = Span(bare.block), Span(wrapped.block)
    x = torch.ones(1, device=device)
    bare_calls, ds_calls = [], []
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    for i in range(args.warmup + args.iters):
        if i == args.warmup:
            bare_span.samples.clear()
            ds_span.samples.clear()
            bare_calls.clear()
            ds_calls.clear()
        for model, calls in ((bare, bare_calls), (engine, ds_calls)):
            t0 = time.perf_counter()
            model(x)
            calls.append((time.perf_counter() - t0) * 1e6)
            sync()  # outside the spans: each forward starts with the device idle
    base, base_call = statistics.median(bare_span.samples), statistics.median(bare_calls)
    per_module = (statistics.median(ds_span.samples) - base, p99(ds_span.samples) - base, base)
    per_forward = (statistics.median(ds_calls) - base_call, p99(ds_calls) - base_call)
    engine.destroy()
    return per_module, per_forward


def main():
    args = parse_args()
    stages = [int(s) for s in args.stages.split(",")]
    if args.iters < 1 or args.numel < 1 or any(s not in (0, 1, 2, 3) for s in stages):
        print("need --iters >= 1, --numel >= 1, stages of 0-3", file=sys.stderr)
        return 2
    one_rank_environment(args.device)
    try:
        import torch
        with contextlib.redirect_stdout(io.StringIO()):
            import deepspeed
    except Exception as e:  # ImportError, or a broken install
        print(f"cannot import deepspeed: {type(e).__name__}: {e}", file=sys.stderr)
        return 3
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"torch {torch.__version__} sees no CUDA device", file=sys.stderr)
        return 3
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    torch.set_num_threads(1)  # a pair runs on one thread; so does the forward here
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            deepspeed.init_distributed(dist_backend="nccl" if args.device == "cuda" else "gloo")
        print(f"deepspeed {deepspeed.__version__} torch {torch.__version__} device {args.device} "
              f"backend {torch.distributed.get_backend()}", flush=True)
        for stage in stages:
            (med, tail, base), (fmed, ftail) = measure(deepspeed, torch, args, stage)
            print(f"stage{stage} median_us {med:.3f} p99_us {tail:.3f} bare_median_us {base:.3f}", flush=True)
            print(f"stage{stage}_forward median_us {fmed:.3f} p99_us {ftail:.3f}", flush=True)
    except Exception as e:  # DeepSpeed refused this machine or this config
        print(f"deepspeed failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
