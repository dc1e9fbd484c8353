#!/usr/bin/env bash
# `zerod join` on a node other than 0 waits up to --timeout for node 0's
# rendezvous; a stop signal (SIGTERM, Ctrl-C) ends that wait at once with
# 128 + the signal (it was ignored until the timeout ran out, and then the
# exit status said "did not answer"). Both hold while a connect is under
# way to a host that answers no SYN (a blocking connect held it for about
# two minutes). A SIGHUP ignored at its start (nohup) stays ignored.
set -uo pipefail
zerod=$1
tmp=$(mktemp -d /tmp/zerod-joinstop-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# A command this script puts in the background starts with SIGINT ignored
# (POSIX), and `zerod join` leaves an ignored SIGINT ignored: started so,
# with SIGINT and SIGHUP at their defaults as at a terminal (also under
# nohup), it gets the Ctrl-C this tests.
if env --default-signal=INT --default-signal=HUP true 2> /dev/null; then
  at_default=(env --default-signal=INT --default-signal=HUP)
else
  at_default=(python3 -c 'import os, signal, sys
for s in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ): signal.signal(s, signal.SIG_DFL)
os.execvp(sys.argv[1], sys.argv[1:])')
fi
for sig in TERM INT; do
  "${at_default[@]}" "$zerod" join --node 1 --nnodes 2 --rendezvous "127.0.0.1:$port" --name joinstop --uri-file "$tmp/uri" \
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
# A SIGHUP ignored at the start (nohup) stays ignored: blocked for
# sigtimedwait it was queued all the same, and join stopped on it.
(
  trap '' HUP
  exec "$zerod" join --node 1 --nnodes 2 --rendezvous "127.0.0.1:$port" --name joinstop --uri-file "$tmp/uri" \
    --timeout 30 -- true
) 2> "$tmp/err" &
pid=$!
sleep 1
kill -HUP "$pid"
sleep 1
if ! kill -0 "$pid" 2> /dev/null || grep -q "stopped" "$tmp/err"; then
  echo "join_stop: FAILED: SIGHUP, ignored when it started, stopped zerod join"; cat "$tmp/err"; exit 1
fi
kill -TERM "$pid"
wait "$pid"
rc=$?
[ "$rc" -eq 143 ] || { echo "join_stop: FAILED: SIGTERM after an ignored SIGHUP: exit $rc, not 143"; cat "$tmp/err"; exit 1; }
echo "join_stop: an ignored SIGHUP (nohup) stays ignored"
# Node 0's port held by a listener whose queue is full: the host answers no
# SYN, as one that drops packets does, and a blocking connect() held `zerod
# join` for about two minutes, deaf to --timeout and to SIGTERM.
python3 - "$tmp/full_port" <<'PY' &
import socket, sys, time
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(0)
port = l.getsockname()[1]
fillers = []
for _ in range(4):
    c = socket.socket()
    c.setblocking(False)
    try:
        c.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    fillers.append(c)
time.sleep(0.2)
open(sys.argv[1], "w").write(str(port))
time.sleep(60)
PY
full=$!
trap 'kill $full 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do [ -s "$tmp/full_port" ] && break; sleep 0.1; done
full_port=$(cat "$tmp/full_port")
t0=$(date +%s.%N)
"$zerod" join --node 1 --nnodes 2 --rendezvous "127.0.0.1:$full_port" --name joinstop --uri-file "$tmp/uri" \
  --timeout 2 -- true 2> "$tmp/err"
rc=$?
took=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")
if [ "$rc" -ne 1 ] || [ "$(python3 -c "print(1 if $took >= 5 else 0)")" = 1 ]; then
  echo "join_stop: FAILED: a port that answers no SYN: exit $rc after $took s (want 1 within 5 s)"; cat "$tmp/err"; exit 1
fi
grep -q "did not answer within 2 s (connect: timed out" "$tmp/err" || {
  echo "join_stop: FAILED: a port that answers no SYN: no word of the connect's timeout"; cat "$tmp/err"; exit 1; }
"$zerod" join --node 1 --nnodes 2 --rendezvous "127.0.0.1:$full_port" --name joinstop --uri-file "$tmp/uri" \
  --timeout 30 -- true 2> "$tmp/err" &
pid=$!
sleep 1.5
t0=$(date +%s.%N)
kill -TERM "$pid"
wait "$pid"
rc=$?
took=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")
if [ "$rc" -ne 143 ] || [ "$(python3 -c "print(1 if $took >= 2 else 0)")" = 1 ]; then
  echo "join_stop: FAILED: SIGTERM during a connect: exit $rc after $took s (want 143 within 2 s)"; cat "$tmp/err"; exit 1
fi
echo "join_stop: a connect nobody answers ends at --timeout ($took s after SIGTERM when stopped)"
echo "join_stop: SIGTERM and SIGINT end the wait for node 0 at once"
