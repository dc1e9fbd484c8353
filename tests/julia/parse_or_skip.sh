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
# fatou's grammar is more lenient than Julia's: it takes `f() do end` on one
# line, where Julia reads `end` as the block's argument and fails to load
# the file (runtests.jl did so until 2026-11-28). Checked here by pattern,
# as nothing else here can.
if grep -nE '\bdo[[:space:]]+end\b' "$@"; then
  echo "FAILED: \`do end\` on one line does not parse in Julia (write \`do; end\`)"
  exit 1
fi
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
