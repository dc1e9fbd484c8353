#!/usr/bin/env bash
# An example trainer started as torchrun starts its workers (WORLD_SIZE,
# RANK, LOCAL_RANK, LOCAL_WORLD_SIZE) and with no ZEROD_JOB: zd_connect
# starts the node's daemon, which needs the job script before any rank
# connects, so the trainer hands it its own (--job, or its default) in
# ZEROD_JOB. Both ranks must end well; rank 0's output is printed for the
# test's pattern.
#   example_under_a_launcher.sh WORK_DIR TRAINER [ARG...]
set -uo pipefail
work=$1 trainer=$2
shift 2
rm -rf "$work" && mkdir -p "$work" || exit 1
# The node daemon's socket goes under XDG_RUNTIME_DIR: this test's own (a
# short path: a socket's is at most 107 bytes).
export XDG_RUNTIME_DIR=$work
unset ZEROD_JOB ZEROD_ENDPOINT ZEROD_RANK ZEROD_WORLD_SIZE ZEROD_LOCAL_RANK ZEROD_LOCAL_WORLD_SIZE \
  OMPI_COMM_WORLD_SIZE SLURM_STEP_NUM_TASKS PMI_SIZE MASTER_ADDR MASTER_PORT
pids=()
for r in 0 1; do
  WORLD_SIZE=2 RANK=$r LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 "$trainer" "$@" >"$work/rank$r" 2>&1 &
  pids[r]=$!
done
status=0
for r in 0 1; do
  wait "${pids[r]}" || { status=1; echo "trainer under a launcher: rank $r failed:"; cat "$work/rank$r"; }
done
[ $status = 0 ] || exit 1
cat "$work/rank0"
echo "trainer under a launcher: both ranks ended well"
