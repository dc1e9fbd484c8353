#!/usr/bin/env bash
# Soak: the main job (the GPT of examples/python/train_gpt.py, through
# zerod.torch, examples/python/gpt_job.lua: ZeRO stage 3, optimizer in the
# host tier) for many steps under `zerod run --nproc 2`, sampling the
# resident memory (VmRSS) and the open fds of the daemon and of each rank
# from /proc every few seconds, and `zerod status` (one more connection to
# the daemon per sample) for the step. Prints start, end, max and the drift
# per 1000 steps of each; the samples stay in a CSV.
#
#   bench/soak/run.sh [STEPS (10000)] [SECONDS BETWEEN SAMPLES (5)]
#
# Environment: ZEROD_BUILD_DIR (default build/), ZEROD_NO_BUILD=1 to use the
# build as it is, ZEROD_SOAK_OUT (default $ZEROD_BUILD_DIR/soak) for the log
# and the CSV. "start" is the first sample after the warm-up (the first 5%
# of the steps: allocators and caches fill then); the drift is the
# least-squares slope over the samples after it.
set -euo pipefail
source "$(dirname "$0")/../../scripts/common.sh"
steps=${1:-10000}
every=${2:-5}
cd "$ZEROD_ROOT"
if [ "${ZEROD_NO_BUILD:-0}" != 1 ]; then
  zerod_build zerod zerod_cli zd_optimizer_adamw zd_comm_local zd_tier_host zd_partitioner_stage3
fi
out=${ZEROD_SOAK_OUT:-$ZEROD_BUILD_DIR/soak}
mkdir -p "$out"
zerod=$ZEROD_BUILD_DIR/bin/zerod
sock_dir=$(mktemp -d /tmp/zerod-soak-XXXXXX)
sock=$sock_dir/zerod.sock
log=$out/train.log
csv=$out/samples.csv

export PYTHONPATH="$ZEROD_ROOT/bindings/python${PYTHONPATH:+:$PYTHONPATH}"
export ZEROD_LIB="$ZEROD_BUILD_DIR/lib/libzerod.so"
"$zerod" run --nproc 2 --socket "$sock" --job examples/python/gpt_job.lua -- \
  /usr/bin/python3 examples/python/train_gpt.py --steps "$steps" --sample-chars 50 > "$log" 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null || true; rm -rf "$sock_dir"' EXIT
zerod_log "soak: $steps steps, daemon pid $daemon, samples every ${every}s in $csv, output in $log"

rss() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo ""; }
fds() { ls "/proc/$1/fd" 2>/dev/null | wc -l; }

echo "seconds,step,daemon_rss_kib,daemon_fds,rank0_rss_kib,rank0_fds,rank1_rss_kib,rank1_fds" > "$csv"
start=$(date +%s)
while kill -0 "$daemon" 2>/dev/null; do
  sleep "$every"
  # zerod status's rank table: "  <rank> <pid> <step> <state>".
  table=$("$zerod" status --socket "$sock" 2>/dev/null |
          awk '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ && $3 ~ /^[0-9]+$/ {print $1, $2, $3}' || true)
  r0=($(echo "$table" | awk '$1 == 0')); r1=($(echo "$table" | awk '$1 == 1'))
  [ ${#r0[@]} -eq 3 ] && [ ${#r1[@]} -eq 3 ] || continue
  step=${r0[2]}
  d_rss=$(rss "$daemon"); d_fds=$(fds "$daemon")
  r0_rss=$(rss "${r0[1]}"); r0_fds=$(fds "${r0[1]}")
  r1_rss=$(rss "${r1[1]}"); r1_fds=$(fds "${r1[1]}")
  [ -n "$d_rss" ] && [ -n "$r0_rss" ] && [ -n "$r1_rss" ] || continue
  echo "$(( $(date +%s) - start )),$step,$d_rss,$d_fds,$r0_rss,$r0_fds,$r1_rss,$r1_fds" >> "$csv"
done
set +e
wait "$daemon"
status=$?
set -e
tail -n 8 "$log"
[ "$status" -eq 0 ] || { echo "soak: zerod run exited with status $status (see $log)"; exit 1; }

python3 - "$csv" "$steps" <<'PY'
import csv, sys
rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(open(sys.argv[1]))]
steps = int(sys.argv[2])
if len(rows) < 3:
    sys.exit(f"soak: only {len(rows)} samples; nothing to say")
warm = [r for r in rows if r["step"] >= 0.05 * steps] or rows
print(f"soak: {len(rows)} samples over {rows[-1]['seconds']:.0f} s, steps {rows[0]['step']:.0f}..{rows[-1]['step']:.0f}; "
      f"start = first sample at step >= {0.05 * steps:.0f}")
def slope(xs, ys):
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return 0.0 if den == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den
print(f"{'':14} {'first':>10} {'start':>10} {'end':>10} {'max':>10} {'drift/1000 steps':>18}")
for who in ("daemon", "rank0", "rank1"):
    for what, unit, scale in (("rss", "MiB", 1 / 1024), ("fds", "", 1)):
        key = f"{who}_{what}_kib" if what == "rss" else f"{who}_{what}"
        ys = [r[key] * scale for r in warm]
        d = slope([r["step"] for r in warm], ys) * 1000
        fmt = (lambda v: f"{v:10.1f}") if what == "rss" else (lambda v: f"{v:10.0f}")
        print(f"{who + ' ' + what + (' ' + unit if unit else ''):14} {fmt(rows[0][key] * scale)} {fmt(ys[0])} "
              f"{fmt(ys[-1])} {fmt(max(r[key] * scale for r in rows))} {d:+17.3f}")
PY
