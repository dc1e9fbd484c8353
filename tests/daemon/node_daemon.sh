#!/usr/bin/env bash
# Ranks of another launcher start their node's daemon on demand (issue 36
# §1, libzerod/src/node_daemon.h), without Python, so that the sanitizer builds
# run it too: two C trainers with torchrun's variables and then with Open
# MPI's end as under `zerod run --nproc 2` (the same final line), through
# one daemon that is gone once they are; a third launch whose rank dies
# leaves no daemon behind either.
#   node_daemon.sh ZEROD TRAIN_MLP JOB
set -uo pipefail
zerod=$1 trainer=$2 job=$3
work=$(mktemp -d /tmp/zerod-node-daemon-XXXXXX)
trap 'pkill -f "zerod serve --until-done.*$work" 2>/dev/null; rm -rf "$work"' EXIT
export XDG_RUNTIME_DIR=$work ZEROD_JOB=$job
unset ZEROD_ENDPOINT ZEROD_RANK ZEROD_WORLD_SIZE ZEROD_LOCAL_RANK RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
ref=$("$zerod" run --no-prefix --nproc 2 --job "$job" -- "$trainer" --steps 30 2>&1 | grep "final loss") ||
  { echo "node_daemon: zerod run failed"; exit 1; }
daemons() { pgrep -f "zerod serve --until-done.*$work" | wc -l; }
launch() {  # launch NAME VARS...: two ranks with the launcher's variables for rank $r
  local name=$1
  shift
  for r in 0 1; do
    env "${@//\{r\}/$r}" "$trainer" --steps 30 >"$work/$name.$r" 2>&1 &
  done
  wait
}
for how in torchrun mpirun; do
  if [ $how = torchrun ]; then
    launch $how RANK={r} WORLD_SIZE=2 LOCAL_RANK={r} LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29611
  else
    launch $how OMPI_COMM_WORLD_RANK={r} OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK={r} \
      OMPI_COMM_WORLD_LOCAL_SIZE=2 PMIX_NAMESPACE=node-daemon-test
  fi
  got=$(grep "final loss" "$work/$how.0") || { echo "node_daemon: $how: rank 0 did not finish:"; cat "$work/$how.0" "$work/$how.1"; exit 1; }
  [ "$got" = "$ref" ] || { echo "node_daemon: $how: '$got', zerod run: '$ref'"; exit 1; }
  grep -q "started this node's daemon" "$work/$how.0" "$work/$how.1" || { echo "node_daemon: $how: no rank said it started the daemon"; exit 1; }
  for _ in $(seq 100); do [ "$(daemons)" = 0 ] && break; sleep 0.1; done
  [ "$(daemons)" = 0 ] || { echo "node_daemon: $how: the daemon outlived its ranks"; exit 1; }
  echo "node_daemon: $how: both ranks through one daemon started on demand: $got, as under zerod run; no daemon left"
done
# A rank killed mid-run: the other is told, and no daemon is left.
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29612 \
    "$trainer" --steps 100000 >"$work/die.$r" 2>&1 &
  pids[$r]=$!
done
for _ in $(seq 200); do grep -q "step" "$work/die.0" 2>/dev/null && break; sleep 0.05; done
kill -9 "${pids[1]}"
wait "${pids[0]}"; rc=$?
[ $rc != 0 ] || { echo "node_daemon: rank 0 ended well although rank 1 was killed"; cat "$work/die.0"; exit 1; }
grep -q "ZD_ERR_PEER_LOST\|rank 1 (pid ${pids[1]}) is gone" "$work/die.0" || { echo "node_daemon: rank 0 was not told:"; cat "$work/die.0"; exit 1; }
for _ in $(seq 100); do [ "$(daemons)" = 0 ] && break; sleep 0.1; done
[ "$(daemons)" = 0 ] || { echo "node_daemon: the daemon outlived a launch whose rank was killed"; exit 1; }
echo "node_daemon: a killed rank was reported to the other (pid ${pids[1]}) and no daemon is left"
echo "node_daemon: all checks passed"
