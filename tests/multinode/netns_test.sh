#!/bin/bash
# zerod across two hosts made of network namespaces (each its own hostname,
# joined through a bridge, 1 Gbit/s per host with tbf): mpirun in the first
# starts one `zerod run --nproc 2` in each (the second through an rsh agent
# that enters its namespace), the ranks train rank_scenario at ZeRO stage 3
# and with 1-bit Adam at stage 1, and every rank must end with the checksum
# one daemon with 4 ranks gives. Everything made is removed on any exit;
# exit 77 (skipped) where namespaces cannot be made.
#   netns_test.sh ZEROD RANK_SCENARIO MPIRUN
set -u
zerod=$1 trainer=$2 mpirun=$3
lib="$(cd "$(dirname "$0")/../comm_mpi" && pwd)/netns_lib.sh"
# shellcheck source=../comm_mpi/netns_lib.sh
. "$lib"
trap zd_netns_cleanup EXIT
trap 'exit 130' INT TERM
zd_netns_setup 2 1gbit || { echo "netns_test: setting up the hosts failed" >&2; exit 1; }
echo "netns_test: hosts ${ZD_HOSTNAME[*]} at ${ZD_IP[*]}, 1 Gbit/s per host (tbf)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_plm_rsh_agent="$ZD_RSH_AGENT"
# Each daemon's mpi plugin logs its node and host at info level.
export ZEROD_LOG=info

checksums() {  # the checksums of ranks 0..3, one line, in rank order
  local out=$1 line="" s rank
  for rank in 0 1 2 3; do
    s=$(echo "$out" | sed -n "s/^\[rank $rank\] rank $rank: checksum //p" | head -1)
    [ -n "$s" ] || { echo "rank $rank printed no checksum:" >&2; echo "$out" >&2; return 1; }
    line+="$s "
  done
  echo "$line"
}

status=0
for case in 'stage3|{ type = "adamw", lr = 0.05 }|3' 'onebit|{ type = "onebit_adam", lr = 0.05, freeze_step = 5 }|1'; do
  IFS='|' read -r name opt stage <<<"$case"
  for backend in mpi local; do
    printf 'return { optimizer = %s, zero = { stage = %s }, comm = { backend = "%s", timeout = 60 } }\n' \
      "$opt" "$stage" "$backend" >"$ZD_DIR/$name.$backend.lua"
  done
  one=$("$zerod" run --nproc 4 --job "$ZD_DIR/$name.local.lua" -- "$trainer" normal 2>&1) || {
    echo "$name: one node failed:"; echo "$one"; exit 1; }
  two=$(zd_netns_run 0 "$mpirun" --host "${ZD_IP[0]}:1,${ZD_IP[1]}:1" -np 2 --map-by node --oversubscribe \
    --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include "$ZD_SUBNET" --mca oob_tcp_if_include "$ZD_SUBNET" \
    -x ZEROD_LOG "$zerod" run --nproc 2 --job "$ZD_DIR/$name.mpi.lua" -- "$trainer" normal 2>&1) || {
    echo "$name: two hosts failed:"; echo "$two"; exit 1; }
  # Each daemon logs the host it runs on: two hosts, not one.
  hosts=$(echo "$two" | sed -n 's/.*plugin mpi: node [01] of 2 (host \([^)]*\)).*/\1/p' | sort -u | wc -l)
  [ "$hosts" -eq 2 ] || { echo "$name: the daemons did not run on 2 distinct hosts ($hosts):"; echo "$two"; exit 1; }
  ref=$(checksums "$one") || exit 1
  got=$(checksums "$two") || exit 1
  # shellcheck disable=SC2086
  if python3 - $ref -- $got <<'PY'
import sys
a = sys.argv[1:]
cut = a.index("--")
ref, got = [float(x) for x in a[:cut]], [float(x) for x in a[cut + 1:]]
r = ref[0]
sys.exit(0 if all(abs(x - r) <= 1e-5 * max(1.0, abs(r)) for x in got) else 1)
PY
  then
    echo "$name: 2 hosts ($got) agree with one node ($ref)"
  else
    echo "$name: 2 hosts ($got) differ from one node ($ref)"; status=1
  fi
done
[ $status -eq 0 ] && echo "netns: all checks passed"
exit $status
