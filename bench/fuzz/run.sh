#!/usr/bin/env bash
# Runs each libFuzzer target (tests/fuzz) for SECONDS, one after the other,
# from its seed corpus, and prints the executions and coverage each reached.
#
#   bench/fuzz/run.sh SECONDS [TARGET...]     (targets: frame_reader request_handler job_script ds_config)
#
# Configures (preset `fuzz`, clang, into build-fuzz/) and builds when needed
# (ZEROD_NO_BUILD=1: uses build-fuzz/ as it is).
# New inputs go to build-fuzz/corpus/<target> (seeded from
# tests/fuzz/corpus/<target>, which stays as committed); a crash goes to
# build-fuzz/artifacts/<target>/ and ends the run with status 1 (reproduce:
# build-fuzz/bin/fuzz_<target> <file>). Logs: build-fuzz/fuzz-<target>.log.
# Runs at nice 19; ZEROD_FUZZ_ARGS adds libFuzzer flags. See docs/fuzzing.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
seconds=${1:?usage: bench/fuzz/run.sh SECONDS [TARGET...]}
shift
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(frame_reader request_handler job_script ds_config)
build=$root/build-fuzz

cd "$root"
if [ "${ZEROD_NO_BUILD:-0}" != 1 ]; then
  [ -f "$build/build.ninja" ] || cmake --preset fuzz
  cmake --build "$build" --target zerod_fuzz
fi

status=0
summary=()
for t in "${targets[@]}"; do
  bin=$build/bin/fuzz_$t
  [ -x "$bin" ] || { echo "no fuzz target '$t' (have: frame_reader request_handler job_script ds_config)"; exit 2; }
  corpus=$build/corpus/$t
  artifacts=$build/artifacts/$t/
  mkdir -p "$corpus" "$artifacts"
  log=$build/fuzz-$t.log
  echo "== fuzz_$t for ${seconds}s (corpus $corpus, log $log)"
  set +e
  # -rss_limit_mb: a model per input plus ASan's shadow; -timeout: the job
  # script sandbox stops a runaway script after 200M instructions, well
  # within it.
  nice -n 19 "$bin" "$corpus" "$root/tests/fuzz/corpus/$t" -max_total_time="$seconds" \
    -artifact_prefix="$artifacts" -print_final_stats=1 -rss_limit_mb=4096 -timeout=60 \
    ${ZEROD_FUZZ_ARGS:-} > "$log" 2>&1
  rc=$?
  set -e
  # The last status line ("#N ... cov: C ft: F corp: ...") and the totals.
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  secs=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  echo "   $last"
  echo "   executions: ${runs:-?} (${secs:-?}/s), exit status $rc"
  summary+=("fuzz_$t: ${runs:-?} executions, $(echo "$last" | grep -oE 'cov: [0-9]+ ft: [0-9]+' || echo 'no coverage line'), exit $rc")
  if [ "$rc" -ne 0 ]; then
    status=1
    echo "   FOUND SOMETHING: see $log and $artifacts"
    grep -E 'ERROR|runtime error|==[0-9]+==|Test unit written' "$log" | head -5 | sed 's/^/   /'
  fi
done
echo "== summary (${seconds}s each, $(nproc) cores, $(date -u +%Y-%m-%d))"
printf '%s\n' "${summary[@]}"
exit $status
