#!/usr/bin/env bash
# README.md's "Several ranks" advice on its own C example: with
# zero = { stage = 2 } and then zero = { stage = 3, param_persistence_threshold = 0 }
# in examples/c/job.lua, 2 ranks each, stage 3 holds fewer device bytes per
# rank than stage 2. (It said zero = { stage = 3 }: at the default threshold
# of 1e5 elements every tensor of this small MLP stays whole on every rank,
# and stage 3 held more than stage 2, 64320 bytes against 55296.)
#   example_c_bytes_by_stage.sh ZEROD TRAIN_MLP SOURCE_DIR SCRATCH_DIR
set -u
zerod=$1 trainer=$2 src=$3 work=$4
rm -rf "$work" && mkdir -p "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }

# Rank 0's device bytes at the end of 20 steps of the README's job with
# `zero = $1` added.
device_bytes() {
  local job=$work/job.lua out
  sed "s/precision = \"fp32\",/precision = \"fp32\", zero = $1,/" "$src/examples/c/job.lua" >"$job"
  grep -qF "zero = $1" "$job" || fail "could not add zero = $1 to examples/c/job.lua"
  out=$("$zerod" run --nproc 2 --job "$job" -- "$trainer" --quiet --steps 20 2>&1) || fail "zero = $1: $out"
  sed -n 's/.*model state per rank: device \([0-9]*\) bytes.*/\1/p' <<<"$out" | grep . || fail "zero = $1: no bytes: $out"
}

advice="{ stage = 3, param_persistence_threshold = 0 }"
grep -qF "zero = $advice" "$src/README.md" || fail "README.md no longer advises zero = $advice: update this test"
stage2=$(device_bytes "{ stage = 2 }") || { echo "$stage2"; exit 1; }
stage3=$(device_bytes "$advice") || { echo "$stage3"; exit 1; }
echo "device bytes per rank: stage 2 $stage2, stage 3 $stage3"
[ "$stage3" -lt "$stage2" ] || fail "stage 3 holds $stage3 device bytes per rank, stage 2 $stage2"
rm -rf "$work"
echo "example C bytes by stage: ok"
