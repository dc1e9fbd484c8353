"""Where a traced zerod step's time went: the total duration of each kind
of span (per thread track), largest first, over the steps the trace holds.
    python3 bench/gpu/trace_summary.py trace.json [--top 30]
"""
import argparse
import collections
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    with open(a.trace) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    total, count, nbytes = collections.Counter(), collections.Counter(), collections.Counter()
    steps = []
    for e in events:
        if e.get("ph") != "X":
            continue
        op = (e.get("args") or {}).get("op") or e["name"].split(" (")[0]
        key = (threads.get((e["pid"], e["tid"]), str(e["tid"])), e.get("cat", ""), op)
        if e.get("cat") == "step":
            steps.append(e["dur"] / 1e3)
            continue
        total[key] += e["dur"] / 1e3
        count[key] += 1
        nbytes[key] += int((e.get("args") or {}).get("bytes", 0) or 0)
    print("steps (ms):", ", ".join(f"{s:.1f}" for s in steps))
    print(f"{'thread':<12} {'cat':<10} {'span':<34} {'ms':>9} {'n':>6} {'GB/s':>7}")
    for key, ms in total.most_common(a.top):
        gbs = nbytes[key] / (ms * 1e6) if nbytes[key] and ms else 0
        print(f"{key[0][:12]:<12} {key[1][:10]:<10} {key[2][:34]:<34} {ms:>9.2f} {count[key]:>6} "
              f"{(f'{gbs:.1f}' if gbs else ''):>7}")


if __name__ == "__main__":
    main()
