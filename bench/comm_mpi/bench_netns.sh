#!/bin/bash
# The mpi plugin's all-reduce between two hosts made of network namespaces
# (one daemon each), beside iperf3 and torch.distributed's gloo backend on
# the same link in the same run: first over a link limited to RATE per
# direction (tbf), then with no limit (veth at memory speed). Needs root
# (namespaces and tc), iperf3 and mpirun; gloo needs the venv's torch
# (scripts/python-venv.sh), and runs on the namespaces' link because
# bench_comm_mpi puts it on the interface --mca btl_tcp_if_include names.
#
#   bench_netns.sh [--build DIR] [--rate 1gbit] [--local N] [--mib 1,4,16,64] [--iters N]
#                  [--spin-us S] [--segment BYTES] [--no-gloo]
# --spin-us is the plugin's spin_us for the run (default: the plugin's, 0):
# both "hosts" share this machine's cores, so a daemon spinning while it
# waits takes the core the other daemon needs.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build="$root/build"
rate="1gbit"
local_ranks=1
mib="1,4,16,64"
iters=5
spin_us=""
segment=""
no_gloo=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --local) local_ranks=$2; shift 2 ;;
    --mib) mib=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --spin-us) spin_us=$2; shift 2 ;;
    --segment) segment=$2; shift 2 ;;
    --no-gloo) no_gloo=--no-gloo; shift ;;
    *) echo "usage: $0 [--build DIR] [--rate 1gbit] [--local N] [--mib 1,4,16,64] [--iters N] [--spin-us S] [--segment BYTES] [--no-gloo]" >&2
       exit 2 ;;
  esac
done
bench="$build/bin/bench_comm_mpi"
[ -x "$bench" ] || { echo "bench_netns: $bench not built (ninja -C $build bench_comm_mpi)" >&2; exit 1; }
command -v iperf3 >/dev/null || { echo "bench_netns: iperf3 is not installed (Debian: iperf3)" >&2; exit 1; }
mpirun=$(command -v mpirun) || { echo "bench_netns: mpirun is not installed (Debian: openmpi-bin)" >&2; exit 1; }
if [ "$(id -u)" -ne 0 ]; then
  echo "bench_netns: needs root: it makes network namespaces, a bridge and tc qdiscs (run it with sudo)" >&2
  exit 1
fi

# shellcheck source=../../tests/comm_mpi/netns_lib.sh
. "$root/tests/comm_mpi/netns_lib.sh"
trap zd_netns_cleanup EXIT
trap 'exit 130' INT TERM
zd_netns_setup 2 "$rate" || { echo "bench_netns: setting up the hosts failed" >&2; exit 1; }

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_plm_rsh_agent="$ZD_RSH_AGENT"

# iperf3, one TCP stream host0 -> host1 for 5 s: the receiver's bits/s.
iperf() {
  zd_netns_run 1 iperf3 -s -1 -B "${ZD_IP[1]}" >/dev/null 2>&1 &
  local server=$!
  sleep 0.5
  zd_netns_run 0 iperf3 -c "${ZD_IP[1]}" -t 5 -J 2>/dev/null |
    python3 -c 'import json,sys; print(int(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]))'
  wait "$server" 2>/dev/null
}

run_bench() {
  local label=$1 link_bits=$2 iperf_bits=$3
  # --bind-to none: each process stands for a node's daemon, which zerod run
  # frees from mpirun's default one-core binding (both hosts were on CPU 0).
  zd_netns_run 0 "$mpirun" --host "${ZD_IP[0]}:1,${ZD_IP[1]}:1" -np 2 --map-by node --oversubscribe --bind-to none \
    --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include "$ZD_SUBNET" --mca oob_tcp_if_include "$ZD_SUBNET" \
    "$bench" --local "$local_ranks" --mib "$mib" --iters "$iters" --link-bits "$link_bits" \
    --iperf-bits "$iperf_bits" ${spin_us:+--spin-us "$spin_us"} ${segment:+--segment "$segment"} $no_gloo --label "$label"
}

echo "bench_netns: hosts ${ZD_HOSTNAME[*]} (${ZD_IP[*]}), veth pairs on a bridge; $(nproc) CPUs"
if [ -n "$rate" ]; then
  limit=$(zd_rate_bits "$rate")
  measured=$(iperf)
  echo "iperf3, $rate link (tbf on each host's egress): ${measured:-?} bits/s"
  run_bench "($rate link, tbf)" "$limit" "${measured:-0}"
  echo
  for (( i = 0; i < 2; i++ )); do
    ip netns exec "${ZD_NS[$i]}" tc qdisc del dev "${ZD_PREFIX}v$i" root 2>/dev/null
  done
fi
measured=$(iperf)
echo "iperf3, no limit (veth): ${measured:-?} bits/s"
run_bench "(no limit)" 0 "${measured:-0}"
