#!/usr/bin/env bash
# A job whose snapshots come only at a clean end (snapshot.every = 0) leaves
# nothing of its run for a restart to resume: `zerod run` says so, keeps the
# daemon in its own process and restarts nothing, and refuses --restarts
# (it used to supervise the daemon with 3 restarts and say that they resume
# from the newest snapshot, which was none of this run's). The end snapshot
# is still written. `zerod serve --resume-snapshots`, what `zerod run`
# passes a daemon it restarts, takes steps or "none" and a job with snapshots.
#   restart_needs_periodic_snapshots.sh ZEROD RESUME_TRAINER
set -uo pipefail
zerod=$1 trainer=$2
tmp=$(mktemp -d /tmp/zerod-every0-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "restart_needs_periodic_snapshots: FAILED: $*"; sed 's/^/  | /' "$tmp/err" 2>/dev/null; exit 1; }
printf 'return { optimizer = { type = "sgd", lr = 0.1 }, snapshot = { path = "%s/snaps", every = 0 } }\n' \
  "$tmp" > "$tmp/job.lua"
printf 'return { optimizer = { type = "sgd", lr = 0.1 } }\n' > "$tmp/plain.lua"

"$zerod" run --nproc 1 --job "$tmp/job.lua" -- "$trainer" 3 0 > "$tmp/out" 2> "$tmp/err" || fail "the run failed"
grep -q "takes a snapshot only at a clean end (snapshot.every = 0): the daemon runs in this process and is not restarted" \
  "$tmp/err" || fail "zerod run did not say that a daemon that dies is not restarted"
grep -q "zerod run: serving 1 ranks on" "$tmp/err" || fail "the daemon did not run in zerod run's process"
! grep -q "daemon pid\|(restart " "$tmp/err" || fail "the daemon ran supervised"
[ -e "$tmp/snaps/step-000000000003/zerod-checkpoint.txt" ] || fail "no snapshot at the clean end: $(ls "$tmp/snaps")"

"$zerod" run --nproc 1 --restarts 1 --job "$tmp/job.lua" -- "$trainer" 3 0 > "$tmp/out" 2> "$tmp/err"
rc=$?
[ "$rc" -eq 2 ] || fail "--restarts 1 with snapshot.every = 0: exit status $rc, not 2"
grep -q "\-\-restarts needs a job that takes snapshots during training: .* snapshot.every = 0" "$tmp/err" ||
  fail "--restarts 1 with snapshot.every = 0 was not refused saying why"

# serve --resume-snapshots: refused before it listens.
serve_refuses() {
  local what=$1 want=$2
  shift 2
  timeout 30 "$zerod" serve --nproc 1 --socket "$tmp/s.sock" "$@" > "$tmp/out" 2> "$tmp/err"
  rc=$?
  [ "$rc" -eq 2 ] || fail "zerod serve $what: exit status $rc, not 2"
  grep -q -- "$want" "$tmp/err" || fail "zerod serve $what: not refused with '$want'"
}
serve_refuses "--resume-snapshots 5,x" "takes snapshot steps such as 5,10, or none" --job "$tmp/job.lua" \
  --resume-snapshots 5,x
serve_refuses "--resume-snapshots -1" "takes snapshot steps such as 5,10, or none" --job "$tmp/job.lua" \
  --resume-snapshots -1
serve_refuses "--resume-snapshots without snapshots" "is for the restarted daemon of a job on one node that takes" \
  --job "$tmp/plain.lua" --resume-snapshots none
echo "restart_needs_periodic_snapshots: every = 0 runs unsupervised, --restarts is refused, the end snapshot is written"
