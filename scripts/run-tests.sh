#!/usr/bin/env bash
# Every test: installs what is missing, builds everything, runs ctest: unit,
# kernel, ABI (with the abidiff check against abi/baseline), plugin, script,
# example and install tests. Exits non-zero if anything fails.
#
# The tests need no virtual environment. The benchmarks' DeepSpeed and
# PyTorch 2.x columns (bench_cpu_adam, bench/gpt_step) run in one that
# scripts/python-venv.sh makes from PyPI at build/venv; without it those
# columns print "not run: <why>" and the rest of the benchmark runs.
set -euo pipefail
source "$(dirname "$0")/common.sh"
zerod_install_packages "${ZEROD_PACKAGES[@]}"
zerod_build
zerod_log "running the tests"
ctest --test-dir "$ZEROD_BUILD_DIR" -j "$ZEROD_JOBS" --output-on-failure --timeout 900
zerod_log "all tests passed"
