#!/usr/bin/env bash
# Ranks of another launcher on several nodes, without `zerod run` (issue 36
# §1): each node's first rank starts that node's daemon on demand under an
# `mpirun -np 1` of its own, given the ompi-server ZEROD_OMPI_SERVER names,
# and the daemons join through the mpi comm plugin (ZEROD_MPI_JOIN). Two
# "nodes" of two ranks on this machine, with torchrun's variables (GROUP_RANK
# says the node): the C example trains to the final loss of `zerod run
# --nproc 4` (within 1e-5: the mpi plugin reduces in another order), no
# daemon, mpirun or server is left. Then the same without an ompi-server of
# the user's: node 0's daemon starts one and hands it to node 1 over the
# rendezvous at MASTER_ADDR:MASTER_PORT+1 (`zerod join`), and with the
# one-node job unchanged (no comm backend named: "mpi" across nodes). A node
# 0 that never answers fails node 1's rank within its timeout, quoting
# `zerod join`'s reason. Without a server
# or a rendezvous address, or without a node index, the ranks are refused
# saying what to set.
#   launched_nodes.sh ZEROD TRAIN_MLP JOB
set -uo pipefail
zerod=$1 trainer=$2 job=$3
work=$(mktemp -d /tmp/zerod-launched-nodes-XXXXXX)
server=""
cleanup() {
  pkill -f "zerod serve --until-done.*$work|ompi-server.*$work/zerod-launch" 2>/dev/null
  [ -n "$server" ] && kill "$server" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
export XDG_RUNTIME_DIR=$work
unset ZEROD_ENDPOINT ZEROD_RANK ZEROD_WORLD_SIZE ZEROD_LOCAL_RANK ZEROD_LOCAL_WORLD_SIZE ZEROD_NODE_RANK \
  RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK ZEROD_OMPI_SERVER
# The mpiruns the ranks start use the loopback only, like every MPI test here.
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=tcp,self OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
{ cat "$job"; } > "$work/local.lua"
sed 's/^return {/return {\n  comm = { backend = "mpi", timeout = 60 },/' "$job" > "$work/mpi.lua"
grep -q 'backend = "mpi"' "$work/mpi.lua" || { echo "launched_nodes: could not write the mpi job"; exit 1; }

ref=$("$zerod" run --no-prefix --nproc 4 --job "$work/local.lua" -- "$trainer" --steps 30 2>&1 | grep "final loss") ||
  { echo "launched_nodes: zerod run failed"; exit 1; }
# The daemons (and their `zerod join` wrappers), and the name servers node 0
# starts (the user's, $server, is not one of these).
left() { pgrep -f "zerod serve --until-done.*$work|ompi-server.*$work/zerod-launch" | wc -l; }
# A port nothing listens on now, and the one above it (the rendezvous).
master_port=$(python3 -c 'import socket
for _ in range(100):
    a, b = socket.socket(), socket.socket()
    try:
        a.bind(("127.0.0.1", 0)); p = a.getsockname()[1]; b.bind(("127.0.0.1", p + 1)); print(p); break
    except OSError: pass
    finally: a.close(); b.close()')

ompi-server --no-daemonize --report-uri "$work/uri" --mca oob_tcp_if_include lo > "$work/server.log" 2>&1 &
server=$!
for _ in $(seq 100); do [ -s "$work/uri" ] && break; sleep 0.1; done
[ -s "$work/uri" ] || { echo "launched_nodes: ompi-server wrote no URI"; cat "$work/server.log"; exit 1; }

# launch NAME VARS...: ranks 0..3, node = rank / 2, with torchrun's variables.
launch() {
  local name=$1 pids=()
  shift
  for r in 0 1 2 3; do
    env RANK=$r WORLD_SIZE=4 LOCAL_RANK=$((r % 2)) LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$master_port \
      TORCHELASTIC_RUN_ID="launched-$$-$name" ZEROD_JOB="$work/mpi.lua" "${@//\{node\}/$((r / 2))}" \
      timeout 240 "$trainer" --steps 30 > "$work/$name.$r" 2>&1 &
    pids+=($!)
  done
  failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=$((failed + 1)); done  # not the ompi-server, which runs on
}

# trains NAME: the 4 ranks launched with VARS end where `zerod run --nproc
# 4` does, one daemon per node, none left.
trains() {
  local name=$1
  launch "$@"
  if [ "$failed" != 0 ] || ! grep -q "final loss" "$work/$name.0"; then
    echo "launched_nodes ($name): $failed of the 4 ranks failed, or rank 0 printed no final loss:"
    for k in 0 1 2 3; do echo "--- rank $k:"; tail -n 20 "$work/$name.$k"; done
    for f in "$work"/zerod-launch/*.log; do echo "--- $f"; tail -20 "$f"; done
    exit 1
  fi
  got=$(grep "final loss" "$work/$name.0")
  python3 - "$ref" "$got" "$name" <<'PY' || exit 1
import re, sys
ref, got = (float(re.search(r"final loss ([-0-9.e+]+)", s).group(1)) for s in sys.argv[1:3])
if abs(ref - got) > 1e-5 * max(1.0, abs(ref)):
    print(f"launched_nodes ({sys.argv[3]}): 2 nodes ended at {got}, zerod run --nproc 4 at {ref}")
    sys.exit(1)
PY
  n=$(grep -l "started this node's daemon" "$work"/$name.* | wc -l)
  [ "$n" = 2 ] || { echo "launched_nodes ($name): $n ranks said they started a daemon, not one per node"; exit 1; }
  for _ in $(seq 100); do [ "$(left)" = 0 ] && break; sleep 0.1; done
  [ "$(left)" = 0 ] || { echo "launched_nodes ($name): a daemon or name server outlived its ranks:"; pgrep -af "$work"; exit 1; }
  # The joined daemons left cleanly: no mpirun saw one killed (SIGPIPE at
  # MPI_Finalize, as before mpi_env.cpp's exit barrier) or end non-zero.
  if grep -lE "exited on signal|non-zero status|did not return within" "$work"/zerod-launch/*.log; then
    echo "launched_nodes ($name): a joined daemon did not leave cleanly:"; cat "$work"/zerod-launch/*.log; exit 1
  fi
  echo "launched_nodes ($name): 2 nodes x 2 ranks through daemons started on demand: $got (zerod run --nproc 4: $ref); nothing left"
}

trains two GROUP_RANK={node} ZEROD_OMPI_SERVER="file:$work/uri"
# No server of the user's: node 0 starts one (the rendezvous on
# MASTER_PORT+1); its daemon's log says so, node 1's names the server. And
# the job as it is for one node, naming no comm backend: a daemon of
# several nodes takes "mpi" by itself.
trains own GROUP_RANK={node} ZEROD_JOB="$work/local.lua"
grep -qh "zerod join: node 0 of 2: name server .* served on port $((master_port + 1))" "$work"/zerod-launch/*.log ||
  { echo "launched_nodes (own): node 0's daemon did not say it served its name server"; cat "$work"/zerod-launch/*.log; exit 1; }
grep -qh "zerod join: node 1 of 2: node 0's name server is " "$work"/zerod-launch/*.log ||
  { echo "launched_nodes (own): node 1's daemon did not say it got node 0's name server"; exit 1; }

# Node 0 never answers (its rendezvous port held by a listener whose queue
# is full, which answers no SYN, as a host that drops packets does): node
# 1's rank fails within its connect timeout (30 s), quoting its daemon's
# `zerod join`, which gave up first and said where it looked (its log was
# read while it was still stuck in connect(), empty).
python3 - "$work/full_port" <<'PY' &
import socket, sys, time
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(0)
fillers = []
for _ in range(4):
    c = socket.socket()
    c.setblocking(False)
    try:
        c.connect(l.getsockname())
    except BlockingIOError:
        pass
    fillers.append(c)
time.sleep(0.2)
open(sys.argv[1], "w").write(str(l.getsockname()[1]))
time.sleep(120)
PY
full=$!
for _ in $(seq 100); do [ -s "$work/full_port" ] && break; sleep 0.1; done
full_port=$(cat "$work/full_port")
t0=$SECONDS
env RANK=2 WORLD_SIZE=4 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 GROUP_RANK=1 ZEROD_RENDEZVOUS="127.0.0.1:$full_port" \
  TORCHELASTIC_RUN_ID="launched-$$-silent" ZEROD_JOB="$work/mpi.lua" timeout 120 "$trainer" --steps 30 \
  > "$work/silent.2" 2>&1
rc=$?
took=$((SECONDS - t0))
kill "$full" 2>/dev/null
[ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$took" -lt 40 ] ||
  { echo "launched_nodes (silent node 0): rank 2 ended with $rc after $took s:"; cat "$work/silent.2"; exit 1; }
grep -q "zerod join: node 1 of 2: node 0's rendezvous at 127.0.0.1:$full_port did not answer within 22 s (connect: timed out" \
  "$work/silent.2" || { echo "launched_nodes (silent node 0): rank 2 did not quote zerod join's reason:"; cat "$work/silent.2"; exit 1; }
for _ in $(seq 100); do [ "$(left)" = 0 ] && break; sleep 0.1; done
[ "$(left)" = 0 ] || { echo "launched_nodes (silent node 0): its daemon outlived the rank:"; pgrep -af "$work"; exit 1; }
echo "launched_nodes (silent node 0): rank 2 failed after $took s quoting zerod join's reason"

# Refused, saying what to set: neither a server nor where node 0 is; no
# node index.
launch noserver GROUP_RANK={node} MASTER_ADDR=
[ "$failed" = 4 ] || { echo "launched_nodes: $((4 - failed)) ranks ran without a server or a rendezvous"; exit 1; }
grep -q "Set ZEROD_RENDEZVOUS=<node 0's host>:<a free port> in every rank, or ZEROD_OMPI_SERVER=" "$work/noserver.0" ||
  { echo "launched_nodes: without ZEROD_OMPI_SERVER or MASTER_ADDR:"; cat "$work/noserver.0"; exit 1; }
launch nonode ZEROD_OMPI_SERVER="file:$work/uri"
[ "$failed" = 4 ] || { echo "launched_nodes: $((4 - failed)) ranks ran without a node index"; exit 1; }
grep -q "does not say which node this is; set ZEROD_NODE_RANK" "$work/nonode.0" ||
  { echo "launched_nodes: without a node index:"; cat "$work/nonode.0"; exit 1; }
[ "$(left)" = 0 ] || { echo "launched_nodes: a refused launch left a daemon"; exit 1; }
echo "launched_nodes: all checks passed"
