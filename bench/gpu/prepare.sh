#!/usr/bin/env bash
# Here, on a machine with Debian's archive and PyPI, in the repository root:
# gathers what the GPU machine (no network) needs to build zerod and run the
# GPU benchmarks beside DeepSpeed, into two folders git ignores:
#   .devdeps/  zerod's Debian build dependencies as .deb files (~5 MB)
#   .whl/      DeepSpeed 0.19.x and the pure-Python packages it needs that the
#              GPU machine's image lacks (and tqdm, which the main job's
#              train_gpt.py shows progress with), as wheels for its Python 3.12
# Then name both in the device tool's `carry` and run bench/gpu/run.sh there.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
for d in .devdeps .whl; do
  grep -qx "/$d/" "$exclude" 2>/dev/null || echo "/$d/" >> "$exclude"
done
mkdir -p .devdeps .whl
(cd .devdeps && apt-get download \
  liblua5.4-dev liblua5.4-0 libhwloc-dev libhwloc15 libaio-dev libaio1 \
  libprotobuf-dev libprotobuf32 libprotobuf-lite32 protobuf-compiler libprotoc32 \
  libgtest-dev libgmock-dev googletest 2>&1 | grep -v 'unsandboxed' || true)
cp "$root/bench/gpu/unpack_debs.sh" .devdeps/unpack.sh
py=(--python-version 3.12 --implementation cp --only-binary=:all: --no-deps -d .whl)
plat=()
for n in 17 24 27 28 31 34; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
plat+=(--platform manylinux2014_x86_64 --platform any)
# DeepSpeed is published as a source archive: built here into a pure-Python
# wheel (its C++/CUDA ops build at first use there, with its nvcc and ninja).
python3 -m pip wheel -q --no-deps "deepspeed==0.19.*" -w .whl
python3 -m pip download -q "${py[@]}" "${plat[@]}" hjson pydantic pydantic-core annotated-types \
  typing-inspection tqdm
echo "prepared: $(ls .devdeps/*.deb | wc -l) .deb files in .devdeps, $(ls .whl | wc -l) wheels in .whl"
du -sh .devdeps .whl
