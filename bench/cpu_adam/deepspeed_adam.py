"""DeepSpeedCPUAdam on one fp32 tensor, for bench_cpu_adam to compare with.

The same update as zerod's adamw plugin defaults (lr 1e-3, betas 0.9/0.999,
eps 1e-8, weight_decay 0.01, AdamW mode), fp32 master, gradient and state.
With --bf16 each step also writes the bf16 working copy the way DeepSpeed's
ZeRO-Offload refreshes it: a cast of the updated fp32 partition
(bit16.copy_(fp32)), timed with the step.

Prints "deepspeed <version> torch <version> threads=<n> isa=<simd width>",
then "rate <params/s>" (median of the timed steps). Exits 3, saying why on
stderr, when DeepSpeed or its CPU Adam op cannot be loaded (the op is
built with ninja and g++ at first use and cached in ~/.cache/torch_extensions).
Run it with OMP_NUM_THREADS set: the op's OpenMP loop takes its thread
count from there.
"""
import argparse
import os
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params", type=float, default=1e8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--bf16", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import torch
        import deepspeed
        from deepspeed.ops.adam import DeepSpeedCPUAdam
    except Exception as e:  # ImportError, or a broken install
        print(f"cannot import deepspeed: {type(e).__name__}: {e}", file=sys.stderr)
        return 3
    torch.set_num_threads(args.threads)
    n = int(args.params)
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(n, dtype=torch.float32))
    p.grad = torch.randn(n, dtype=torch.float32)
    work = torch.empty(n, dtype=torch.bfloat16) if args.bf16 else None
    try:
        opt = DeepSpeedCPUAdam([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, adamw_mode=True)
    except Exception as e:  # the op failed to build or load
        print(f"DeepSpeedCPUAdam unavailable: {type(e).__name__}: {e}", file=sys.stderr)
        return 3
    times = []
    with torch.no_grad():
        for i in range(args.warmup + args.steps):
            t0 = time.perf_counter()
            opt.step()
            if work is not None:
                work.copy_(p)
            t1 = time.perf_counter()
            if i >= args.warmup:
                times.append(t1 - t0)
    from deepspeed.ops.op_builder import CPUAdamBuilder
    width = CPUAdamBuilder().simd_width()
    print(f"deepspeed {deepspeed.__version__} torch {torch.__version__} threads={torch.get_num_threads()} "
          f"isa={width.strip() or 'scalar'}")
    print(f"rate {n / statistics.median(times):.6g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
