#!/bin/bash
# Daemons that no single mpirun started: NODES mpiruns of one process each,
# given one ompi-server, form one world with ZEROD_MPI_JOIN (the plugin's
# join.h) and pass the same collective tests as `mpirun -np NODES`. Then a
# job whose last node never comes: the others end within the join's
# timeout, saying how many daemons they saw.
#   join_test.sh NODES TEST_BINARY GTEST_FILTER MPIRUN [MPIRUN OPTIONS...]
set -u
nodes=$1
binary=$2
filter=$3
shift 3
tmp=$(mktemp -d)
server=""
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null
  jobs -p | xargs -r kill 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

ompi-server --no-daemonize --report-uri "$tmp/uri" > "$tmp/server.log" 2>&1 &
server=$!
for _ in $(seq 100); do [ -s "$tmp/uri" ] && break; sleep 0.1; done
[ -s "$tmp/uri" ] || { echo "join_test: ompi-server wrote no URI"; cat "$tmp/server.log"; exit 1; }

# Runs node $1 of $2 (job name $3, join timeout $4 s) as an mpirun of its
# own; its output in $tmp/<name>.node<k>.
run_node() {
  local node=$1 of=$2 name=$3 timeout=$4
  shift 4
  ZEROD_MPI_JOIN="zerod-join-test-$$-$name,$node,$of,$timeout" \
    "$@" --ompi-server "file:$tmp/uri" -np 1 "$binary" "$filter" > "$tmp/$name.node$node" 2>&1
}

# 1. Every node comes, in reverse order (node 0 last): the same tests pass.
pids=()
for ((k = nodes - 1; k >= 0; k--)); do
  run_node "$k" "$nodes" all 120 "$@" &
  pids+=($!)
  sleep 0.3
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
if [ "$failed" != 0 ]; then
  for ((k = 0; k < nodes; k++)); do echo "--- node $k:"; tail -30 "$tmp/all.node$k"; done
  echo "join_test: a joined node failed its tests"
  exit 1
fi
grep -h "PASSED" "$tmp"/all.node* | sort | uniq -c

# 2. The last node never comes: the others end within the timeout (5 s)
# with the plugin's message, not a hang.
pids=()
for ((k = 0; k < nodes - 1; k++)); do
  run_node "$k" "$nodes" missing 5 "$@" &
  pids+=($!)
done
start=$SECONDS
for p in "${pids[@]}"; do wait "$p" && { echo "join_test: a node passed although node $((nodes - 1)) never came"; exit 1; }; done
took=$((SECONDS - start))
if [ "$took" -gt 60 ]; then
  echo "join_test: the nodes took $took s to give up on a join with a 5 s timeout"
  exit 1
fi
for ((k = 0; k < nodes - 1; k++)); do
  if ! grep -q "waited 5 s for the $nodes daemons of 'zerod-join-test-$$-missing' and saw $((nodes - 1))" "$tmp/missing.node$k"; then
    echo "--- node $k:"; cat "$tmp/missing.node$k"
    echo "join_test: node $k did not say that it saw $((nodes - 1)) of $nodes daemons"
    exit 1
  fi
done
echo "join_test: $nodes mpiruns joined through ompi-server and passed; a missing node was reported in $took s"
