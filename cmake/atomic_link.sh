#!/bin/sh
# The linker launcher of every executable, shared library and plugin
# (CMAKE_<LANG>_LINKER_LAUNCHER in CMakeLists.txt):
#   atomic_link.sh <link command ...> -o FILE <...>
# runs the link command with its output written to a file beside FILE, and
# renames that over FILE only when the link succeeds.
#
# Why: GNU ld replaces FILE in place (it removes it, then writes the new one
# over 1-4 seconds for libzerod's 50 MB) and removes it when a link fails. A
# test that starts meanwhile -- a build in the same tree while ctest or
# pytest runs, as when several people share one -- loads a truncated
# library (SIGBUS, no message) or finds none ("libzerod.so.0.1.0: no such
# file"), and fails for no fault of its own. A rename is atomic: a process
# opens the old file or the new one, whole, and a failed link leaves the
# old one in place.
set -u

out=
previous=
for arg do
  shift
  if [ -z "$out" ] && [ "$previous" = "-o" ]; then
    out=$arg
    arg="$out.linking.$$"
  fi
  set -- "$@" "$arg"
  previous=$arg
done

if [ -z "$out" ]; then
  exec "$@"  # no output named: nothing to replace
fi

partial="$out.linking.$$"
status=0
"$@" || status=$?
if [ "$status" -eq 0 ]; then
  exec mv -f "$partial" "$out"
fi
rm -f "$partial"
exit "$status"
