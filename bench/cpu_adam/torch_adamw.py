#!/usr/bin/python3
"""torch.optim.AdamW on one fp32 tensor, for bench_cpu_adam to compare with.

Prints one line per variant, "foreach=<bool> <params/s>", then
"best <params/s> foreach=<bool>". Exits 3, saying why on stderr, when torch
cannot be imported.
"""
import argparse
import statistics
import sys
import time


def measure(torch, n, steps, warmup, foreach):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(n, dtype=torch.float32))
    p.grad = torch.randn(n, dtype=torch.float32)
    kwargs = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    if foreach is not None:
        kwargs["foreach"] = foreach
    opt = torch.optim.AdamW([p], **kwargs)
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        opt.step()
        t1 = time.perf_counter()
        if i >= warmup:
            times.append(t1 - t0)
    del opt, p
    return n / statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params", type=float, default=1e8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=1)
    args = ap.parse_args()
    try:
        import torch
    except Exception as e:  # ImportError, or a broken install
        print(f"cannot import torch: {type(e).__name__}: {e}", file=sys.stderr)
        return 3
    torch.set_num_threads(args.threads)
    n = int(args.params)
    # foreach= exists on AdamW since torch 1.12; older versions take neither.
    try:
        torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], foreach=False)
        variants = [False, True]
    except TypeError:
        variants = [None]
    best = None
    for fe in variants:
        rate = measure(torch, n, args.steps, args.warmup, fe)
        print(f"foreach={fe} {rate:.6g}")
        if best is None or rate > best[0]:
            best = (rate, fe)
    print(f"torch {torch.__version__} threads={torch.get_num_threads()}")
    print(f"best {best[0]:.6g} foreach={best[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
