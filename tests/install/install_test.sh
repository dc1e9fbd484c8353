#!/usr/bin/env bash
# Installs the build into a temporary prefix and uses it as a user of the
# install would, with nothing of this build in the environment (no
# LD_LIBRARY_PATH, a clean env): a consumer found through find_package(zerod);
# one built with pkg-config's flags and the rpath README.md's "Using an
# installed zerod" gives, alone and as the two ranks of the installed
# `zerod run`; two ranks of another launcher whose libzerod starts the zerod
# of its own install, not one on PATH; and `zerod ckpt import` handing its
# Python the installed libzerod.
set -euo pipefail
build_dir=$1
src_dir=$2
prefix=$(mktemp -d /tmp/zerod-install-XXXXXX)
trap 'rm -rf "$prefix"' EXIT
fail() {
  echo "install test: $*" >&2
  exit 1
}
# What a user's shell has: the system's PATH, no library path, nothing of
# this build. Extra NAME=VALUE arguments come after, so they win.
clean() { env -i HOME="$prefix" PATH=/usr/bin:/bin "$@"; }

cmake --install "$build_dir" --prefix "$prefix" >/dev/null
for f in include/zerod/zerod.h include/zerod/zerod_plugin.h bin/zerod \
         lib/libzerod.so lib/zerod/plugins/zd_optimizer_adamw.so \
         lib/cmake/zerod/zerodConfig.cmake lib/pkgconfig/zerod.pc; do
  [ -e "$prefix/$f" ] || fail "the install is missing $f"
done

# find_package: CMake links the consumer with an rpath to the library.
cmake -S "$src_dir/tests/install/consumer" -B "$prefix/consumer-build" \
      -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/consumer-build" >/dev/null
clean "$prefix/consumer-build/consumer" || fail "the find_package consumer failed in a clean environment"

# pkg-config, with README's flags. The installed .pc finds its prefix from
# where it lies: nothing to override.
pc() { PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config "$@"; }
flags=$(pc --cflags --libs zerod)
case "$flags" in
  *"$prefix"*) ;;
  *) fail "pkg-config names another prefix than $prefix: $flags" ;;
esac
# shellcheck disable=SC2086  # the flags are words
cc -o "$prefix/consumer-pc" "$src_dir/tests/install/consumer/main.c" $flags "-Wl,-rpath,$(pc --variable=libdir zerod)"
clean "$prefix/consumer-pc" || fail "the pkg-config consumer failed in a clean environment (exit 127: no libzerod.so.1)"

# The same program as the ranks of the installed zerod.
printf 'return { optimizer = { type = "adamw", lr = 0.1 } }\n' >"$prefix/job.lua"
out=$(clean "$prefix/bin/zerod" run --nproc 2 --job "$prefix/job.lua" -- "$prefix/consumer-pc" 2>&1) ||
  fail "zerod run --nproc 2 of the pkg-config consumer failed:"$'\n'"$out"
[ "$(grep -c "step 1 applied" <<<"$out")" = 2 ] || fail "zerod run: not both ranks stepped:"$'\n'"$out"

# Ranks of another launcher (torchrun's variables): the first starts the
# node's daemon, the zerod beside the installed libzerod. A zerod earlier on
# PATH that fails says when another was taken.
mkdir "$prefix/decoy" "$prefix/run"
printf '#!/bin/sh\necho "the zerod on PATH ran, not the one beside libzerod" >&2\nexit 1\n' >"$prefix/decoy/zerod"
chmod +x "$prefix/decoy/zerod"
launch_two_ranks() {  # both ranks' status: 0 when both ended well
  local pids=() r status=0
  for r in 0 1; do
    clean PATH="$prefix/decoy:/usr/bin:/bin" XDG_RUNTIME_DIR="$prefix/run" ZEROD_JOB="$prefix/job.lua" \
      RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29614 \
      "$prefix/consumer-pc" >"$prefix/rank$r.log" 2>&1 &
    pids+=($!)
  done
  for r in 0 1; do wait "${pids[$r]}" || status=1; done
  return $status
}
# Without bin/zerod, the decoy is what runs (so the check below can fail),
# not <libdir>/zerod, the plugins' folder beside libzerod.
mv "$prefix/bin/zerod" "$prefix/bin/zerod.away"
! launch_two_ranks || fail "the launched consumer ran without the installed zerod"
grep -q "the zerod on PATH ran" "$prefix/rank0.log" ||
  fail "without bin/zerod, rank 0 did not fall back to the zerod on PATH:"$'\n'"$(cat "$prefix/rank0.log")"
mv "$prefix/bin/zerod.away" "$prefix/bin/zerod"
launch_two_ranks || fail "the launched consumer failed:"$'\n'"$(cat "$prefix/rank0.log" "$prefix/rank1.log")"
# The daemon ends with its ranks (serve --until-done): let it go before the
# prefix it runs from is removed.
daemon=$(sed -n "s/.*started this node's daemon (pid \([0-9]*\)).*/\1/p" "$prefix/rank0.log" "$prefix/rank1.log")
[ -n "$daemon" ] || fail "no rank said it started the node's daemon"
for _ in $(seq 100); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.05; done
! kill -0 "$daemon" 2>/dev/null || fail "the node's daemon (pid $daemon) outlived its ranks"

# zerod ckpt import runs Python (zerod.ckpt), whose `import zerod` must load
# this install's libzerod: a stand-in Python writes the ZEROD_LIB it was
# given, and fails (the import then stops, saying so).
mkdir -p "$prefix/ds/global_step1"
echo global_step1 >"$prefix/ds/latest"
# shellcheck disable=SC2016  # $ZEROD_LIB is the stand-in's to expand, when it runs
printf '#!/bin/sh\nprintf "%%s\\n" "$ZEROD_LIB" >"%s"\nexit 1\n' "$prefix/zerod_lib_seen" >"$prefix/python"
chmod +x "$prefix/python"
if clean ZEROD_PYTHON="$prefix/python" "$prefix/bin/zerod" ckpt import "$prefix/ds" --to "$prefix/imported" \
  >"$prefix/import.log" 2>&1; then
  fail "zerod ckpt import succeeded with a Python that fails"
fi
[ -e "$prefix/zerod_lib_seen" ] || fail "zerod ckpt import did not run ZEROD_PYTHON:"$'\n'"$(cat "$prefix/import.log")"
seen=$(cat "$prefix/zerod_lib_seen")
[ "$seen" = "$prefix/lib/libzerod.so.1" ] || fail "zerod ckpt import gave Python ZEROD_LIB='$seen', not $prefix/lib/libzerod.so.1"

clean "$prefix/bin/zerod" version
echo "install test: ok"
