"""Draws a zerod trace (docs/observability.md) as PNGs:

  <name>-memory.png  bytes per tier over the recorded steps (the most held
                     between two calls' returns), per rank
  <name>-steps.png   each step's time by what the rank did: its own compute,
                     waiting for gathers, reductions, the optimizer, NVMe
  <name>-loss.png    the loss the trainer reported (zd_model_report), per step

Run as `zerod plot trace.json [--out DIR]` or `python3 -m zerod.plot ...`.
Needs matplotlib (Debian: python3-matplotlib)."""
import argparse
import os
import sys

from . import trace as _trace

COLORS = {"compute": "#4C72B0", "gather wait": "#DD8452", "reduction": "#55A868", "optimizer": "#C44E52",
          "nvme": "#8172B3", "other zerod": "#BBBBBB"}
TIER_COLORS = {"device": "#C44E52", "host": "#4C72B0", "nvme": "#8172B3"}


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        sys.exit("zerod plot: matplotlib is not installed (Debian: apt-get install python3-matplotlib)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _title(tr, what):
    job = os.path.basename(tr.meta.get("job", "")) or "zerod"
    return f"{what} — {job}, ZeRO stage {tr.meta.get('zero_stage', '?')}, {len(tr.ranks)} rank(s)"


def _unit(max_bytes):
    for name, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if max_bytes >= (1 << shift):
            return name, float(1 << shift)
    return "bytes", 1.0


def plot_memory(tr, plt, path):
    ranks = tr.ranks
    peak = max((v for r in ranks for _, a in tr.memory(r) for v in a.values()), default=0)
    unit, scale = _unit(peak)
    fig, axes = plt.subplots(len(ranks), 1, figsize=(11, 2.6 * len(ranks) + 0.8), sharex=True, squeeze=False)
    t0 = min((e["ts"] for e in tr.events if "ts" in e), default=0)
    for ax, rank in zip(axes[:, 0], ranks):
        pts = tr.memory(rank)
        xs = [(t - t0) / 1e3 for t, _ in pts]
        for tier in ("device", "host", "nvme"):
            ys = [a.get(tier, 0) / scale for _, a in pts]
            if any(ys):
                ax.step(xs, ys, where="post", color=TIER_COLORS[tier], label=tier, linewidth=1.6)
        for i, (step, (lo, hi, _)) in enumerate(sorted(tr.steps(rank).items())):
            ax.axvspan((lo - t0) / 1e3, (hi - t0) / 1e3, color="#000000", alpha=0.04 if i % 2 else 0.09, linewidth=0)
            ax.text(((lo + hi) / 2 - t0) / 1e3, 1.0, f"step {step}", transform=ax.get_xaxis_transform(),
                    ha="center", va="bottom", fontsize=8, color="#555555")
        ax.set_ylabel(f"rank {rank}\n{unit}")
        ax.set_ylim(bottom=0)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(loc="upper right", fontsize=8, frameon=False)
    axes[-1, 0].set_xlabel("time since the trace began (ms)")
    fig.suptitle(_title(tr, "Model state per tier"), fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _stack(ax, xs, rows, parts, width, legend):
    bottom = [0.0] * len(rows)
    for part in parts:
        ys = [r[part] for r in rows]
        if not any(ys):
            continue
        ax.bar(xs, ys, bottom=bottom, color=COLORS[part], label=part if legend else None, width=width)
        bottom = [b + y for b, y in zip(bottom, ys)]
    return bottom


def plot_steps(tr, plt, path):
    """One panel per rank with each step stacked by part, and a last panel
    that zooms into zerod's own parts (everything but the trainer's
    compute), ranks side by side: on a trainer that computes most of the
    step, that is where zerod's cost can be read."""
    ranks = tr.ranks
    rows_of = {rank: _trace.breakdown(tr, rank) for rank in ranks}
    fig, axes = plt.subplots(len(ranks) + 1, 1, figsize=(11, 2.6 * (len(ranks) + 1) + 0.8), sharex=True,
                             squeeze=False)
    for ax, rank in zip(axes[:-1, 0], ranks):
        rows = rows_of[rank]
        xs = [r["step"] for r in rows]
        _stack(ax, xs, rows, _trace.PARTS, 0.7, True)
        peer = [r["peer wait"] for r in rows]
        if any(peer):
            ax.scatter(xs, peer, marker="_", s=400, color="black", zorder=3, label="its collectives waiting on\nother ranks (overlaps the bars)")
        for x, r in zip(xs, rows):
            zerod = r["total"] - r["compute"]
            ax.text(x, r["total"], f"{r['total']:.1f} ms, zerod {zerod:.1f}", ha="center", va="bottom", fontsize=8)
        ax.set_ylabel(f"rank {rank}\nms")
        ax.set_ylim(0, max([r["total"] for r in rows] + [1e-3]) * 1.2)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    zoom = axes[-1, 0]
    width = 0.8 / len(ranks)
    top = 1e-3
    for i, rank in enumerate(ranks):
        rows = rows_of[rank]
        xs = [r["step"] - 0.4 + width * (i + 0.5) for r in rows]
        tops = _stack(zoom, xs, rows, _trace.PARTS[1:], width * 0.9, i == 0)
        for x, t in zip(xs, tops):
            zoom.text(x, t, f"r{rank}", ha="center", va="bottom", fontsize=7, color="#555555")
        top = max([top] + tops)
    zoom.set_ylim(0, top * 1.25)
    zoom.set_ylabel("inside zerod's calls\nms (zoomed)")
    zoom.grid(axis="y", alpha=0.3)
    zoom.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    zoom.set_xlabel("step")
    zoom.set_xticks(sorted({r["step"] for rows in rows_of.values() for r in rows}))
    fig.suptitle(_title(tr, "Where each step's time went"), fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_loss(tr, plt, path):
    by_rank = {}
    for r in tr.reports:
        if r.get("loss") is not None:
            by_rank.setdefault(r["rank"], []).append((r["step"], r["loss"]))
    fig, ax = plt.subplots(figsize=(11, 4))
    per_step = {}
    for rank, pts in sorted(by_rank.items()):
        pts.sort()
        ax.plot([s for s, _ in pts], [v for _, v in pts], linewidth=0.8, alpha=0.35, label=f"rank {rank}")
        for s, v in pts:
            per_step.setdefault(s, []).append(v)
    steps = sorted(per_step)
    mean = [sum(per_step[s]) / len(per_step[s]) for s in steps]
    # A moving average over about 2% of the run shows the trend through the noise.
    k = max(1, len(steps) // 50)
    smooth = [sum(mean[max(0, i - k + 1):i + 1]) / len(mean[max(0, i - k + 1):i + 1]) for i in range(len(mean))]
    ax.plot(steps, smooth, color="black", linewidth=1.8, label=f"mean over ranks, moving average of {k}")
    lo, hi = tr.meta.get("steps", [None, None])
    if lo is not None:
        ax.axvspan(lo - 0.5, hi + 0.5, color="#DD8452", alpha=0.15, label="steps in the timeline")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, frameon=False)
    ax.set_title(_title(tr, "Loss reported by the trainer"), fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot(trace_path, out_dir=None):
    """Writes the PNGs for a trace file; returns their paths."""
    tr = _trace.load(trace_path)
    if not tr.ranks:
        raise ValueError(f"{trace_path}: the trace holds no events (did the run reach trace.steps?)")
    plt = _pyplot()
    out_dir = out_dir or os.path.dirname(os.path.abspath(trace_path))
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.splitext(os.path.basename(trace_path))[0]
    paths = []
    for suffix, fn, wanted in (("memory", plot_memory, True), ("steps", plot_steps, True),
                               ("loss", plot_loss, any(r.get("loss") is not None for r in tr.reports))):
        if not wanted:
            continue
        p = os.path.join(out_dir, f"{stem}-{suffix}.png")
        fn(tr, plt, p)
        paths.append(p)
    return paths


def main(argv=None):
    ap = argparse.ArgumentParser(prog="zerod plot", description="PNGs of a zerod trace: memory per tier, "
                                 "each step's time by what it waited on, and the loss when the trainer reported it.")
    ap.add_argument("trace", help="the trace file (trace.path, or zerod run --trace FILE)")
    ap.add_argument("--out", help="the folder for the PNGs (default: the trace's folder)")
    ap.add_argument("--check", action="store_true", help="also check the trace (begin/end pairs, nesting) and fail on a problem")
    args = ap.parse_args(argv)
    try:
        tr = _trace.load(args.trace)
    except (OSError, ValueError) as e:
        sys.exit(f"zerod plot: cannot read {args.trace}: {e}")
    if args.check:
        problems = _trace.check(tr)
        if problems:
            sys.exit("zerod plot: the trace is not sound:\n  " + "\n  ".join(problems[:20]))
    try:
        for p in plot(args.trace, args.out):
            print(p)
    except ValueError as e:
        sys.exit(f"zerod plot: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
