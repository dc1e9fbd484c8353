"""bench/onebit/run.sh's tables: every stage's rows, printed after the last
stage, since the fastest Adam row of the run is known only then.

    table.py LINK_BITS_PER_S PARAMS  STAGE OPTIMIZER STEP_MS MEAN_MS NET_BYTES CHECKSUM  ...

Per row: the median and mean step, the bytes a daemon put on the network per
step, the time those bytes take at the link's rate, how many times fewer
bytes than fp32 Adam's all-reduce (the constant 4 B per parameter at 2
ranks), and how many times faster the mean step is than the fastest Adam row
of the run (at any stage: the Adam a user would pick) and than Adam at the
row's stage. zerod's stage-2 Adam sends 6 B per parameter (its bucketed
reduce-scatter plus the working-copy gather), so the same-stage ratio
flatters stage 2's rows by about 1.4-1.5x; the first ratio is the one to
quote.
"""
import sys

# fp32 Adam's bytes per parameter: a ring all-reduce of fp32 gradients on 2
# ranks sends 2 (W-1)/W * 4 B = 4 B, a constant. zerod's stage-2 Adam sends
# 6 B (its bucketed reduce-scatter plus the working-copy gather), so its row
# says 0.7.
FP32_ADAM_BYTES_PER_PARAM = 4


def parse(argv):
    """(link bytes/s, params, rows), each row (stage, optimizer, step ms, mean ms, net bytes)."""
    link, params, rest = float(argv[0]) / 8, float(argv[1]), argv[2:]
    if len(rest) % 6:
        raise SystemExit(f"table.py: {len(rest)} row fields, not a multiple of 6 (STAGE OPT MS MEAN NET SUM)")
    rows = [(rest[i], rest[i + 1], float(rest[i + 2]), float(rest[i + 3]), float(rest[i + 4]))
            for i in range(0, len(rest), 6)]
    return link, params, rows


def table(link, params, rows):
    """The tables' text."""
    out = []
    fp32_adam = FP32_ADAM_BYTES_PER_PARAM * params
    adams = {stage: mean for stage, name, _, mean, _ in rows if name == "adam"}
    best_stage = min(adams, key=adams.get) if adams else None
    if best_stage is None:
        out.append("\n(no adam row in --optimizers: no step ratios)")
    else:
        out.append(f"\nx best Adam: against the fastest Adam row of this run, stage {best_stage}'s "
                   f"(mean {adams[best_stage]:.1f} ms); x same-stage Adam: against Adam at the row's stage")
    for stage in dict.fromkeys(r[0] for r in rows):
        out.append(f"\nZeRO stage {stage}")
        out.append(f"{'':<20} {'step ms':>8} {'mean ms':>8} {'net MB/step':>12} {'link ms':>8} "
                   f"{'x fewer B than 4/param':>22} {'x best Adam':>12} {'x same-stage Adam':>18}")
        for s, name, ms, mean, net in rows:
            if s != stage:
                continue
            bound = net / link * 1e3
            fewer = fp32_adam / net if net else float("inf")
            best = adams[best_stage] / mean if best_stage is not None and mean else 0
            same = adams[stage] / mean if stage in adams and mean else 0
            out.append(f"{name:<20} {ms:>8.1f} {mean:>8.1f} {net / 1e6:>12.2f} {bound:>8.1f} {fewer:>22.1f} "
                       f"{best:>12.2f} {same:>18.2f}")
    return "\n".join(out)


if __name__ == "__main__":
    print(table(*parse(sys.argv[1:])))
