#!/usr/bin/env bash
# One long-running `zerod serve --jobs` serves several jobs at once (issue
# 36 §1): two 2-rank jobs with their own job scripts, started at the same
# time with torchrun's variables (so both have a rank 0 and a rank 1), each
# end exactly as under `zerod run`; their model state is charged together
# against the node's host memory (--host-memory), a model whole or not at
# all, so a job that would not fit beside a running one is refused at
# finalize naming the job that holds it, and runs once that job is gone, and
# of two started at once beside room for one, one trains and the other is
# refused (charged rank by rank, each could get a rank in and both failed);
# ranks started by hand are one job;
# a process alone is a job of its own; the daemon serves on until SIGTERM.
#   multi_job.sh ZEROD TRAIN_MLP JOB_A JOB_B
set -uo pipefail
zerod=$1 trainer=$2 job_a=$3 job_b=$4
work=$(mktemp -d /tmp/zerod-multi-job-XXXXXX)
serve_pid=
trap '[ -n "$serve_pid" ] && kill -9 $serve_pid 2>/dev/null; pkill -9 -f "$work" 2>/dev/null; rm -rf "$work"' EXIT
unset ZEROD_ENDPOINT ZEROD_RANK ZEROD_WORLD_SIZE ZEROD_LOCAL_RANK ZEROD_LOCAL_WORLD_SIZE ZEROD_JOB ZEROD_JOB_KEY \
  RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT
