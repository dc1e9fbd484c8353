#!/usr/bin/python3
"""torch.distributed with the gloo backend (what DeepSpeed's comm runs on a
CPU) on the collectives bench_comm_local measures, for it to compare with.

Spawns --ranks processes on this machine, joined through a FileStore in a
temporary folder (no port to pick), one torch thread each (the local plugin
runs one thread per rank). On f32 tensors of the same sizes as
bench_comm_local (B = --mib MiB per rank, chunk = B / 4 / ranks elements):
  all_reduce      dist.all_reduce, in place on B
  reduce_scatter  dist.reduce_scatter_tensor, B in, one chunk out
  all_gather      dist.all_gather_into_tensor, in place (the input is this
                  rank's chunk of the output, as ZeRO-3 gathers)
  all_to_all      dist.all_to_all_single, B in, B out
Each collective runs once on a deterministic input and its output is checked
against the exact expected values (small integers: any summation order gives
them), then --warmup untimed and --iters timed calls. A timed call starts
after a barrier; its time is the longest any rank took (as bench_comm_local
times until every rank thread is done), and the figure is the median over
the timed calls.

Prints "torch <version> gloo", then per collective "checked <op> <ranks>"
and "time <op> <ranks> <seconds>", or "unsupported <op> <ranks> <why>" when
this torch's gloo refuses it (an older torch has no reduce_scatter on gloo).
Exits 1 with "check failed: ..." when a result is wrong, 3 (saying why on
stderr) when torch or its gloo backend is missing.
"""
import argparse
import datetime
import os
import shutil
import statistics
import sys
import tempfile

OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")


# The input of rank r at element j of block b (blocks are chunk elements
# long) is rank + 1 + 100 b + 10000 (j % 5): the formula of bench_comm_local's
# input_value(). Every value and every sum over up to 64 ranks stays below
# 2^24, so each is an exact f32 whatever order the ranks are summed in.
def blocks(torch, n, chunk, base, step):
    """n elements; element j of block b (the last block maybe shorter) is
    base(b) + step * (j % 5)."""
    period = (torch.arange(chunk, dtype=torch.int32) % 5).to(torch.float32) * float(step)
    out = torch.empty(n, dtype=torch.float32)
    for b in range((n + chunk - 1) // chunk):
        lo = b * chunk
        hi = min(n, lo + chunk)
        out[lo:hi] = period[: hi - lo] + float(base(b))
    return out


def inputs(torch, n, chunk, rank):
    return blocks(torch, n, chunk, lambda b: rank + 1 + 100 * b, 10000)


def sums(torch, n, chunk, world, block_of):
    """The sum over the ranks' inputs at block block_of(b), element j."""
    return blocks(torch, n, chunk, lambda b: world * (world + 1) // 2 + world * 100 * block_of(b), world * 10000)


class CheckFailed(Exception):
    pass


def check(torch, op, rank, got, want):
    if torch.equal(got, want):
        return
    bad = int((got != want).nonzero()[0])
    raise CheckFailed(f"check failed: {op}, rank {rank}: element {bad} is {float(got[bad]):g} "
                     f"where {float(want[bad]):g} was expected")


def setups(torch, dist, rank, world, count):
    """Per collective: (inputs made, the call, the output, its expected
    values), built one at a time so that only one collective's tensors are
    alive at once."""
    chunk = count // world
    mine = lambda n: inputs(torch, n, chunk, rank)

    def all_reduce():
        buf = mine(count)
        want = sums(torch, count, chunk, world, lambda b: b)
        return (lambda: dist.all_reduce(buf)), buf, want

    def reduce_scatter():
        send = mine(chunk * world)
        recv = torch.zeros(chunk, dtype=torch.float32)
        want = sums(torch, chunk, chunk, world, lambda b: rank)
        return (lambda: dist.reduce_scatter_tensor(recv, send)), recv, want

    def all_gather():
        recv = mine(chunk * world)
        send = recv[rank * chunk:(rank + 1) * chunk]
        want = blocks(torch, chunk * world, chunk, lambda b: b + 1 + 100 * b, 10000)  # block b from rank b
        return (lambda: dist.all_gather_into_tensor(recv, send)), recv, want

    def all_to_all():
        send = mine(chunk * world)
        recv = torch.zeros(chunk * world, dtype=torch.float32)
        want = blocks(torch, chunk * world, chunk, lambda b: b + 1 + 100 * rank, 10000)  # rank b's block for us
        return (lambda: dist.all_to_all_single(recv, send)), recv, want

    return dict(all_reduce=all_reduce, reduce_scatter=reduce_scatter, all_gather=all_gather,
                all_to_all=all_to_all)


def rank_main(rank, world, store_path, count, iters, warmup, results):
    import time

    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    try:
        made = setups(torch, dist, rank, world, count)
        for op in OPS:
            call, out, want = made[op]()
            try:
                call()
            except RuntimeError as e:  # refused before any rank sends: every rank takes this path
                if "does not support" not in str(e) and "no support for" not in str(e):
                    raise
                if rank == 0:
                    results.put(("unsupported", op, str(e).splitlines()[0]))
                continue
            check(torch, op, rank, out, want)
            del want
            times = []
            for i in range(warmup + iters):
                dist.barrier()
                t0 = time.perf_counter()
                call()
                t1 = time.perf_counter()
                if i >= warmup:
                    times.append(t1 - t0)
            slowest = torch.tensor(times, dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            if rank == 0:
                results.put(("time", op, statistics.median(slowest.tolist())))
            del call, out
    finally:
        dist.destroy_process_group()


def import_gloo():
    """torch, after printing "torch <version> gloo"; or None, after saying
    on stderr why torch or its gloo backend cannot be had (the benches print
    that line as why gloo is not available). bench/comm_mpi's
    torch_gloo_nodes.py uses it too."""
    try:
        import torch
        import torch.distributed as dist
    except Exception as e:  # ImportError, or a broken install
        print(f"cannot import torch: {type(e).__name__}: {e}", file=sys.stderr)
        return None
    if not dist.is_available() or not dist.is_gloo_available():
        print(f"torch {torch.__version__} has no gloo backend", file=sys.stderr)
        return None
    print(f"torch {torch.__version__} gloo", flush=True)
    return torch


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    torch = import_gloo()
    if torch is None:
        return 3
    import torch.multiprocessing as mp
    count = (args.mib << 20) // 4
    folder = tempfile.mkdtemp(prefix="torch_gloo.")
    try:
        # fork: the children share the imported torch instead of importing
        # it again (seconds each on a small machine); no thread has started.
        ctx = mp.get_context("fork")
        results = ctx.SimpleQueue()
        try:
            mp.start_processes(rank_main, nprocs=args.ranks, start_method="fork",
                               args=(args.ranks, os.path.join(folder, "store"), count, args.iters,
                                     args.warmup, results))
        except mp.ProcessExitedException as e:
            print(f"a rank failed: {e}", file=sys.stderr)
            return 1
        except mp.ProcessRaisedException as e:
            lines = str(e).strip().splitlines()
            why = [line for line in lines if "check failed" in line]
            print(why[-1].split(": ", 1)[-1] if why else f"a rank failed: {lines[-1]}", file=sys.stderr)
            return 1
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    while not results.empty():
        kind, op, what = results.get()
        if kind == "time":
            print(f"checked {op} {args.ranks}")
            print(f"time {op} {args.ranks} {what:.6g}")
        else:
            print(f"unsupported {op} {args.ranks} {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
