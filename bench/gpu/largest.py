"""The largest GPT that trains on one GPU (3 steps, loss finite and
falling), by mode: plain PyTorch AdamW, zerod stage 3 with the optimizer on
the host (fp32 and bf16 state), with the parameters on the host too, and
with the optimizer on NVMe; DeepSpeed ZeRO-3 with the optimizer on the host.
Micro-batches of one sequence of 1024 tokens, every block checkpointed, so
that activations do not decide it. Layers grow at a fixed width until a run
fails, then bisection; each try is a fresh process. After the first size
that trains, the next try jumps to 90% of what that run's bytes per
parameter say the machine holds (GPU memory, host RAM, disk), then grows by
a quarter; no zerod try grows past what host RAM and disk hold at zerod's
figures (host bytes at their peak, beside the trainer's own memory).

Prints the largest that trained and the first that did not, with why, its
ratio to plain PyTorch's and to DeepSpeed's, and beside each zerod row the
machine's limit at that row's own bytes per parameter (host RAM over zerod's
host bytes per parameter; for NVMe rows also the disk's free space over its
NVMe bytes per parameter, whichever is smaller) and the share of it reached.

    python3 bench/gpu/largest.py [--embd 4096] [--modes torch,zerod3_host,...] [--budget 1200] [--timeout 420]
                                 [--rows-err FILE]

Each try's stderr is appended to --rows-err (default: $OUT/rows.err where
OUT is set, as under run.sh; else nowhere), as offload.py's rows' are.
"""
import argparse
import math
import os
import shutil
import time

from common import NVME, fmt_params, run
from model import Config, n_params

MODES = "torch,zerod3_host,zerod3_params,zerod3_nvme_opt,zerod3_host_bf16,ds3_host"
SEQ = 1024
STEP_ARGS = ["--micro", "1", "--seq", str(SEQ), "--ckpt"]
# Not worth starting a try with less left than this: setup alone takes longer.
MIN_TRY_S = 30


def host_ram():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


def limit(r, ram, disk):
    """(parameters, which) the machine holds at zerod's bytes per parameter
    in run r: host RAM, and disk for a row with state on NVMe."""
    found = []
    if r.get("zerod_host_bytes_per_param"):
        found.append((ram / r["zerod_host_bytes_per_param"], "host RAM"))
    if r.get("zerod_nvme_bytes_per_param"):
        found.append((disk / r["zerod_nvme_bytes_per_param"], "disk"))
    return min(found) if found else (None, None)


# The share of host RAM a try may give zerod's state: the kernel and the
# trainer's own memory (torch, CUDA's context: a few GiB, not per
# parameter) hold the rest.
RAM_SHARE = 0.95


def host_capacity(r, ram):
    """The parameters whose zerod host state fits in RAM at its highest, at
    run r's figures; None for a row without them. At its highest: the
    ledger's peak where the row has it, else its steady figure, which is
    finalize's too (finalize drops the registered initial values before it
    allocates the gradients and the optimizer state: docs/offload.md). Beside
    it the trainer's own memory: RAM_SHARE leaves room for it, or the room r
    measured it took (its peak RSS less zerod's host bytes), where larger."""
    steady = r.get("zerod_host_bytes_per_param")
    if not steady:
        return None
    peak = max(steady, r.get("zerod_host_peak_bytes_per_param") or 0)
    other = ((r.get("host_peak_gib") or 0) - (r.get("zerod_host_gib") or 0)) * 2**30
    if other + peak * r["params"] > ram:
        other = 0  # a stand-in RAM (--ram-gib) smaller than what r held: not a measure of it
    return min(RAM_SHARE * ram, ram - other) / peak


def capacity(r, ram, disk):
    """The parameters the machine holds at run r's zerod figures: host RAM
    (host_capacity) and, for a row with state on NVMe, the disk; None for a
    row without them."""
    found = [host_capacity(r, ram)]
    if r.get("zerod_nvme_bytes_per_param"):
        found.append(disk / r["zerod_nvme_bytes_per_param"])
    return min((g for g in found if g is not None), default=None)


def ceiling(r, embd, ram, disk):
    """The most layers a try may have after run r trained: no try is grown
    past the machine's limit, where it would be killed for memory after
    minutes (None: r has no zerod figures to say where that is)."""
    most = capacity(r, ram, disk)
    return None if most is None else layers_for(most, embd)


def predicted(r, ram, disk):
    """The parameters that would fill the first of GPU memory, host RAM
    or disk at run r's bytes per parameter (an estimate: fixed costs count
    as per-parameter ones, so small runs guess low; zerod's host RAM and
    disk at their peak, beside the trainer's own: capacity)."""
    p = r["params"]
    guesses = [capacity(r, ram, disk)]
    dev = (r.get("device_peak_gib") or 0) + (r.get("zerod_device_peak_gib") or 0)
    if dev and r.get("device_total_gib"):
        guesses.append(p * r["device_total_gib"] / dev)
    if not r["mode"].startswith("zerod") and r.get("host_gib_over_start"):
        guesses.append(p * ram / 2**30 / r["host_gib_over_start"])
    return min((g for g in guesses if g), default=None)


def params_of(layers, embd):
    return n_params(Config(n_layer=layers, n_embd=embd, block_size=SEQ))


