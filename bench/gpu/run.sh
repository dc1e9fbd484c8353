#!/usr/bin/env bash
# On the GPU machine (the device tool), from the repository root, with
# .devdeps and .whl carried (bench/gpu/prepare.sh makes them):
#   bench/gpu/run.sh [--dry-run] PART...     (--help: the parts and the variables)
# Builds zerod with CUDA for the GPU it finds (build-gpu/, before the first
# part that needs it), then runs the parts in the order given; hostbw (the
# host's memory bandwidth) needs no build and runs whatever the build did.
# A part whose build failed (the configure, or its binaries) is skipped and
# the others run on; the run then exits 2, as where the tests part has no
# test list to run.
# Where a part needs the build and neither .devdeps nor the machine has
# zerod's build dependencies, it stops at once (exit 2), before any part.
# The whole run keeps to RUN_DEADLINE_S (from its start): each part is capped
# by the time left, and one that would start with under MIN_PART_S left is
# skipped (and said so).
# Everything it prints also goes under $OUT (the device tool brings back at
# most 8 files: run.log, configure.log, build.log and one or two a part).
# The *_ARGS variables and PROFILE_SIZE are split at spaces on purpose:
# shellcheck disable=SC2086
set -uo pipefail
cd "$(dirname "$0")/../.." || exit

PARTS=(tests pycuda smoke profile offload largest hostbw nccl daemon main)
usage() {
  cat <<'EOF'
usage: bench/gpu/run.sh [--dry-run] [--help] [PART...]   (default: tests offload largest)

parts, run in the order given:
  tests    every CUDA test (ctest), stopped TESTS_S after they start; TESTS_R
           (a ctest -R regex, e.g. '^NAME( |$)') runs those alone, with their
           whole output (-V); a TESTS_R that matches no test, or a test list
           ctest cannot read, skips the part (the run goes on, then exits 2)
  pycuda   python.cuda alone, with the distances it measured
  smoke    every step.py mode on a small GPT (4 x 1024), one line each
  profile  traced steps of PROFILE_MODES at PROFILE_SIZE, summed by trace_summary.py
  offload  offload.py (OFFLOAD_ARGS; its --budget, unless given, is the time left)
  largest  largest.py (LARGEST_ARGS; likewise its --budget)
  hostbw   the host's STREAM copy and triad (no build needed)
  nccl     the nccl comm plugin: two daemons on one GPU
  daemon   daemon.py (DAEMON_ARGS; likewise its --budget): the daemon against embedded on the GPU
  main     the main job's GPU form (scripts/run-main.sh gpu MAIN_ARGS) on build-gpu

a part that needs the build is skipped where the configure failed or its
binaries did not build; the other parts run on, and the run then exits 2

options:
  -n, --dry-run   print the plan (parts, budgets, time limits) and do nothing;
                  exit 2 where the real run would stop at once (a part needs
                  the build and neither .devdeps nor the machine has lua5.4)
  -h, --help      this text

variables: RUN_DEADLINE_S (450: seconds for the whole run), TESTS_S (220),
  TESTS_R, MIN_PART_S (30), OUT (/tmp/zerod-gpu), OFFLOAD_ARGS, LARGEST_ARGS,
  DAEMON_ARGS, PROFILE_MODES, PROFILE_SIZE, MAIN_ARGS
EOF
}

# The arguments, all checked before anything runs.
dry=0 bad=0 what=()
for a in "$@"; do
  case $a in
    -h | --help) usage; exit 0 ;;
    -n | --dry-run) dry=1 ;;
    *)
      if [[ " ${PARTS[*]} " == *" $a "* ]]; then
        what+=("$a")
      else
        echo "bench/gpu/run.sh: unknown $([[ $a == -* ]] && echo option || echo part) '$a'" >&2
        bad=1
      fi ;;
  esac
done
RUN_DEADLINE_S=${RUN_DEADLINE_S:-450} TESTS_S=${TESTS_S:-220} MIN_PART_S=${MIN_PART_S:-30}
for v in RUN_DEADLINE_S TESTS_S MIN_PART_S; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "bench/gpu/run.sh: $v must be a number of seconds, not '${!v}'" >&2; bad=1; }
done
if [ "$bad" = 1 ]; then
  usage >&2
  exit 2
