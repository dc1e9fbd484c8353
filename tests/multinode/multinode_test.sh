#!/usr/bin/env bash
# zerod across "nodes" on one machine: mpirun starts one daemon per node
# (zerod run --nproc 2 each, the way a cluster job would), the daemons talk
# through the mpi comm plugin, and the ranks train rank_scenario. Checks:
#   1. stages 0-3, 1-bit Adam at stages 0-3, 0/1 Adam (stage 2) and 1-bit
#      LAMB (stage 3), and compression.replay (1-bit Adam at stages 2 and
#      3, 0/1 Adam at stage 1) on 2 nodes x 2 ranks end with the same
#      checksum on every rank as one daemon with 4 ranks (the local plugin);
#   2. a rank that dies on node 0 is reported on node 1's ranks, no hang;
#   3. the local backend under mpirun (by zerod run, before any rank starts)
#      and --nnodes without mpirun are refused with a message that says
#      what to do;
#   4. under mpirun's default binding (one core) the daemon's ranks run on
#      every CPU; under --bind-to core they stay on one.
# usage: multinode_test.sh ZEROD RANK_SCENARIO MPIRUN
set -euo pipefail
# Output is matched with grep <<<"$out", not echo | grep -q: under pipefail a
# grep -q that matches early and exits can fail the echo with SIGPIPE.
zerod=$1 trainer=$2 mpirun=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Loopback TCP only, so that the run does not depend on the machine's network.
mpi=("$mpirun" --oversubscribe -np 2 --mca pml ob1 --mca btl tcp,self
     --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)

job() {  # job NAME STAGE BACKEND OPTIMIZER (a NAME with _replay: compression.replay)
  local extra=""
  case "$1" in *_replay*) extra="compression = { replay = true }," ;; esac
  cat >"$work/$1.lua" <<LUA
return {
  optimizer = $4,
  zero = { stage = $2 }, $extra
  comm = { backend = "$3", timeout = 60 },
}
LUA
}
adamw='{ type = "adamw", lr = 0.05 }'
# Compression from step 5 of rank_scenario's 20.
onebit='{ type = "onebit_adam", lr = 0.05, freeze_step = 5 }'
zero_one='{ type = "zero_one_adam", lr = 0.05, var_freeze_step = 5, local_steps = false }'
lamb='{ type = "onebit_lamb", lr = 0.01, freeze_step = 5 }'

checksums() {  # the checksums of ranks 0..3 in a run's output, one line
  local out=$1 line=""
  for rank in 0 1 2 3; do
    s=$(echo "$out" | sed -n "s/^\[rank $rank\] rank $rank: checksum //p" | head -1)
    [ -n "$s" ] || { echo "rank $rank printed no checksum:"; echo "$out"; return 1; }
    line+="$s "
  done
  echo "$line"
}

agree() {  # agree LABEL REFERENCE... -- GOT...: every value within 1e-5 of the reference's first
  python3 - "$@" <<'PY'
import sys
label, rest = sys.argv[1], sys.argv[2:]
cut = rest.index("--")
ref = [float(x) for x in rest[:cut]]
got = [float(x) for x in rest[cut + 1:]]
r = ref[0]
if any(x != r for x in ref):
    print(label, "the one-node reference disagrees with itself:", ref); sys.exit(1)
bad = [x for x in got if abs(x - r) > 1e-5 * max(1.0, abs(r))]
if bad:
    print(label, "2 nodes:", got, "one node:", r); sys.exit(1)
print(label, "agrees: 2 nodes", got, "one node", r)
PY
}

for case in "stage0 0 $adamw" "stage1 1 $adamw" "stage2 2 $adamw" "stage3 3 $adamw" \
            "onebit_stage0 0 $onebit" "onebit_stage1 1 $onebit" "onebit_stage2 2 $onebit" \
            "onebit_stage3 3 $onebit" "zero_one_stage2 2 $zero_one" "lamb_stage3 3 $lamb" \
            "onebit_replay_stage2 2 $onebit" "onebit_replay_stage3 3 $onebit" "zero_one_replay_stage1 1 $zero_one"; do
  read -r name stage opt <<<"$case"
  job "$name.mpi" "$stage" mpi "$opt"
  job "$name.local" "$stage" local "$opt"
  one=$("$zerod" run --nproc 4 --job "$work/$name.local.lua" -- "$trainer" normal 2>&1) || {
    echo "$name: one node failed:"; echo "$one"; exit 1; }
  two=$("${mpi[@]}" "$zerod" run --nproc 2 --job "$work/$name.mpi.lua" -- "$trainer" normal 2>&1) || {
    echo "$name: two nodes failed:"; echo "$two"; exit 1; }
  ref=$(checksums "$one") got=$(checksums "$two")
  # shellcheck disable=SC2086
  agree "$name" $ref -- $got