def layers_for(params, embd):
    per_layer = params_of(2, embd) - params_of(1, embd)
    return max(1, math.floor((params - params_of(0, embd)) / per_layer))


def search(mode, a, deadline, ram, disk):
    """(largest run that trained, first that did not, why it stopped early
    or None)."""
    ok = bad = None
    layers, grow = 2, 2.0
    while True:
        left = deadline - time.time()
        if left < MIN_TRY_S:
            return ok, bad, "its share of the budget spent"
        r = run(mode, layers, a.embd, 3, min(a.timeout, left), STEP_ARGS, log=a.rows_err)
        cut = left < a.timeout and r.get("error", "").startswith("over ")
        print(f"  {mode}: {layers} layers ({fmt_params(params_of(layers, a.embd))}): "
              f"{'trains' if r.get('ok') else 'fails: ' + r.get('error', 'loss did not fall')}"
              f"{' (cut by the budget)' if cut else ''}", flush=True)
        if cut:
            return ok, bad, "its share of the budget spent"
        if r.get("ok"):
            first = ok is None
            ok = r
            guess = predicted(r, ram, disk) if first else None
            if guess and layers_for(0.9 * guess, a.embd) > layers * grow:
                layers, grow = layers_for(0.9 * guess, a.embd), 1.25
                continue
        else:
            bad = r
        if bad is None:
            layers = max(layers + 1, math.ceil(layers * grow))
            top = ceiling(ok, a.embd, ram, disk)
            if top is not None and layers > top:
                if ok["layers"] >= top:
                    return ok, bad, "the next size is over the machine's limit"
                layers = top
        elif ok and bad["layers"] - ok["layers"] > max(1, ok["layers"] // 8):
            layers = (ok["layers"] + bad["layers"]) // 2
        else:
            return ok, bad, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--embd", type=int, default=4096)
    ap.add_argument("--modes", default=MODES, help="also: zerod0, zerod3, zerod3_nvme, ds3_params, ...")
    ap.add_argument("--budget", type=int, default=1200, help="seconds for the whole search: each mode gets an "
                                                             "equal share of what is left when it starts")
    ap.add_argument("--timeout", type=int, default=420, help="seconds for one try")
    ap.add_argument("--rows-err", default=os.path.join(os.environ["OUT"], "rows.err") if os.environ.get("OUT")
                    else None, help="a file each try's stderr is appended to")
    # The host RAM to assume instead of MemTotal: the drivers' smoke test on
    # the CPU, where nothing but RAM would stop the search.
    ap.add_argument("--ram-gib", type=float, help=argparse.SUPPRESS)
    a = ap.parse_args()
    modes = a.modes.split(",")
    ram = a.ram_gib * 2**30 if a.ram_gib else host_ram()
    os.makedirs(NVME, exist_ok=True)
    disk = shutil.disk_usage(NVME).free
    shutil.rmtree(NVME, ignore_errors=True)
    print(f"host RAM {ram / 2**30:.0f} GiB, free disk at {NVME} {disk / 2**30:.0f} GiB; "
          f"{a.budget} s for {len(modes)} modes", flush=True)
    results = {}
    start = time.time()
    for i, m in enumerate(modes):
        share = (a.budget - (time.time() - start)) / (len(modes) - i)
        results[m] = search(m, a, time.time() + share, ram, disk)
    base = (results.get("torch") or (None,))[0]
    ds = (results.get("ds3_host") or (None,))[0]
    nan = float("nan")
    print(f"\nlargest GPT (width {a.embd}, micro-batch 1 x {SEQ}, checkpointed blocks) that trains 3 steps on "
          f"this GPU; host RAM {ram / 2**30:.0f} GiB, free disk {disk / 2**30:.0f} GiB")
    print(f"{'mode':<17} {'largest':>9} {'x torch':>8} {'x DeepSpeed':>12} {'step ms':>9} {'host B/param':>13} "
          f"{'disk B/param':>13} {'machine limit':>23} {'reached':>8}  first failure")
    for m, (ok, bad, stopped) in results.items():
        n = ok["params"] if ok else 0
        lim, which = limit(ok, ram, disk) if ok else (None, None)
        why = (f"{fmt_params(params_of(bad['layers'], a.embd))}: {bad.get('error', 'loss did not fall')}"
               if bad else "none")
        if stopped:
            why += f" (stopped: {stopped})"
        print(f"{m:<17} {fmt_params(n) if n else 'none':>9} {n / base['params'] if n and base else nan:>8.1f} "
              f"{n / ds['params'] if n and ds and m.startswith('zerod') else nan:>12.2f} "
              f"{ok.get('step_ms', nan) if ok else nan:>9.1f} "
              f"{(ok or {}).get('zerod_host_bytes_per_param', nan):>13.1f} "
              f"{(ok or {}).get('zerod_nvme_bytes_per_param', nan):>13.1f} "
              f"{(fmt_params(lim) + ' (' + which + ')') if lim else '-':>23} "
              f"{f'{100 * n / lim:.0f}%' if lim else '-':>8}  {why}")
    print("\nmachine limit: host RAM (MemTotal) over zerod's host bytes per parameter (its host-tier ledger), "
          "for NVMe rows also the free disk over its NVMe bytes per parameter, the smaller; reached: the largest "
          "over it")


if __name__ == "__main__":
    main()
