"""Step inflation (issue 33): how much longer one optimizer step takes with
the state offloaded than plain PyTorch's without, by tokens per step. A
1.3B GPT (24 x 2048), sequences of 2048, bf16 autocast, every block
checkpointed, clipping 1.0, AdamW; micro-batches of 4 x 2048 = 8k tokens,
accumulated 1, 2 and 8 times for 8k, 16k and 64k tokens per step (the same
micro-batch and accumulation in every row of a size). Rows: plain PyTorch
(no offload), zerod and DeepSpeed ZeRO-3 with the optimizer on the host,
and with the parameters there too; each a fresh process.

Targets (issue 33): <= 1.3x plain PyTorch at 64k tokens per step, <= 2.5x
at 16k, <= 0.5x DeepSpeed's step everywhere. A ratio sets two rows whose
loss stayed finite and fell (step.py's ok) against each other; where either
is not ok the row says "not ok: no ratio" and no target is met or missed.
Under each zerod row, its
timeline of steps 3-4 summed up (trace_summary.exposed: the time the
trainer spent in zerod's calls, by call and by what they waited for inside,
and the CPU update's rate in parameters and bytes a second, to set beside
run.sh hostbw's STREAM figures); --no-trace leaves it out. A traced row's
step time leaves out step 4, inside which zerod writes the trace (step.py's
timed_steps: with --steps 4, step 3 alone).

    python3 bench/gpu/offload.py [--sizes 8k,16k,64k] [--modes torch,zerod3_host,...] [--steps 5]
                                 [--budget 480] [--timeout 240] [--no-deepspeed] [--no-trace]
                                 [--zerod-args=--accumulate=host] [--rows-err FILE] [--ds-ready FILE]

Each row's stderr is appended to --rows-err (default: $OUT/rows.err where
OUT is set, as on the device tool; else nowhere). A row is not started with
less of the budget left than it needs (min_row_s: 30 s, 45 s at 1B
parameters and up), and named as skipped. --ds-ready: a file run.sh's
background build of DeepSpeed's CPU Adam writes as it ends ("EXIT
SECONDS"); the first DeepSpeed row waits for it (the rows before it do not,
and a row that ran while it compiled says so in its note: the two shared
the CPU), at most until the budget would leave it too little.
"""
import argparse
import json
import os
import shlex
import tempfile
import time

from common import fmt_params, run
from trace_summary import exposed

MODES = ["torch", "zerod3_host", "zerod3_params", "ds3_host", "ds3_params"]
PEER = {"zerod3_host": "ds3_host", "zerod3_host_bf16": "ds3_host", "zerod3_params": "ds3_params",
        "zerod3_nvme_opt": "ds3_nvme_opt", "zerod3_nvme": "ds3_nvme"}
TARGET_X_TORCH = {64 * 1024: 1.3, 16 * 1024: 2.5}
TARGET_X_DS = 0.5
# Not worth starting a row with less left than this: its setup (a fresh
# process, torch, the model built and placed) alone takes about 30 s, and a
# 1.3B row (24 x 2048) took 40-90 s in all on the H100 and H200: one begun
# with 31 s left is killed before its timed steps and measures nothing.
MIN_ROW_S = 30
MIN_ROW_S_1B = 45
VOCAB = 50304  # model.Config's (not imported: model.py imports torch)


def min_row_s(layers, embd):
    """The least time left worth starting a row of this GPT in (model.py's
    params ~= 12 * n_layer * n_embd^2 + vocab * n_embd)."""
    return MIN_ROW_S_1B if 12 * layers * embd ** 2 + VOCAB * embd >= 1e9 else MIN_ROW_S


def wait_for_ds_build(ready, until):
    """Waits for run.sh's DeepSpeed build to end (its file `ready`), at most
    until time `until`; says how it ended and how long this waited."""
    start = time.time()
    while not os.path.exists(ready) and time.time() < until:
        time.sleep(0.5)
    waited = time.time() - start
    try:
        with open(ready) as f:
            rc, secs = f.read().split()[:2]
    except (OSError, ValueError):
        return f"DeepSpeed's CPU Adam build: not ended (offload waited {waited:.0f} s for it)"
    return f"DeepSpeed's CPU Adam build: exit {rc} after {secs} s (offload waited {waited:.0f} s for it)"


