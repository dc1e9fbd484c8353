#!/usr/bin/env bash
# Trains rank_scenario on N ranks under `zerod run` and checks that every
# rank ends with the same parameters, bit for bit: each rank prints the
# FNV-1a hash of each of its parameters' fp32 bytes, and all N lines must be
# there and equal. The run's output is printed whole, so the caller
# (run_and_match) sees any sanitizer report in it.
# usage: ranks_agree.sh N ZEROD JOB TRAINER
set -uo pipefail
n=$1 zerod=$2 job=$3 trainer=$4
out=$("$zerod" run --nproc "$n" --job "$job" -- "$trainer" normal 2>&1)
status=$?
echo "$out"
[ "$status" -eq 0 ] || { echo "ranks_agree: zerod run exited with status $status"; exit 1; }
ref=""
for ((r = 0; r < n; r++)); do
  h=$(echo "$out" | sed -n "s/^\[rank $r\] rank $r: parameters //p")
  [ -n "$h" ] || { echo "ranks_agree: rank $r printed no parameter hashes"; exit 1; }
  [ "$(echo "$h" | wc -l)" -eq 1 ] || { echo "ranks_agree: rank $r printed its hashes more than once"; exit 1; }
  if [ -z "$ref" ]; then
    ref=$h
  elif [ "$h" != "$ref" ]; then
    echo "ranks_agree: rank $r ends with parameters $h, rank 0 with $ref"
    exit 1
  fi
done
echo "ranks_agree: all $n ranks end with the same parameters, bit for bit ($ref)"
