#!/usr/bin/env bash
# On the GPU machine (the device tool), from the repository root, with
# .devdeps and .whl carried (bench/gpu/prepare.sh makes them):
#   bench/gpu/run.sh [tests] [pycuda] [smoke] [profile] [offload] [largest] [hostbw] [nccl] [daemon]
#   (default: tests offload largest; OFFLOAD_ARGS, LARGEST_ARGS, DAEMON_ARGS,
#   PROFILE_MODES and PROFILE_SIZE pass options on)
# Builds zerod with CUDA for the GPU it finds, runs every CUDA test (the
# cuda device against the scalar reference and the cpu device, the optimizer
# kernels, zerod.torch against PyTorch on the GPU), then the benchmarks;
# hostbw alone (the host's memory bandwidth) needs no build.
# Everything it prints also goes under $OUT (the device tool brings it back).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/zerod-gpu}
mkdir -p "$OUT"
what=("$@")
[ ${#what[@]} -eq 0 ] && what=(tests offload largest)
log() { printf '\n=== %s\n' "$*" | tee -a "$OUT/run.log"; }

log "machine"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; free -g | head -2; python3 -c 'import torch; print("torch", torch.__version__)'; } 2>&1 | tee -a "$OUT/run.log"

eval "$(bash .devdeps/unpack.sh .devdeps)"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export ZEROD_LIB=$PWD/build-gpu/lib/libzerod.so
export PYTHONPATH=$PWD/bindings/python${PYTHONPATH:+:$PYTHONPATH}

if [[ " ${what[*]} " =~ \ (tests|pycuda|smoke|profile|offload|largest|nccl|daemon)\  ]]; then
  log "build (CUDA for this GPU)"
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
  # NCCL for the nccl comm plugin: the one PyTorch's nvidia-nccl wheel
  # brings where it is installed (the NCCL torch itself runs; its
  # nvidia/nccl folder has include/ and lib/, searched first), else the CUDA
  # toolkit's. configure.log's "nccl comm plugin" line says which.
  nccl_root=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZEROD_CUDA=ON \
    ${nccl_root:+-DZEROD_NCCL_ROOT="$nccl_root"} \
    -DCMAKE_CUDA_ARCHITECTURES="${arch:-90}" -DZEROD_PYTHON="$(command -v python3)" > "$OUT/configure.log" 2>&1 \
    || { tail -30 "$OUT/configure.log"; exit 1; }
  SECONDS=0; cmake --build build-gpu -j"$(nproc)" > "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" -A3 "$OUT/build.log" | head -60; exit 1; }
  echo "built in ${SECONDS} s" | tee -a "$OUT/run.log"
fi

for w in "${what[@]}"; do
  case $w in
    tests)
      log "CUDA tests"
      ctest --test-dir build-gpu -j4 -R '^(device\.|device_engine\.|overlap\..*cuda|kernels\..*Cuda|python\.cuda|example\.cpp_gpt_cuda)' \
        --output-on-failure --timeout 240 2>&1 | tee "$OUT/cuda-tests.log" | grep -E "tests passed|Failed|\*\*\*|Skipped" ;;
    pycuda)
      log "zerod.torch on the GPU against torch's AdamW, with the distances it measured"
      ctest --test-dir build-gpu -R '^python\.cuda$' -V --timeout 240 2>&1 | tee "$OUT/python-cuda.log" \
        | grep -E "(fp32|bf16) .*zerod vs torch|passed|failed" ;;
    smoke)
      log "every step.py mode on a small GPT (4 x 1024), 6 steps"
      for m in torch zerod0 zerod3 zerod3_host zerod3_host_bf16 zerod3_params zerod3_nvme_opt zerod3_nvme ds3_host; do
        timeout 200 python3 bench/gpu/step.py --mode "$m" --layers 4 --embd 1024 --steps 6 2>>"$OUT/smoke.err" \
          | tee -a "$OUT/smoke.txt" || { echo "$m: exit $?"; tail -5 "$OUT/smoke.err"; }
      done ;;
    profile)
      log "where zerod's offloaded step goes: traced steps 3-4 (${PROFILE_SIZE:-4 x 1024})"
      for m in ${PROFILE_MODES:-zerod3_host zerod3_params zerod3_nvme}; do
        timeout 200 python3 bench/gpu/step.py --mode "$m" ${PROFILE_SIZE:---layers 4 --embd 1024} --steps 6 --trace "$OUT/trace-$m.json" \
          2>>"$OUT/profile.err" | tee -a "$OUT/profile.txt"
        [ -f "$OUT/trace-$m.json" ] && python3 bench/gpu/trace_summary.py "$OUT/trace-$m.json" --top 25 | tee -a "$OUT/profile.txt"
        rm -f "$OUT/trace-$m.json"
      done ;;
    offload)
      log "offload step time: zerod and DeepSpeed against plain PyTorch"
      python3 bench/gpu/offload.py ${OFFLOAD_ARGS:-} 2>&1 | tee "$OUT/offload.txt" ;;
    largest)
      log "the largest GPT that trains, by mode"
      python3 bench/gpu/largest.py ${LARGEST_ARGS:-} 2>&1 | tee "$OUT/largest.txt" ;;
    nccl)
      # Two daemons on one GPU through the nccl comm plugin (each its own
      # NCCL_HOSTID, joined over the loopback): the conformance suite with a
      # timed 256 MiB all-reduce (busbw, bytes sent), then `zerod run`
      # parity at stages 1-3 against one daemon. About a minute on an H100
      # after the build (estimated: it has never run).
      log "nccl: two daemons on one GPU (conformance, bytes sent, zerod run parity)"
      grep -E "nccl comm plugin" "$OUT/configure.log" | tee -a "$OUT/run.log"
      timeout 240 build-gpu/bin/test_comm_nccl_gpu 2>&1 | tee "$OUT/nccl-gpu.log" \
        | grep -E "nccl bench|nccl conformance|FAILED|Failure|SKIPPED"
      timeout 240 tests/comm_nccl/run_parity.sh build-gpu/bin/zerod build-gpu/bin/rank_scenario \
        build-gpu/bin/test_comm_nccl_gpu 2>&1 | tee "$OUT/nccl-parity.log" \
        | grep -E "agrees|bit-identical|differ|failed|passed|SKIPPED" ;;
    daemon)
      # Issue 32 section 4: the daemon against embedded on the GPU (1 rank,
      # and 2 ranks on the one GPU with their device bytes against DESIGN.md
      # section 4), begin + end pairs, the C++ trainer against the PyTorch
      # GPT. About 4 minutes after the build (estimated: it has never run).
      log "the daemon on the GPU: against embedded, 2 ranks on one GPU, begin + end pairs, the C++ trainer"
      python3 bench/gpu/daemon.py ${DAEMON_ARGS:-} 2>&1 | tee "$OUT/daemon.txt" ;;
    hostbw)
      log "host memory bandwidth (STREAM copy and triad, 3 arrays of 2 GiB)"
      { gcc -O3 -fopenmp -march=native bench/gpu/hostbw.c -o "$OUT/hostbw" \
          && for t in 1 "$(nproc)"; do OMP_NUM_THREADS=$t OMP_PROC_BIND=spread "$OUT/hostbw" 2; done
        rm -f "$OUT/hostbw"; } 2>&1 | tee "$OUT/hostbw.txt" ;;
  esac
done
