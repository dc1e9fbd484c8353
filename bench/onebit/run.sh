#!/bin/bash
# Adam against 1-bit Adam across two "nodes" joined by a slow link: two
# network namespaces, a veth pair each on a bridge, a tbf limit of RATE on
# each host's egress (1 Gbit/s by default, the link 1-bit Adam is for).
# mpirun starts one `zerod run --nproc L` per host, the daemons talk through
# the mpi comm plugin, and every rank is onebit_rank (a model of --params
# fp32 parameters with made-up gradients), at ZeRO stage 0 (DeepSpeed's only
# setting for 1-bit Adam) and stages 1-3 (--stages), with Adam, 1-bit Adam,
# 0/1 Adam and 1-bit LAMB (--optimizers; a name ending in _replay is that
# optimizer with compression.replay, run at stages 1-3 with fp32 working
# copies only: onebit_adam_replay, zero_one_adam_replay, onebit_lamb_replay).
# Printed side by side in one run:
# iperf3 on the same link, then per stage and optimizer the median and mean
# step time, the bytes each daemon put on the network per step, the time
# those bytes take at iperf3's rate (the link's bound), how many times fewer
# bytes than fp32 Adam's all-reduce (the constant 4 B per parameter at 2
# ranks, whatever this run's Adam rows sent), and how many times faster the
# mean step is than this run's fastest Adam row at any stage (the Adam a user
# would pick) and, beside it, than Adam at the same stage (zerod's stage-2
# Adam sends 1.5x the bytes of its stages 0, 1 and 3, so the same-stage ratio
# flatters stage 2). The tables print after the last stage, since the fastest
# Adam row is known only then. onebit_rank has no forward or backward pass: a
# step exchanges made-up gradients and updates, so its times are the
# optimizer's and the link's, not a model's. Needs root (namespaces, tc),
# mpirun and iperf3.
#
#   bench/onebit/run.sh [--build DIR] [--rate 1gbit] [--local L] [--params 25e6] [--steps 12]
#                       [--stages "0 1 2 3"] [--optimizers "adam onebit_adam onebit_adam_replay zero_one_adam zero_one_adam_replay onebit_lamb onebit_lamb_replay"]
#                       [--dtype fp32|bf16] [--trace DIR]
#
# --trace DIR: each job also writes a timeline of steps 6-7 (docs/observability.md)
# to DIR/OPTIMIZER-sSTAGE.ranks0-0.json (and .ranks1-1.json for the second host),
# for seeing where a step's time goes beside the link's.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build="$root/build"
rate="1gbit"
local_ranks=1
params="25e6"
steps=12
stages="0 1 2 3"
optimizers="adam onebit_adam onebit_adam_replay zero_one_adam zero_one_adam_replay onebit_lamb onebit_lamb_replay"
dtype="fp32"
trace_dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --local) local_ranks=$2; shift 2 ;;
    --params) params=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --stages) stages=$2; shift 2 ;;
    --optimizers) optimizers=$2; shift 2 ;;
    --dtype) dtype=$2; shift 2 ;;
    --trace) trace_dir=$(mkdir -p "$2" && cd "$2" && pwd) || exit 2; shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--rate 1gbit] [--local L] [--params 25e6] [--steps 12] [--stages \"0 1 2 3\"] [--optimizers \"adam onebit_adam onebit_adam_replay zero_one_adam zero_one_adam_replay onebit_lamb\"] [--dtype fp32|bf16] [--trace DIR]" >&2
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

# The jobs. Warm-ups of 2 updates: steps 0-1 are plain Adam (or plain
# LAMB-style steps), the measured steps (from the fifth, onebit_rank --skip)
# are all in the compression phase. 0/1 Adam: variance steps until update 2,
# then (stage 0) local steps with a sync every 2nd step (compression.sync, a
# Lua function of the step; the steady state of gpt_job.lua's policy, whose
# loss is within 2% of Adam's); at stages 1-3, where local steps are refused,
# a 1-bit momentum sync every step with v frozen (local_steps = false).
write_job() {  # write_job OPTIMIZER STAGE FILE
  local prec="fp32" opt
  [ "$dtype" = bf16 ] && prec="bf16"
  local extra="" base=$1
  if [ "${1%_replay}" != "$1" ]; then base=${1%_replay}; extra='compression = { replay = true },'; fi
  case "$base" in
    adam) opt='type = "adam", lr = 1e-3, bias_correction = false' ;;
    onebit_adam) opt='type = "onebit_adam", lr = 1e-3, freeze_step = 2' ;;
    onebit_lamb) opt='type = "onebit_lamb", lr = 1e-3, freeze_step = 2' ;;
    zero_one_adam)
      if [ "$2" = 0 ]; then
        opt='type = "zero_one_adam", lr = 1e-3, var_freeze_step = 2'
        extra="$extra"' compression = { sync = function(step) return step % 2 == 1 end },'
      else
        opt='type = "zero_one_adam", lr = 1e-3, var_freeze_step = 2, local_steps = false'
      fi ;;
    *) echo "run.sh: unknown optimizer $1" >&2; exit 2 ;;
  esac
  [ -n "$trace_dir" ] && extra="$extra trace = { path = \"$trace_dir/$1-s$2.json\", steps = {6, 7} },"
  cat >"$3" <<LUA
