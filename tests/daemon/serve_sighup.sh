#!/usr/bin/env bash
# `zerod serve` stops on SIGHUP as on SIGTERM: exit status 0, "stopping
# (signal 1)", its socket and private directory removed. SIGHUP (a closed
# terminal; `zerod join` passes its own on to its serve) used to kill it by
# its default action: status 129, the socket and its directory left behind,
# a snapshot's commit cut off. Both a daemon of one job and one of --jobs.
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
# Waits up to $2 seconds for "$1" (a command) to succeed.
within() {
  local i=0
  while ! eval "$1"; do
    i=$((i + 1))
    [ "$i" -gt $(($2 * 20)) ] && return 1
    sleep 0.05
  done
}

# The private socket directories are made here, where we can see them.
mkdir -m 700 "$tmp/xdg"
export XDG_RUNTIME_DIR=$tmp/xdg

hangup() {  # hangup <name> <serve's arguments...>
  local name=$1
  shift
  "$zerod" serve "$@" > "$tmp/out" 2> "$tmp/err" &
  serve=$!
  within 'grep -q "listening on" "$tmp/out" 2> /dev/null' 30 || fail "$name: the daemon did not start"
  local sock
  sock=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$tmp/out" | head -n1)
  [ -S "$sock" ] || fail "$name: no socket at $sock"
  kill -HUP "$serve"
  wait "$serve"
  local rc=$?
  serve=
  [ "$rc" -eq 0 ] || fail "$name: exit status $rc after SIGHUP, not 0"
  grep -q "^zerod serve: stopping (signal 1)$" "$tmp/err" || fail "$name: it did not say that it stops on signal 1"
  [ ! -e "$sock" ] || fail "$name: its socket $sock is left"
  [ ! -e "$(dirname "$sock")" ] || fail "$name: its private directory $(dirname "$sock") is left"
}

hangup "one job" --nproc 1 --job "$job"
hangup "--jobs" --jobs
echo "serve_sighup: SIGHUP stops zerod serve cleanly, of one job and of --jobs"
