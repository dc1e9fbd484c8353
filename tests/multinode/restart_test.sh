#!/bin/bash
# Nothing lost across nodes (issue 35): NODES hosts made of network
# namespaces (tests/comm_mpi/netns_lib.sh), one `zerod run --nproc 2` each
# under mpirun, train resume_trainer with snapshot = { every = 5 }.
#   1. The job runs under a relaunch loop (the launcher again until it
#      succeeds, as docs/multinode.md shows). The last host's daemon is
#      SIGKILLed mid-run, then (in the next try) one of its ranks, then every
#      process of that host at once (orted, zerod run, its ranks: the node's
#      whole process tree). Each time the job ends, the loop starts it again,
#      every rank resumes at the same step from the newest complete
#      snapshot, and every step printed by every try is the uninterrupted
#      run's, bit for bit. The time from each death to training again is
#      printed. Then, with a larger model, the last host is frozen (SIGSTOP)
#      while it writes a snapshot, before it reported its part, and killed:
#      that step has no manifest, and the job resumes from the one before.
#   2. shared: the newest snapshot damaged three ways (a flipped byte in a
#      shard, a shard cut short, a shard deleted): the job resumes from the
#      one before, the daemons name what they skipped and why.
#   3. shared: resumed at another size (fewer nodes, and more or fewer
#      ranks per node) from a kept snapshot, each rank prints what a run
#      started from the same snapshot resharded by `zerod ckpt reshard`
#      prints; with 3 hosts also a 2-node snapshot resumed on 3 nodes.
#   node-local (MODE): each host sees its own directory at the snapshot path
#      (a mount namespace per daemon); 1 and 2 as above; resuming at another
#      size is refused naming why, and works once the parts are copied into
#      one directory.
# Exit 77 (skipped) where namespaces cannot be made.
#   restart_test.sh ZEROD RESUME_TRAINER MPIRUN NODES [shared|node-local]
set -u
zerod=$1 trainer=$2 mpirun=$3 nodes=$4 mode=${5:-shared}
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=../comm_mpi/netns_lib.sh
. "$here/../comm_mpi/netns_lib.sh"
trap zd_netns_cleanup EXIT
trap 'exit 130' INT TERM
zd_netns_setup "$nodes" 1gbit || { echo "restart_test: setting up the hosts failed" >&2; exit 1; }
echo "restart_test: $nodes hosts ${ZD_HOSTNAME[*]} at ${ZD_IP[*]}, 1 Gbit/s per host (tbf), snapshots $mode;" \
     "$(date -u '+%F %T UTC'), $(nproc) CPUs ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1))"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_plm_rsh_agent="$ZD_RSH_AGENT"
export ZEROD_LOG=warn
check="$here/restart_check.py"
STEPS=60 EVERY=5 MS=40 NPROC=2
last=$((nodes - 1))
stage=3
[ "$mode" = node-local ] && stage=0  # node-local at stage 0: each node's first rank writes the whole state
D=$ZD_DIR

job() {  # job FILE SNAPSHOT_PATH BACKEND [EVERY]
  cat >"$1" <<LUA
return {
  zero = { stage = $stage$([ "$stage" = 3 ] && echo ", param_persistence_threshold = 0") },
  optimizer = { type = "adamw", lr = 0.01, weight_decay = 0.01 },
  snapshot = { path = "$2", every = ${4:-$EVERY}, keep = 3 },
  comm = { backend = "$3", timeout = 30 },
}
LUA
}

# Node-local: each daemon sees $D/disk-<its host> at $D/local (its own mount
# namespace), as a node's own disk would be.
wrap=()
base=$D  # where the jobs' snapshot paths are, as the daemons see them
if [ "$mode" = node-local ]; then
  for h in "${ZD_HOSTNAME[@]}"; do mkdir -p "$D/disk-$h"; done
  mkdir -p "$D/local"
  cat >"$D/own_disk" <<SH
#!/bin/sh
exec unshare -m sh -c 'mount --bind "$D/disk-\$(hostname)" "$D/local" && exec "\$0" "\$@"' "\$@"
SH
  chmod +x "$D/own_disk"
  wrap=("$D/own_disk")
  base=$D/local
