#!/usr/bin/env bash
# `zerod serve` stops on SIGHUP as on SIGTERM: exit status 0, "stopping
# (signal 1)", its socket and private directory removed. SIGHUP (a closed
# terminal; `zerod join` passes its own on to its serve) used to kill it by
# its default action: status 129, the socket and its directory left behind,
# a snapshot's commit cut off. Both a daemon of one job and one of --jobs.
# A SIGHUP ignored at the start (`nohup zerod serve`) stays ignored: blocked
# for sigwait it was queued all the same, and the daemon stopped on it.
#   serve_sighup.sh ZEROD JOB
set -uo pipefail
zerod=$1 job=$2
tmp=$(mktemp -d /tmp/zerod-sighup-XXXXXX)
serve=
cleanup() {
  [ -n "$serve" ] && kill -KILL "$serve" 2> /dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "serve_sighup: FAILED: $*"; sed 's/^/  | /' "$tmp/err" 2> /dev/null; exit 1; }
. "$(dirname "$0")/within.sh"  # within CMD SECONDS

# The private socket directories are made here, where we can see them.
mkdir -m 700 "$tmp/xdg"
export XDG_RUNTIME_DIR=$tmp/xdg

# What runs a command with SIGHUP at its default, so that the cases that
# want it stopping pass under nohup too (a simple command, so that $! is the
# daemon's pid). A shell cannot reset a signal ignored when it started
# (`trap - HUP` does nothing then): env does, or Python (which resets what
# it ignores itself too).
if env --default-signal=HUP true 2> /dev/null; then
  hup_at_default=(env --default-signal=HUP)
else
  hup_at_default=(python3 -c 'import os, signal, sys
for s in (signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ): signal.signal(s, signal.SIG_DFL)
os.execvp(sys.argv[1], sys.argv[1:])')
fi

# Waits for the daemon $serve to listen; sets sock to its socket. The
# case's output files are removed before it starts (fresh): the background
# job truncates them only once it runs, and the last case's line would be read.
sock=
fresh() { rm -f "$tmp/out" "$tmp/err"; }
listening() {  # listening <name>
  within 'grep -q "listening on" "$tmp/out" 2> /dev/null' 30 || fail "$1: the daemon did not start"
  sock=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$tmp/out" | head -n1)
  [ -S "$sock" ] || fail "$1: no socket at $sock"
}

# Waits for $serve to exit after the signal $2; fails unless it exits 0 having
# said so and removed its socket and its private directory.
stops_cleanly() {  # stops_cleanly <name> <signal number>
  local name=$1 signal=$2
  wait "$serve"
  local rc=$?
  serve=
  [ "$rc" -eq 0 ] || fail "$name: exit status $rc after signal $signal, not 0"
  grep -q "^zerod serve: stopping (signal $signal)$" "$tmp/err" || fail "$name: it did not say that it stops on signal $signal"
  [ ! -e "$sock" ] || fail "$name: its socket $sock is left"
  [ ! -e "$(dirname "$sock")" ] || fail "$name: its private directory $(dirname "$sock") is left"
}

hangup() {  # hangup <name> <serve's arguments...>
  local name=$1
  shift
  fresh
  "${hup_at_default[@]}" "$zerod" serve "$@" > "$tmp/out" 2> "$tmp/err" &
  serve=$!
  listening "$name"
  kill -HUP "$serve"
  stops_cleanly "$name" 1
}

# As under nohup: the hangup is ignored, and SIGTERM still stops the daemon.
hangup_ignored() {  # hangup_ignored <name> <serve's arguments...>
  local name="$1 under nohup"
  shift
  fresh
  (
    trap '' HUP
    exec "$zerod" serve "$@"
  ) > "$tmp/out" 2> "$tmp/err" &
  serve=$!
  listening "$name"
  kill -HUP "$serve"
  sleep 1
  kill -0 "$serve" 2> /dev/null || fail "$name: SIGHUP, ignored when it started, stopped it"
  ! grep -q "stopping" "$tmp/err" || fail "$name: it took the ignored SIGHUP for a stop"
  kill -TERM "$serve"
  stops_cleanly "$name" 15
}

hangup "one job" --nproc 1 --job "$job"
hangup "--jobs" --jobs
hangup_ignored "one job" --nproc 1 --job "$job"
hangup_ignored "--jobs" --jobs
echo "serve_sighup: SIGHUP stops zerod serve cleanly, of one job and of --jobs, unless ignored at its start"
