#!/usr/bin/env bash
# Trains the same job at stages 0-3 on 2 ranks through the daemon and checks
# that every rank of every stage ends with the same parameter checksum.
set -euo pipefail
zerod=$1 trainer=$2 dir=$3
sums=()
for stage in 0 1 2 3; do
  out=$("$zerod" run --nproc 2 --job "$dir/job_stage$stage.lua" -- "$trainer" normal 2>&1)
  for rank in 0 1; do
    s=$(echo "$out" | sed -n "s/^\[rank $rank\] rank $rank: checksum //p")
    [ -n "$s" ] || { echo "stage $stage rank $rank printed no checksum:"; echo "$out"; exit 1; }
    sums+=("$s")
    echo "stage $stage rank $rank: $s"
  done
done
python3 - "${sums[@]}" <<'PY'
import sys
v = [float(x) for x in sys.argv[1:]]
ref = v[0]
bad = [x for x in v if abs(x - ref) > 1e-3 * max(1.0, abs(ref))]
if bad:
    print("checksums differ:", v); sys.exit(1)
print("stages agree: every checksum within 1e-3 of", ref)
PY