fi
[ ${#what[@]} -eq 0 ] && what=(tests offload largest)
# The tests that use the GPU: the cases named cuda of the suites that run on
# every device (device.Devices/OnDevice.*/cuda, device_engine's and overlap's
# cuda_*), device.CudaShared.*, device.CudaStream.*, kernels' CudaUpdate,
# python.cuda*, the C++ GPT's; not their cpu and opaque cases, nor
# device.CudaFailure.* (messages, on the CPU), which would start first. And
# the few others with a branch of their own where there is a GPU (under a
# second each): "auto" picks it (abi), the host tier page-locks with it
# (offload), a job that asks for cuda is planned on it (cli), python.errors'
# "no GPU" error is not raised with one.
CUDA_TESTS='^((device|device_engine|overlap|kernels)\.[^ ]*[Cc]uda|python\.cuda|example\.cpp_gpt_cuda'
CUDA_TESTS+='|abi\.DeviceTest\.AutoIsTheGpuWhereThereIsOne$|offload\.HostTier\.ThisMachineIsBoundAndNotPageLockedWithoutAGpu$'
CUDA_TESTS+='|cli\.plan_honours_a_cuda_job$|python\.errors$)'
CUDA_TESTS_ON_CPU='^device\.CudaFailure\.'
# The tests the next GPU session reads first (bench/gpu/README.md): seconds
# each, but with no timings (a fresh machine) or short ones (a warm one),
# ctest would start them after the long tests (COST 1000), maybe not before
# the stop time. ctest takes the cost of a test without a COST property from
# the build's Testing/Temporary/CTestCostData.txt: theirs is set above.
FIRST_TESTS='^device\.Cuda(Shared|Stream)\.'
FIRST_COST=2000
tests_r=${TESTS_R:-$CUDA_TESTS}
tests_sel=(-R "$tests_r")
tests_shown="-R '$tests_r'"
tests_v=()
if [ -n "${TESTS_R:-}" ]; then
  tests_v=(-V)
  tests_shown+=" -V"
else
  tests_sel+=(-E "$CUDA_TESTS_ON_CPU")
  tests_shown+=" -E '$CUDA_TESTS_ON_CPU'"
fi

# Time: everything against one deadline.
t0=$(date +%s)
deadline=$((t0 + RUN_DEADLINE_S))
left() { echo $((deadline - $(date +%s))); }
# The smaller of $1 and the time left (at least 1).
cap() {
  local l
  l=$(left)
  ((l < 1)) && l=1
  echo $(($1 < l ? $1 : l))
}

# Whether an argument string ($1) holds option $2 (as `$2 V` or `$2=V`).
has_opt() { [[ " $1 " == *" $2 "* || " $1 " == *" $2="* ]]; }
# The value of option $2 in $1, else $3.
opt_of() {
  local prev="" x
  for x in $1; do
    [ "$prev" = "$2" ] && { echo "$x"; return; }
    [[ $x == "$2="* ]] && { echo "${x#"$2="}"; return; }
    prev=$x
  done
  echo "$3"
}
# Whether a part in the run starts DeepSpeed rows (whose CPU Adam compiles
# at first use: built beforehand, in the background, while the tests run).
runs_deepspeed() {
  local w
  for w in "${what[@]}"; do
    case $w in
      offload)
        has_opt "${OFFLOAD_ARGS:-}" --no-deepspeed && continue
        [[ ,$(opt_of "${OFFLOAD_ARGS:-}" --modes torch,zerod3_host,zerod3_params,ds3_host,ds3_params), == *,ds* ]] \
          && return 0 ;;
      largest) [[ ,$(opt_of "${LARGEST_ARGS:-}" --modes ds3_host), == *,ds* ]] && return 0 ;;
      smoke) return 0 ;;
    esac
  done
  return 1
}
# The files a part needs from the build.
needs() {
  case $1 in
    tests) echo build-gpu/CTestTestfile.cmake ;;
    pycuda) echo build-gpu/CTestTestfile.cmake build-gpu/lib/libzerod.so ;;
    smoke | profile | offload | largest) echo build-gpu/lib/libzerod.so ;;
    nccl) echo build-gpu/bin/test_comm_nccl_gpu build-gpu/bin/zerod build-gpu/bin/rank_scenario ;;
    daemon | main) echo build-gpu/bin/zerod build-gpu/lib/libzerod.so ;;
  esac
}
# The first part that needs the build, if any.
building_part() {
  local w
  for w in "${what[@]}"; do [ -n "$(needs "$w")" ] && { echo "$w"; return; }; done
}
# Fails, saying so, where a part needs the build and nothing here has zerod's
# build dependencies (.devdeps, else the machine's own: lua5.4 stands for
# them): the configure would fail minutes in, after hostbw, and every part
# but hostbw would be skipped.
build_deps_here() {
  local w
  w=$(building_part)
  [ -z "$w" ] || [ -f .devdeps/unpack.sh ] || pkg-config --exists lua5.4 2>/dev/null && return 0
  echo "bench/gpu/run.sh: $w needs the build, and there is no .devdeps/ here nor lua5.4 on this machine:" \
    "run bench/gpu/prepare.sh on the CPU machine first, and carry .devdeps and .whl" \
    "(run(..., carry=[\".devdeps\", \".whl\"]))" >&2
  return 1
}
# Scratch files, outside $OUT (the device tool brings back 8 files at most).
tmp=$(mktemp -d "${TMPDIR:-/tmp}/zerod-run.XXXXXX") || exit
trap 'rm -rf "$tmp"' EXIT
# Lists (ctest -N) the tests of build folder $1 that the tests part selects
# into tests_listed, and their number into tests_count. Fails, the reason in
# tests_problem, where ctest cannot read the folder (its own error, whose
# first lines are kept: a test list CMake cannot parse is no regex's fault)
# or the selection matches no test (ctest alone would print "No tests were
# found!!!" and exit 0). A value-parameterised test's name may go on after
# a space (CMake's "  # GetParam() = ...", in a build from before
# tests/CMakeLists.txt's NO_PRETTY_VALUES), so '^NAME$' can miss it.
tests_list() {
  local rc=0
  tests_listed=$(ctest --test-dir "$1" -N "${tests_sel[@]}" 2>"$tmp/ctest.err") || rc=$?
  tests_count=$(sed -n 's/^Total Tests: //p' <<<"$tests_listed")
  if ((rc != 0)); then
    tests_problem="ctest -N cannot read $1 (exit $rc): $(grep -v '^ *$' "$tmp/ctest.err" | head -4 | tr '\n' ' ')"
    return 1
  fi
  [ "${tests_count:-0}" -gt 0 ] && return 0
  tests_problem="bench/gpu/run.sh: ctest -R '$tests_r' matches no test in $1/ (ctest -N): nothing would run; for one test write TESTS_R='^NAME( |\$)'"
  return 1
}
# The names in tests_listed.
listed_names() { sed -nE 's/^ *Test +#[0-9]+: //p' <<<"$tests_listed"; }
# Gives the listed tests of FIRST_TESTS a cost above the others' in build
# folder $1's cost data (the other lines kept, the failed tests after ---).
put_first() {
  local data=$1/Testing/Temporary/CTestCostData.txt first
  first=$(listed_names | grep -E "$FIRST_TESTS") || return 0
  mkdir -p "$(dirname "$data")"
  touch "$data"
  awk -v first="$first" -v cost="$FIRST_COST" '
    BEGIN { n = split(first, f, "\n"); for (i = 1; i <= n; i++) { put[f[i]] = 1; print f[i], 1, cost } }
    /^---$/ { costs_done = 1 }
    costs_done || !($1 in put) { print }
    END { if (!costs_done) print "---" }' "$data" >"$tmp/cost" && cp "$tmp/cost" "$data"
}
# The listed tests that ctest's log $1 never says it started ("Start N:").
not_started() {
  LC_ALL=C comm -23 <(listed_names | LC_ALL=C sort -u) \
    <(sed -nE 's/^ *Start +[0-9]+: //p' "$1" | LC_ALL=C sort -u)
}
# The budget a driver gets when its arguments name none: the time left, less
# a margin for its tables.
budget_args() {
  if has_opt "$1" --budget; then
    echo "$1"
  else
    echo "$1 --budget $(($(left) - 15))"
  fi
}

