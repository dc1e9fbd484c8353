#!/usr/bin/env bash
# A job that asks to keep its state: its ranks crash (rank 1 is killed at
# step 5), the daemon keeps the model, the ranks start again and resume from
# the last applied step instead of from scratch. Also checks `zerod status`.
# Then the same with comm.timeout = 0 (wait forever): a restarted rank that
# re-attaches and waits for the other is killed, and its wait ends with it;
# the ranks start again, rank 1 1.5 s after rank 0, and resume; a rank
# waiting alone for the other to re-attach does not hold up the daemon's
# stop (SIGTERM).
set -uo pipefail
zerod=$1 trainer=$2 dir=$3
tmp=$(mktemp -d /tmp/zerod-restart-XXXXXX)
serve=
trap '[ -n "$serve" ] && kill -9 $serve 2>/dev/null; rm -rf "$tmp"' EXIT

start_serve() {  # start_serve <job script>: a daemon for two ranks on $sock
  job=$1 sock=$tmp/zerod-$(basename "$1" .lua).sock
  "$zerod" serve --nproc 2 --job "$job" --socket "$sock" > "$tmp/serve.log" 2>&1 &
  serve=$!
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
  [ -S "$sock" ] || { echo "the daemon did not start:"; cat "$tmp/serve.log"; exit 1; }
}
rank() {  # rank <r> <scenario>: one rank in the background, output in $tmp/<scenario>.<r>
  ZEROD_ENDPOINT=unix:$sock ZEROD_RANK=$1 ZEROD_WORLD_SIZE=2 ZEROD_JOB=$job \
    "$trainer" "$2" > "$tmp/$2.$1" 2>&1 &
  pids[$1]=$!
}
run() {  # run <scenario> [seconds rank 1 starts after rank 0]: both ranks, to their end
  rank 0 "$1"
  sleep "${2:-0}"
  rank 1 "$1"
  wait "${pids[0]}" "${pids[1]}" 2>/dev/null
}
waiting() {  # waiting <pid>: rank 0 (that process) is connected to the daemon and still runs
  for _ in $(seq 100); do
    "$zerod" status --socket "$sock" 2>/dev/null | grep -Eq "^ +0 +$1 " && break
    sleep 0.1
  done
  sleep 0.5  # its finalize follows the connection within milliseconds
  kill -0 "$1" 2>/dev/null || { echo "rank 0 did not wait for rank 1 to re-attach:"; cat "$tmp/resume.0"; exit 1; }
}
resumed() {  # resumed <step>: both ranks of the last `run resume` resumed there and finished
  for r in 0 1; do
    grep -q "rank $r: resumed at step $1" "$tmp/resume.$r" || { echo "rank $r did not resume at step $1"; exit 1; }
    grep -q "rank $r: checksum" "$tmp/resume.$r" || { echo "rank $r did not finish"; exit 1; }
  done
}

start_serve "$dir/job_keep.lua"
run die
echo "--- first run (rank 1 killed at step 5):"; cat "$tmp/die.0" "$tmp/die.1"
grep -q "ZD_ERR_PEER_LOST" "$tmp/die.0" || { echo "rank 0 was not told its peer was lost"; exit 1; }

"$zerod" status --socket "$sock" > "$tmp/status" || { cat "$tmp/status"; exit 1; }
echo "--- zerod status between the runs:"; cat "$tmp/status"
grep -q "lost" "$tmp/status" || { echo "status does not show the lost rank"; exit 1; }

run resume
echo "--- second run:"; cat "$tmp/resume.0" "$tmp/resume.1"
resumed 6
kill $serve; wait $serve 2>/dev/null; serve=

# comm.timeout = 0: a re-attached rank waits for the other however long it takes.
start_serve "$dir/job_keep_forever.lua"
run die
grep -q "ZD_ERR_PEER_LOST" "$tmp/die.0" || { echo "comm.timeout = 0: rank 0 was not told its peer was lost:"; cat "$tmp/die.0"; exit 1; }
# Rank 0 alone re-attaches and waits in its finalize; it dies there. Its
# wait must end with it, else its session holds the rank (the next rank 0
# is refused as "already connected") and counts it as re-attached.
rank 0 resume
waiting "${pids[0]}"
kill -9 "${pids[0]}"; wait "${pids[0]}" 2>/dev/null
run resume 1.5
echo "--- comm.timeout = 0, rank 1 re-attaching 1.5 s after rank 0:"; cat "$tmp/resume.0" "$tmp/resume.1"
resumed 6
# Rank 0 alone again, waiting for rank 1: the daemon's stop ends its wait.
rank 0 resume
waiting "${pids[0]}"
kill -TERM $serve
for _ in $(seq 50); do kill -0 $serve 2>/dev/null || break; sleep 0.1; done
kill -0 $serve 2>/dev/null && { echo "zerod serve still runs 5 s after SIGTERM while a rank waits to re-attach"; cat "$tmp/serve.log"; exit 1; }
wait $serve 2>/dev/null; serve=
wait "${pids[0]}" 2>/dev/null
echo "restart: the kept model resumed at step 6; with comm.timeout = 0 too, after a late rank, a dead waiter and a stop"
