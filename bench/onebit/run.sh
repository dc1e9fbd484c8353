#!/bin/bash
# Adam against 1-bit Adam across two "nodes" joined by a slow link: two
# network namespaces, a veth pair each on a bridge, a tbf limit of RATE on
# each host's egress (1 Gbit/s by default, the link 1-bit Adam is for).
# mpirun starts one `zerod run --nproc L` per host, the daemons talk through
# the mpi comm plugin, and every rank is onebit_rank (a model of --params
# fp32 parameters with made-up gradients), at ZeRO stage 0 (DeepSpeed's only
# setting for 1-bit Adam) and stage 1 (--stages). Printed side by
# side in one run: iperf3 on the same link, then for each optimizer the
# median step time, the bytes each daemon put on the network per step, the
# time those bytes take at iperf3's rate (the link's bound), and the
# 1-bit/Adam ratios. Needs root (namespaces, tc), mpirun and iperf3.
#
#   bench/onebit/run.sh [--build DIR] [--rate 1gbit] [--local L] [--params 25e6] [--steps 12] [--stages "0 1"]
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build="$root/build"
rate="1gbit"
local_ranks=1
params="25e6"
steps=12
stages="0 1"
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --local) local_ranks=$2; shift 2 ;;
    --params) params=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --stages) stages=$2; shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--rate 1gbit] [--local L] [--params 25e6] [--steps 12] [--stages \"0 1\"]" >&2
       exit 2 ;;
  esac
done
zerod="$build/bin/zerod"
rank="$build/bin/onebit_rank"
for f in "$zerod" "$rank"; do
  [ -x "$f" ] || { echo "run.sh: $f is not built (ninja -C $build)" >&2; exit 1; }
done
[ -f "$build/lib/zerod/plugins/zd_comm_mpi.so" ] || [ -n "$(find "$build" -name zd_comm_mpi.so -print -quit)" ] ||
  { echo "run.sh: the mpi comm plugin is not built (Debian: openmpi-bin libopenmpi-dev, then reconfigure)" >&2; exit 1; }
command -v iperf3 >/dev/null || { echo "run.sh: iperf3 is not installed (Debian: iperf3)" >&2; exit 1; }
mpirun=$(command -v mpirun) || { echo "run.sh: mpirun is not installed (Debian: openmpi-bin)" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "run.sh: needs root: it makes network namespaces, a bridge and tc qdiscs" >&2; exit 1; }

# shellcheck source=../../tests/comm_mpi/netns_lib.sh
. "$root/tests/comm_mpi/netns_lib.sh"
trap zd_netns_cleanup EXIT
trap 'exit 130' INT TERM
zd_netns_setup 2 "$rate" || { echo "run.sh: setting up the hosts failed" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_plm_rsh_agent="$ZD_RSH_AGENT"

# iperf3, one TCP stream host0 -> host1 for 5 s: the receiver's bits/s.
zd_netns_run 1 iperf3 -s -1 -B "${ZD_IP[1]}" >/dev/null 2>&1 &
server=$!
sleep 0.5
link_bits=$(zd_netns_run 0 iperf3 -c "${ZD_IP[1]}" -t 5 -J 2>/dev/null |
  python3 -c 'import json,sys; print(int(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]))')
wait "$server" 2>/dev/null
[ -n "$link_bits" ] || { echo "run.sh: iperf3 measured nothing" >&2; exit 1; }

# freeze_step 2: steps 0-1 are plain Adam (1-bit Adam's warm-up), the
# measured steps (from step 4, onebit_rank --skip) are all compressed.
write_jobs() {  # write_jobs STAGE
  cat >"$ZD_DIR/adam.lua" <<LUA
return { optimizer = { type = "adam", lr = 1e-3, bias_correction = false }, zero = { stage = $1 },
         comm = { backend = "mpi", timeout = 300 } }
LUA
  cat >"$ZD_DIR/onebit.lua" <<LUA
return { optimizer = { type = "onebit_adam", lr = 1e-3, freeze_step = 2 }, zero = { stage = $1 },
         comm = { backend = "mpi", timeout = 300 } }
LUA
}

run() {  # run JOB: onebit_rank's figures, "step_ms network_bytes_per_step checksum"
  local out
  out=$(zd_netns_run 0 "$mpirun" --host "${ZD_IP[0]}:1,${ZD_IP[1]}:1" -np 2 --map-by node --oversubscribe \
    --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include "$ZD_SUBNET" --mca oob_tcp_if_include "$ZD_SUBNET" \
    "$zerod" run --nproc "$local_ranks" --no-prefix --job "$1" -- "$rank" --params "$params" --steps "$steps" 2>&1)
  local ms net sum
  ms=$(echo "$out" | sed -n 's/^onebit_rank: step_ms //p')
  net=$(echo "$out" | sed -n 's/^onebit_rank: network_bytes_per_step //p')
  sum=$(echo "$out" | sed -n 's/^onebit_rank: checksum //p')
  [ -n "$ms" ] && [ -n "$net" ] || { echo "run.sh: the run of $1 failed:" >&2; echo "$out" >&2; return 1; }
  echo "$ms $net $sum"
}

echo "bench/onebit: 2 hosts (network namespaces) x $local_ranks rank(s), $params fp32 parameters;" \
     "$(nproc) CPUs shared by both hosts; median step of $((steps - 4)) after 4"
echo "link: $rate per direction (tbf); iperf3 measured $(python3 -c "print(f'{$link_bits/1e9:.3f}')") Gbit/s"
for stage in $stages; do
  write_jobs "$stage"
  adam=$(run "$ZD_DIR/adam.lua") || exit 1
  onebit=$(run "$ZD_DIR/onebit.lua") || exit 1
  echo
  echo "ZeRO stage $stage"
  python3 - "$link_bits" $adam $onebit <<'PY'
import sys
link = float(sys.argv[1]) / 8  # bytes/s
a_ms, a_net = float(sys.argv[2]), float(sys.argv[3])
o_ms, o_net = float(sys.argv[5]), float(sys.argv[6])
def row(name, ms, net):
    bound = net / link * 1e3
    print(f"{name:<12} {ms:>10.1f} {net / 1e6:>14.2f} {bound:>14.1f} {bound / ms if ms else 0:>10.2f}")
print(f"{'':<12} {'step ms':>10} {'net MB/step':>14} {'link ms/step':>14} {'link/step':>10}")
row("adam", a_ms, a_net)
row("1-bit adam", o_ms, o_net)
print(f"1-bit adam / adam: step time {o_ms / a_ms:.3f}x (speed-up {a_ms / o_ms:.2f}x), "
      f"network bytes {o_net / a_net:.4f}x ({a_net / o_net:.1f}x fewer)")
PY
done