if [ "$dry" = 1 ]; then
  echo "bench/gpu/run.sh ${what[*]}: the plan (dry run: nothing runs)"
  echo "  deadline: ${RUN_DEADLINE_S} s from the start (RUN_DEADLINE_S); a part with under ${MIN_PART_S} s left is skipped"
  build_deps_here || exit 2
  for d in .devdeps/unpack.sh .whl; do
    [ -e "$d" ] || echo "  WARNING: no $d here: carry .devdeps and .whl (bench/gpu/prepare.sh makes them)"
  done
  building=$(building_part)
  [ -n "$building" ] && echo "  build: build-gpu/ with CUDA for the GPU found (ninja -k 0: a part whose binaries did not build is skipped; a failed configure skips every part that needs the build; the run then exits 2), before $building"
  runs_deepspeed && echo "  DeepSpeed's CPU Adam: built in the background after the build (into run.log); offload's first ds row waits for it, largest and smoke wait before they start"
  i=0
  for w in "${what[@]}"; do
    i=$((i + 1))
    case $w in
      tests)
        checked="" first=""
        for b in build-gpu build; do [ -f "$b/CTestTestfile.cmake" ] && checked=$b && break; done
        if [ -z "$checked" ]; then
          m="not counted: no build here"
        elif tests_list "$checked"; then
          m="tests in $checked/ now: $tests_count"
          first="; the $(listed_names | grep -cE "$FIRST_TESTS") of '$FIRST_TESTS' among them started first"
        else
          echo "$tests_problem" >&2
          exit 2
        fi
        d="ctest $tests_shown -j4 ($m), --timeout 240 for tests without their own, --stop-time at min(TESTS_S=${TESTS_S}, the time left) s after they start, then the tests not started by then named$first; cuda-tests.log" ;;
      pycuda) d="ctest -R '^python\.cuda\$' -V, --stop-time at min(240, the time left) s; python-cuda.log" ;;
      smoke) d="9 step.py modes, each at most min(200, the time left) s; smoke.txt, smoke.err" ;;
      profile) d="step.py --trace for ${PROFILE_MODES:-zerod3_host zerod3_params zerod3_nvme} at ${PROFILE_SIZE:---layers 4 --embd 1024}, each at most min(200, the time left) s; profile.txt, profile.err" ;;
      offload) d="python3 bench/gpu/offload.py ${OFFLOAD_ARGS:-}$(has_opt "${OFFLOAD_ARGS:-}" --budget || echo " --budget (the time left when it starts - 15)")$(runs_deepspeed && echo " --ds-ready (the file the DeepSpeed build writes as it ends)"), at most the time left (a row is not started with under 45 s of its budget left at 1B parameters and up, 30 s below); offload.txt, rows.err (each row's stderr)" ;;
      largest) d="python3 bench/gpu/largest.py ${LARGEST_ARGS:-}$(has_opt "${LARGEST_ARGS:-}" --budget || echo " --budget (the time left when it starts - 15)"), at most the time left; largest.txt, rows.err (each try's stderr)" ;;
      hostbw) d="gcc -O3 -fopenmp hostbw.c; STREAM on 1 thread and on every core, at most min(120, the time left) s; hostbw.txt" ;;
      nccl) d="test_comm_nccl_gpu, then tests/comm_nccl/run_parity.sh, each at most min(240, the time left) s; nccl-gpu.log, nccl-parity.log" ;;
      daemon) d="python3 bench/gpu/daemon.py ${DAEMON_ARGS:-}$(has_opt "${DAEMON_ARGS:-}" --budget || echo " --budget (the time left when it starts - 15)"), at most the time left; daemon.txt" ;;
      main) d="ZEROD_SKIP_INSTALL=1 ZEROD_BUILD_DIR=build-gpu scripts/run-main.sh gpu ${MAIN_ARGS:-}, at most min(300, the time left) s; main-gpu.txt" ;;
    esac
    echo "  $i. $w: $d"
    for f in $(needs "$w"); do echo "       needs $f from the build"; done
  done
  exit 0
