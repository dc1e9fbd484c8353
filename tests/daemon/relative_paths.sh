#!/usr/bin/env bash
# A job script's relative paths (here snapshot.path) resolve beside the
# script, in a daemon as in embedded mode and in `zerod check`: the daemon
# gets the script's text, and used to resolve them against its own working
# directory (snapshots written where `zerod run` was started, and not found
# by the next run started elsewhere). Also a script given as text: the
# trainer's working directory, not the daemon's.
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
echo "relative_paths: snapshot.path resolved beside the script under the daemon"
