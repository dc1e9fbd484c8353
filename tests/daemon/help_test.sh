#!/usr/bin/env bash
# Every command of the zerod executable answers --help and -h with its usage
# on stdout and exit status 0 (nothing on stderr): the commands listed by
# `zerod --help`, and the ckpt commands listed by `zerod ckpt --help`, so a
# command added to either list is checked without touching this test. A
# trainer's own --help after `--` still reaches the trainer.
#   help_test.sh ZEROD JOB.lua
set -u
zerod=$1 job=$2
fails=0 checked=0
err=$(mktemp)
trap 'rm -f "$err"' EXIT

# `zerod ARGS... FLAG` must exit 0, print "usage: zerod WANT" on stdout and
# nothing on stderr.
expect_usage() {
  local want=$1 flag=$2
  shift 2
  local out rc what="$*${*:+ }$flag"
  out=$(timeout 30 "$zerod" "$@" "$flag" 2>"$err")
  rc=$?
  checked=$((checked + 1))
  if [ "$rc" -ne 0 ]; then
    echo "FAIL: zerod $what exited $rc: $(head -c 300 "$err")"
    fails=$((fails + 1))
  elif ! grep -q "^usage: zerod $want" <<<"$out"; then
    echo "FAIL: zerod $what: no 'usage: zerod $want' on stdout; stdout: $(head -c 300 <<<"$out") stderr: $(head -c 300 "$err")"
    fails=$((fails + 1))
  elif [ -s "$err" ]; then
    echo "FAIL: zerod $what wrote to stderr: $(head -c 300 "$err")"
    fails=$((fails + 1))
  else
    echo "ok: zerod $what"
  fi
}

# The command names: the first word of each line under "commands:".
commands=$("$zerod" --help | sed -n '/^commands:/,/^[^ ]/s/^  \([a-z][a-z-]*\) .*/\1/p')
ckpt_commands=$("$zerod" ckpt --help | sed -n 's/^  \([a-z][a-z-]*\) [A-Z_]*DIR .*/\1/p')
# A list that failed to parse would check nothing: these must be there.
for c in run serve join status top plot check translate plan ckpt version; do
  grep -qx "$c" <<<"$commands" || { echo "FAIL: '$c' is not among zerod --help's commands: $commands"; fails=$((fails + 1)); }
done
for c in info export reshard import; do
  grep -qx "$c" <<<"$ckpt_commands" || { echo "FAIL: '$c' is not among zerod ckpt --help's commands: $ckpt_commands"; fails=$((fails + 1)); }
done

for flag in --help -h; do
  expect_usage "<command>" "$flag"
  for c in $commands; do
    # zerod plot runs Python, which cannot load a sanitizer build's libzerod.
    if [ "$c" = plot ] && [ -n "${ZEROD_SANITIZED:-}" ]; then
      echo "skipped: zerod plot $flag (a sanitizer build: its Python cannot load this libzerod)"
      continue
    fi
    expect_usage "$c" "$flag" "$c"
  done
  for c in $ckpt_commands; do
    expect_usage "ckpt $c" "$flag" ckpt "$c"
  done
  # Asked for after other arguments too.
  expect_usage "ckpt export" "$flag" ckpt export some/dir --to out.safetensors
  expect_usage "check" "$flag" check "$job"
done

# A wrong option is still an error (exit 2, usage on stderr), not help.
if timeout 30 "$zerod" ckpt info --no-such-option >/dev/null 2>"$err"; then
  echo "FAIL: zerod ckpt info --no-such-option exited 0"
  fails=$((fails + 1))
elif ! grep -q "unknown option --no-such-option" "$err"; then
  echo "FAIL: zerod ckpt info --no-such-option: $(head -c 300 "$err")"
  fails=$((fails + 1))
fi

# The trainer's --help is the trainer's.
out=$(timeout 60 "$zerod" run --nproc 1 --no-prefix --job "$job" -- sh -c 'echo "TRAINER GOT $1"' sh --help 2>&1)
if ! grep -q "^TRAINER GOT --help" <<<"$out"; then
  echo "FAIL: a trainer's --help after -- did not reach it: $(head -c 500 <<<"$out")"
  fails=$((fails + 1))
fi

echo "help_test: $checked commands asked for help, $fails failure(s)"
[ "$fails" -eq 0 ]
