#!/usr/bin/env bash
# The nccl backend's keys in a job script, checked by `zerod check` (no GPU
# needed: a comm plugin that spans nodes is instantiated only with the
# model): a good table passes and resolves every key; an unknown key, a port
# out of range and a non-boolean check are refused, each naming its key.
# usage: job_keys_test.sh ZEROD
set -euo pipefail
zerod=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

check() {  # check NAME COMM_TABLE: zerod check's output and status for a job with that comm table
  printf 'return { optimizer = { type = "adamw", lr = 0.05 }, zero = { stage = 2 }, comm = %s }\n' "$2" \
    >"$work/$1.lua"
  out=$("$zerod" check "$work/$1.lua" 2>&1) && status=0 || status=$?
}

check good '{ backend = "nccl", timeout = 60, port = 29510, check = false, spin_us = 5 }'
[ "$status" -eq 0 ] || { echo "a good nccl table was refused:"; echo "$out"; exit 1; }
for want in 'comm.backend += "nccl"' 'comm.port += 29510' 'comm.check += false' 'comm.spin_us += 5' \
            'comm +nccl 0.1 \(plugin ABI 3\)'; do
  grep -qE "$want" <<<"$out" || { echo "zerod check did not show /$want/:"; echo "$out"; exit 1; }
done
echo "good table: accepted, every key resolved"

refused() {  # refused NAME COMM_TABLE PATTERN
  check "$1" "$2"
  [ "$status" -ne 0 ] || { echo "$1: accepted:"; echo "$out"; exit 1; }
  grep -qE "$3" <<<"$out" || { echo "$1: the refusal does not match /$3/:"; echo "$out"; exit 1; }
  echo "$1: refused: $(grep -E "$3" <<<"$out" | head -1)"
}
refused unknown_key '{ backend = "nccl", root = "head:29502" }' "unknown_key\.lua:1: unknown key 'comm\.root'"
refused bad_port '{ backend = "nccl", port = 70000 }' "bad_port\.lua:1: comm\.port: must be <= 65535, got 70000"
refused bad_check '{ backend = "nccl", check = 3 }' "bad_check\.lua:1: comm\.check: must be a boolean"
echo "job_keys: all checks passed"
