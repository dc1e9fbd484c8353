#!/usr/bin/python3
"""torch.distributed with the gloo backend between nodes (what DeepSpeed's
comm runs on between CPU machines), on what bench_comm_mpi measures, for it
to compare with.

One process per node: bench_comm_mpi starts this script on every node with
--node (the rank) and --nodes (the world size), after node 0 has picked
--master ADDR:PORT and sent it to the others over MPI; node 0 hosts the
rendezvous (torch's TCPStore) there. GLOO_SOCKET_IFNAME, which the bench
sets, names the interface gloo's own connections use.

On f32 buffers of each --mib size (B per node, as bench_comm_mpi's B per
rank): dist.all_reduce in place, once on deterministic inputs (those of
bench/comm_local/torch_gloo.py, with chunk = B / 4 / nodes elements) whose
sums every node checks against the exact expected values, then 2 untimed
and --iters timed calls back to back; node 0's median is the figure (as
bench_comm_mpi times its own calls on node 0). Then the latency of a
1-element all_reduce (checked once) and of a barrier: 10 batches of 200
calls, the first dropped, the median time per call.

Prints "torch <version> gloo"; per size "checked all_reduce <mib>" and, on
node 0, "time all_reduce <mib> <seconds>"; on node 0 "latency all_reduce
<seconds>" and "latency barrier <seconds>". A wrong result on any node ends
every node's run with exit status 1 and "check failed on node K: ..." as its
last line; exit status 3 (saying why on stderr) when torch or its gloo
backend is missing.
"""
import argparse
import datetime
import os
import statistics
import sys
import time

# The inputs, expected sums, check and torch import of the one-node peer.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "comm_local"))
from torch_gloo import CheckFailed, check, import_gloo, inputs, sums  # noqa: E402

WARMUP = 2  # bench_comm_mpi's warm-up calls per size
BATCHES = 10  # latency: the first batch is dropped
CALLS = 200


def agree_checked(torch, dist, what, node, got, want):
    """Checks this node's result, then agrees with the others so that every
    node stops when any node's result is wrong (one alone would leave the
    others waiting in their next call)."""
    why = None
    try:
        check(torch, what, node, got, want)
    except CheckFailed as e:
        why = str(e)
        print(why, file=sys.stderr, flush=True)
    worst = torch.tensor([0.0 if why is None else float(node + 1)])
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    if worst.item() > 0:
        raise CheckFailed(f"check failed on node {int(worst.item()) - 1}: {what}")


def median_call(call, warmup, iters):
    times = []
    for i in range(warmup + iters):
        t0 = time.perf_counter()
        call()
        t1 = time.perf_counter()
        if i >= warmup:
            times.append(t1 - t0)
    return statistics.median(times)


def all_reduce_sizes(torch, dist, node, nodes, mibs, iters):
    for mib in mibs:
        count = (mib << 20) // 4
        chunk = count // nodes
        buf = inputs(torch, count, chunk, node)
        want = sums(torch, count, chunk, nodes, lambda b: b)
        dist.all_reduce(buf)
        agree_checked(torch, dist, f"all_reduce of {mib} MiB", node, buf, want)
        del want
        print(f"checked all_reduce {mib}", flush=True)
        seconds = median_call(lambda: dist.all_reduce(buf), WARMUP, iters)
        if node == 0:
            print(f"time all_reduce {mib} {seconds:.6g}", flush=True)
        del buf


def latency(torch, dist, node, nodes):
    one = torch.tensor([float(node + 1)])
    dist.all_reduce(one)
    agree_checked(torch, dist, "all_reduce of 1 f32", node, one, torch.tensor([float(nodes * (nodes + 1) // 2)]))
    one.zero_()  # sums of zeros stay zero however many calls run
    for name, call in (("all_reduce", lambda: dist.all_reduce(one)), ("barrier", dist.barrier)):
        per_call = []
        for batch in range(BATCHES):
            t0 = time.perf_counter()
            for _ in range(CALLS):
                call()
            if batch > 0:
                per_call.append((time.perf_counter() - t0) / CALLS)
        if node == 0:
            print(f"latency {name} {statistics.median(per_call):.6g}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--node", type=int, required=True)
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--master", required=True, help="node 0's ADDR:PORT for the rendezvous")
    ap.add_argument("--mib", default="1,4,16,64", help="sizes, MiB, comma-separated")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=60, help="seconds to wait for the other nodes")
    args = ap.parse_args()
    torch = import_gloo()
    if torch is None:
        return 3
    import torch.distributed as dist
    try:
        dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=args.node, world_size=args.nodes,
                                timeout=datetime.timedelta(seconds=args.timeout))
    except Exception as e:  # a node that never came (its own line says why), an address gloo cannot use
        print(f"rendezvous at {args.master} failed: {type(e).__name__}: {str(e).strip().splitlines()[0]}",
              file=sys.stderr)
        return 1
    try:
        all_reduce_sizes(torch, dist, args.node, args.nodes, [int(m) for m in args.mib.split(",")], args.iters)
        latency(torch, dist, args.node, args.nodes)
    except CheckFailed as e:
        print(e, file=sys.stderr)
        return 1
    except RuntimeError as e:  # gloo's: a peer gone, a connection refused
        print(f"gloo failed: {str(e).strip().splitlines()[0]}", file=sys.stderr)
        return 1
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
