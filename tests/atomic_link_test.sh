#!/bin/sh
# cmake/atomic_link.sh, the linker launcher: while a link runs, its output
# path holds the old file, whole, never a partial or missing one (GNU ld's
# in-place write made tests that loaded libzerod during another build's
# relink die of SIGBUS or find no library); a successful link replaces it,
# a failed one leaves it and no scratch file, and the status comes through.
#   atomic_link_test.sh LAUNCHER
# The fake linker below writes its -o file as ld does: removes it, writes
# half, pauses, writes the rest (or, with FAIL=1, removes it and fails).
set -u
launcher=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/fake_ld" <<'EOF'
#!/bin/sh
while [ $# -gt 0 ]; do
  [ "$1" = "-o" ] && out=$2
  shift
done
rm -f "$out"
printf 'new-' > "$out"
sleep 1
if [ "${FAIL:-0}" = 1 ]; then
  rm -f "$out"
  exit 3
fi
printf 'whole\n' >> "$out"
EOF
chmod +x "$dir/fake_ld"

fail() {
  echo "atomic_link: $*"
  exit 1
}

# link_watched EXPECTED_STATUS: runs the launcher on the fake linker and
# reads the output path until the link ends; every read must be whole.
link_watched() {
  "$launcher" "$dir/fake_ld" -shared -o "$dir/out" input.o &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    seen=$(cat "$dir/out" 2>/dev/null || echo missing)
    case $seen in
      old-whole | new-whole) ;;
      *) fail "during the link the output was '$seen', not a whole file" ;;
    esac
  done
  status=0
  wait "$pid" || status=$?
  [ "$status" -eq "$1" ] || fail "the link exited $status, not $1"
  leftovers=$(find "$dir" -name 'out.linking.*')
  [ -z "$leftovers" ] || fail "scratch file left: $leftovers"
}

printf 'old-whole\n' > "$dir/out"
link_watched 0
[ "$(cat "$dir/out")" = "new-whole" ] || fail "a successful link left '$(cat "$dir/out")'"

printf 'old-whole\n' > "$dir/out"
FAIL=1 link_watched 3
[ "$(cat "$dir/out")" = "old-whole" ] || fail "a failed link left '$(cat "$dir/out")', not the old file"

status=0
"$launcher" sh -c 'exit 5' || status=$?
[ "$status" -eq 5 ] || fail "a command without -o exited $status through the launcher, not 5"

echo "atomic_link: a link replaces its output whole, a failed one leaves the old"