fi

# Exported: offload.py and largest.py write each row's stderr to $OUT/rows.err.
export OUT=${OUT:-/tmp/zerod-gpu}
mkdir -p "$OUT"
log() { printf '\n=== %s\n' "$*" | tee -a "$OUT/run.log"; }
note() { echo "$*" | tee -a "$OUT/run.log"; }

# Without the build's dependencies every part but hostbw would be skipped
# after minutes: stopped here, before anything runs.
if ! build_deps_here 2>"$tmp/deps"; then
  note "$(cat "$tmp/deps")"
  exit 2
fi
if [ -f .devdeps/unpack.sh ]; then
  if env_of_devdeps=$(bash .devdeps/unpack.sh .devdeps 2>"$tmp/unpack.err"); then
    eval "$env_of_devdeps"
  else
    note "bench/gpu/run.sh: .devdeps/unpack.sh failed: $(tail -3 "$tmp/unpack.err" | tr '\n' ' ')"
    # The configure would fail, or find another lua than the one carried.
    if [ -n "$(building_part)" ]; then
      note "nothing runs ($(building_part) needs the build): run bench/gpu/prepare.sh again and carry .devdeps and .whl"
      exit 2
    fi
  fi
else
  note "no .devdeps/ here (carry it: bench/gpu/prepare.sh makes it); the build finds what the machine has"
