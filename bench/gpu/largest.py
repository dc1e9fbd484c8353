"""The largest GPT that trains on one GPU (3 steps, loss finite and
falling), by mode: plain PyTorch AdamW, zerod stage 0, zerod stage 3 with
the optimizer on the host, and with the parameters on the host (and NVMe).
Layers grow at a fixed width (doubling, then bisection) until a run fails;
each try is a fresh process. Prints the largest that trained and the first
that did not, with why, and the ratio to plain PyTorch's; the host-memory
limit (host RAM / host bytes per parameter) beside zerod's offload rows.

    python3 bench/gpu/largest.py [--embd 4096] [--modes torch,zerod0,zerod3_host,zerod3_params] [--budget 1200]
"""
import argparse
import os
import time

from common import fmt_params, run


def search(mode, embd, deadline, timeout):
    ok, bad, layers = None, None, 2
    while time.time() < deadline:  # doubling
        r = run(mode, layers, embd, 3, timeout)
        print(f"  {mode}: {layers} layers ({fmt_params(r['params'])}): "
              f"{'trains' if r.get('ok') else 'fails: ' + r.get('error', 'loss did not fall')}", flush=True)
        if r.get("ok"):
            ok, layers = r, layers * 2
        else:
            bad = r
            break
    while ok and bad and bad["layers"] - ok["layers"] > max(1, ok["layers"] // 8) and time.time() < deadline:
        mid = (ok["layers"] + bad["layers"]) // 2
        r = run(mode, mid, embd, 3, timeout)
        print(f"  {mode}: {mid} layers ({fmt_params(r['params'])}): "
              f"{'trains' if r.get('ok') else 'fails: ' + r.get('error', 'loss did not fall')}", flush=True)
        if r.get("ok"):
            ok = r
        else:
            bad = r
    return ok, bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--embd", type=int, default=4096)
    ap.add_argument("--modes", default="torch,zerod0,zerod3_host,zerod3_params")
    ap.add_argument("--budget", type=int, default=1200, help="seconds for the whole search")
    ap.add_argument("--timeout", type=int, default=420, help="seconds for one try")
    a = ap.parse_args()
    modes = a.modes.split(",")
    host_ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    results = {}
    start = time.time()
    for i, m in enumerate(modes):
        deadline = start + a.budget * (i + 1) / len(modes)
        results[m] = search(m, a.embd, deadline, a.timeout)
    base = results.get("torch", (None, None))[0]
    print(f"\nlargest GPT (width {a.embd}) that trains 3 steps on this GPU; host RAM {host_ram / 2**30:.0f} GiB")
    print(f"{'mode':<15} {'largest':>9} {'x torch':>8} {'step ms':>9} {'host B/param':>13} {'host limit':>11}  first failure")
    for m, (ok, bad) in results.items():
        n = ok["params"] if ok else 0
        bpp = ok.get("zerod_host_bytes_per_param") if ok else None
        limit = fmt_params(host_ram / bpp) if bpp else "-"
        print(f"{m:<15} {fmt_params(n) if n else 'none':>9} "
              f"{(n / base['params'] if n and base else float('nan')):>8.1f} {ok.get('step_ms', float('nan')) if ok else float('nan'):>9.1f} "
              f"{bpp if bpp else float('nan'):>13.1f} {limit:>11}  "
              f"{(fmt_params(bad['params']) + ': ' + bad.get('error', '')) if bad else 'none within the budget'}")


if __name__ == "__main__":
    main()
