#!/usr/bin/env bash
# Creates (or reuses) a Python virtual environment with packages from PyPI,
# for the benchmarks that compare zerod with what users would pick instead
# (DeepSpeed, PyTorch 2.x) and for the integration tests with the libraries
# users train with (Lightning, Accelerate, DeepSpeed, Hugging Face's
# Trainer; tests/python, run by scripts/run-tests.sh). Idempotent: a stamp
# file records the package list, and a second run with the same list only
# checks that the packages import. zerod itself never needs it; its other
# tests use Debian's python3.
#
#   scripts/python-venv.sh [--venv DIR] [--check MODULE]... [PACKAGE_SPEC...]
#
# DIR defaults to build/venv (under the build folder, so `rm -rf build`
# removes it). Without PACKAGE_SPECs the list is $ZEROD_VENV_PACKAGES, or
# the default: torch 2.x, DeepSpeed 0.19.x, Lightning 2.6.x, Accelerate 1.x,
# Transformers 5.x and pytest (one environment for the benchmarks and the
# tests). --check names modules that must import afterwards (default: the
# first word of each spec, e.g. torch, deepspeed). Prints the venv's python
# on the last line.
#
# PyPI's torch wheel pulls the CUDA libraries (about 4-5 GB) even on a
# machine without a GPU; DeepSpeed builds its CPU Adam op with ninja and g++
# at first use, which needs python3-dev (scripts/common.sh installs it).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="${ZEROD_BUILD_DIR:-$ROOT/build}/venv"
CHECKS=()
SPECS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --venv) VENV=$2; shift 2 ;;
    --check) CHECKS+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) SPECS+=("$1"); shift ;;
  esac
done
if [ ${#SPECS[@]} -eq 0 ]; then
  # shellcheck disable=SC2206
  SPECS=(${ZEROD_VENV_PACKAGES:-"torch>=2,<3" "deepspeed>=0.19,<0.20" "lightning>=2.6,<2.7" "accelerate>=1,<2" "transformers>=5,<6" "pytest"})
fi
if [ ${#CHECKS[@]} -eq 0 ]; then
  for s in "${SPECS[@]}"; do CHECKS+=("$(printf '%s' "$s" | sed -E 's/[<>=!~\[; ].*//; s/-/_/g')"); done
fi

say() { printf '[python-venv] %s\n' "$*" >&2; }
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)
"$PY" -c 'import venv, ensurepip' 2>/dev/null || {
  say "$PY has no venv/ensurepip module: apt-get install python3-venv"; exit 1; }

STAMP="$VENV/.zerod-packages"
WANT=$(printf '%s\n' "${SPECS[@]}")
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "$PY" -m venv "$VENV"
fi
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  say "$VENV already has: $(echo $WANT)"
else
  say "installing into $VENV: $(echo $WANT) (torch from PyPI is about 4-5 GB with its CUDA libraries)"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip setuptools wheel
  "$VENV/bin/python" -m pip install --quiet "${SPECS[@]}"
  printf '%s\n' "$WANT" > "$STAMP"
fi
for m in "${CHECKS[@]}"; do
  "$VENV/bin/python" -c "import $m" >/dev/null 2>&1 || {
    say "module '$m' does not import in $VENV; remove $STAMP and run again"; exit 1; }
done
echo "$VENV/bin/python"
