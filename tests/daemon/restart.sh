#!/usr/bin/env bash
# A job that asks to keep its state: its ranks crash (rank 1 is killed at
# step 5), the daemon keeps the model, the ranks start again and resume from
# the last applied step instead of from scratch. Also checks `zerod status`.
set -uo pipefail
zerod=$1 trainer=$2 dir=$3
tmp=$(mktemp -d /tmp/zerod-restart-XXXXXX)
trap 'kill $serve 2>/dev/null; wait $serve 2>/dev/null; rm -rf "$tmp"' EXIT
sock=$tmp/zerod.sock
"$zerod" serve --nproc 2 --job "$dir/job_keep.lua" --socket "$sock" > "$tmp/serve.log" 2>&1 &
serve=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
[ -S "$sock" ] || { echo "the daemon did not start:"; cat "$tmp/serve.log"; exit 1; }

run() {  # run <scenario>: both ranks, output in $tmp/<scenario>.<rank>
  for r in 0 1; do
    ZEROD_ENDPOINT=unix:$sock ZEROD_RANK=$r ZEROD_WORLD_SIZE=2 ZEROD_JOB=$dir/job_keep.lua \
      "$trainer" "$1" > "$tmp/$1.$r" 2>&1 &
  done
  wait %2 %3 2>/dev/null
}
run die
echo "--- first run (rank 1 killed at step 5):"; cat "$tmp/die.0" "$tmp/die.1"
grep -q "ZD_ERR_PEER_LOST" "$tmp/die.0" || { echo "rank 0 was not told its peer was lost"; exit 1; }

"$zerod" status --socket "$sock" > "$tmp/status" || { cat "$tmp/status"; exit 1; }
echo "--- zerod status between the runs:"; cat "$tmp/status"
grep -q "lost" "$tmp/status" || { echo "status does not show the lost rank"; exit 1; }

run resume
echo "--- second run:"; cat "$tmp/resume.0" "$tmp/resume.1"
for r in 0 1; do
  grep -q "rank $r: resumed at step 6" "$tmp/resume.$r" || { echo "rank $r did not resume at step 6"; exit 1; }
  grep -q "rank $r: checksum" "$tmp/resume.$r" || { echo "rank $r did not finish"; exit 1; }
done
echo "restart: the kept model resumed at step 6"