fi
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export ZEROD_LIB=$PWD/build-gpu/lib/libzerod.so
export PYTHONPATH=$PWD/bindings/python${PYTHONPATH:+:$PYTHONPATH}

log "machine"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  nproc
  free -g | head -2
  python3 -c 'import torch; print("torch", torch.__version__)'
  python3 -c 'import deepspeed, pydantic; print("deepspeed", deepspeed.__version__, "pydantic", pydantic.__version__)'
  echo "run.sh ${what[*]}: deadline ${RUN_DEADLINE_S} s, tests ${TESTS_S} s"
} 2>&1 | tee -a "$OUT/run.log"

# not_run: the parts that could not run for want of their build or test
# list, and why; the other parts run on, and the call then exits 2, so that
# a run that could not test this code does not read as one that did.
built="" build_failed="" ds_pid="" not_run=()
# Written by the DeepSpeed build as it ends ("EXIT SECONDS"): offload.py's
# --ds-ready, which its first ds row waits for.
ds_ready=$tmp/ds-ready
# Configures and builds build-gpu once, before the first part that needs it.
# A compile error stops only what it breaks (ninja -k 0): the parts whose
# binaries it left out of date are skipped.
build() {
  [ -n "$built" ] && return
  built=1
  log "build (CUDA for this GPU)"
  local arch nccl_root s
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
  # NCCL for the nccl comm plugin: the one PyTorch's nvidia-nccl wheel
  # brings where it is installed (the NCCL torch itself runs; its
  # nvidia/nccl folder has include/ and lib/, searched first), else the CUDA
  # toolkit's. configure.log's "nccl comm plugin" line says which.
  nccl_root=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
  if ! cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZEROD_CUDA=ON \
    ${nccl_root:+-DZEROD_NCCL_ROOT="$nccl_root"} \
    -DCMAKE_CUDA_ARCHITECTURES="${arch:-90}" -DZEROD_PYTHON="$(command -v python3)" >"$OUT/configure.log" 2>&1; then
    tail -30 "$OUT/configure.log"
    # build-gpu/ may hold an earlier call's binaries (a warm machine): no
    # part may run them as this code's.
    build_failed=1
    note "the configure failed: only the parts that need no build (hostbw) run"
    return
  fi
  s=$(date +%s)
  if timeout "$(cap 420)" cmake --build build-gpu -j"$(nproc)" -- -k 0 >"$OUT/build.log" 2>&1; then
    note "built in $(($(date +%s) - s)) s"
  else
    grep -E "error|FAILED" -A3 "$OUT/build.log" | head -60
    # What a failed compile left out of date (an earlier call's binary on a
    # warm machine among them) must not run as if it were this code's.
    local stale f
    stale=$(ninja -C build-gpu -n 2>/dev/null |
      sed -nE 's/.*Linking [A-Za-z]+ (executable|shared library|shared module|static library) //p')
    for f in $stale; do rm -f "build-gpu/$f"; done
    note "the build failed after $(($(date +%s) - s)) s (build.log); not built: $(grep -v '\.a$' <<<"$stale" | tr '\n' ' ')"
  fi
  if runs_deepspeed; then
    # DeepSpeed compiles its CPU Adam at its first use (a minute and more):
    # here, beside the tests, so that no timed row waits for it.
    ds_clear_locks
    note "DeepSpeed's CPU Adam: building in the background ([ds build] lines)"
    ds_build "$(cap 400)" > >(sed -u 's/^/[ds build] /' >>"$OUT/run.log") 2>&1 &
    ds_pid=$!
  fi
}
# In the background: DeepSpeed's CPU Adam build, at most $1 s, then its exit
# status and its own seconds into $ds_ready (offload.py polls for it). A
# SIGTERM (run.sh's end, no part having waited) stops the compile too.
ds_build() {
  local s rc=0 child
  s=$(date +%s)
  timeout "$1" python3 -c 'from deepspeed.ops.op_builder import CPUAdamBuilder as B; B().load()' &
  child=$!
  trap 'kill "$child" 2>/dev/null; wait "$child"; exit 143' TERM
  wait "$child" || rc=$?
  trap - TERM
  # A failed build's lock would hold the rows' own build of it for good.
  ((rc == 0)) || ds_clear_locks >/dev/null
  echo "$rc $(($(date +%s) - s))" >"$ds_ready.part" && mv "$ds_ready.part" "$ds_ready"
}
# The DeepSpeed build's line: its exit status and its own time.
ds_result() {
  local rc secs
  if read -r rc secs 2>/dev/null <"$ds_ready"; then
    echo "[ds build] exit $rc after $secs s"
  else
    echo "[ds build] ended without saying how"
  fi
}
# A build of a torch extension that was killed (a row past its time, a call
# cut at its limit on a warm machine) leaves its FileBaton lock behind, and
# the next load of it waits on that for good. A lock is stale when no
# process works in its folder (torch runs ninja there). Only where torch
# locks by the file's existence (FileBaton): a newer torch holds a flock on
# it, which the kernel drops with its holder, and removing that file would
# let two builds in at once.
ds_clear_locks() {
  local busy f
  python3 -c 'import sys, torch.utils.cpp_extension as c; sys.exit(0 if hasattr(c, "FileBaton") else 1)' \
    2>/dev/null || return 0
  busy=$(for c in /proc/[0-9]*/cwd; do readlink "$c"; done 2>/dev/null | sort -u)
  while IFS= read -r f; do
    [ -n "$f" ] || continue
    grep -qxF "$(dirname "$f")" <<<"$busy" && continue
    rm -f "$f" && note "removed a stale torch extension lock: $f"
  done < <(find "${TORCH_EXTENSIONS_DIR:-$HOME/.cache/torch_extensions}" -maxdepth 3 -type f -name lock 2>/dev/null)
}
# Waits for the DeepSpeed build (largest and smoke, whose first try or
# mode may be DeepSpeed's), saying how long it took and how long it was
# waited for.
ds_wait() {
  [ -n "$ds_pid" ] || return 0
  local s
  s=$(date +%s)
  [ -f "$ds_ready" ] || note "waiting for DeepSpeed's CPU Adam build"
  wait "$ds_pid"
  ds_pid=""
  note "$(ds_result) (waited $(($(date +%s) - s)) s)"
}
# At the end: the DeepSpeed build's line where it ended unwaited for (offload
# read it itself), else the build stopped, its lock cleared for the next call
# on this machine.
ds_finish() {
  [ -n "$ds_pid" ] || return 0
  if [ -f "$ds_ready" ]; then
    wait "$ds_pid"
    note "$(ds_result)"
  else
    kill "$ds_pid" 2>/dev/null
    wait "$ds_pid" 2>/dev/null
    ds_clear_locks
    note "DeepSpeed's CPU Adam build: stopped unfinished, no part waited for it"
  fi
  ds_pid=""
}
# Whether part $1 can run: its binaries there (after the build) and the time
# (after the DeepSpeed build, where the part waits for it).
ready() {
  local f l
  if [ -n "$(needs "$1")" ]; then
    build
    if [ -n "$build_failed" ]; then
      log "$1: skipped, the configure failed (configure.log)"
      not_run+=("$1 (the configure failed)")
      return 1
    fi
    for f in $(needs "$1"); do
      [ -e "$f" ] || {
        log "$1: skipped, $f was not built"
        not_run+=("$1 ($f was not built)")
        return 1
      }
    done
  fi
  case $1 in smoke | largest) ds_wait ;; esac
  l=$(left)
  if ((l < MIN_PART_S)); then
    log "$1: skipped, ${l} s left of the ${RUN_DEADLINE_S} s (RUN_DEADLINE_S)"
    return 1
  fi
}
stop_time() { date -d "@$(($(date +%s) + $1))" +%H:%M:%S; }

