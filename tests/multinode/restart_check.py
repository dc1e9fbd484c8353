"""Checks for restart_test.sh: reads the output of runs of resume_trainer
(each line stamped with the time it was read: "<seconds> <line>"), split
into tries by "=== try N" lines, and compares every step a rank printed with
the step an uninterrupted run printed for that rank, bit for bit.

    restart_check.py steps LOG                 # prints "rank step value" lines of LOG
    restart_check.py same REF LOG --ranks W --every E [--resume-at S] [--kill TRY:SECONDS:STEP:WHAT]...
        every step of every try matches REF; from the second try on every
        rank resumed at the same step, a multiple of E, at most the step the
        try before reached when it was killed; the last try ended at REF's
        last step. With --kill: how long from each kill to the launcher's end
        and to the first step trained again.
"""
import argparse
import re
import sys

STEP = re.compile(r"^\[rank (\d+)\] step (\d+) (\S+)$")
RESUMED = re.compile(r"^\[rank (\d+)\] resumed at (\d+)$")
TRY = re.compile(r"^=== try (\d+)")


def read(path):
    """[(try, seconds, line)]; a log without === lines is one try."""
    out, cur = [], 1
    with open(path, errors="replace") as f:
        for raw in f:
            raw = raw.rstrip("\n")
            stamp, _, line = raw.partition(" ")
            try:
                t = float(stamp)
            except ValueError:
                t, line = 0.0, raw
            m = TRY.match(line)
            if m:
                cur = int(m.group(1))
            out.append((cur, t, line))
    return out


def steps(lines):
    """{(rank, step): value} and {try: {rank: resumed}} and {try: {rank: [steps]}}"""
    values, resumed, printed = {}, {}, {}
    for tr, _, line in lines:
        m = STEP.match(line)
        if m:
            r, s, v = int(m.group(1)), int(m.group(2)), m.group(3)
            values.setdefault((tr, r, s), v)
            printed.setdefault(tr, {}).setdefault(r, []).append(s)
        m = RESUMED.match(line)
        if m:
            resumed.setdefault(tr, {})[int(m.group(1))] = int(m.group(2))
    return values, resumed, printed


def fail(why):
    print("restart_check: FAILED:", why)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what")
    ap.add_argument("ref")
    ap.add_argument("log", nargs="?")
    ap.add_argument("--ranks", type=int, default=0)
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--resume-at", type=int, default=-1)
    ap.add_argument("--kill", action="append", default=[])
    a = ap.parse_args()
    if a.what == "steps":
        values, _, _ = steps(read(a.ref))
        for (tr, r, s), v in sorted(values.items()):
            print(tr, r, s, v)
        return
    ref_values, _, _ = steps(read(a.ref))
    ref = {(r, s): v for (_, r, s), v in ref_values.items()}
    last = max(s for (_, s) in ref)
    lines = read(a.log)
    values, resumed, printed = steps(lines)
    tries = sorted({tr for tr, _, _ in lines if tr in printed or tr in resumed})
    if not tries:
        fail(f"{a.log}: no rank printed a step")
    compared = 0
    for (tr, r, s), v in values.items():
        if ref.get((r, s)) != v:
            fail(f"try {tr}, rank {r}, step {s}: {v}, the uninterrupted run: {ref.get((r, s))}")
        compared += 1
    reached = {}
    for tr in tries:
        ranks = printed.get(tr, {})
        reached[tr] = max((max(v) for v in ranks.values()), default=-1)
    kills = {}
    for k in a.kill:
        tr, secs, step, what = k.split(":", 3)
        kills[int(tr)] = (float(secs), int(step), what)
    report = []
    for i, tr in enumerate(tries):
        res = resumed.get(tr, {})
        if i == 0 and a.resume_at < 0:
            if res:
                fail(f"try {tr} resumed ({res}) although nothing was snapshotted before it")
            continue
        want_ranks = set(range(a.ranks))
        if set(res) != want_ranks:
            fail(f"try {tr}: ranks {sorted(res)} said where they resumed, expected all of {sorted(want_ranks)}")
        at = set(res.values())
        if len(at) != 1:
            fail(f"try {tr}: the ranks resumed at different steps: {res}")
        at = at.pop()
        if a.resume_at >= 0 and i == 0 and at != a.resume_at:
            fail(f"try {tr} resumed at {at}, expected {a.resume_at}")
        # A named resume step may be the snapshot the ranks took together as
        # they left (at any step); the others are taken every E steps.
        if at % a.every and not (a.resume_at >= 0 and i == 0):
            fail(f"try {tr} resumed at {at}, not a multiple of every = {a.every}")
        if i > 0 and at > reached[tries[i - 1]] + 1:
            fail(f"try {tr} resumed at {at}, past the step {reached[tries[i - 1]]} its predecessor reached")
        for r in want_ranks:
            got = printed.get(tr, {}).get(r, [])
            if not got or got[0] != at:
                fail(f"try {tr}: rank {r} resumed at {at} but its first step printed is {got[:1]}")
        if i > 0 and tries[i - 1] in kills:
            t_kill, step, what = kills[tries[i - 1]]
            t_end = max(t for t2, t, l in lines if t2 == tries[i - 1])
            t_first = min(t for t2, t, l in lines if t2 == tr and STEP.match(l))
            report.append(f"{what} at step {step}: the launcher ended {t_end - t_kill:.2f} s after, "
                          f"training again (step {at}, resumed) {t_first - t_kill:.2f} s after, "
                          f"{step - at} steps redone")
    final = tries[-1]
    for r in range(a.ranks):
        if max(printed.get(final, {}).get(r, [-1])) != last:
            fail(f"the last try (try {final}) did not reach step {last} on rank {r}")
    print(f"restart_check: {compared} steps of {len(tries)} tries match the uninterrupted run bit for bit "
          f"(resumed at {[min(resumed[t].values()) for t in tries if t in resumed]})")
    for line in report:
        print("restart_check:", line)


main()
