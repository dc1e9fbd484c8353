#!/usr/bin/python3
"""torch.optim.AdamW on one fp32 tensor, for bench_cpu_adam and
bench_offload_step to compare with.

Tries every implementation this torch has on the CPU: foreach=False (the
per-tensor loop), foreach=True and, where torch has a fused CPU AdamW
(torch >= 2.4), fused=True; a variant torch refuses is left out. Prints one
line per variant, "<variant> <params/s>", then "torch <version> threads=<n>"
and "best <params/s> <variant>". Exits 3, saying why on stderr, when torch
cannot be imported.
"""
import argparse
import statistics
import sys
import time


def measure(torch, n, steps, warmup, kwargs):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(n, dtype=torch.float32))
    p.grad = torch.randn(n, dtype=torch.float32)
    opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, **kwargs)
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        opt.step()
        t1 = time.perf_counter()
        if i >= warmup:
            times.append(t1 - t0)
    del opt, p
    return n / statistics.median(times)


def variants(torch):
    """The AdamW implementations this torch takes on a CPU tensor: name and
    keyword arguments. foreach= exists since torch 1.12, fused= on the CPU
    since 2.4; an older torch takes neither and is measured as it comes."""
    found = []
    for name, kwargs in (("foreach=False", dict(foreach=False)), ("foreach=True", dict(foreach=True)),
                         ("fused=True", dict(fused=True))):
        try:
            p = torch.nn.Parameter(torch.zeros(4))
            p.grad = torch.zeros(4)
            torch.optim.AdamW([p], **kwargs).step()  # fused refuses CPU tensors at the step before 2.4
        except (TypeError, RuntimeError, ValueError):
            continue
        found.append((name, kwargs))
    return found or [("default", {})]


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
    best = None
    for name, kwargs in variants(torch):
        rate = measure(torch, n, args.steps, args.warmup, kwargs)
        print(f"{name} {rate:.6g}")
        if best is None or rate > best[0]:
            best = (rate, name)
    print(f"torch {torch.__version__} threads={torch.get_num_threads()}")
    print(f"best {best[0]:.6g} {best[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
