#!/usr/bin/env python3
"""Checks a trace file the way tests need, without loading libzerod (so it
runs beside sanitizer builds): zerod.trace's check() (begin/end pairs on one
track, spans nesting, every span inside its step) plus what the run must
have recorded.

  check_trace.py TRACE [--ranks N] [--steps A B] [--ops op,op,...] [--late]
"""
import argparse
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "zerod_trace", os.path.join(HERE, "..", "..", "bindings", "python", "zerod", "trace.py"))
ztrace = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ztrace)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--ranks", type=int)
    ap.add_argument("--steps", type=int, nargs=2)
    ap.add_argument("--ops", default="", help="ops that must appear (args.op); nvme and copy ones with bytes")
    ap.add_argument("--late", action="store_true", help="some collective waited for a named later rank")
    a = ap.parse_args()
    tr = ztrace.load(a.trace)
    problems = ztrace.check(tr)
    if a.ranks is not None and tr.ranks != list(range(a.ranks)):
        problems.append(f"ranks {tr.ranks}, expected 0..{a.ranks - 1}")
    for r in tr.ranks:
        steps = sorted(tr.steps(r))
        if a.steps and steps != list(range(a.steps[0], a.steps[1] + 1)):
            problems.append(f"rank {r}: steps {steps}, expected {a.steps[0]}..{a.steps[1]}")
    ops = {}
    for e in tr.events:
        if e.get("ph") in ("X", "b", "i"):
            ops.setdefault(e["args"].get("op"), []).append(e)
    for op in filter(None, a.ops.split(",")):
        if op not in ops:
            problems.append(f"no {op!r} event (have: {sorted(k for k in ops if k)})")
        elif op.startswith("nvme") or op in ("all_gather", "reduce_scatter", "gather", "reduce bucket"):
            if not any(e["args"].get("bytes", 0) > 0 for e in ops[op]):
                problems.append(f"no {op!r} event carries its bytes")
    if a.late:
        late = [e for e in tr.events if e.get("cat") == "comm" and "late_rank" in e.get("args", {})]
        if not late:
            problems.append("no collective names a late rank")
        elif not any(e["args"]["late_rank"] != e["pid"] for e in late):
            problems.append("a rank was named late at its own collective")
    n = sum(1 for e in tr.events if e.get("ph") != "M")
    if problems:
        print("check_trace: FAILED:\n  " + "\n  ".join(problems[:40]))
        return 1
    rows = {r: ztrace.breakdown(tr, r) for r in tr.ranks}
    print(f"check_trace: OK: {n} events, ranks {tr.ranks}, steps {sorted(tr.steps(tr.ranks[0]))}; "
          f"rank 0 step ms: " + ", ".join(f"{x['step']}: {x['total']:.2f}" for x in rows[tr.ranks[0]]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
