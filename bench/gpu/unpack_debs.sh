#!/usr/bin/env bash
# On the GPU machine: unpacks the .deb files of DIR into DIR/root (not into /)
# and prints the environment that points CMake, pkg-config, the linker and the
# loader at them:  eval "$(bash .devdeps/unpack.sh .devdeps)"
set -euo pipefail
dir=$(cd "${1:?usage: unpack.sh DIR}" && pwd)
root=$dir/root
mkdir -p "$root"
for f in "$dir"/*.deb; do dpkg-deb -x "$f" "$root"; done
lib=$root/usr/lib/x86_64-linux-gnu
cat <<ENV
export CMAKE_PREFIX_PATH="$root/usr\${CMAKE_PREFIX_PATH:+:\$CMAKE_PREFIX_PATH}"
export PKG_CONFIG_SYSROOT_DIR="$root"
export PKG_CONFIG_LIBDIR="$lib/pkgconfig:$root/usr/share/pkgconfig"
export LD_LIBRARY_PATH="$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export LIBRARY_PATH="$lib\${LIBRARY_PATH:+:\$LIBRARY_PATH}"
export CPATH="$root/usr/include:$root/usr/include/x86_64-linux-gnu\${CPATH:+:\$CPATH}"
export PATH="$root/usr/bin:\$PATH"
ENV
