#!/usr/bin/env bash
# Checks the built libzerod against the ABI promise:
#  1. it exports zd_* symbols and nothing else;
#  2. libabigail's abidiff finds no change to anything in the checked-in
#     baseline (libzerod/baseline/libzerod.abi). New functions pass. Any other
#     reported change fails: abidiff calls a changed member type merely an
#     "ABI change", not "incompatible", so the check cannot tell a safe growth
#     from a break. A deliberate, compatible change (a field added at the end
#     of a size-prefixed struct) is landed by refreshing the baseline with
#     --update in the same commit, where review sees it.
#
#   libzerod/check_abi.sh <path/to/libzerod.so> [--update]
set -euo pipefail
lib=$1
here=$(cd "$(dirname "$0")" && pwd)
baseline="$here/baseline/libzerod.abi"
headers="$here/../include/zerod"

extra=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -vE '^(zd_|_init$|_fini$|_edata$|_end$|__bss_start$)' || true)
if [ -n "$extra" ]; then
  echo "ABI check: $lib exports symbols outside zd_*:"
  echo "$extra" | head -20
  exit 1
fi
echo "ABI check: exports $(nm -D --defined-only "$lib" | grep -c ' zd_') zd_* functions and nothing else"

current=$(mktemp /tmp/libzerod-XXXXXX.abi)
trap 'rm -f "$current"' EXIT
abidw --headers-dir "$headers" --exported-interfaces-only --drop-private-types \
     --no-corpus-path --no-comp-dir-path --no-show-locs --out-file "$current" "$lib"

if [ "${2:-}" = "--update" ]; then
  cp "$current" "$baseline"
  echo "ABI check: baseline updated: $baseline"
  exit 0
fi
[ -f "$baseline" ] || { echo "ABI check: no baseline at $baseline (run with --update once)"; exit 1; }

set +e
report=$(abidiff --no-added-syms "$baseline" "$current")
rc=$?
set -e
# abidiff's exit status is a bit field: 1 error, 2 usage error, 4 ABI change,
# 8 incompatible ABI change.
if (( rc & 3 )); then
  echo "ABI check: abidiff failed ($rc):"; echo "$report"; exit 1
fi
if (( rc & 12 )); then
  echo "ABI check: the ABI changed against the baseline:"; echo "$report"
  echo "A released signature or struct layout changed: add a _v2 call, or a field at the end of"
  echo "a size-prefixed struct and then refresh the baseline: libzerod/check_abi.sh $lib --update"
  exit 1
fi
echo "ABI check: no change to the released ABI (baseline $(basename "$baseline"))"