done

# A rank that dies on node 0: node 1's ranks are told which rank on which node.
job dead 1 mpi "$adamw"
if out=$(timeout 120 "${mpi[@]}" "$zerod" run --nproc 2 --job "$work/dead.lua" -- "$trainer" die 2>&1); then
  echo "a run with a dead rank succeeded:"; echo "$out"; exit 1
fi
# Node 1's daemon logs it and fails its ranks' calls with it (mpirun may
# kill those ranks before they print, once node 0 has exited non-zero).
grep -qE 'node 0 \(ranks 0-1, host .*\) failed: rank 1 was lost' <<<"$out" || {
  echo "node 1 did not name the lost rank:"; echo "$out"; exit 1; }
echo "dead rank: node 1 was told which rank on which node"

# The local backend cannot span daemons.
job local2 1 local "$adamw"
if out=$("${mpi[@]}" "$zerod" run --nproc 2 --job "$work/local2.lua" -- "$trainer" normal 2>&1); then
  echo "the local backend across 2 daemons was accepted:"; echo "$out"; exit 1
fi
# Refused by `zerod run` itself, before any rank starts.
grep -q 'zerod run: this daemon is node [01] of 2 .*for a job across daemons (nodes) use comm = { backend = "mpi" }' <<<"$out" || {
  echo "no clear error for the local backend across daemons:"; echo "$out"; exit 1; }
if grep -q '^\[rank ' <<<"$out"; then
  echo "ranks were started for a job that cannot run:"; echo "$out"; exit 1
fi
echo "local backend across daemons: refused before any rank started"

# --nnodes 2 with one daemon started by hand: the mpi plugin sees one MPI process.
job alone 1 mpi "$adamw"
if out=$(timeout 120 "$zerod" run --nproc 2 --nnodes 2 --node-rank 0 --job "$work/alone.lua" -- "$trainer" normal 2>&1); then
  echo "--nnodes 2 without mpirun succeeded:"; echo "$out"; exit 1
fi
grep -q 'start one daemon per node under MPI' <<<"$out" || {
  echo "no clear error for --nnodes without mpirun:"; echo "$out"; exit 1; }
echo "--nnodes without mpirun: refused with a clear error"

# mpirun binds each process to one core unless told otherwise; a node's
# daemon takes every CPU back for itself and its ranks, and keeps a binding
# asked for with --bind-to (daemon/cli/mpi_binding.h).
all_cpus=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
if [ "$(nproc)" -lt 2 ]; then
  echo "mpirun's binding: not checked, this process may run on one CPU only"
else
  show='sed -n "s/^Cpus_allowed_list:[[:space:]]*//p" /proc/self/status'
  single=("$mpirun" -np 1 --mca pml ob1 --mca btl self --mca oob_tcp_if_include lo)
  job bind 0 local "$adamw"
  out=$(ZEROD_LOG=info "${single[@]}" "$zerod" run --nproc 2 --job "$work/bind.lua" -- sh -c "$show" 2>&1) || {
    echo "zerod run under mpirun's default binding failed:"; echo "$out"; exit 1; }
  for rank in 0 1; do
    got=$(sed -n "s/^\[rank $rank\] //p" <<<"$out")
    [ "$got" = "$all_cpus" ] || {
      echo "rank $rank runs on CPUs '$got' under mpirun's default binding, not on this machine's $all_cpus:"
      echo "$out"; exit 1; }
  done
  grep -q 'zerod run: mpirun bound this process to CPUs .* the daemon and its ranks run on CPUs' <<<"$out" || {
    echo "the daemon did not say that it widened mpirun's binding:"; echo "$out"; exit 1; }
  out=$("${single[@]}" --bind-to core "$zerod" run --nproc 1 --job "$work/bind.lua" -- sh -c "$show" 2>&1) || {
    echo "zerod run under --bind-to core failed:"; echo "$out"; exit 1; }
  got=$(sed -n 's/^\[rank 0\] //p' <<<"$out")
  case "$got" in
    *,* | *-*) echo "rank 0 runs on CPUs '$got' although mpirun was asked for --bind-to core:"; echo "$out"; exit 1 ;;
  esac
  echo "mpirun's binding: its default widened to CPUs $all_cpus, --bind-to core kept (CPU $got)"
fi
echo "multinode: all checks passed"
