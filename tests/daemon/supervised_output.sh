#!/usr/bin/env bash
# What a supervised daemon (a job that takes snapshots during training)
# prints on its stdout after it listens, a job's Lua `print` in its lr
# function, comes out on `zerod run`'s stdout, as it does with the daemon in
# `zerod run`'s own process. `zerod run` used to close the daemon's stdout
# after its banner, so the first such print killed the daemon with SIGPIPE,
# and every restarted one too, until "no restarts left" (exit status 1).
#   supervised_output.sh ZEROD RESUME_TRAINER
set -uo pipefail
zerod=$1 trainer=$2
tmp=$(mktemp -d /tmp/zerod-supervised-output-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "supervised_output: FAILED: $*"; sed 's/^/  | /' "$tmp/err" "$tmp/out" 2>/dev/null; exit 1; }
cat > "$tmp/job.lua" <<LUA
return { optimizer = { type = "sgd", lr = 0.1 },
  lr = function(step) print("lr asked at step " .. step) return 0.1 end,
  snapshot = { path = "$tmp/snaps", every = 2 } }
LUA
timeout 60 "$zerod" run --nproc 1 --restarts 1 --job "$tmp/job.lua" -- "$trainer" 4 0 > "$tmp/out" 2> "$tmp/err"
rc=$?
[ "$rc" -eq 0 ] || fail "zerod run exited $rc"
grep -q "daemon pid" "$tmp/err" || fail "the daemon was not supervised"
! grep -q "restarting\|lost it" "$tmp/err" || fail "the daemon died"
grep -q "^lr asked at step 3$" "$tmp/out" || fail "the daemon's print is not on zerod run's stdout"
! grep -q "listening on" "$tmp/out" || fail "the daemon's banner is on zerod run's stdout"
echo "supervised_output: the supervised daemon's prints reach zerod run's stdout"
