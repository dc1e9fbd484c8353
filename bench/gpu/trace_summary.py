"""Where a traced zerod step's time went: the total duration of each kind
of span (per thread track), largest first, over the steps the trace holds.
    python3 bench/gpu/trace_summary.py trace.json [--top 30]
offload.py prints exposed()'s line under each zerod row.
"""
import argparse
import collections
import json


def load(path):
    """(the traced steps' durations in ms, {(thread, category, span): [ms, count, bytes]})."""
    with open(path) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans = collections.defaultdict(lambda: [0.0, 0, 0])
    steps = []
    for e in events:
        if e.get("ph") != "X":
            continue
        if e.get("cat") == "step":
            steps.append(e["dur"] / 1e3)
            continue
        op = (e.get("args") or {}).get("op") or e["name"].split(" (")[0]
        s = spans[(threads.get((e["pid"], e["tid"]), str(e["tid"])), e.get("cat", ""), op)]
        s[0] += e["dur"] / 1e3
        s[1] += 1
        s[2] += int((e.get("args") or {}).get("bytes", 0) or 0)
    return steps, dict(spans)


def host_update(path):
    """(elements, seconds) of the optimizer's pieces on the host tier."""
    with open(path) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    n = t = 0
    for e in events:
        a = e.get("args") or {}
        if e.get("ph") == "X" and a.get("op") == "optimizer piece" and a.get("tier") == "host":
            n += int(a.get("value", 0))
            t += e["dur"] / 1e6
    return n, t


def exposed(path, top=4, update_bytes=28):
    """One line: the time a traced step spent in zerod's calls (the
    trainer's thread waiting: what the overlap did not hide), the calls
    that took it and the spans inside them, in ms a step; then the CPU
    update's rate, and its bytes a second at update_bytes a parameter (the
    fp32 master, m and v read and written, 24; the gradient read, in the
    working dtype as step.py's jobs keep it (bf16), 2, no longer zeroed
    in host memory (GradReducer::update_zeroes); the bf16 working copy
    written, 2: 28. Runs before 2026-11-28 zeroed it: 30)."""
    steps, spans = load(path)
    n, secs = host_update(path)
    rate = (f"; CPU update {n / secs / 1e6:.0f} M params/s, {n * update_bytes / secs / 1e9:.1f} GB/s at "
            f"{update_bytes} B a parameter" if n and secs else "")
    k = max(1, len(steps))
    on_calls = sorted(((v[0] / k, key) for key, v in spans.items() if key[0] == "calls"), reverse=True)
    calls = [(ms, key[2]) for ms, key in on_calls if key[1] == "call"]
    inner = [(ms, key[2]) for ms, key in on_calls if key[1] != "call"]
    step = f"step {sum(steps) / k:.1f} ms, " if steps else ""
    return (f"trace: {step}in zerod's calls {sum(ms for ms, _ in calls):.1f} ms ("
            + ", ".join(f"{name} {ms:.1f}" for ms, name in calls[:top]) + "); inside them: "
            + ", ".join(f"{name} {ms:.1f}" for ms, name in inner[:top]) + rate)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    steps, spans = load(a.trace)
    print("steps (ms):", ", ".join(f"{s:.1f}" for s in steps))
    print(f"{'thread':<12} {'cat':<10} {'span':<34} {'ms':>9} {'n':>6} {'GB/s':>7}")
    for key, (ms, n, nbytes) in sorted(spans.items(), key=lambda kv: -kv[1][0])[:a.top]:
        gbs = nbytes / (ms * 1e6) if nbytes and ms else 0
        print(f"{key[0][:12]:<12} {key[1][:10]:<10} {key[2][:34]:<34} {ms:>9.2f} {n:>6} "
              f"{(f'{gbs:.1f}' if gbs else ''):>7}")


if __name__ == "__main__":
    main()
