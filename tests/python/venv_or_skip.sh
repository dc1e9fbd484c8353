#!/usr/bin/env bash
# Runs pytest on the given test file under the Python of the build's virtual
# environment (torch 2.x, DeepSpeed, ...: scripts/python-venv.sh makes it).
# Where that environment is missing or lacks a module the test needs, says
# which and exits 77: ctest reports the test Skipped (SKIP_RETURN_CODE).
#   venv_or_skip.sh VENV_DIR "module module ..." TEST_FILE [pytest args...]
venv=$1 modules=$2
shift 2
py="$venv/bin/python"
if [ ! -x "$py" ]; then
  echo "SKIPPED: no virtual environment at $venv (scripts/python-venv.sh makes it: torch 2.x and DeepSpeed from PyPI)"
  exit 77
fi
for m in $modules; do
  if ! "$py" -c "import $m" 2>/dev/null; then
    echo "SKIPPED: $py cannot import $m (scripts/python-venv.sh installs it)"
    exit 77
  fi
done
exec "$py" -m pytest -q -p no:cacheprovider "$@"
