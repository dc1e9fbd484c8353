#!/usr/bin/env bash
# Every test: installs what is missing, builds everything, runs ctest: unit,
# kernel, ABI (with the abidiff check against libzerod/baseline), plugin, script,
# example and install tests. Exits non-zero if anything fails.
#
# The integration tests with the libraries users train with (DeepSpeed's
# engine, configs and checkpoints, Lightning, Accelerate, Hugging Face's
# Trainer: python.deepspeed_*, python.lightning, python.accelerate,
# python.hf_trainer) run in a virtual environment that
# scripts/python-venv.sh makes from PyPI at build/venv (torch 2.x with its
# CUDA libraries, about 5 GB and 5-10 minutes the first time; later runs
# reuse it). This script makes it. ZEROD_NO_VENV=1 skips that, and so does
# a failure to make it (no network): those tests then show as skipped with
# the reason, and everything else runs. The benchmarks' DeepSpeed and
# PyTorch 2.x columns (bench_cpu_adam, bench/gpt_step) use the same venv.
set -euo pipefail
source "$(dirname "$0")/common.sh"
zerod_install_packages "${ZEROD_PACKAGES[@]}"
zerod_build
if [ "${ZEROD_NO_VENV:-0}" != 1 ]; then
  zerod_log "the Python environment of the integration tests (scripts/python-venv.sh)"
  "$(dirname "$0")/python-venv.sh" >/dev/null ||
    zerod_log "no virtual environment (see above): the python.deepspeed_*, python.lightning and python.accelerate tests will show as skipped"
fi
zerod_log "running the tests"
ctest --test-dir "$ZEROD_BUILD_DIR" -j "$ZEROD_JOBS" --output-on-failure --timeout 900
zerod_log "all tests passed"