# job B (examples/c/job_offload.lua) keeps its optimizer on disk there; the daemon runs the script.
export ZEROD_NVME_PATH=$work/nvme
mkdir -p "$ZEROD_NVME_PATH"
die() { echo "multi_job: $*"; for f in "$work"/*.out "$work"/serve.log; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done; exit 1; }

ref_a=$("$zerod" run --no-prefix --nproc 2 --job "$job_a" -- "$trainer" --steps 30 2>&1 | grep "final loss") || die "zerod run (job A) failed"
ref_b=$("$zerod" run --no-prefix --nproc 2 --job "$job_b" -- "$trainer" --steps 30 2>&1 | grep "final loss") || die "zerod run (job B) failed"
[ "$ref_a" != "$ref_b" ] || die "the two job scripts train alike; the test could not tell them apart"

sock=$work/serve.sock
start_serve() {  # start_serve [--host-memory SIZE]
  "$zerod" serve --jobs --socket "$sock" "$@" >"$work/serve.log" 2>&1 &
  serve_pid=$!
  for _ in $(seq 100); do [ -S "$sock" ] && return; sleep 0.05; done
  die "zerod serve --jobs did not listen"
}
stop_serve() {
  kill -TERM $serve_pid
  wait $serve_pid; local rc=$?
  [ $rc = 0 ] || die "zerod serve --jobs ended with $rc on SIGTERM"
  serve_pid=
}
# launch NAME JOB PORT STEPS: a job's two ranks, as torchrun starts them, pointed at the daemon.
launch() {
  local name=$1 job=$2 port=$3 steps=$4
  for r in 0 1; do
    ZEROD_ENDPOINT=unix:$sock ZEROD_JOB=$job RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 \
      MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$trainer" --steps "$steps" >"$work/$name.$r.out" 2>&1 &
    pids[$r]=$!
  done
}

# 1. What job A's two ranks need together: a daemon that may hold 1 KiB refuses it, saying how much.
start_serve --host-memory 1KiB
launch probe "$job_a" 29701 30
wait "${pids[@]}"
need=$(grep -ho "needs [^(]*(\([0-9]*\) bytes)" "$work"/probe.*.out | head -1 | sed 's/.*(\([0-9]*\) bytes)/\1/')
[ -n "$need" ] || die "a job that cannot fit in 1 KiB was not refused with its need"
grep -q "ZD_ERR_BUDGET" "$work/probe.0.out" || die "the refusal is not ZD_ERR_BUDGET"
grep -q "ranks 0,1 on this node needs [^(]*($need bytes)" "$work"/probe.*.out ||
  die "the refusal does not name the model's two ranks"
stop_serve
echo "multi_job: job A's two ranks need $need bytes of host memory together (refused with 1 KiB)"

# 2. Two jobs at once, each with its own script, the same rank numbers: each ends as under zerod run.
start_serve
launch a "$job_a" 29702 30; a_pids=("${pids[@]}")
launch b "$job_b" 29703 30; b_pids=("${pids[@]}")
for p in "${a_pids[@]}" "${b_pids[@]}"; do wait "$p" || die "a rank of the two concurrent jobs failed"; done
got_a=$(grep "final loss" "$work/a.0.out") got_b=$(grep "final loss" "$work/b.0.out")
[ "$got_a" = "$ref_a" ] || die "job A through serve --jobs: '$got_a', zerod run: '$ref_a'"
[ "$got_b" = "$ref_b" ] || die "job B through serve --jobs: '$got_b', zerod run: '$ref_b'"
[ "$(grep -c "serving job" "$work/serve.log")" = 2 ] || die "the daemon did not serve two jobs"
kill -0 $serve_pid 2>/dev/null || die "zerod serve --jobs ended when its jobs did"
# The daemon forgets a job once its ranks' connections are seen closed.
for _ in $(seq 100); do
  status=$("$zerod" status --socket "$sock") || die "zerod status failed"
  echo "$status" | grep -q "serving 0 jobs; their planned model state holds 0 B" && break
  sleep 0.1
done
echo "$status" | grep -q "serving 0 jobs; their planned model state holds 0 B" || die "after both jobs: $status"
stop_serve
echo "multi_job: two jobs at once through one daemon: '$got_a' and '$got_b', as under zerod run"

# 3. Room for one and a half jobs: job A runs; job C (A's script, another launch) does not fit beside it.
room=$((need * 3 / 2))
start_serve --host-memory "${room}B"
launch long "$job_a" 29704 1000000; long_pids=("${pids[@]}")
# Up to 60 s: a sanitizer build on a loaded machine takes seconds to its first step.
for _ in $(seq 1200); do grep -q "step" "$work/long.0.out" 2>/dev/null && break; sleep 0.05; done
grep -q "step" "$work/long.0.out" || die "job A did not start training"
"$zerod" status --socket "$sock" | grep -q "serving 1 job;" || die "status does not show the running job"
launch refused "$job_a" 29705 30
wait "${pids[0]}"; rc0=$?
wait "${pids[1]}"; rc1=$?
[ $rc0 != 0 ] && [ $rc1 != 0 ] || die "job C trained although its state does not fit beside job A's"
grep -q "ZD_ERR_BUDGET" "$work"/refused.*.out || die "job C was not refused with ZD_ERR_BUDGET"
grep -q "MASTER_PORT=29704.*model 0: ranks 0,1" "$work"/refused.*.out || die "the refusal does not name the job holding the memory"
kill -9 "${long_pids[@]}"; wait "${long_pids[@]}" 2>/dev/null
for _ in $(seq 100); do "$zerod" status --socket "$sock" | grep -q "holds 0 B" && break; sleep 0.1; done
"$zerod" status --socket "$sock" | grep -q "holds 0 B" || die "job A's memory was not given back when its ranks died"
launch after "$job_a" 29705 30
wait "${pids[0]}" && wait "${pids[1]}" || die "job C failed once job A was gone"
got=$(grep "final loss" "$work/after.0.out")
[ "$got" = "$ref_a" ] || die "job C after job A: '$got', zerod run: '$ref_a'"
echo "multi_job: a job that did not fit beside a running one was refused naming it, and ran once it was gone"
stop_serve

# 4. Room for one job, two started at once: one trains, the other is refused whole. Both would train
# for good (a loaded machine could otherwise let one finish and give the room back before the other's
# ranks reach finalize, and both would train): the first job whose ranks end must be the refused one.
start_serve --host-memory "${need}B"
launch x "$job_a" 29706 1000000; x_pids=("${pids[@]}")
launch y "$job_a" 29707 1000000; y_pids=("${pids[@]}")
ended() { local pid; for pid in "$@"; do kill -0 "$pid" 2>/dev/null && return 1; done; return 0; }
refused= trained=
# Up to 120 s: a sanitizer build on a loaded machine is slow to reach finalize.
for _ in $(seq 2400); do
  if ended "${x_pids[@]}"; then refused=x trained=y; break; fi
  if ended "${y_pids[@]}"; then refused=y trained=x; break; fi
  sleep 0.05
done
[ -n "$refused" ] || die "two jobs beside room for one: neither was refused"
[ $refused = x ] && p=("${x_pids[@]}") t=("${y_pids[@]}") || p=("${y_pids[@]}") t=("${x_pids[@]}")
for pid in "${p[@]}"; do wait "$pid" && die "job $refused ended with 0, as if it had trained"; done
grep -q "ZD_ERR_BUDGET" "$work/$refused".*.out && grep -q "a model is admitted whole or not at all" \
  "$work/$refused".*.out || die "the job that ended first ($refused) was not refused with ZD_ERR_BUDGET, saying why"
for _ in $(seq 1200); do grep -q "step" "$work/$trained.0.out" 2>/dev/null && break; sleep 0.05; done
grep -q "step" "$work/$trained.0.out" || die "the job that got the room ($trained) did not train"
! grep -q "ZD_ERR" "$work/$trained".*.out || die "the job that got the room ($trained) saw an error"
kill -9 "${t[@]}"; wait "${t[@]}" 2>/dev/null
for _ in $(seq 100); do "$zerod" status --socket "$sock" | grep -q "holds 0 B" && break; sleep 0.1; done
"$zerod" status --socket "$sock" | grep -q "holds 0 B" || die "memory is still held after both jobs"
echo "multi_job: of two jobs started at once beside room for one, one trained and the other was refused"

# 5. Ranks started by hand (zerod's variables, no launcher ids) are one job: the parent they share.
for r in 0 1; do
  ZEROD_ENDPOINT=unix:$sock ZEROD_JOB=$job_a ZEROD_RANK=$r ZEROD_WORLD_SIZE=2 "$trainer" --steps 30 >"$work/hand.$r.out" 2>&1 &
  pids[$r]=$!
done
wait "${pids[0]}" && wait "${pids[1]}" || die "two ranks started by hand failed"
got=$(grep "final loss" "$work/hand.0.out")
[ "$got" = "$ref_a" ] || die "ranks started by hand: '$got', zerod run: '$ref_a'"
# A process alone is a job of its own. What is refused, saying why: protocol_test's MultiJob.*
# (a job key with another world size, a rank of several naming no job, ranks on several nodes).
ZEROD_ENDPOINT=unix:$sock ZEROD_JOB=$job_a "$trainer" --steps 30 >"$work/single.out" 2>&1 || die "a one-rank job failed"
"$zerod" serve --jobs --job "$job_a" --socket "$work/other.sock" >"$work/clash.out" 2>&1 && die "serve --jobs took --job"
grep -q "takes no --job" "$work/clash.out" || die "serve --jobs --job was not refused saying why"
stop_serve
echo "multi_job: all checks passed"
