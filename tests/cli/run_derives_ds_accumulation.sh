#!/usr/bin/env bash
# A DeepSpeed config that gives train_batch_size and the micro-batch but not
# gradient_accumulation_steps, run with `zerod run --nproc 2`: the steps are
# train_batch_size / (micro-batch × ranks), 16 / (4 × 2) = 2, as DeepSpeed
# derives them (zerod run refused it, asking for an option it lacks). The
# run's trace shows 2 micro-batches per optimizer step on each rank, and
# `zerod check --world-size 2` says the same; `zerod check` without the
# rank count refuses it naming --world-size. A config that does not fit
# 2 ranks (18 with a micro-batch of 4) is refused before any rank starts,
# naming the numbers.
#   run_derives_ds_accumulation.sh ZEROD TRAIN_MLP SCRATCH_DIR
set -u
zerod=$1 trainer=$2 work=$3
rm -rf "$work" && mkdir -p "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }

cat >"$work/cfg.json" <<'JSON'
{
  "train_batch_size": 16,
  "train_micro_batch_size_per_gpu": 4,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
  "zero_optimization": {"stage": 2}
}
JSON
sed 's/"train_batch_size": 16/"train_batch_size": 18/' "$work/cfg.json" >"$work/bad.json"

out=$("$zerod" check "$work/cfg.json" 2>&1)
rc=$?
[ "$rc" -eq 1 ] || fail "zerod check without the rank count exited $rc: $out"
grep -q "give gradient_accumulation_steps too, or the rank count with --world-size N" <<<"$out" ||
  fail "zerod check's refusal does not name --world-size: $out"
echo "ok: zerod check without the rank count names --world-size"

out=$("$zerod" check "$work/cfg.json" --world-size 2 2>&1) || fail "zerod check --world-size 2: $out"
grep -Eq "gradient_accumulation_steps += 2 +\(.*cfg.json:2\)" <<<"$out" ||
  fail "zerod check --world-size 2 does not derive 2 steps from line 2: $out"
echo "ok: zerod check --world-size 2 derives 2 accumulation steps"

# trace.steps records optimizer steps 2-6: step 2's backward calls are its
# micro-batches.
"$zerod" run --nproc 2 --trace "$work/trace.json" --job "$work/cfg.json" -- "$trainer" --steps 2 --quiet \
  >"$work/run.log" 2>&1 || fail "zerod run exited $?: $(tail -5 "$work/run.log")"
grep -q "final loss" "$work/run.log" || fail "the trainer did not finish: $(tail -5 "$work/run.log")"
for rank in 0 1; do
  n=$(grep -o "\"name\":\"backward_begin fc1\",\"cat\":\"call\",\"pid\":$rank,[^}]*\"step\":2," "$work/trace.json" | wc -l)
  [ "$n" -eq 2 ] || fail "rank $rank ran $n micro-batches in step 2, not 16 / (4 × 2) = 2"
done
echo "ok: zerod run --nproc 2 accumulates 2 micro-batches per step"

out=$("$zerod" run --nproc 2 --job "$work/bad.json" -- /bin/sh -c "touch '$work/started'" 2>&1)
rc=$?
[ "$rc" -eq 1 ] || fail "zerod run of a config that does not fit 2 ranks exited $rc: $out"
grep -q "bad.json:2: train_batch_size: 18 is not a whole multiple of train_micro_batch_size_per_gpu (4) × 2 ranks" \
  <<<"$out" || fail "the refusal does not name the numbers: $out"
grep -q "nothing was started" <<<"$out" || fail "the refusal does not say nothing was started: $out"
[ ! -e "$work/started" ] || fail "a rank started"
echo "ok: a config that does not fit 2 ranks is refused before any rank starts"
rm -rf "$work"
echo "run derives ds accumulation: ok"
