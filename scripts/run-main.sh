#!/usr/bin/env bash
# The main job: installs what is missing, builds libzerod, `zerod` and the
# plugins, and trains the character-level GPT of examples/python/train_gpt.py
# (PyTorch, through zerod.torch) with the zerod daemon: 2 ranks, ZeRO stage 3
# (examples/python/gpt_job.lua), with a timeline of a few steps and its
# plots in build/main-job/. Arguments go to train_gpt.py (--text FILE,
# --steps N, ...).
#   scripts/run-main.sh c [args]   trains the C example (examples/c/train_mlp.c) instead
#   scripts/run-main.sh gpu [args] on the GPU: a larger GPT in bf16 through the
#                                  daemon, one rank per GPU (examples/python/
#                                  gpt_job_gpu.lua), after plain PyTorch on one
#                                  GPU, and their tokens/s per GPU side by side
#                                  (each rank trains the yardstick's batch; on
#                                  the device tool, with no network:
#                                  bench/gpu/run.sh main)
# ZEROD_SKIP_INSTALL=1 installs nothing; ZEROD_BUILD_DIR names the build.
set -euo pipefail
source "$(dirname "$0")/common.sh"
zerod_install_packages "${ZEROD_PACKAGES[@]}"
plugins=(zd_optimizer_adamw zd_optimizer_adam zd_optimizer_sgd zd_comm_local zd_tier_host zd_tier_nvme
  zd_partitioner_stage0 zd_partitioner_stage1 zd_partitioner_stage2 zd_partitioner_stage3)
cd "$ZEROD_ROOT"

if [ "${1:-}" = c ]; then
  shift
  zerod_build train_mlp zerod_cli "${plugins[@]}"
  zerod_log "checking the job script"
  "$ZEROD_BUILD_DIR/bin/zerod" check examples/c/job.lua --lr-steps 0
  zerod_log "training"
  exec "$ZEROD_BUILD_DIR/bin/train_mlp" --job examples/c/job.lua "$@"
fi

if [ "${1:-}" = gpu ]; then
  shift
  # torch with CUDA: the build's virtual environment (scripts/python-venv.sh),
  # else the machine's python3.
  py=python3
  [ -x "$ZEROD_BUILD_DIR/venv/bin/python" ] && py="$ZEROD_BUILD_DIR/venv/bin/python"
  # A torch that does not import is said as such, not as "no GPU".
  err=$(mktemp)
  if ! ngpu=$("$py" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>"$err"); then
    echo "scripts/run-main.sh gpu: $py cannot import torch: $(grep -v '^ ' "$err" | tail -1)" \
      "(scripts/python-venv.sh makes $ZEROD_BUILD_DIR/venv with a torch for CUDA)" >&2
    rm -f "$err"
    exit 1
  fi
  rm -f "$err"
  if [ "$ngpu" = 0 ]; then
    echo "scripts/run-main.sh gpu: $py's torch sees no GPU (make one visible, or scripts/python-venv.sh for torch with CUDA)" >&2
    exit 1
  fi
  zerod_build zerod zerod_cli "${plugins[@]}"
  export PYTHONPATH="$ZEROD_ROOT/bindings/python${PYTHONPATH:+:$PYTHONPATH}"
  export ZEROD_LIB="$ZEROD_BUILD_DIR/lib/libzerod.so"
  # Whether this zerod can serve the GPU job (a build without CUDA, a driver
  # too old for it), found before the yardstick's run instead of after: the
  # job with a trainer that does nothing, which zerod refuses at once, saying
  # why, where it cannot.
  if ! "$ZEROD_BUILD_DIR/bin/zerod" run --nproc "$ngpu" --job examples/python/gpt_job_gpu.lua -- true >/dev/null; then
    echo "scripts/run-main.sh gpu: $ZEROD_BUILD_DIR/bin/zerod cannot serve examples/python/gpt_job_gpu.lua on" \
      "this machine (above: why); nothing was trained" >&2
    exit 1
  fi
  out="$ZEROD_BUILD_DIR/main-job-gpu"
  mkdir -p "$out"
  size=(--device cuda --bf16 --layers 8 --heads 8 --embd 512 --block 256 --batch 32)
  zerod_log "plain PyTorch on one GPU (the yardstick): the same model, data, schedule and batch per GPU"
  "$py" examples/python/train_gpt.py "${size[@]}" --plain --sample-chars 0 "$@" 2>&1 | tee "$out/plain.txt"
  zerod_log "zerod: $ngpu rank(s) through the daemon, one per GPU, ZeRO stage 3 on the GPU"
  "$ZEROD_BUILD_DIR/bin/zerod" run --nproc "$ngpu" --job examples/python/gpt_job_gpu.lua -- \
    "$py" examples/python/train_gpt.py "${size[@]}" "$@" 2>&1 | tee "$out/zerod.txt"
  rate() { grep -o '[0-9,]* tokens/s' "$1" | head -1 | tr -d ', tokens/s'; }
  p=$(rate "$out/plain.txt") z=$(rate "$out/zerod.txt")
  # zerod's figure is the whole job's, over its $ngpu GPUs; the yardstick ran
  # on one. Compared per GPU: each rank trains the batch the yardstick does.
  [ -n "$p" ] && [ -n "$z" ] &&
    zerod_log "$(awk -v z="$z" -v p="$p" -v n="$ngpu" 'BEGIN{printf "tokens/s per GPU: zerod %.0f (%d over %d GPU%s), plain PyTorch %d on one GPU: %.2fx", z/n, z, n, n == 1 ? "" : "s", p, z/n/p}')"
  exit 0
