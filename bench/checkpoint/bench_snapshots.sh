#!/bin/bash
# What snapshots cost a step: the same job with snapshot = { every = EVERY }
# and without, on one node (zerod run --nproc L, the local backend) and on
# two hosts made of network namespaces joined by a 1 Gbit/s link
# (tests/comm_mpi/netns_lib.sh, the multi-node tests' setup; mpirun starts
# one zerod run --nproc L per host, the mpi backend). Every rank is
# bench/onebit's onebit_rank: --params fp32 parameters in 8 tensors, made-up
# gradients, AdamW, ZeRO stage --stage. The variants take turns, round after
# round, so that they share the machine's load; per variant the mean step of
# rank 0 (steps 4.. of --steps: snapshots at every multiple of EVERY among
# them) in each round, then the ratio of the medians of those means. On a
# shared machine those move by more than a snapshot costs, so each run's
# steps are compared within the run too: what the steps from a snapshot's
# step to WINDOW steps after it took beyond the run's median step, less the
# same steps' excess in the run without snapshots of the same round, is
# what one snapshot cost; over EVERY steps, the cost per step. Then
# the bytes of one snapshot against the state's (12 B a parameter: the
# fp32 master and AdamW's two slots), and the largest model whose snapshots
# (keep + 1 at most: the kept ones and the one being written) fit on the
# snapshot directory's disk. Needs root (namespaces, tc) and mpirun; asserts
# nothing.
#
#   bench/checkpoint/bench_snapshots.sh [--build DIR] [--params 10e6] [--steps 104] [--every 50]
#                                       [--local 2] [--stage 3] [--rounds 3] [--dir /var/tmp]
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build="$root/build"
params=10e6 steps=104 every=50 local_ranks=2 stage=3 rounds=3 dir=/var/tmp keep=2 window=10
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --params) params=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --every) every=$2; shift 2 ;;
    --local) local_ranks=$2; shift 2 ;;
    --stage) stage=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--params 10e6] [--steps 104] [--every 50] [--local 2] [--stage 3] [--rounds 3] [--dir /var/tmp]" >&2
       exit 2 ;;
  esac
done
zerod="$build/bin/zerod"
rank="$build/bin/onebit_rank"
for f in "$zerod" "$rank"; do
  [ -x "$f" ] || { echo "bench_snapshots: $f is not built" >&2; exit 1; }
