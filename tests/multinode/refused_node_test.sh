#!/usr/bin/env bash
# Two daemons under one mpirun (one app context each) that cannot make the
# job's comm instance together: every rank must hear why at once.
#   1. both daemons told they are node 0 (--node-rank 0), comm.timeout = 0
#      (no limit): node 1 refuses its layout, and it still takes part in
#      the daemons' exchange, so node 0's three ranks fail at once naming
#      node 1 and its words (they used to wait for it for ever), and node
#      1's ranks get its own words;
#   2. node 1's ranks never create the job's second model, comm.timeout =
#      3: node 0's three ranks fail together at the timeout with the same
#      error (each used to build the model again, one after another, each
#      create waiting the timeout anew). (MPI is up on both first: a daemon
#      that never creates any instance never initialises MPI, and the other
#      waits in MPI_Init, which has no timeout.)
# usage: refused_node_test.sh ZEROD RANK_SCENARIO MPIRUN
set -euo pipefail
zerod=$1 trainer=$2 mpirun=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Loopback TCP only; --tag-output tells node 0's lines ([1,0]) from node 1's.
mpi=("$mpirun" --oversubscribe --tag-output --mca pml ob1 --mca btl tcp,self
     --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)

job() {  # job NAME TIMEOUT
  cat >"$work/$1.lua" <<LUA
return {
  optimizer = { type = "adamw", lr = 0.05 },
  zero = { stage = 1 },
  comm = { backend = "mpi", timeout = $2 },
}
LUA
}

# Each line of stdin with the seconds since the epoch in front.
stamp() { while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done; }

# The lines of MPI process $1 (node) from rank $2 of its daemon.
lines_of() { grep -E "^[0-9.]+ \[[0-9]+,$1\]<std(out|err)>:\[rank $2\] " "$out_file" || true; }

# 1. A refusal reaches every daemon at once.
job refused 0
out_file=$work/refused.out
start=$SECONDS
set +e
timeout 120 "${mpi[@]}" -np 1 "$zerod" run --nproc 3 --nnodes 2 --node-rank 0 --job "$work/refused.lua" -- \
    "$trainer" normal : -np 1 "$zerod" run --nproc 3 --nnodes 2 --node-rank 0 --job "$work/refused.lua" -- \
    "$trainer" normal 2>&1 | stamp >"$out_file"
rc=${PIPESTATUS[0]}
set -e
took=$((SECONDS - start))
if [ "$rc" = 124 ]; then
  echo "refused node: the job was still running after 120 s (a daemon waits for the one that refused):"
  cat "$out_file"; exit 1
fi
[ "$rc" != 0 ] || { echo "refused node: a job whose daemons both say node 0 succeeded:"; cat "$out_file"; exit 1; }
words='MPI process 1 of 2 serves ranks 0-2 of 6, but the mpi comm plugin expects one daemon per node'
for r in 0 1 2; do
  grep -q "node 1 (host .*, pid [0-9]*) refused the mpi comm instance, so no daemon can open it: $words" \
      <<<"$(lines_of 0 $r)" || {
    echo "refused node: node 0's rank $r did not name node 1 and its words:"; cat "$out_file"; exit 1; }
  grep -q "ZD_ERR_CONFIG: .*$words" <<<"$(lines_of 1 $r)" || {
    echo "refused node: node 1's rank $r did not say why it refused:"; cat "$out_file"; exit 1; }
done
# The daemons' exit is bounded too (mpi_env.cpp's watchdog after a failed create).
[ "$took" -lt 60 ] || { echo "refused node: the job took $took s to end:"; cat "$out_file"; exit 1; }
echo "refused node: every rank of both nodes heard node 1's refusal at once, the job ended in $took s"

# 2. A node that never creates the second model: node 0's ranks fail
# together at the timeout.
job absent 3
out_file=$work/absent.out
set +e
timeout 120 "${mpi[@]}" -np 1 "$zerod" run --nproc 3 --nnodes 2 --node-rank 0 --job "$work/absent.lua" -- \
    sh -c "\"$trainer\" normal && exec \"$trainer\" normal" : \
    -np 1 "$zerod" run --nproc 3 --nnodes 2 --node-rank 1 --job "$work/absent.lua" -- \
    sh -c "\"$trainer\" normal && sleep 8" 2>&1 | stamp >"$out_file"
rc=${PIPESTATUS[0]}
set -e
[ "$rc" != 0 ] && [ "$rc" != 124 ] || { echo "refused node: the job with an absent node ended with $rc:"; cat "$out_file"; exit 1; }
times=()
for r in 0 1 2; do
  line=$(grep "waited 3 s for the other 1 daemons (MPI processes) to create their mpi comm instance" \
      <<<"$(lines_of 0 $r)" | head -1 || true)
  [ -n "$line" ] || { echo "refused node: node 0's rank $r did not time out naming the absent daemon:"; cat "$out_file"; exit 1; }
  times+=("${line%% *}")
done
spread=$(python3 -c 'import sys; t = [float(x) for x in sys.argv[1:]]; print(round(max(t) - min(t), 2))' "${times[@]}")
python3 -c "import sys; sys.exit(0 if $spread < 2.0 else 1)" || {
  echo "refused node: node 0's ranks timed out $spread s apart, one create after another:"; cat "$out_file"; exit 1; }
echo "refused node: node 0's 3 ranks timed out together ($spread s apart) waiting for the absent node"
echo "refused_node: all checks passed"
