#!/usr/bin/env bash
# What `zerod run` leaves behind: nothing, whether it ends or is killed.
#   - Killed with SIGKILL (plain, and supervised: a job that takes
#     snapshots), its ranks die with it (PR_SET_PDEATHSIG) and so does what
#     they started (`sleep 1000 &`, a DataLoader's workers), also of a rank
#     that had already ended; the private directory of its socket is
#     removed, and the run's files beside a socket of the user's
#     (zerod-run-$ZEROD_RUN_ID-*, the gloo store) too: its watchdog does it
#     (daemon/launcher/watchdog.h). Before, all of it stayed.
#   - Ending normally, the run's files go with it, and the private
#     directory goes even when a rank put files in it (it was left then).
#   killed_run.sh <zerod> <dir of the job scripts>
set -uo pipefail
zerod=$1 jobs=$2
tmp=$(mktemp -d /tmp/zerod-killed-run-XXXXXX)
run=
cleanup() {
  [ -n "$run" ] && kill -9 "$run" 2>/dev/null
  for f in "$tmp"/bg.*; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "killed_run: FAILED: $*"; [ -f "$tmp/err" ] && sed 's/^/  | /' "$tmp/err"; exit 1; }

# The private socket directories are made here, where we can see them.
mkdir -m 700 "$tmp/xdg"
export XDG_RUNTIME_DIR=$tmp/xdg
mkdir "$tmp/user"
printf 'return { optimizer = { type = "sgd", lr = 0.1 }, snapshot = { path = "%s/snaps", every = 5 } }\n' \
  "$tmp" > "$tmp/snapshots.lua"

# Gone, or a zombie that is not ours to reap.
ended() { [ ! -e "/proc/$1" ] || grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }
. "$(dirname "$0")/within.sh"  # within CMD SECONDS

# Each rank starts a background sleep, writes its pid to $T/bg.<rank> and a
# file of the run beside the socket; rank 1 then ends, rank 0 runs on.
RANK='sock=${ZEROD_ENDPOINT#unix:}; touch "$(dirname "$sock")/zerod-run-$ZEROD_RUN_ID-gloo-store";
sleep 1000 & echo $! > "$T/bg.tmp.$ZEROD_RANK"; mv "$T/bg.tmp.$ZEROD_RANK" "$T/bg.$ZEROD_RANK";
[ "$ZEROD_RANK" = 1 ] && exit 0; exec sleep 1000'

killed() {  # killed <name> <job> [--socket PATH]
  local name=$1 job=$2
  shift 2
  rm -f "$tmp"/bg.*
  T=$tmp "$zerod" run --nproc 2 "$@" --job "$job" -- sh -c "$RANK" > /dev/null 2> "$tmp/err" &
  run=$!
  within '[ -f "$tmp/bg.0" ] && [ -f "$tmp/bg.1" ]' 30 || fail "$name: the ranks did not start"
  local sock
  sock=$(sed -n 's/.*serving 2 ranks on \([^ ]*\).*/\1/p' "$tmp/err" | head -n1)
  [ -n "$sock" ] || fail "$name: no socket named"
  local dir
  dir=$(dirname "$sock")
  ls "$dir"/zerod-run-*-gloo-store > /dev/null 2>&1 || fail "$name: the ranks' run file is missing (ZEROD_RUN_ID unset?)"
  sleep 0.3  # rank 1 has ended
  kill -9 "$run"
  wait "$run" 2> /dev/null
  run=
  for f in "$tmp"/bg.0 "$tmp"/bg.1; do
    local pid
    pid=$(cat "$f")
    within "ended $pid" 5 || fail "$name: pid $pid, which rank ${f##*.} started, outlived the killed zerod run"
  done
  if [ "$dir" = "$tmp/user" ]; then
    within '! ls "$dir"/zerod-run-* > /dev/null 2>&1' 5 || fail "$name: the run's files were left in $dir: $(ls "$dir")"
    [ -S "$sock" ] || [ ! -e "$sock" ] || fail "$name: what is $sock?"
  else
    # Under $XDG_RUNTIME_DIR, as docs/daemon.md says: the supervised run
    # made its private directory under /tmp regardless.
    [ "$(dirname "$dir")" = "$tmp/xdg" ] || fail "$name: its private directory $dir is not under \$XDG_RUNTIME_DIR"
    within '[ ! -e "$dir" ]' 5 || fail "$name: its directory $dir was left behind: $(ls -A "$dir")"
  fi
  echo "killed_run: $name: nothing left"
}

killed plain "$jobs/job_stage0.lua"
killed "plain, --socket" "$jobs/job_stage0.lua" --socket "$tmp/user/zerod.sock"
killed supervised "$tmp/snapshots.lua"
killed "supervised, --socket" "$tmp/snapshots.lua" --socket "$tmp/user/zerod.sock"

# A normal end: the run's files and the private directory go, whatever the
# ranks put there.
ENDS='sock=${ZEROD_ENDPOINT#unix:}; d=$(dirname "$sock"); touch "$d/zerod-run-$ZEROD_RUN_ID-gloo-store";
mkdir -p "$d/zerod-run-$ZEROD_RUN_ID-x/y"; echo "dir=$d"'
for job in "$jobs/job_stage0.lua" "$tmp/snapshots.lua"; do
  timeout 60 "$zerod" run --nproc 2 --job "$job" -- sh -c "$ENDS" > "$tmp/out" 2> "$tmp/err" || fail "$job: the run failed"
  dir=$(sed -n 's/.*dir=//p' "$tmp/out" | head -n1)
  [ -n "$dir" ] || fail "no directory named"
  [ ! -e "$dir" ] || fail "$job: a run that ended left $dir: $(ls -A "$dir")"
  timeout 60 "$zerod" run --nproc 2 --socket "$tmp/user/zerod.sock" --job "$job" -- sh -c "$ENDS" > "$tmp/out" 2> "$tmp/err" ||
    fail "$job, --socket: the run failed"
  ! ls "$tmp/user"/zerod-run-* > /dev/null 2>&1 || fail "$job, --socket: a run that ended left $(ls "$tmp/user")"
done
echo "killed_run: normal ends leave nothing"
echo "killed_run: nothing outlives zerod run"
