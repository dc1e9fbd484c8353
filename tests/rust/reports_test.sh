#!/usr/bin/env bash
# The Rust trainer reports each micro-batch's loss and samples as the C
# trainer does (zd_model_report): a 2-rank run's trace holds as many loss
# entries from one as from the other, and some.
# usage: reports_test.sh TRAIN_MLP TRAIN_MLP_RS ZEROD JOB
set -euo pipefail
c_trainer=$1 rust_trainer=$2 zerod=$3 job=$4
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
count() {
  "$zerod" run --nproc 2 --trace "$dir/$2.json" --job "$job" -- "$1" --steps 10 --quiet >/dev/null
  grep -o '"loss"' "$dir/$2.json" | wc -l
}
c=$(count "$c_trainer" c)
rust=$(count "$rust_trainer" rust)
echo "loss entries in the trace: c $c, rust $rust"
[ "$c" -gt 0 ] && [ "$c" = "$rust" ]