fi
on_host() {  # on_host I SUBDIR: where host I's daemon keeps SUBDIR of the snapshot paths
  if [ "$mode" = node-local ]; then echo "$D/disk-${ZD_HOSTNAME[$1]}/$2"; else echo "$D/$2"; fi
}

launch() {  # launch JOB NODES NPROC STEPS MS [SCALE]: the job on the first NODES hosts, mpirun in the first
  local list="" i
  for ((i = 0; i < $2; i++)); do list+="${list:+,}${ZD_IP[$i]}:1"; done
  zd_netns_run 0 "$mpirun" --host "$list" -np "$2" --map-by node --oversubscribe --mca pml ob1 \
    --mca btl tcp,self --mca btl_tcp_if_include "$ZD_SUBNET" --mca oob_tcp_if_include "$ZD_SUBNET" -x ZEROD_LOG \
    "${wrap[@]}" "$zerod" run --nproc "$3" --job "$1" -- "$trainer" "$4" "$5" "${6:-1}"
}
one_node() {  # one_node JOB NPROC STEPS: on the first host alone, the local backend
  zd_netns_run 0 "$zerod" run --nproc "$2" --job "$1" -- "$trainer" "$3" 0
}
stamp() { while IFS= read -r l; do printf '%s %s\n' "$EPOCHREALTIME" "$l"; done; }
# The relaunch loop: what a job script around mpirun (or srun) does.
relaunch() {  # relaunch TRIES launch-args...
  local tries=$1 t
  shift
  for ((t = 1; t <= tries; t++)); do
    echo "=== try $t"
    if launch "$@"; then echo "=== done"; return 0; fi
    echo "=== try $t failed"
  done
  return 1
}
step_of() {  # step_of LOG TRY: the last step rank 0 printed in that try (-1: none)
  awk -v t="$2" '$2 == "===" && $3 == "try" { cur = $4 } cur == t && $2 == "[rank" && $3 == "0]" && $4 == "step" { s = $5 }
                 END { print (s == "" ? -1 : s) }' "$1"
}
wait_step() {  # wait_step LOG TRY STEP: until rank 0 of that try printed STEP (60 s at most)
  local i
  for ((i = 0; i < 3000; i++)); do
    [ "$(step_of "$1" "$2")" -ge "$3" ] && return 0
    sleep 0.02
  done
  echo "restart_test: try $2 never reached step $3:"; cat "$1"; exit 1
}
pids_of() {  # pids_of HOST COMM: the processes named COMM in that host's namespace
  local p
  for p in $(ip netns pids "${ZD_NS[$1]}"); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$2" ] && echo "$p"
  done
}
fail() { echo "restart_test: FAILED: $*"; exit 1; }
W=$((nodes * NPROC))

