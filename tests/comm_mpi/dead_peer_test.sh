#!/bin/bash
# A daemon (MPI process) of NODES that stops answering, or dies, in the
# middle of a collective: never a hang, and a message that names it.
#
#  1. stopped (SIGSTOP): the others must fail within the call's timeout with
#     the plugin's message naming that daemon (DeadPeer.* checks it on each
#     of them); then this script kills the stopped one so the job can end.
#  2. killed (SIGKILL), mpirun as deployed (a process that dies aborts the
#     job): the job must end promptly, and mpirun names the dead process.
#     (With mpirun's recovery on, the others would fail with the plugin's
#     message too, but Open MPI 4's TCP transport may also abort a process
#     that was sending to the dead one, by its own rule, so that is not
#     something a test can rely on.)
#   dead_peer_test.sh NODES TEST_BINARY MPIRUN [MPIRUN OPTIONS...]
set -u
nodes=$1
binary=$2
shift 2
tmp=$(mktemp -d)
mpid=""
cleanup() {
  [ -n "$mpid" ] && kill "$mpid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
want=$((nodes - 1))

# Waits at most $1 seconds for mpirun ($mpid) to end; then stops it.
wait_mpirun() {
  local limit=$1 start=$SECONDS
  while kill -0 "$mpid" 2>/dev/null; do
    if [ $((SECONDS - start)) -ge "$limit" ]; then
      echo "dead_peer_test: mpirun still running after $limit s: stopping it" >&2
      kill "$mpid" 2>/dev/null
      sleep 2
      kill -9 "$mpid" 2>/dev/null
      break
    fi
    sleep 0.2
  done
  wait "$mpid" 2>/dev/null
  local status=$?
  mpid=""
  return $status
}

# 1. Stopped.
out="$tmp/stopped.log"
ZEROD_TEST_DEATH=stop "$@" -x ZEROD_TEST_DEATH -np "$nodes" "$binary" --gtest_color=no \
  --gtest_filter='DeadPeer.*' >"$out" 2>&1 &
mpid=$!
start=$SECONDS
while kill -0 "$mpid" 2>/dev/null && [ $((SECONDS - start)) -lt 120 ]; do
  done_count=$(grep -cE '\[  (PASSED|FAILED)  \] 1 test' "$out" 2>/dev/null)
  [ "${done_count:-0}" -ge "$want" ] && break
  sleep 0.2
done
victim=$(sed -n 's/.*stopping myself (pid \([0-9]*\)).*/\1/p' "$out" | head -n 1)
[ -n "$victim" ] && kill -9 "$victim" 2>/dev/null
wait_mpirun 60
status=$?
cat "$out"
passed=$(grep -c '\[  PASSED  \] 1 test' "$out")
echo "dead_peer_test (stopped daemon): mpirun exit status $status; $passed of the $want other daemons passed"
ok=1
[ -n "$victim" ] || { echo "dead_peer_test: FAILED: the victim never stopped" >&2; ok=0; }
grep -q '\[  FAILED  \]' "$out" && { echo "dead_peer_test: FAILED: a daemon failed its checks" >&2; ok=0; }
[ "$passed" -eq "$want" ] || { echo "dead_peer_test: FAILED: not every other daemon passed" >&2; ok=0; }

# 2. Killed, the job aborted by mpirun.
out="$tmp/killed.log"
start=$SECONDS
ZEROD_TEST_DEATH=kill "$@" -x ZEROD_TEST_DEATH -np "$nodes" "$binary" --gtest_color=no \
  --gtest_filter='DeadPeer.*' >"$out" 2>&1 &
mpid=$!
wait_mpirun 60
status=$?
took=$((SECONDS - start))
cat "$out"
echo "dead_peer_test (killed daemon): mpirun exit status $status after $took s"
grep -q 'killing myself' "$out" || { echo "dead_peer_test: FAILED: the victim never died" >&2; ok=0; }
if ! grep -qE "process rank $want with PID [0-9]+ on node .* exited on signal 9" "$out"; then
  echo "dead_peer_test: FAILED: mpirun did not name the dead process" >&2
  ok=0
fi
[ "$took" -lt 60 ] || { echo "dead_peer_test: FAILED: the job did not end" >&2; ok=0; }
[ "$status" -ne 0 ] || { echo "dead_peer_test: FAILED: mpirun reported success" >&2; ok=0; }

[ "$ok" -eq 1 ] || exit 1
echo "dead_peer_test: ok"
