"""The same 1-2B GPT, the same batches, on one GPU: plain PyTorch (no
offload), zerod and DeepSpeed with the optimizer offloaded to the host (and
with the parameters too), side by side in one run. Prints step time, each
as a ratio to plain PyTorch and zerod's to DeepSpeed's, tokens/s, peak
device memory and host bytes per parameter.

Anchors (issue 11): DeepSpeed ZeRO-Offload on one GPU 2.46x, torchao 1.20x;
zerod's target <= 1.3x. Host bytes per parameter: DeepSpeed users report 28;
zerod's target <= 16.5 with fp32 optimizer state.

    python3 bench/gpu/offload.py [--layers 24 --embd 2048] [--steps 12] [--no-deepspeed]
"""
import argparse
import json

from common import fmt_params, run

MODES = ["torch", "zerod3_host", "ds3_host", "zerod3_params", "ds3_params"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--embd", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--no-deepspeed", action="store_true")
    ap.add_argument("--timeout", type=int, default=600)
    a = ap.parse_args()
    modes = [m for m in MODES if not (a.no_deepspeed and m.startswith("ds"))]
    rows = {}
    for m in modes:  # each row as it comes, so a run cut short still says what it measured
        rows[m] = run(m, a.layers, a.embd, a.steps, a.timeout)
        print(json.dumps(rows[m]), flush=True)
    base = rows["torch"].get("step_ms")
    print(f"GPT {a.layers} layers x {a.embd}: {fmt_params(rows['torch']['params'])} parameters, "
          f"{a.steps} steps, bf16 compute, AdamW\n")
    print(f"{'mode':<15} {'ok':<4} {'step ms':>9} {'x torch':>8} {'x DeepSpeed':>12} {'tok/s':>8} "
          f"{'dev GiB':>8} {'host B/param':>13}  note")
    for m, r in rows.items():
        ms = r.get("step_ms")
        peer = {"zerod3_host": "ds3_host", "zerod3_params": "ds3_params"}.get(m)
        vs_ds = ms / rows[peer]["step_ms"] if ms and peer in rows and rows[peer].get("step_ms") else None
        host = r.get("zerod_host_bytes_per_param") or (
            r["host_gib_over_start"] * 2**30 / r["params"] if r.get("host_gib_over_start") is not None else None)
        print(f"{m:<15} {('yes' if r.get('ok') else 'NO'):<4} {ms or float('nan'):>9.1f} "
              f"{(ms / base if ms and base else float('nan')):>8.2f} {vs_ds if vs_ds else float('nan'):>12.2f} "
              f"{r.get('tokens_per_s', 0):>8} {r.get('device_peak_gib', float('nan')):>8.2f} "
              f"{host if host else float('nan'):>13.1f}  {r.get('error', '')}")
    print("\nhost B/param: zerod's host-tier ledger (state it holds) where available, else the process's peak RSS "
          "growth over its start, divided by the parameters")


if __name__ == "__main__":
    main()
