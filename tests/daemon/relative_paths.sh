#!/usr/bin/env bash
# A job script's relative paths (here snapshot.path) resolve beside the
# script, in a daemon as in embedded mode and in `zerod check`: the daemon
# gets the script's text, and used to resolve them against its own working
# directory (snapshots written where `zerod run` was started, and not found
# by the next run started elsewhere). Also a script given as text: the
# trainer's working directory, not the daemon's. And a relative --socket (below).
set -uo pipefail
zerod=$1 trainer=$2
tmp=$(mktemp -d /tmp/zerod-relpaths-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/jobs" "$tmp/elsewhere"
cat > "$tmp/jobs/job.lua" <<'LUA'
return {
  zero = { stage = 1 },
  optimizer = { type = "adamw", lr = 1e-2 },
  snapshot = { path = "snaps", every = 5 },
}
LUA
cd "$tmp/elsewhere" || exit 1
"$zerod" run --nproc 2 --job ../jobs/job.lua -- "$trainer" --steps 12 --quiet > "$tmp/run.log" 2>&1
rc=$?
[ $rc -eq 0 ] || { echo "relative_paths: FAILED: zerod run exited $rc"; cat "$tmp/run.log"; exit 1; }
if [ -e "$tmp/elsewhere/snaps" ]; then
  echo "relative_paths: FAILED: snapshots written under the daemon's directory:"; ls -R "$tmp/elsewhere/snaps"; exit 1
fi
ls "$tmp/jobs/snaps" | grep -q '^step-000000000010$' || {
  echo "relative_paths: FAILED: no snapshot beside the script:"; ls -R "$tmp"; cat "$tmp/run.log"; exit 1; }
# A relative --socket reaches the ranks by its absolute path, so that a rank
# that changes its working directory still connects: the supervised daemon
# (this job takes snapshots) used to get it, in ZEROD_ENDPOINT, as typed.
sed 's/"snaps"/"snaps-socket"/' "$tmp/jobs/job.lua" > "$tmp/jobs/socket.lua"
"$zerod" run --nproc 1 --socket rel.sock --job "$tmp/jobs/socket.lua" -- \
  sh -c 'echo "endpoint=$ZEROD_ENDPOINT"; cd / && exec "$0" --steps 6 --quiet' "$trainer" > "$tmp/run.log" 2>&1
rc=$?
[ $rc -eq 0 ] || { echo "relative_paths: FAILED: --socket rel.sock: zerod run exited $rc"; cat "$tmp/run.log"; exit 1; }
grep -q "endpoint=unix:$tmp/elsewhere/rel.sock$" "$tmp/run.log" || {
  echo "relative_paths: FAILED: --socket rel.sock is not absolute in ZEROD_ENDPOINT:"; cat "$tmp/run.log"; exit 1; }
echo "relative_paths: snapshot.path resolved beside the script under the daemon"
