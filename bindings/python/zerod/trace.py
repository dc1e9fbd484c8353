"""Reads the timeline zerod writes (Chrome trace event JSON, see
docs/observability.md): its events, its checks, and each step's time broken
down by what the rank was doing. No numpy, no libzerod: the standard library
only, so `zerod plot` and the tests can use it anywhere."""
import json
from collections import defaultdict

# ts and dur are written in microseconds with three decimals: two rounded
# values may disagree by a nanosecond or two.
_SLACK_US = 0.005

# The parts of a step, in the order the plots stack them.
PARTS = ("compute", "gather wait", "reduction", "optimizer", "nvme", "other zerod")


class Trace:
    def __init__(self, data):
        self.data = data
        self.events = data.get("traceEvents", [])
        self.meta = data.get("zerodTrace", {})
        self.reports = data.get("zerodReports", [])

    @property
    def ranks(self):
        return sorted({e["pid"] for e in self.events if e.get("ph") != "M"})

    def steps(self, rank):
        """{step: (start_us, end_us, tid)} of the rank's recorded steps."""
        out = {}
        for e in self.events:
            if e.get("ph") == "X" and e.get("cat") == "step" and e["pid"] == rank:
                out[e["args"]["step"]] = (e["ts"], e["ts"] + e["dur"], e["tid"])
        return out

    def spans(self, rank, cat=None, op=None, tid=None):
        for e in self.events:
            if e.get("ph") != "X" or e["pid"] != rank:
                continue
            if cat is not None and e.get("cat") != cat:
                continue
            if op is not None and e["args"].get("op") not in ((op,) if isinstance(op, str) else op):
                continue
            if tid is not None and e["tid"] != tid:
                continue
            yield e

    def memory(self, rank):
        """[(ts_us, {"device": bytes, "host": bytes, "nvme": bytes})] in time order: the most
        each tier held from ts_us until the rank's next point (a buffer that
        came and went inside a call counts), so a step plot drawn "post" is
        the curve."""
        pts = [(e["ts"], e["args"]) for e in self.events
               if e.get("ph") == "C" and e.get("name") == "memory" and e["pid"] == rank]
        return sorted(pts, key=lambda p: p[0])

    def thread_names(self):
        return {(e["pid"], e["tid"]): e["args"]["name"] for e in self.events
                if e.get("ph") == "M" and e.get("name") == "thread_name"}


def load(path):
    with open(path) as f:
        return Trace(json.load(f))


def check(trace):
    """The problems found in a trace, as sentences; [] when it is sound:
    every async begin ("b") has exactly one end ("e") with the same id on the
    same track (pid, tid) and category, not before it; complete events ("X")
    have a duration >= 0 and, on one track, nest (none overlaps another
    partly); every event that names a step lies inside that step's span on
    its rank."""
    problems = []
    if not trace.events:
        return ["the trace has no events"]
    opened = {}
    for e in trace.events:
        ph = e.get("ph")
        if ph == "b":
            key = (e.get("cat"), e.get("id"))
            if key in opened:
                problems.append(f"async id {key} begins twice")
            opened[key] = e
        elif ph == "e":
            key = (e.get("cat"), e.get("id"))
            b = opened.pop(key, None)
            if b is None:
                problems.append(f"async end {e.get('name')!r} id {e.get('id')} has no begin")
            elif (b["pid"], b["tid"]) != (e["pid"], e["tid"]):
                problems.append(f"{b['name']!r} begins on track {(b['pid'], b['tid'])} and ends on {(e['pid'], e['tid'])}")
            elif e["ts"] + _SLACK_US < b["ts"]:
                problems.append(f"{b['name']!r} ends at {e['ts']} before it begins at {b['ts']}")
            else:
                b["_end"] = e["ts"]
    for key, b in opened.items():
        problems.append(f"{b['name']!r} (id {key[1]}) begins at {b['ts']} and never ends")

    by_track = defaultdict(list)
    for e in trace.events:
        if e.get("ph") == "X":
            if e["dur"] < 0:
                problems.append(f"{e['name']!r} has a negative duration")
            by_track[(e["pid"], e["tid"])].append(e)
    for track, spans in by_track.items():
        spans.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in spans:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"] + _SLACK_US:
                stack.pop()
            if stack and e["ts"] + e["dur"] > stack[-1]["ts"] + stack[-1]["dur"] + _SLACK_US:
                p = stack[-1]
                problems.append(f"on track {track}, {e['name']!r} [{e['ts']}, {e['ts'] + e['dur']}] overlaps "
                                f"{p['name']!r} [{p['ts']}, {p['ts'] + p['dur']}] without nesting in it")
            stack.append(e)

    for rank in trace.ranks:
        steps = trace.steps(rank)
        for e in trace.events:
            if e["pid"] != rank or e.get("ph") not in ("X", "b", "i") or e.get("cat") == "step":
                continue
            step = e.get("args", {}).get("step")
            if step not in steps:
                continue  # its step's span is outside the recorded window (or was overwritten)
            lo, hi, _ = steps[step]
            end = e["ts"] + e.get("dur", 0) if e["ph"] == "X" else e.get("_end", e["ts"])
            if e["ts"] + _SLACK_US < lo or end > hi + _SLACK_US:
                problems.append(f"rank {rank}: {e['name']!r} [{e['ts']}, {end}] of step {step} lies outside "
                                f"that step [{lo}, {hi}]")
    return problems


def _inside(e, lo, hi):
    return e["ts"] + _SLACK_US >= lo and e["ts"] + e["dur"] <= hi + _SLACK_US


def breakdown(trace, rank):
    """Each recorded step of the rank: {"step", "total", PARTS..., "peer wait"}
    in milliseconds. The parts are the rank's calling thread: time outside
    zerod's calls is the trainer's (compute); inside them, waiting for a
    gather (gather wait), for gradient reductions and the norm (reduction),
    the optimizer (less its NVMe waits), blocked on NVMe (nvme), and the
    rest. "peer wait" is the time the rank's collectives waited for another
    rank (on the collectives thread; it overlaps the parts)."""
    rows = []
    for step, (lo, hi, tid) in sorted(trace.steps(rank).items()):
        def total(cat=None, op=None, any_tid=False):
            return sum(e["dur"] for e in trace.spans(rank, cat, op, None if any_tid else tid) if _inside(e, lo, hi))
        in_zerod = total("call")
        gather = total("residency", "gather wait")
        reduction = total("grads", ("wait for collectives", "reduce gradients", "pack bucket")) + \
            total("optimizer", "gradient norm")
        nvme = total("nvme", ("wait for nvme read", "wait for nvme write", "nvme read", "nvme write"))
        optimizer = max(0.0, total("optimizer", ("optimizer", "compressed step"))
                        - total("nvme", ("wait for nvme read", "wait for nvme write")))
        other = max(0.0, in_zerod - gather - reduction - nvme - optimizer)
        peer = sum(e["dur"] for e in trace.spans(rank, "comm", "wait for rank")
                   if e["args"].get("step") == step)
        row = {"step": step, "total": (hi - lo) / 1e3, "compute": max(0.0, hi - lo - in_zerod) / 1e3,
               "gather wait": gather / 1e3, "reduction": reduction / 1e3, "optimizer": optimizer / 1e3,
               "nvme": nvme / 1e3, "other zerod": other / 1e3, "peer wait": peer / 1e3}
        rows.append(row)
    return rows
