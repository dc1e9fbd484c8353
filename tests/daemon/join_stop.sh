#!/usr/bin/env bash
# `zerod join` on a node other than 0 waits up to --timeout for node 0's
# rendezvous; a stop signal (SIGTERM, Ctrl-C) ends that wait at once with
# 128 + the signal (it was ignored until the timeout ran out, and then the
# exit status said "did not answer").
set -uo pipefail
zerod=$1
tmp=$(mktemp -d /tmp/zerod-joinstop-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for sig in TERM INT; do
  "$zerod" join --node 1 --nnodes 2 --rendezvous "127.0.0.1:$port" --name joinstop --uri-file "$tmp/uri" \
    --timeout 30 -- true 2> "$tmp/err" &
  pid=$!
  sleep 1
  t0=$(date +%s.%N)
  kill -"$sig" "$pid"
  wait "$pid"
  rc=$?
  took=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")
  want=$((128 + $(kill -l "$sig")))
  slow=$(python3 -c "print(1 if $took >= 5 else 0)")
  if [ "$rc" -ne "$want" ] || [ "$slow" = 1 ]; then
    echo "join_stop: FAILED: SIG$sig: exit $rc after $took s (want $want within 5 s)"; cat "$tmp/err"; exit 1
  fi
  grep -q "stopped while waiting for node 0's rendezvous" "$tmp/err" || {
    echo "join_stop: FAILED: SIG$sig: no word of the stop"; cat "$tmp/err"; exit 1; }
done
echo "join_stop: SIGTERM and SIGINT end the wait for node 0 at once"
