#!/usr/bin/env bash
# Installs the build into a temporary prefix, then builds and runs a consumer
# found through find_package(zerod) and one built with pkg-config's flags.
set -euo pipefail
build_dir=$1
src_dir=$2
prefix=$(mktemp -d /tmp/zerod-install-XXXXXX)
trap 'rm -rf "$prefix"' EXIT

cmake --install "$build_dir" --prefix "$prefix" >/dev/null
for f in include/zerod/zerod.h include/zerod/zerod_plugin.h bin/zerod \
         lib/libzerod.so lib/zerod/plugins/zd_optimizer_adamw.so \
         lib/cmake/zerod/zerodConfig.cmake lib/pkgconfig/zerod.pc; do
  [ -e "$prefix/$f" ] || { echo "install is missing $f"; exit 1; }
done
export LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

cmake -S "$src_dir/tests/install/consumer" -B "$prefix/consumer-build" \
      -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/consumer-build" >/dev/null
"$prefix/consumer-build/consumer"

export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
# The installed .pc finds its prefix from where it lies: nothing to override.
flags=$(pkg-config --cflags --libs zerod)
case "$flags" in
  *"$prefix"*) ;;
  *) echo "pkg-config names another prefix than $prefix: $flags" >&2; exit 1 ;;
esac
cc -o "$prefix/consumer-pc" "$src_dir/tests/install/consumer/main.c" $flags
"$prefix/consumer-pc"
"$prefix/bin/zerod" version
echo "install test: ok"
