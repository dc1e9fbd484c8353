#!/usr/bin/env bash
# scripts/run-main.sh gpu's checks, before and after its two runs, on any
# machine: a build folder of stand-ins (ZEROD_SKIP_INSTALL=1, a cmake that
# builds nothing, a Python in its venv/) in place of a GPU.
#  1. a torch that does not import is said as such (it said "torch sees no GPU");
#  2. a torch that sees no GPU is said as such (this machine's python3, with
#     CUDA_VISIBLE_DEVICES empty; left out where it has no torch);
#  3. a zerod that cannot serve the GPU job (built without CUDA, no driver)
#     stops it before the plain PyTorch run (which ran first, for nothing;
#     left out where this zerod can serve it: a GPU machine);
#  4. the tokens/s are compared per GPU: zerod's are the whole job's over N
#     GPUs, the yardstick's one GPU's (it compared N GPUs with one).
#   run_main_gpu_checks.sh SOURCE_DIR ZEROD SCRATCH_DIR
set -u
src=$1 zerod=$2 work=$3
rm -rf "$work" && mkdir -p "$work/build/bin" "$work/build/venv/bin" "$work/fakebin" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
build=$work/build
touch "$build/build.ninja"  # configured: common.sh's zerod_build only builds
printf '#!/bin/sh\nexit 0\n' >"$work/fakebin/cmake"
chmod +x "$work/fakebin/cmake"
ln -s "$zerod" "$build/bin/zerod"
# Debian's, which has torch where scripts/common.sh installed it.
python=/usr/bin/python3
[ -x "$python" ] || python=$(command -v python3) || fail "no python3"
run_main() {
  ZEROD_SKIP_INSTALL=1 ZEROD_BUILD_DIR=$build PATH="$work/fakebin:$PATH" "$src/scripts/run-main.sh" gpu >"$work/out" 2>&1
}
stand_in() {  # the venv's python: a shell script
  printf '#!/bin/sh\n%s\n' "$1" >"$build/venv/bin/python"
  chmod +x "$build/venv/bin/python"
}

# 1. No torch: a Python without its site-packages.
stand_in "exec $python -I -S \"\$@\""
run_main && fail "1: run-main.sh gpu without torch exited 0: $(cat "$work/out")"
grep -q "cannot import torch: ModuleNotFoundError: No module named 'torch'" "$work/out" ||
  fail "1: not said that torch does not import: $(cat "$work/out")"
grep -q "sees no GPU" "$work/out" && fail "1: a torch that does not import was said to see no GPU: $(cat "$work/out")"
echo "ok 1: a torch that does not import is said so"

# 2. torch, no GPU.
if "$python" -c 'import torch' 2>/dev/null; then
  stand_in "CUDA_VISIBLE_DEVICES= exec $python \"\$@\""
  run_main && fail "2: run-main.sh gpu without a GPU exited 0: $(cat "$work/out")"
  grep -q "torch sees no GPU" "$work/out" || fail "2: not said that torch sees no GPU: $(cat "$work/out")"
  echo "ok 2: a torch that sees no GPU is said so"
else
  echo "skipped 2: $python has no torch"
fi

# A Python whose torch sees $1 GPUs and whose runs of train_gpt.py (the
# yardstick) print $2 tokens/s and are noted in $work/ran.
gpus_and_rate() {
  stand_in "if [ \"\$1\" = -c ]; then echo $1; exit 0; fi
echo yardstick >>'$work/ran'
echo 'trained 10 steps in 1.0 s: $2 tokens/s; loss 4.000 -> 2.000 (mean of the first and last 10 steps), validation loss 2.100 [plain PyTorch]'"
}

# 3. A GPU, and a zerod that cannot serve the job there.
if "$zerod" run --nproc 1 --job "$src/examples/python/gpt_job_gpu.lua" -- true >/dev/null 2>&1; then
  echo "skipped 3: $zerod serves the GPU job here"
else
  gpus_and_rate 1 1,000
  rm -f "$work/ran"
  run_main && fail "3: run-main.sh gpu exited 0 with a zerod that cannot serve the GPU job: $(cat "$work/out")"
  grep -q "cannot serve examples/python/gpt_job_gpu.lua on this machine" "$work/out" ||
    fail "3: not said that zerod cannot serve the job: $(cat "$work/out")"
  grep -q 'device = "cuda", but' "$work/out" || fail "3: zerod's reason is not shown: $(cat "$work/out")"
  [ ! -e "$work/ran" ] || fail "3: the plain PyTorch run ran before zerod was found unable: $(cat "$work/out")"
  echo "ok 3: a zerod that cannot serve the GPU job stops it before the yardstick"
fi

# 4. Two GPUs: zerod (a stand-in) trains 3,000 tokens/s over both, the
# yardstick 1,000 on one: 1,500 per GPU, 1.50x.
rm -f "$build/bin/zerod"
cat >"$build/bin/zerod" <<'ZEROD'
#!/bin/sh
for a; do last=$a; done
[ "$last" = true ] && exit 0
echo 'trained 10 steps in 1.0 s: 3,000 tokens/s; loss 4.000 -> 2.000 (mean of the first and last 10 steps), validation loss 2.100'
ZEROD
chmod +x "$build/bin/zerod"
gpus_and_rate 2 1,000
run_main || fail "4: run-main.sh gpu with stand-ins exited $?: $(cat "$work/out")"
grep -q "tokens/s per GPU: zerod 1500 (3000 over 2 GPUs), plain PyTorch 1000 on one GPU: 1.50x" "$work/out" ||
  fail "4: not compared per GPU: $(cat "$work/out")"
echo "ok 4: tokens/s compared per GPU"
rm -rf "$work"
echo "run-main.sh gpu checks: ok"