return { precision = "$prec", optimizer = { $opt }, zero = { stage = $2 }, $extra
         comm = { backend = "mpi", timeout = 300 } }
LUA
}

run() {  # run JOB: onebit_rank's figures, "step_ms mean_step_ms network_bytes_per_step checksum"
  local out
  out=$(zd_netns_run 0 "$mpirun" --host "${ZD_IP[0]}:1,${ZD_IP[1]}:1" -np 2 --map-by node --oversubscribe \
    --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include "$ZD_SUBNET" --mca oob_tcp_if_include "$ZD_SUBNET" \
    "$zerod" run --nproc "$local_ranks" --no-prefix --job "$1" -- "$rank" --params "$params" --steps "$steps" \
    --dtype "$dtype" 2>&1)
  local ms mean net sum
  ms=$(echo "$out" | sed -n 's/^onebit_rank: step_ms //p')
  mean=$(echo "$out" | sed -n 's/^onebit_rank: mean_step_ms //p')
  net=$(echo "$out" | sed -n 's/^onebit_rank: network_bytes_per_step //p')
  sum=$(echo "$out" | sed -n 's/^onebit_rank: checksum //p')
  # Each rank's CPUs, kept for the last line of the bench.
  echo "$out" | sed -n 's/^onebit_rank: rank \([0-9]*\) cpus /\1 /p' >"$ZD_DIR/cpus.$$" 2>/dev/null
  [ -n "$ms" ] && [ -n "$net" ] || { echo "run.sh: the run of $1 failed:" >&2; echo "$out" >&2; return 1; }
  echo "$ms $mean $net $sum"
}

echo "bench/onebit: 2 hosts (network namespaces) x $local_ranks rank(s), $params $dtype parameters;" \
     "$(nproc) CPUs shared by both hosts; median and mean step of $((steps - 4)) after 4"
echo "link: $rate per direction (tbf); iperf3 measured $(python3 -c "print(f'{$link_bits/1e9:.3f}')") Gbit/s"
figures=()  # "STAGE OPTIMIZER step_ms mean_ms net_bytes checksum", every stage's rows
for stage in $stages; do
  for opt in $optimizers; do
    # Replay runs where it can: stages 1-3, fp32 working copies.
    if [ "${opt%_replay}" != "$opt" ] && { [ "$stage" = 0 ] || [ "$dtype" != fp32 ]; }; then
      continue
    fi
    write_job "$opt" "$stage" "$ZD_DIR/$opt.lua"
    f=$(run "$ZD_DIR/$opt.lua") || exit 1
    figures+=("$stage" "$opt" $f)
  done
done
python3 "$here/table.py" "$link_bits" "$params" "${figures[@]}"
echo
# mpirun binds each process to a core unless told otherwise; zerod run takes
# every CPU back for its daemon and ranks (docs/multinode.md). The last run's
# ranks say what they had:
[ -s "$ZD_DIR/cpus.$$" ] && echo "CPUs each rank could run on (last run):" \
  "$(sort -n "$ZD_DIR/cpus.$$" | sed 's/^\([0-9]*\) /rank \1 on /' | paste -sd, - | sed 's/,/, /g')"
