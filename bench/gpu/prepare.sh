#!/usr/bin/env bash
# Here, on a machine with Debian's archive and PyPI, in the repository root:
# gathers what the GPU machine (no network) needs to build zerod and run the
# GPU benchmarks beside DeepSpeed, into two folders git ignores, emptied first:
#   .devdeps/  zerod's Debian build dependencies as .deb files (~5 MB)
#   .whl/      DeepSpeed and the pure-Python packages it needs that the GPU
#              machine's image lacks or has too old (and tqdm, which the main
#              job's train_gpt.py shows progress with), as wheels for its
#              Python 3.12, at the versions below
# Then name both in the device tool's `carry` and run bench/gpu/run.sh there.
# Fails, and says what, when a package cannot be had.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
for d in .devdeps .whl; do
  grep -qx "/$d/" "$exclude" 2>/dev/null || echo "/$d/" >>"$exclude"
done
# Made afresh (in a folder of their own, then put in place of the old ones
# at the end, so that a failure leaves the old ones): a wheel of another
# version left from an earlier run would stop the install there (two
# versions of one package), and a .deb of another version would be unpacked
# over the one fetched now.
new=$(mktemp -d /tmp/zerod-prepare.XXXXXX)
trap 'rm -rf "$new"' EXIT
mkdir -p "$new/.devdeps" "$new/.whl"
cd "$new"

# The .deb files: Debian 12's current ones (a point release replaces the old
# versions in the archive, so these are not pinned; run.sh's machine block
# and configure.log say what was built with).
debs=(liblua5.4-dev liblua5.4-0 libhwloc-dev libhwloc15 libaio-dev libaio1
  libprotobuf-dev libprotobuf32 libprotobuf-lite32 protobuf-compiler libprotoc32
  libgtest-dev libgmock-dev googletest)
# apt-get's note that it downloads unsandboxed as root is no error.
(cd .devdeps && apt-get download "${debs[@]}" 2> >(grep -v 'unsandboxed' >&2)) || {
  echo "prepare.sh: apt-get download failed (an old package list? apt-get update first)" >&2
  exit 1
}
missing=()
for p in "${debs[@]}"; do
  compgen -G ".devdeps/${p}_*.deb" >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "prepare.sh: no .deb for: ${missing[*]}" >&2
  exit 1
fi
cp "$root/bench/gpu/unpack_debs.sh" .devdeps/unpack.sh

# The wheels, pinned: what ran on the H100 and H200 (DeepSpeed 0.19.8),
# with what pydantic 2.14.4 requires (pydantic-core exactly 2.50.5,
# typing-extensions >= 4.16.0, which the image's may not be).
deepspeed=deepspeed==0.19.8
wheels=(hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
  typing-inspection==0.4.5 typing-extensions==4.16.0 tqdm==4.70.1)
py=(--python-version 3.12 --implementation cp --only-binary=:all: --no-deps -d .whl)
plat=()
for n in 17 24 27 28 31 34; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
plat+=(--platform manylinux2014_x86_64 --platform any)
# DeepSpeed is published as a source archive: built here into a pure-Python
# wheel (its C++/CUDA ops build at first use there, with its nvcc and ninja).
python3 -m pip wheel -q --no-deps "$deepspeed" -w .whl
python3 -m pip download -q "${py[@]}" "${plat[@]}" "${wheels[@]}"
n=$(compgen -G ".whl/*.whl" | wc -l)
if [ "$n" -ne $((${#wheels[@]} + 1)) ]; then
  echo "prepare.sh: $n wheels in .whl, not $((${#wheels[@]} + 1)):" >&2
  ls .whl >&2
  exit 1
fi
cd "$root"
rm -rf .devdeps .whl
mv "$new/.devdeps" "$new/.whl" .
echo "prepared: $(compgen -G '.devdeps/*.deb' | wc -l) .deb files in .devdeps, $n wheels in .whl"
ls .whl
du -sh .devdeps .whl