done
mpirun=$(command -v mpirun) || { echo "bench_snapshots: mpirun is not installed (Debian: openmpi-bin)" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "bench_snapshots: needs root (network namespaces, tc)" >&2; exit 1; }
# shellcheck source=../../tests/comm_mpi/netns_lib.sh
. "$root/tests/comm_mpi/netns_lib.sh"
trap 'zd_netns_cleanup; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
work=$(mktemp -d "$dir/zerod-bench-snapshots.XXXX")
zd_netns_setup 2 1gbit || { echo "bench_snapshots: setting up the hosts failed" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_plm_rsh_agent="$ZD_RSH_AGENT"

job() {  # job FILE BACKEND [SNAPSHOT_PATH]
  local snap=""
  [ -n "${3:-}" ] && snap="snapshot = { path = \"$3\", every = $every, keep = $keep },"
  cat >"$1" <<LUA
return { optimizer = { type = "adamw", lr = 1e-3 }, zero = { stage = $stage }, $snap
         comm = { backend = "$2", timeout = 300 } }
LUA
}
run() {  # run NODES JOB TIMES_FILE: rank 0's mean step in ms; its steps' times into TIMES_FILE
  local out
  if [ "$1" -eq 1 ]; then
    out=$("$zerod" run --nproc "$local_ranks" --no-prefix --job "$2" -- "$rank" --params "$params" --steps "$steps" \
      --step-times 1 2>&1)
  else
    out=$(zd_netns_run 0 "$mpirun" --host "${ZD_IP[0]}:1,${ZD_IP[1]}:1" -np 2 --map-by node --oversubscribe \
      --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include "$ZD_SUBNET" --mca oob_tcp_if_include "$ZD_SUBNET" \
      "$zerod" run --nproc "$local_ranks" --no-prefix --job "$2" -- "$rank" --params "$params" --steps "$steps" \
      --step-times 1 2>&1)
  fi
  local mean
  mean=$(sed -n 's/^onebit_rank: mean_step_ms //p' <<<"$out")
  [ -n "$mean" ] || { echo "bench_snapshots: the run of $2 failed:" >&2; echo "$out" >&2; return 1; }
  sed -n 's/^onebit_rank: step_times //p' <<<"$out" >"$3"
  echo "$mean"
}

echo "bench_snapshots: $(date -u '+%F %T UTC'), $(nproc) CPUs ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)),"
echo "  $(free -g | awk '/^Mem:/ { print $2 " GiB" }') RAM; snapshots in $work ($(df -h --output=source,size,avail "$work" | tail -1 | tr -s ' '))"
echo "  onebit_rank: $params fp32 parameters, AdamW, ZeRO stage $stage, $local_ranks ranks per node; mean step of steps 4..$((steps - 1)); snapshot every $every, keep $keep"
declare -A means
for ((r = 1; r <= rounds; r++)); do
  for nodes in 1 2; do
    backend=local
    [ "$nodes" -eq 2 ] && backend=mpi
    for variant in none snapshots; do
      rm -rf "$work/snaps"
      if [ "$variant" = none ]; then job "$work/job.lua" "$backend"; else job "$work/job.lua" "$backend" "$work/snaps"; fi
      m=$(run "$nodes" "$work/job.lua" "$work/times.$r.$nodes.$variant") || exit 1
      means[$nodes.$variant]+="$m "
      echo "  round $r, $nodes node(s), $variant: mean step $m ms"
    done
  done
done
snap=$(ls -d "$work/snaps"/step-* | sort | tail -1)
bytes=$(du -sb "$snap" | cut -f1)
avail=$(df -B1 --output=avail "$work" | tail -1)
python3 - "$params" "$bytes" "$avail" "$keep" "$every" "$work" "$rounds" "$steps" "$window" \
  "${means[1.none]}" "${means[1.snapshots]}" "${means[2.none]}" "${means[2.snapshots]}" <<'PY'
import statistics, sys
params, size, avail, keep, every = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
work, rounds, steps, window = sys.argv[6], int(sys.argv[7]), int(sys.argv[8]), int(sys.argv[9])
rows = [[float(x) for x in a.split()] for a in sys.argv[10:14]]
SKIP = 4  # onebit_rank's first measured step
print()
print(f"{'':<12} {'no snapshots, ms':>18} {'every ' + str(every) + ', ms':>16} {'slower':>8}   (mean step per round)")
for label, a, b in (("1 node", rows[0], rows[1]), ("2 nodes", rows[2], rows[3])):
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"{label:<12} {ma:>18.1f} {mb:>16.1f} {100 * (mb / ma - 1):>7.1f}%   "
          f"({', '.join(f'{x:.1f}' for x in a)} / {', '.join(f'{x:.1f}' for x in b)})")

def times(r, nodes, variant):
    with open(f"{work}/times.{r}.{nodes}.{variant}") as f:
        return [float(x) for x in f.read().split()]

# Loop step s (0-based) applies step s + 1: snapshots are taken in loop steps
# every - 1, 2 every - 1, ...; their cost lands there and in the steps after.
snaps = [s for s in range(SKIP, steps) if (s + 1) % every == 0]
print(f"\nwithin each run: steps {', '.join(f'{s}..{s + window}' for s in snaps)} (loop steps; a snapshot is "
      f"taken in the first of each) beyond the run's median step, less the same in the run without snapshots")
print(f"{'':<12} {'per snapshot, ms':>18} {'per step, ms':>14} {'of a step':>10}   (per round)")
for nodes, label in ((1, "1 node"), (2, "2 nodes")):
    costs, medians = [], []
    for r in range(1, rounds + 1):
        excess = {}
        for variant in ("none", "snapshots"):
            t = times(r, nodes, variant)
            med = statistics.median(t)
            if variant == "none":
                medians.append(med)
            excess[variant] = sum(t[i] - med for s in snaps for i in range(s - SKIP, min(len(t), s - SKIP + window + 1)))
        costs.append((excess["snapshots"] - excess["none"]) / len(snaps))
    c, m = statistics.median(costs), statistics.median(medians)
    print(f"{label:<12} {c:>18.1f} {c / every:>14.2f} {100 * c / every / m:>9.2f}%   "
          f"({', '.join(f'{x:.0f}' for x in costs)} ms; median step {m:.1f} ms)")
state = 12 * params
print(f"\none snapshot (2 nodes): {size / 1e6:.1f} MB on disk for {state / 1e6:.1f} MB of state "
      f"(fp32 master + 2 AdamW slots): {size / state:.4f} x")
per_param = size / params
print(f"largest model whose {keep + 1} snapshots fit in the {avail / 1e9:.1f} GB free there: "
      f"{avail / (per_param * (keep + 1)) / 1e9:.2f} B parameters")
PY