def tokens(size):
    s = size.strip().lower()
    return int(s[:-1]) * 1024 if s.endswith("k") else int(s)


def label(n):
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def ratio(row, peer):
    """row's step time over peer's: None where either has none, False where
    either is not ok (its loss NaN or not falling, step.py's ok): a broken
    run's time is no figure to set a target against."""
    ms, peer_ms = row.get("step_ms"), (peer or {}).get("step_ms")
    if not (ms and peer_ms):
        return None
    if not (row.get("ok") and peer.get("ok")):
        return False
    return ms / peer_ms


def table(size, gas, a, rows):
    target_t = TARGET_X_TORCH.get(size)
    params = next((r["params"] for r in rows.values() if "params" in r), None)
    print(f"\n{label(size)} tokens per step ({a.micro} x {a.seq} x {gas} micro-batches), "
          f"GPT {a.layers} x {a.embd} ({fmt_params(params) if params else '?'} parameters), "
          f"{a.steps} steps, bf16, checkpointed blocks; targets: "
          f"{f'<= {target_t}x torch, ' if target_t else ''}<= {TARGET_X_DS}x DeepSpeed")
    print(f"{'mode':<17} {'ok':<4} {'step ms':>9} {'x torch':>8} {'x DeepSpeed':>12} {'tok/s':>8} "
          f"{'dev GiB':>8} {'host B/param':>13}  targets / note")
    nan = float("nan")
    for m, r in rows.items():
        ms = r.get("step_ms")
        x_torch, x_ds = ratio(r, rows.get("torch")), ratio(r, rows.get(PEER.get(m)))
        host = r.get("zerod_host_bytes_per_param") or (
            r["host_gib_over_start"] * 2**30 / r["params"] if r.get("host_gib_over_start") is not None else None)
        dev = r.get("device_peak_gib")
        if dev is not None and r.get("zerod_device_peak_gib") is not None:
            dev += r["zerod_device_peak_gib"]
        met = []
        if m.startswith("zerod"):
            if target_t and x_torch:
                met.append(f"x torch {'met' if x_torch <= target_t else 'MISSED'}")
            if x_ds:
                met.append(f"x DeepSpeed {'met' if x_ds <= TARGET_X_DS else 'MISSED'}")
        if x_torch is False or x_ds is False:
            met.append("not ok: no ratio")
        said = "; ".join(r[k] for k in ("error", "note") if r.get(k))
        print(f"{m:<17} {('yes' if r.get('ok') else 'NO'):<4} {ms or nan:>9.1f} {x_torch or nan:>8.2f} "
              f"{x_ds or nan:>12.2f} {r.get('tokens_per_s', 0):>8} {nan if dev is None else dev:>8.2f} "
              f"{host or nan:>13.1f}  {', '.join(met)}{'; ' if met and said else ''}{said}")
        if r.get("exposed"):
            print(f"    {r['exposed']}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--embd", type=int, default=2048)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--micro", type=int, default=4, help="sequences per micro-batch")
    ap.add_argument("--sizes", default="8k,16k,64k", help="tokens per optimizer step, in the order run")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--steps", type=int, default=5, help="optimizer steps per row (the median of those after "
                                                         "the first 2 is the step time; a traced zerod row "
                                                         "leaves out step 4, which writes the trace)")
    ap.add_argument("--no-deepspeed", action="store_true")
    ap.add_argument("--no-trace", action="store_true", help="no timeline summary under the zerod rows")
    ap.add_argument("--zerod-args", default="", help="more step.py options for the zerod rows, "
                                                    "e.g. '--accumulate host'")
    ap.add_argument("--timeout", type=int, default=240, help="seconds for one row")
    ap.add_argument("--budget", type=int, help="seconds for the whole run: rows that would start later are "
                                               "skipped")
    ap.add_argument("--rows-err", default=os.path.join(os.environ["OUT"], "rows.err") if os.environ.get("OUT")
                    else None, help="a file each row's stderr is appended to")
    ap.add_argument("--ds-ready", help="a file written as DeepSpeed's CPU Adam build ends (run.sh's, in the "
                                       "background): the first DeepSpeed row waits for it")
    a = ap.parse_args()
    modes = [m for m in a.modes.split(",") if not (a.no_deepspeed and m.startswith("ds"))]
    sizes = []
    for s in a.sizes.split(","):
        n, per_micro = tokens(s), a.micro * a.seq
        if n % per_micro:
            ap.error(f"--sizes {s}: {n} tokens is not a whole number of micro-batches of {a.micro} x {a.seq}")
        sizes.append((n, n // per_micro))
    start = time.time()
    min_row = min_row_s(a.layers, a.embd)
    # Where there is no budget, a row has its --timeout and the wait for
    # DeepSpeed's build as long.
    end = start + a.budget if a.budget is not None else None
    ds_waited = not a.ds_ready
    results, skipped = {}, []
    for n, gas in sizes:
        results[n] = {}
        for m in modes:  # each row as it comes, so a run cut short still says what it measured
            if m.startswith("ds") and not ds_waited:
                until = end if end is not None else time.time() + a.timeout
                print(wait_for_ds_build(a.ds_ready, until - min_row), flush=True)
                ds_waited = True
            left = end - time.time() if end is not None else a.timeout
            if left < min_row:
                skipped.append(f"{m} at {label(n)}")
                continue
            extra = ["--seq", str(a.seq), "--micro", str(a.micro), "--gas", str(gas), "--ckpt"]
            trace = None
            if m.startswith("zerod"):
                extra += shlex.split(a.zerod_args)
                if not a.no_trace and a.steps >= 4:  # step.py traces steps 3-4
                    fd, trace = tempfile.mkstemp(prefix="zerod-offload-", suffix=".json")
                    os.close(fd)
                    extra += ["--trace", trace]
            # DeepSpeed's build compiles on while the rows before its own
            # run: such a row shares the CPU (its host update) with it.
            beside_build = bool(a.ds_ready) and not os.path.exists(a.ds_ready)
            r = run(m, a.layers, a.embd, a.steps, min(a.timeout, left), extra, log=a.rows_err)
            if beside_build:
                r["note"] = "ran beside DeepSpeed's CPU Adam build"
            if trace:
                if r.get("ok") and os.path.getsize(trace):
                    # bf16 m and v: 2 bytes less each, each way.
                    bf16 = "bf16" in m or "state-dtype" in a.zerod_args
                    try:
                        r["exposed"] = exposed(trace, update_bytes=20 if bf16 else 28)
                    except Exception as e:  # a malformed trace costs its line, not the rows after it
                        r["exposed"] = f"trace: not summarised ({type(e).__name__}: {e})"
                os.remove(trace)
            r.setdefault("tokens_per_step", n)
            results[n][m] = r
            print(json.dumps(r), flush=True)
    for n, gas in sizes:
        if results[n]:
            try:
                table(n, gas, a, results[n])
            except Exception as e:  # one odd row costs its table, not the others (the JSON lines above hold it)
                print(f"\n{label(n)} tokens per step: no table ({type(e).__name__}: {e})")
    peers = ", ".join(f"{z} over {d}" for z, d in PEER.items() if z in modes and d in modes)
    print(f"\nx DeepSpeed: over DeepSpeed's row with the same placement ({peers or 'none run'}). dev GiB: "
          "torch's allocator peak, plus zerod's own device peak on zerod rows. host B/param: zerod's host-tier "
          "ledger (state it holds), else the process's peak RSS growth over its start, over the parameters")
    if skipped:
        of = f"the {a.budget} s budget" if a.budget is not None else f"the row's --timeout of {a.timeout} s"
        print(f"skipped, under {min_row} s left of {of}: {', '.join(skipped)}")


if __name__ == "__main__":
    main()
