#!/usr/bin/env bash
# Parses the Julia files of bindings/julia without Julia, with fatou (a Julia
# language server and linter from PyPI, written in Rust: `pip install fatou`;
# not Julia's own parser). Fails on a parse error (or any other finding
# fatou calls an error); prints its warnings. Where no fatou is found (on
# the PATH or in the build's virtual environment), says so and exits 77:
# ctest reports the test Skipped.
#   parse_or_skip.sh VENV_DIR FILE...
venv=$1
shift
fatou=$(command -v fatou || true)
[ -z "$fatou" ] && [ -x "$venv/bin/fatou" ] && fatou="$venv/bin/fatou"
if [ -z "$fatou" ]; then
  echo "SKIPPED: no fatou (a Julia parser and linter from PyPI: pip install fatou) on the PATH or in $venv"
  exit 77
fi
out=$("$fatou" --no-config --color never lint "$@" 2>&1)
echo "$out"
if grep -q '^error' <<<"$out"; then
  echo "FAILED: fatou ($("$fatou" --version)) finds errors in the Julia files"
  exit 1
fi
echo "parsed: $# Julia files ($("$fatou" --version))"
