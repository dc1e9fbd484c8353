#!/bin/bash
# The GPT example's losses with each optimizer and ZeRO stage, against
# Adam's: 2 ranks through the daemon (local comm), the same data and seed,
# bench/onebit/gpt_job.lua. Prints per run the mean training loss of the last
# 10 steps, the validation loss, their difference from Adam's at stage 0,
# and rank 0's bytes sent per step. An optimizer named NAME+replay runs NAME
# with compression.replay (stages 1-3: onebit_adam+replay:1). GPT_LR,
# GPT_WARM and GPT_VAR_SCALER in the environment set the job's learning
# rate, warm-up fraction and 0/1 Adam's var_update_scaler (gpt_job.lua).
#
#   bench/onebit/gpt_loss.sh [--build DIR] [--steps 800] [--runs "adam:0 onebit_adam:0 ..."] [-- TRAINER ARGS]
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build="$root/build"
steps=800
runs="adam:0 onebit_adam:0 onebit_adam:3 zero_one_adam:0 zero_one_adam:1 onebit_lamb:0 onebit_lamb:3"
python=${PYTHON:-/usr/bin/python3}
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "usage: $0 [--build DIR] [--steps 800] [--runs \"adam:0 onebit_adam:0 ...\"] [-- TRAINER ARGS]" >&2; exit 2 ;;
  esac
done
table=()
for r in $runs; do
  opt=${r%%:*} stage=${r##*:} replay=0
  [ "${opt%+replay}" != "$opt" ] && replay=1
  start=$(date +%s)
  out=$(GPT_OPTIMIZER=${opt%+replay} GPT_REPLAY=$replay GPT_STAGE=$stage GPT_STEPS=$steps PYTHONPATH="$root/bindings/python" \
    "$build/bin/zerod" run --nproc 2 --job "$here/gpt_job.lua" -- \
    "$python" "$root/examples/python/train_gpt.py" --steps "$steps" --sample-chars 0 "$@" 2>&1)
  line=$(echo "$out" | grep -m1 'trained .* steps')
  sent=$(echo "$out" | grep -m1 'collectives:')
  [ -n "$line" ] || { echo "gpt_loss.sh: $opt at stage $stage failed:" >&2; echo "$out" | tail -20 >&2; exit 1; }
  train=$(echo "$line" | sed -n 's/.*-> \([0-9.]*\) (mean.*/\1/p')
  val=$(echo "$line" | sed -n 's/.*validation loss \([0-9.]*\).*/\1/p')
  bps=$(echo "$sent" | sed -n 's/.*(\([0-9,]*\) bytes per step.*/\1/p' | tr -d ,)
  echo "$opt stage $stage: $line | $sent ($(($(date +%s) - start)) s)"
  table+=("$opt" "$stage" "$train" "$val" "${bps:-0}")
done
echo
/usr/bin/python3 - "$steps" "${table[@]}" <<'PY'
import sys
steps, rows = sys.argv[1], sys.argv[2:]
res = [rows[i:i + 5] for i in range(0, len(rows), 5)]
ref = next((r for r in res if r[0] == "adam"), None)
print(f"GPT, {steps} steps, 2 ranks")
print(f"{'optimizer':<21} {'stage':>5} {'train':>7} {'val':>7} {'train vs adam':>14} {'val vs adam':>12} {'B/step':>12}")
for o, s, t, v, b in res:
    dt = (float(t) / float(ref[2]) - 1) * 100 if ref else 0
    dv = (float(v) / float(ref[3]) - 1) * 100 if ref else 0
    print(f"{o:<21} {s:>5} {float(t):>7.3f} {float(v):>7.3f} {dt:>+13.1f}% {dv:>+11.1f}% {int(b):>12,}")
PY
