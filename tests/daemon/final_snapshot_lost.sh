#!/usr/bin/env bash
# A job whose final snapshot fails (a full disk) did not save its end, though
# every rank exited 0: the log said "training goes on, and the older
# snapshots are kept" and `zerod run` exited 0, so a job of snapshot.every =
# 0 lost its whole run with exit status 0. Now the log says that the run's
# final state was NOT saved, which snapshot is the newest kept (or that none
# is) and what to do, and `zerod run` says so last and exits 74:
#   - every = 0: the daemon in zerod run's own process (the job's record of
#     its models' ends, read after the server stopped);
#   - every = 2: the daemon supervised in a `zerod serve` of its own, which
#     exits 74 itself, and zerod run learns it from that status.
# The snapshots go to a small tmpfs in a mount namespace of the test's own.
#   final_snapshot_lost.sh ZEROD RESUME_TRAINER
set -uo pipefail
zerod=$1 trainer=$2
if [ -z "${ZD_IN_MOUNT_NS:-}" ]; then
  # As root a mount namespace; else one of a user namespace, where this
  # user may mount a tmpfs.
  how=(-m)
  [ "$(id -u)" -eq 0 ] || how=(-r -m)
  if ! unshare "${how[@]}" true 2> /dev/null; then
    echo "final_snapshot_lost: SKIPPED: mounting a small tmpfs needs a mount namespace (unshare ${how[*]} fails here)"
    exit 77
  fi
  ZD_IN_MOUNT_NS=1 exec unshare "${how[@]}" --propagation private "$0" "$@"
fi
tmp=$(mktemp -d /tmp/zerod-endlost-XXXXXX)
trap 'umount "$tmp/snaps" "$tmp/probe" 2> /dev/null; rm -rf "$tmp"' EXIT
fail() { echo "final_snapshot_lost: FAILED: $*"; sed 's/^/  | /' "$tmp/err" 2> /dev/null; exit 1; }
mount_tmpfs() {  # DIR SIZE
  mkdir -p "$1"
  mount -t tmpfs -o "size=$2" tmpfs "$1" ||
    { echo "final_snapshot_lost: SKIPPED: cannot mount a tmpfs here"; exit 77; }
}
job() {  # FILE PATH EVERY
  printf 'return { optimizer = { type = "sgd", lr = 0.1 }, snapshot = { path = "%s", every = %s } }\n' "$2" "$3" > "$1"
}

# every = 0, the whole disk full: nothing of the run is saved.
mount_tmpfs "$tmp/snaps" 64k
head -c 1M /dev/zero > "$tmp/snaps/.filler" 2> /dev/null  # stops at the disk's end
job "$tmp/job.lua" "$tmp/snaps" 0
"$zerod" run --nproc 1 --job "$tmp/job.lua" -- "$trainer" 3 0 > "$tmp/out" 2> "$tmp/err"
rc=$?
[ "$rc" -eq 74 ] || fail "every = 0: exit status $rc, not 74"
grep -q "zerod run: all 1 ranks finished" "$tmp/err" || fail "every = 0: the rank did not finish"
grep -q "the final snapshot, of step 3, failed (.*the run's final state (step 3) was NOT saved; no snapshot is kept under $tmp/snaps: nothing of this run is saved there (snapshot.every = 0 snapshots only the end" \
  "$tmp/err" || fail "every = 0: the error does not say that the end was not saved and nothing is kept"
grep -q "Free space on the disk of $tmp/snaps" "$tmp/err" || fail "every = 0: the error does not say what to do"
tail -n 1 "$tmp/err" | grep -q "^zerod run: the job's final snapshot failed: the run's final state was NOT saved (model 0 (.*job.lua); .*); exit status 74$" ||
  fail "every = 0: zerod run's last line does not say that the end was not saved"
! grep -q "training goes on" "$tmp/err" || fail "every = 0: the log says that training goes on"
umount "$tmp/snaps"

# every = 2 under a supervised daemon, a disk with room for one snapshot and
# a half: the snapshot of step 2 is kept, the final one (step 3) fails. One
# snapshot's size, as tmpfs counts it, from a run on a roomy one.
mount_tmpfs "$tmp/probe" 16m
job "$tmp/probe.lua" "$tmp/probe" 2
"$zerod" run --nproc 1 --job "$tmp/probe.lua" -- "$trainer" 3 0 > "$tmp/out" 2> "$tmp/err" || fail "the probe run failed"
kib=$(du -sk "$tmp/probe/step-000000000002" | cut -f1)
[ "${kib:-0}" -gt 0 ] || fail "the probe run wrote no snapshot of step 2"
mount_tmpfs "$tmp/snaps" "$((kib * 3 / 2 + 4))k"  # and a page for the lock file
job "$tmp/job.lua" "$tmp/snaps" 2
"$zerod" run --nproc 1 --job "$tmp/job.lua" -- "$trainer" 3 0 > "$tmp/out" 2> "$tmp/err"
rc=$?
[ "$rc" -eq 74 ] || fail "every = 2: exit status $rc, not 74 (a snapshot takes $kib KiB)"
grep -q "zerod run: daemon pid [0-9]* serving 1 ranks" "$tmp/err" || fail "every = 2: the daemon was not supervised"
grep -q "the run's final state (step 3) was NOT saved; the newest snapshot kept is of step 2 ($tmp/snaps/step-000000000002)" \
  "$tmp/err" || fail "every = 2: the error does not name the snapshot of step 2 as the newest kept"
grep -q "^zerod serve: the job's final snapshot failed: .*; exit status 74$" "$tmp/err" ||
  fail "every = 2: the daemon did not say that the end was not saved"
tail -n 1 "$tmp/err" | grep -q "^zerod run: the job's final snapshot failed: the run's final state was NOT saved (its daemon, pid [0-9]*, exited with status 74; .*); exit status 74$" ||
  fail "every = 2: zerod run's last line does not say that the end was not saved"
[ -e "$tmp/snaps/step-000000000002/zerod-checkpoint.txt" ] || fail "every = 2: the snapshot of step 2 is gone"
[ -z "$(ls -d "$tmp/snaps"/step-000000000003* 2> /dev/null)" ] || fail "every = 2: the failed one was left: $(ls "$tmp/snaps")"
echo "final_snapshot_lost: the lost end is said and zerod run exits 74, in its own process and supervised"