for w in "${what[@]}"; do
  ready "$w" || continue
  case $w in
    tests)
      # --timeout covers only the tests without a TIMEOUT of their own
      # (python.cuda_daemon's is 900 s); --stop-time ends them all.
      t=$(cap "$TESTS_S")
      if ! tests_list build-gpu; then
        # The other parts still run (offload needs no test list); the call
        # says it failed with its exit status.
        log "CUDA tests: skipped"
        note "$tests_problem"
        not_run+=("tests (ctest -N: nothing to run)")
        continue
      fi
      put_first build-gpu
      log "CUDA tests: ctest $tests_shown, $tests_count tests (stopped after ${t} s)"
      ctest --test-dir build-gpu -j4 "${tests_sel[@]}" "${tests_v[@]}" \
        --output-on-failure --timeout 240 --stop-time "$(stop_time "$t")" 2>&1 | tee "$OUT/cuda-tests.log" \
        | grep -E "tests passed|Failed|\*\*\*|Skipped|[Ss]top time|No tests were found"
      # ctest's summary counts only the tests it started: those the stop
      # time kept from starting are named nowhere else.
      unstarted=$(not_started "$OUT/cuda-tests.log")
      [ -z "$unstarted" ] || note "not started before the stop time ($(wc -l <<<"$unstarted")): $(paste -sd ' ' <<<"$unstarted")" ;;
    pycuda)
      log "zerod.torch on the GPU against torch's AdamW, with the distances it measured"
      ctest --test-dir build-gpu -R '^python\.cuda$' -V --timeout 240 --stop-time "$(stop_time "$(cap 240)")" 2>&1 \
        | tee "$OUT/python-cuda.log" | grep -E "(fp32|bf16) .*zerod vs torch|passed|failed" ;;
    smoke)
      log "every step.py mode on a small GPT (4 x 1024), 6 steps"
      for m in torch zerod0 zerod3 zerod3_host zerod3_host_bf16 zerod3_params zerod3_nvme_opt zerod3_nvme ds3_host; do
        (($(left) < MIN_PART_S)) && { note "smoke: $m and after skipped, the deadline"; break; }
        timeout "$(cap 200)" python3 bench/gpu/step.py --mode "$m" --layers 4 --embd 1024 --steps 6 2>>"$OUT/smoke.err" \
          | tee -a "$OUT/smoke.txt" || { echo "$m: exit $?"; tail -5 "$OUT/smoke.err"; }
      done ;;
    profile)
      log "where zerod's offloaded step goes: traced steps 3-4 (${PROFILE_SIZE:-4 x 1024})"
      for m in ${PROFILE_MODES:-zerod3_host zerod3_params zerod3_nvme}; do
        (($(left) < MIN_PART_S)) && { note "profile: $m and after skipped, the deadline"; break; }
        timeout "$(cap 200)" python3 bench/gpu/step.py --mode "$m" ${PROFILE_SIZE:---layers 4 --embd 1024} --steps 6 --trace "$OUT/trace-$m.json" \
          2>>"$OUT/profile.err" | tee -a "$OUT/profile.txt"
        [ -f "$OUT/trace-$m.json" ] && python3 bench/gpu/trace_summary.py "$OUT/trace-$m.json" --top 25 | tee -a "$OUT/profile.txt"
        rm -f "$OUT/trace-$m.json"
      done ;;
    offload)
      # Its DeepSpeed rows wait for the build, not the rows before them.
      args=$(budget_args "${OFFLOAD_ARGS:-}")${ds_pid:+ --ds-ready $ds_ready}
      log "offload step time: zerod and DeepSpeed against plain PyTorch (offload.py $args)"
      # What else holds a core as the rows start (a process left by an
      # earlier part would slow the host's update, which waits for its
      # slowest worker at every chunk).
      { echo "busiest processes before the rows:"; ps -eo pcpu,pid,etimes,comm --sort=-pcpu | head -6; } >"$OUT/offload-ps.txt" 2>&1
      # The rows' stderr: $OUT/rows.err (offload.py's default under $OUT).
      timeout --kill-after=10 "$(cap 100000)" python3 bench/gpu/offload.py $args 2>&1 | tee "$OUT/offload.txt" ;;
    largest)
      args=$(budget_args "${LARGEST_ARGS:-}")
      log "the largest GPT that trains, by mode (largest.py $args)"
      timeout --kill-after=10 "$(cap 100000)" python3 bench/gpu/largest.py $args 2>&1 | tee "$OUT/largest.txt" ;;
    nccl)
      # Two daemons on one GPU through the nccl comm plugin (each its own
      # NCCL_HOSTID, joined over the loopback): the conformance suite with a
      # timed 256 MiB all-reduce (busbw, bytes sent), then `zerod run`
      # parity at stages 1-3 against one daemon.
      log "nccl: two daemons on one GPU (conformance, bytes sent, zerod run parity)"
      grep -E "nccl comm plugin" "$OUT/configure.log" | tee -a "$OUT/run.log"
      timeout "$(cap 240)" build-gpu/bin/test_comm_nccl_gpu 2>&1 | tee "$OUT/nccl-gpu.log" \
        | grep -E "nccl bench|nccl conformance|FAILED|Failure|SKIPPED"
      timeout "$(cap 240)" tests/comm_nccl/run_parity.sh build-gpu/bin/zerod build-gpu/bin/rank_scenario \
        build-gpu/bin/test_comm_nccl_gpu 2>&1 | tee "$OUT/nccl-parity.log" \
        | grep -E "agrees|bit-identical|differ|failed|passed|SKIPPED" ;;
    daemon)
      # Issue 32 section 4: the daemon against embedded on the GPU (1 rank,
      # and 2 ranks on the one GPU with their device bytes against DESIGN.md
      # section 4), begin + end pairs, the C++ trainer against the PyTorch
      # GPT. About 4 minutes after the build (estimated: it has never run).
      log "the daemon on the GPU: against embedded, 2 ranks on one GPU, begin + end pairs, the C++ trainer"
      args=$(budget_args "${DAEMON_ARGS:-}")
      timeout --kill-after=10 "$(cap 100000)" python3 bench/gpu/daemon.py $args 2>&1 | tee "$OUT/daemon.txt" ;;
    main)
      # The main job's GPU form on this build: no installs (the machine has
      # no network; the build's dependencies are .devdeps'), build-gpu.
      log "the main job on the GPU: plain PyTorch, then zerod through the daemon (scripts/run-main.sh gpu ${MAIN_ARGS:-})"
      ZEROD_SKIP_INSTALL=1 ZEROD_BUILD_DIR=$PWD/build-gpu ZEROD_JOBS=$(nproc) \
        timeout --kill-after=10 "$(cap 300)" scripts/run-main.sh gpu ${MAIN_ARGS:-} 2>&1 | tee "$OUT/main-gpu.txt" ;;
    hostbw)
      log "host memory bandwidth (STREAM copy and triad, 3 arrays of 2 GiB)"
      { gcc -O3 -fopenmp -march=native bench/gpu/hostbw.c -o "$OUT/hostbw" \
          && for t in 1 "$(nproc)"; do OMP_NUM_THREADS=$t OMP_PROC_BIND=spread timeout "$(cap 60)" "$OUT/hostbw" 2; done
        rm -f "$OUT/hostbw"; } 2>&1 | tee "$OUT/hostbw.txt" ;;
  esac
done
ds_finish
if ((${#not_run[@]})); then
  note "run.sh ${what[*]}: done after $(($(date +%s) - t0)) s, exit 2: not run: $(printf '%s, ' "${not_run[@]}" | sed 's/, $//') (above)"
  exit 2
fi
note "run.sh ${what[*]}: done after $(($(date +%s) - t0)) s"
