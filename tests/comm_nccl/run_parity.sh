#!/usr/bin/env bash
# `zerod run` across two daemons through the nccl plugin against one daemon,
# on one GPU: at ZeRO stages 1-3, rank_scenario trains 20 steps on 2 ranks
#   - one daemon, 2 ranks, comm = local (the reference), and
#   - two daemons (--nnodes 2 --node-rank k), 1 rank each, comm = nccl,
#     each with its own NCCL_HOSTID (NCCL 2.28 puts two ranks of one
#     communicator on one GPU only when they look like two hosts; it then
#     joins them over loopback sockets), the root at ZEROD_NCCL_ROOT;
# and every rank's checksum must agree within 1e-5 (two ranks: a + b is
# b + a, so the sums are expected to be equal bits; the script says whether
# the parameter hashes are). The ranks' buffers are host memory (the job's
# device is the cpu backend): the plugin stages them through the GPU.
# Exits 77 (skipped) without a CUDA device.
# usage: run_parity.sh ZEROD RANK_SCENARIO GPU_TEST
set -euo pipefail
zerod=$1 trainer=$2 gpu_test=$3
probe=0; "$gpu_test" --probe || probe=$?
[ "$probe" -eq 0 ] || { [ "$probe" -eq 77 ] && { echo "SKIPPED: no CUDA device is visible here"; exit 77; }; exit "$probe"; }
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

job() {  # job FILE STAGE BACKEND
  cat >"$1" <<LUA
return {
  optimizer = { type = "adamw", lr = 0.05 },
  zero = { stage = $2 },
  comm = { backend = "$3", timeout = 60 },
}
LUA
}

value() {  # value OUTPUT RANK KEY: what rank R printed after "rank R: KEY "
  sed -n "s/^\[rank $2\] rank $2: $3 //p" <<<"$1" | head -1
}

# NCCL between the two daemons over the loopback through its own sockets,
# whatever else the machine has (a network plugin, a multi-node NVLink
# fabric); its warnings shown.
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} NCCL_IB_DISABLE=${NCCL_IB_DISABLE:-1} \
  NCCL_NET=${NCCL_NET:-Socket} NCCL_MNNVL_ENABLE=${NCCL_MNNVL_ENABLE:-0} NCCL_DEBUG=${NCCL_DEBUG:-WARN}
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for stage in 1 2 3; do
  job "$work/local$stage.lua" "$stage" local
  job "$work/nccl$stage.lua" "$stage" nccl
  one=$(timeout 300 "$zerod" run --nproc 2 --job "$work/local$stage.lua" -- "$trainer" normal 2>&1) || {
    echo "stage $stage: one daemon failed:"; echo "$one"; exit 1; }
  pids=()
  for k in 0 1; do
    ZEROD_NCCL_ROOT=127.0.0.1:$port NCCL_HOSTID=zerod-parity-node-$k \
      timeout 300 "$zerod" run --nproc 1 --nnodes 2 --node-rank $k --job "$work/nccl$stage.lua" -- "$trainer" normal \
      >"$work/node$k.log" 2>&1 &
    pids+=($!)
  done
  for k in 0 1; do
    wait "${pids[$k]}" || { echo "stage $stage: node $k failed:"; cat "$work/node0.log" "$work/node1.log"; exit 1; }
  done
  pids=()
  two=$(cat "$work/node0.log" "$work/node1.log")
  for r in 0 1; do
    ref=$(value "$one" $r checksum) got=$(value "$two" $r checksum)
    [ -n "$ref" ] && [ -n "$got" ] || { echo "stage $stage: rank $r printed no checksum:"; echo "$one"; echo "$two"; exit 1; }
    python3 - "$stage" "$r" "$ref" "$got" <<'PY'
import sys
stage, r, ref, got = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
if abs(ref - got) > 1e-5 * max(1.0, abs(ref)):
    print(f"stage {stage} rank {r}: two daemons through nccl {got!r}, one daemon {ref!r}"); sys.exit(1)
print(f"stage {stage} rank {r}: checksum agrees: nccl {got!r}, local {ref!r}")
PY
    if [ "$(value "$one" $r parameters)" = "$(value "$two" $r parameters)" ]; then
      echo "stage $stage rank $r: parameters bit-identical"
    else
      echo "stage $stage rank $r: parameters differ in their bits (within the tolerance above)"
    fi
  done
done
echo "run_parity: all checks passed"
