#!/usr/bin/env bash
# Trains the C example under `zerod run` (or embedded with --embedded) with
# a job that records a trace, then checks the file (check_trace.py).
#   trace_run.sh ZEROD TRAIN_MLP JOB NPROC|embedded [check_trace.py args...]
set -euo pipefail
zerod=$1 trainer=$2 job=$3 nproc=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/nvme"
cd "$work"
export ZEROD_NVME_PATH="$work/nvme"
if [ "$nproc" = embedded ]; then
  "$trainer" --job "$job" --steps 6 --quiet
else
  "$zerod" run --nproc "$nproc" --trace "$work/trace.json" --job "$job" -- "$trainer" --steps 6 --quiet
fi
# check_trace.py reads JSON only; any Python 3 does.
python3 "$here/check_trace.py" "$work/trace.json" "$@"
