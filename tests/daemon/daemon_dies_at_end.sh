#!/usr/bin/env bash
# A supervised daemon (a job of snapshot.every > 0: `zerod run` runs it as a
# `zerod serve` of its own) that dies as the ranks end, while they are in
# zd_model_destroy, which writes the job's final snapshot: the ranks' destroy
# returns nothing to fail on, so every rank exited 0, and `zerod run` said
# "all 2 ranks finished" and exited 0 with the final snapshot never written.
# It looked only for the daemon's own status 74 (docs/daemon.md). Now it
# says that the daemon died before it was told to stop, so the job's end may
# not be saved, and exits 74.
# The daemon is stopped (SIGSTOP) once both ranks printed their last step,
# before their destroy (each sleeps after a step), so the final snapshot
# cannot be written; then killed.
#   daemon_dies_at_end.sh ZEROD RESUME_TRAINER
set -uo pipefail
zerod=$1 trainer=$2
tmp=$(mktemp -d /tmp/zerod-dies-at-end-XXXXXX)
run= daemon=
cleanup() {
  [ -n "$daemon" ] && kill -KILL "$daemon" 2> /dev/null
  [ -n "$run" ] && kill -KILL "$run" 2> /dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "daemon_dies_at_end: FAILED: $*"; sed 's/^/  | /' "$tmp/err" "$tmp/out" 2> /dev/null; exit 1; }
. "$(dirname "$0")/within.sh"  # within CMD SECONDS

mkdir -m 700 "$tmp/xdg"
export XDG_RUNTIME_DIR=$tmp/xdg
printf 'return { optimizer = { type = "sgd", lr = 0.1 }, snapshot = { path = "%s/snaps", every = 2 } }\n' \
  "$tmp" > "$tmp/job.lua"
# 3 steps, 2 s after each: the last step is "step 2", and the ranks'
# destroy comes 2 s later, time enough to stop the daemon before it on a
# loaded machine, so that it cannot write the final snapshot.
"$zerod" run --nproc 2 --job "$tmp/job.lua" -- "$trainer" 3 2000 > "$tmp/out" 2> "$tmp/err" &
run=$!
within '[ "$(grep -c "step 2 " "$tmp/out" 2> /dev/null)" -ge 2 ]' 60 || fail "the ranks did not reach their last step"
daemon=$(sed -n 's/^zerod run: daemon pid \([0-9]*\) serving 2 ranks.*/\1/p' "$tmp/err" | head -n1)
[ -n "$daemon" ] || fail "zerod run named no daemon"
kill -STOP "$daemon" || fail "the daemon (pid $daemon) is gone before it was stopped"
# Killed once the ranks are in their destroy, waiting for it, as a crash
# there would leave them. Killed before (a machine too loaded for this
# wait) it leaves them the same: their destroy returns as they find it gone.
sleep 2.5
kill -KILL "$daemon"
wait "$run"
rc=$?
run=
daemon=
[ "$rc" -eq 74 ] || fail "exit status $rc, not 74"
grep -q "^zerod run: all 2 ranks finished" "$tmp/err" || fail "the ranks did not finish"
tail -n 1 "$tmp/err" | grep -q "^zerod run: the daemon (pid [0-9]*) was killed by signal 9 (Killed) before it was told to stop, so the job's end may NOT have been saved (its final snapshot is written as the ranks destroy their models; the newest whole snapshot under $tmp/snaps is of step 2); exit status 74$" ||
  fail "zerod run's last line does not say that the daemon died before the job's end was saved"
[ -z "$(ls -d "$tmp/snaps"/step-000000000003 2> /dev/null)" ] || fail "the final snapshot was written: the daemon was stopped too late"
echo "daemon_dies_at_end: a daemon killed in the ranks' destroy fails zerod run with 74, saying so"