# --- 1. Deaths, relaunches, bit-identical steps -------------------------
job "$D/ref.lua" "$D/ref-snaps" mpi
launch "$D/ref.lua" "$nodes" "$NPROC" "$STEPS" 0 >"$D/ref.log" 2>&1 || { cat "$D/ref.log"; fail "the uninterrupted run failed"; }
job "$D/job.lua" "$base/snaps" mpi
{ relaunch 6 "$D/job.lua" "$nodes" "$NPROC" "$STEPS" "$MS"; echo "=== loop status $?"; } 2>&1 | stamp >"$D/run.log" &
loop=$!
kills=()
kill_in() {  # kill_in TRY WHAT: once try TRY is 12 steps past where it began
  local try=$1 what=$2 from now victims
  wait_step "$D/run.log" "$try" 0
  from=$(awk -v t="$try" '$2 == "===" && $3 == "try" { cur = $4 } cur == t && $2 == "[rank" && $3 == "0]" && $4 == "resumed" { s = $6 }
                          END { print (s == "" ? 0 : s) }' "$D/run.log")
  wait_step "$D/run.log" "$try" $((from + 12))
  case $what in
    daemon) victims=$(pids_of "$last" zerod) ;;
    rank) victims=$(pids_of "$last" resume_trainer | head -1) ;;
    node) victims=$(ip netns pids "${ZD_NS[$last]}") ;;
  esac
  [ -n "$victims" ] || fail "nothing to kill for '$what' on host $last"
  now=$EPOCHREALTIME
  # shellcheck disable=SC2086
  kill -9 $victims 2>/dev/null
  kills+=(--kill "$try:$now:$(step_of "$D/run.log" "$try"):SIGKILL of host $last's $what")
  echo "restart_test: try $try: SIGKILL to host $last's $what (pids $(echo $victims | tr '\n' ' ')) at step $(step_of "$D/run.log" "$try")"
}
kill_in 1 daemon
kill_in 2 rank
kill_in 3 node
wait "$loop"
grep -q "=== loop status 0" "$D/run.log" || { cat "$D/run.log"; fail "the relaunch loop gave up"; }
# The survivors named the dead node (zerod's message) or mpirun did.
for ((t = 1; t <= ${#kills[@]} / 2; t++)); do
  awk -v t="$t" '$2 == "===" && $3 == "try" { cur = $4 } cur == t' "$D/run.log" |
    grep -qE "node $last \(ranks [0-9]+-[0-9]+, host|process rank $last with PID|rank $((last * NPROC))|rank $((last * NPROC + 1))" ||
    { cat "$D/run.log"; fail "try $t: nothing named node $last or its ranks"; }
done
python3 "$check" same "$D/ref.log" "$D/run.log" --ranks "$W" --every "$EVERY" "${kills[@]}" ||
  { cat "$D/run.log"; exit 1; }

# --- 1b. A node that dies in the middle of a snapshot ---------------------
# A model of 6.5M parameters (resume_trainer's scaled 5000 times) with a
# snapshot every 2 steps: as soon as the last host has begun writing one,
# every process of that host is stopped; if its report (its part file) is
# not there yet, the host is killed so; else it goes on until the next.
SCALE=5000 MID_STEPS=12
job "$D/midref.lua" "$D/midref-snaps" mpi 2
launch "$D/midref.lua" "$nodes" "$NPROC" "$MID_STEPS" 0 "$SCALE" >"$D/midref.log" 2>&1 ||
  { cat "$D/midref.log"; fail "the uninterrupted run of the larger model failed"; }
job "$D/mid.lua" "$base/mid" mpi 2
{ echo "=== try 1"; launch "$D/mid.lua" "$nodes" "$NPROC" "$MID_STEPS" 0 "$SCALE"; } 2>&1 | stamp >"$D/mid.log" &
mid=$!
caught=""
for n in 4 6 8 10; do
  partial="$(on_host "$last" mid)/$(printf 'step-%012d' "$n").partial"
  for ((i = 0; i < 60000; i++)); do
    [ -d "$partial" ] && break
    kill -0 "$mid" 2>/dev/null || break
    sleep 0.001
  done
  [ -d "$partial" ] || break
  victims=$(ip netns pids "${ZD_NS[$last]}")
  # shellcheck disable=SC2086
  kill -STOP $victims
  if [ ! -e "$partial/$(printf 'node-%05d.part' "$last")" ]; then caught=$n; break; fi
  # shellcheck disable=SC2086
  kill -CONT $victims
done
[ -n "$caught" ] || { wait "$mid"; cat "$D/mid.log"; fail "host $last was never caught writing a snapshot"; }
# shellcheck disable=SC2086
kill -9 $victims
wait "$mid"
manifest="$(on_host 0 mid)/$(printf 'step-%012d' "$caught")/zerod-checkpoint.txt"
[ -e "$manifest" ] && fail "step $caught has a manifest although host $last never reported its part"
{ echo "=== try 2"; launch "$D/mid.lua" "$nodes" "$NPROC" "$MID_STEPS" 0 "$SCALE"; } 2>&1 | stamp >>"$D/mid.log" ||
  { cat "$D/mid.log"; fail "the job did not restart after host $last died mid-snapshot"; }
python3 "$check" same "$D/midref.log" "$D/mid.log" --ranks "$W" --every 2 >/dev/null ||
  { python3 "$check" same "$D/midref.log" "$D/mid.log" --ranks "$W" --every 2; cat "$D/mid.log"; exit 1; }
grep -q "\[rank 0\] resumed at $((caught - 2))$" "$D/mid.log" ||
  { cat "$D/mid.log"; fail "after host $last died writing step $caught the job did not resume at step $((caught - 2))"; }
echo "restart_test: host $last stopped and killed while writing the snapshot of step $caught (its part not reported):" \
     "no manifest for step $caught; the job resumed at step $((caught - 2)), every step as the uninterrupted run's"

# --- 2. A damaged newest snapshot ---------------------------------------
newest() { ls -d "$1"/step-* | grep -v partial | sort | tail -1; }
damaged() {  # damaged HOW DIR FILE: damage FILE of DIR, rerun, resume from the one before
  local how=$1 dir=$2 file=$3 prev at
  prev=$(ls -d "$(dirname "$dir")"/step-* | grep -v partial | sort | tail -2 | head -1)
  at=$((10#${prev##*step-}))
  case $how in
    flipped) printf '\x5a' | dd of="$dir/$file" bs=1 seek=40 conv=notrunc status=none ;;
    cut) truncate -s 100 "$dir/$file" ;;
    deleted) rm -f "$dir/$file" ;;
  esac
  { echo "=== try 1"; launch "$D/job.lua" "$nodes" "$NPROC" "$STEPS" 0 2>&1; } | stamp >"$D/damaged.log" ||
    { cat "$D/damaged.log"; fail "$how: the job did not resume"; }
  python3 "$check" same "$D/ref.log" "$D/damaged.log" --ranks "$W" --every "$EVERY" --resume-at "$at" >/dev/null ||
    { python3 "$check" same "$D/ref.log" "$D/damaged.log" --ranks "$W" --every "$EVERY" --resume-at "$at"
      cat "$D/damaged.log"; exit 1; }
  grep -q "snapshot .*$(basename "$dir") skipped: " "$D/damaged.log" || { cat "$D/damaged.log"; fail "$how: no warning named $(basename "$dir")"; }
  echo "restart_test: $how $file in $(basename "$dir"): resumed from $(basename "$prev"), the steps match; the warning:"
  grep -m1 "$(basename "$dir") skipped: " "$D/damaged.log" | cut -d' ' -f2- | cut -c1-300
}
if [ "$mode" = shared ]; then
  shard="rank-$(printf %05d $((W - 1)))-of-$(printf %05d "$W").zdshard"
  damaged flipped "$(newest "$D/snaps")" "$shard"
  damaged cut "$(newest "$D/snaps")" "rank-00000-of-$(printf %05d "$W").zdshard"
  damaged deleted "$(newest "$D/snaps")" "$shard"
else
  # Node 1's part on node 1's own disk.
  shard="rank-$(printf %05d "$NPROC")-of-$(printf %05d "$W").zdshard"
  damaged flipped "$(newest "$(on_host 1 snaps)")" "$shard"
fi

# --- 3. Another size ------------------------------------------------------
resized() {  # resized LABEL SNAPSHOT_DIR NODES NPROC: resume at that size from it and from its reshard
  local label=$1 from=$2 n=$3 p=$4 w step backend=mpi
  w=$((n * p)) step=$((10#${from##*step-}))
  [ "$n" -eq 1 ] && backend=local
  rm -rf "$D/as-is" "$D/resharded"
  mkdir -p "$D/as-is" "$D/resharded"
  cp -r "$from" "$D/as-is/"
  "$zerod" ckpt reshard "$from" --world "$w" --to "$D/resharded/$(basename "$from")" >/dev/null ||
    fail "$label: zerod ckpt reshard failed"
  for kind in as-is resharded; do
    job "$D/$kind.lua" "$D/$kind" "$backend"
    if [ "$n" -eq 1 ]; then one_node "$D/$kind.lua" "$p" "$STEPS"; else launch "$D/$kind.lua" "$n" "$p" "$STEPS" 0; fi \
      >"$D/$kind.log" 2>&1 || { cat "$D/$kind.log"; fail "$label: the $kind run failed"; }
  done
  python3 "$check" same "$D/resharded.log" "$D/as-is.log" --ranks "$w" --every "$EVERY" --resume-at "$step" >/dev/null ||
    { python3 "$check" same "$D/resharded.log" "$D/as-is.log" --ranks "$w" --every "$EVERY" --resume-at "$step"
      cat "$D/as-is.log"; exit 1; }
  echo "restart_test: $label: the $(sed -n 's/^world_size //p' "$from/zerod-checkpoint.txt")-rank snapshot of step $step resumed on $n node(s) x $p ranks;" \
       "steps $step..$((STEPS - 1)) of all $w ranks match the run from its reshard to $w, bit for bit"
}
if [ "$mode" = shared ]; then
  kept=$(ls -d "$D/snaps"/step-* | sort | head -1)
  resized "fewer nodes" "$kept" $((nodes - 1)) "$NPROC"
  if [ "$nodes" -eq 2 ]; then
    resized "more ranks" "$kept" "$nodes" 3
  else
    resized "fewer ranks" "$kept" "$nodes" 1
    # More nodes: a snapshot of 2 nodes resumed on 3; 52 steps, so that it
    # is the one the ranks take together as they leave (zd_model_destroy).
    job "$D/two.lua" "$D/two-snaps" mpi
    launch "$D/two.lua" 2 "$NPROC" 52 0 >"$D/two.log" 2>&1 || { cat "$D/two.log"; fail "the 2-node run failed"; }
    [ -e "$D/two-snaps/step-000000000052/zerod-checkpoint.txt" ] ||
      { ls "$D/two-snaps"; fail "no snapshot of step 52 when the ranks left at step 52"; }
    resized "more nodes" "$D/two-snaps/step-000000000052" "$nodes" "$NPROC"
  fi
else
  # Each node holds its own part: another size is refused, naming why ...
  kept=$(newest "$(on_host 0 snaps)")
  job "$D/one.lua" "$(on_host 0 snaps)" local
  if out=$(one_node "$D/one.lua" "$NPROC" "$STEPS" 2>&1); then
    echo "$out"; fail "a node-local snapshot resumed on one node with another node's part missing"
  fi
  grep -q "no snapshot under .* can be resumed from" <<<"$out" && grep -q "each node keeping its part on its own disk.*a node reads only its own part" <<<"$out" ||
    { echo "$out"; fail "no clear refusal of a node-local snapshot at another size"; }
  echo "restart_test: node-local at another size: refused, saying why:"
  grep -m1 "a node reads only its own part" <<<"$out" | cut -c1-400
  # ... and works once every node's files of it are in one directory.
  for ((h = 1; h < nodes; h++)); do cp "$(on_host "$h" snaps)/$(basename "$kept")"/* "$kept/"; done
  out=$(one_node "$D/one.lua" "$NPROC" "$STEPS" 2>&1) || { echo "$out"; fail "the parts copied together did not resume"; }
  grep -q "^\[rank 1\] resumed at $((10#${kept##*step-}))$" <<<"$out" || { echo "$out"; fail "the parts copied together: no resume"; }
  echo "restart_test: node-local, the parts copied into one directory: resumed on 1 node x $NPROC ranks at step $((10#${kept##*step-}))"
fi
# --- 4. What a job across nodes cannot ask for ------------------------------
if [ "$mode" = shared ]; then
  # zerod run's own restarts: a daemon cannot rejoin the others' MPI job.
  list="${ZD_IP[0]}:1,${ZD_IP[1]}:1"
  if out=$(zd_netns_run 0 "$mpirun" --host "$list" -np 2 --map-by node --oversubscribe --mca pml ob1 --mca btl tcp,self \
      --mca btl_tcp_if_include "$ZD_SUBNET" --mca oob_tcp_if_include "$ZD_SUBNET" \
      "$zerod" run --restarts 2 --nproc 1 --job "$D/job.lua" -- "$trainer" 2 0 2>&1); then
    echo "$out"; fail "zerod run --restarts was accepted across nodes"
  fi
  grep -q "zerod run: --restarts restarts the daemon of a job on one node; this is node [01] of 2 .*run the launcher again instead" <<<"$out" ||
    { echo "$out"; fail "no clear refusal of --restarts across nodes"; }
  # daemon.keep_state: a node that dies takes the kept state with it.
  printf 'return { optimizer = { type = "adamw", lr = 0.01 }, daemon = { keep_state = true }, comm = { backend = "mpi", timeout = 30 } }\n' \
    >"$D/keep.lua"
  if out=$(launch "$D/keep.lua" 2 1 2 0 2>&1); then echo "$out"; fail "daemon.keep_state was accepted across nodes"; fi
  grep -q "daemon.keep_state works with one daemon only: with 2 nodes .* restarts under its launcher from a snapshot" <<<"$out" ||
    { echo "$out"; fail "no clear refusal of daemon.keep_state across nodes"; }
  echo "restart_test: across nodes zerod run --restarts and daemon.keep_state are refused, saying why"
fi
echo "restart_test: all checks passed"
