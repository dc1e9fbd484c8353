#!/usr/bin/env bash
# The daemon's GPU path on the CPU (issue 32 §5): its ranks on the emulated
# device (device = "emulated": memory the engine cannot address, exported
# to each trainer as a memfd it maps, transfers that land late) train as on
# the cpu device, bit for bit, at stages 0-3 with 1 and 2 ranks, with the
# parameters and optimizer in host memory too, and with compressing
# optimizers (1-bit Adam, 1-bit LAMB); and a job that keeps its state keeps
# it on that device when its ranks die, and resumes there.
#   emulated_device.sh ZEROD RANK_SCENARIO TESTS_DAEMON_DIR
set -euo pipefail
zerod=$1 trainer=$2 dir=$3
work=$(mktemp -d /tmp/zerod-emulated-XXXXXX)
trap 'rm -rf "$work"' EXIT

job() {  # job SRC DEVICE [EXTRA]: SRC's table with device (and EXTRA) set
  sed -e "s/^return {/return {\n  device = \"$2\",${3:+\n  $3,}/" "$1"
}
runs=0
for stage in 0 1 2 3; do
  for nproc in 1 2; do
    for extra in "" 'offload = { params = "host", optimizer = "host" }'; do
      [ -n "$extra" ] && [ "$stage" != 3 ] && continue  # parameters offload at stage 3
      label="stage $stage, $nproc rank(s)${extra:+, parameters and optimizer in host memory}"
      for dev in cpu emulated; do
        out=$work/$stage-$nproc-${extra:+host-}$dev
        mkdir -p "$out"
        job "$dir/job_stage$stage.lua" "$dev" "$extra" >"$out.lua"
        log=$(ZEROD_SCENARIO_DUMP="$out" "$zerod" run --nproc "$nproc" --job "$out.lua" -- "$trainer" normal 2>&1) ||
          { echo "$label on $dev: zerod run failed:"; echo "$log"; exit 1; }
      done
      for ((r = 0; r < nproc; r++)); do
        a=$work/$stage-$nproc-${extra:+host-}cpu/rank$r.f32 b=$work/$stage-$nproc-${extra:+host-}emulated/rank$r.f32
        [ -s "$a" ] && [ -s "$b" ] || { echo "$label: rank $r wrote no parameters"; exit 1; }
        cmp -s "$a" "$b" || { echo "$label: rank $r's parameters on the emulated device differ from the cpu device's"; exit 1; }
      done
      echo "emulated_device: $label: the same bits as on the cpu device"
      runs=$((runs + 1))
    done
  done
done

# Compressing optimizers (issue 34 §2): 1-bit Adam and 1-bit LAMB, whose
# host loops (prepare, the exchange's error feedback, the kept average, the
# planned passes and 1-bit LAMB's per-tensor figures) reach the device's
# memory through host copies, end where the cpu device ends, bit for bit.
# At stages 1-3 with 2 ranks also with compression.replay (each rank
# replays the owners' update on its working copy, at stage 3 its whole copy
# of the parameters, in the device's memory).
compressed=0
for opt in onebit_adam onebit_lamb; do
  for stage in 0 1 2 3; do
    for nproc in 1 2; do
      for extra in "" 'compression = { replay = true }'; do
        [ -n "$extra" ] && { [ "$nproc" != 2 ] || [ "$stage" = 0 ]; } && continue
        label="$opt, stage $stage, $nproc rank(s)${extra:+, compression.replay}"
        for dev in cpu emulated; do
          out=$work/$opt-$stage-$nproc-${extra:+replay-}$dev
          mkdir -p "$out"
          job "$dir/job_stage$stage.lua" "$dev" "$extra" |
            sed -e "s/type = \"adamw\", lr = 0.05/type = \"$opt\", lr = 0.05, freeze_step = 5/" >"$out.lua"
          grep -q "\"$opt\"" "$out.lua" || { echo "$label: the job script does not name the optimizer"; exit 1; }
          log=$(ZEROD_SCENARIO_DUMP="$out" "$zerod" run --nproc "$nproc" --job "$out.lua" -- "$trainer" normal 2>&1) ||
            { echo "$label on $dev: zerod run failed:"; echo "$log"; exit 1; }
        done
        for ((r = 0; r < nproc; r++)); do
          a=$work/$opt-$stage-$nproc-${extra:+replay-}cpu/rank$r.f32 b=$work/$opt-$stage-$nproc-${extra:+replay-}emulated/rank$r.f32
          [ -s "$a" ] && [ -s "$b" ] || { echo "$label: rank $r wrote no parameters"; exit 1; }
          cmp -s "$a" "$b" || { echo "$label: rank $r's parameters on the emulated device differ from the cpu device's"; exit 1; }
        done
        echo "emulated_device: $label: the same bits as on the cpu device"
        compressed=$((compressed + 1))
      done
    done
  done
done

# Kept state on the device: rank 1 is killed at step 5, the daemon keeps the
# model in its emulated device's memory, the restarted ranks resume there.
job "$dir/job_keep.lua" emulated >"$work/keep.lua"
sock=$work/zerod.sock
"$zerod" serve --nproc 2 --job "$work/keep.lua" --socket "$sock" >"$work/serve.log" 2>&1 &
serve=$!
trap 'kill $serve 2>/dev/null; wait $serve 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
[ -S "$sock" ] || { echo "the daemon did not start:"; cat "$work/serve.log"; exit 1; }
run() {
  for r in 0 1; do
    ZEROD_ENDPOINT=unix:$sock ZEROD_RANK=$r ZEROD_WORLD_SIZE=2 ZEROD_JOB=$work/keep.lua \
      "$trainer" "$1" >"$work/$1.$r" 2>&1 &
  done
  wait %2 %3 2>/dev/null || true
}
run die
grep -q "ZD_ERR_PEER_LOST" "$work/die.0" || { echo "rank 0 was not told its peer was lost:"; cat "$work/die.0"; exit 1; }
run resume
for r in 0 1; do
  grep -q "rank $r: resumed at step 6" "$work/resume.$r" || { echo "rank $r did not resume at step 6:"; cat "$work/resume.$r"; exit 1; }
done
grep -q "emulated" "$work/serve.log" || true
echo "emulated_device: the kept model resumed on the emulated device at step 6"
echo "emulated_device: all $runs jobs, $compressed with compressing optimizers, and the restart passed"