fi

zerod_build zerod zerod_cli "${plugins[@]}"
zerod_log "checking the job script"
"$ZEROD_BUILD_DIR/bin/zerod" check examples/python/gpt_job.lua --lr-steps 0
zerod_log "training a GPT on 2 ranks through the zerod daemon"
# The bindings from this checkout, against the libzerod just built.
export PYTHONPATH="$ZEROD_ROOT/bindings/python${PYTHONPATH:+:$PYTHONPATH}"
export ZEROD_LIB="$ZEROD_BUILD_DIR/lib/libzerod.so"
# The daemon records a timeline of steps 2-6 (the job's default trace.steps)
# and the plots are drawn from it afterwards (docs/observability.md).
out="$ZEROD_BUILD_DIR/main-job"
mkdir -p "$out"
rm -f "$out"/trace*.json "$out"/trace-*.png
# Debian's torch does its matrix math through the system OpenBLAS, which
# falls back to its slowest x86-64 kernels (Prescott) on a CPU newer than its
# table: the job then trains 3-4x slower. Where that happened, the best
# kernels the CPU supports, checked to compute what the fallback does
# (scripts/openblas-coretype.py says why it chose or did not); never over
# the user's own OPENBLAS_CORETYPE.
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  core=$(/usr/bin/python3 scripts/openblas-coretype.py --python /usr/bin/python3 || true)
  if [ -n "$core" ]; then
    export OPENBLAS_CORETYPE=$core
    zerod_log "OpenBLAS did not know this CPU: OPENBLAS_CORETYPE=$core for the ranks"
  fi
fi
"$ZEROD_BUILD_DIR/bin/zerod" run --nproc 2 --trace "$out/trace.json" --job examples/python/gpt_job.lua -- \
  /usr/bin/python3 examples/python/train_gpt.py "$@"
# No trace when the ranks trained no step (train_gpt.py --help): nothing to
# plot, and `zerod plot` would fail the script on the missing file.
if [ ! -f "$out/trace.json" ]; then
  zerod_log "no trace was recorded in $out/trace.json (the ranks trained no step): nothing to plot"
  exit 0
fi
zerod_log "plotting the trace"
plots=$("$ZEROD_BUILD_DIR/bin/zerod" plot "$out/trace.json" --out "$out")
zerod_log "the timeline of steps 2-6 of both ranks: $out/trace.json (open it in ui.perfetto.dev or chrome://tracing)"
for p in $plots; do zerod_log "plot: $p"; done
