#!/usr/bin/env bash
# scripts/run-main.sh when its ranks record no trace (train_gpt.py --help
# trains no step): it says so and exits 0 (it failed with "zerod plot:
# cannot read build/main-job/trace.json"). Run against a build folder of
# stand-ins, as run_main_gpu_checks.sh: ZEROD_SKIP_INSTALL=1 and a cmake
# that builds nothing (common.sh's zerod_build would rebuild the tree),
# this build's zerod and libzerod.
#   run_main_without_a_trace.sh SOURCE_DIR ZEROD LIBZEROD SCRATCH_DIR
set -u
src=$1 zerod=$2 lib=$3 work=$4
rm -rf "$work" && mkdir -p "$work/build/bin" "$work/build/lib" "$work/fakebin" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
# The script runs train_gpt.py under Debian's python3, which imports torch
# and tqdm before it reads its arguments.
if ! /usr/bin/python3 -c 'import torch, tqdm' 2>/dev/null; then
  echo "SKIPPED: /usr/bin/python3 cannot import torch and tqdm (Debian: python3-torch python3-tqdm)"
  exit 77
fi
build=$work/build
touch "$build/build.ninja"  # configured: zerod_build only builds
printf '#!/bin/sh\nexit 0\n' >"$work/fakebin/cmake"
chmod +x "$work/fakebin/cmake"
ln -s "$zerod" "$build/bin/zerod"
ln -s "$lib" "$build/lib/libzerod.so"

ZEROD_SKIP_INSTALL=1 ZEROD_BUILD_DIR=$build PATH="$work/fakebin:$PATH" "$src/scripts/run-main.sh" --help \
  >"$work/out" 2>&1 || fail "run-main.sh --help exited $?: $(cat "$work/out")"
grep -q "usage: train_gpt.py" "$work/out" || fail "train_gpt.py's help is not shown: $(cat "$work/out")"
grep -q "no trace was recorded" "$work/out" || fail "not said that no trace was recorded: $(cat "$work/out")"
grep -q "plotting the trace" "$work/out" && fail "a missing trace was plotted: $(cat "$work/out")"
rm -rf "$work"
echo "run-main.sh without a trace: ok"
