#!/usr/bin/env bash
# The Python package over an installed zerod, used from outside the checkout
# with nothing but the install's bin on PATH (no ZEROD_LIB, no
# LD_LIBRARY_PATH, no ldconfig): `import zerod` finds the libzerod beside
# that zerod (bindings/python/zerod/_lib.py).
#   python_install_test.sh BUILD_DIR SOURCE_DIR PYTHON target  pip install --target, PYTHONPATH to it
#   python_install_test.sh BUILD_DIR SOURCE_DIR PYTHON venv    docs/python.md's recipe in a fresh venv
# Exits 77 (skipped) where this Python lacks what the recipe needs.
set -euo pipefail
build_dir=$1
src_dir=$2
python=$3
how=$4
skip() {
  echo "python install test ($how): SKIPPED: $*"
  exit 77
}
[ -x "$python" ] || skip "no $python"
"$python" -c 'import numpy' 2>/dev/null || skip "$python cannot import numpy (Debian: python3-numpy)"
# setuptools before pip: pip imports distutils, which setuptools' hack then refuses.
"$python" -c 'import setuptools, wheel, pip' 2>/dev/null ||
  skip "$python cannot import pip, setuptools and wheel (Debian: python3-pip python3-setuptools python3-wheel)"
if [ "$how" = venv ]; then
  "$python" -c 'import venv, ensurepip' 2>/dev/null || skip "$python has no venv with pip (Debian: python3-venv)"
fi
prefix=$(mktemp -d /tmp/zerod-pyinstall-XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build_dir" --prefix "$prefix" >/dev/null
# setuptools writes build/ and zerod.egg-info beside the sources: a copy,
# laid out as a checkout's, without the rest of the checkout.
mkdir -p "$prefix/checkout/bindings"
cp -r "$src_dir/bindings/python" "$prefix/checkout/bindings/python"
rm -rf "$prefix/checkout/bindings/python/zerod/__pycache__"
# Offline, as the recipe must work: pip may not ask an index.
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

case "$how" in
  target)
    "$python" -m pip install -q --no-build-isolation --no-deps --target "$prefix/site" "$prefix/checkout/bindings/python"
    run_python=("$python") site=$prefix/site ;;
  venv)
    (cd "$prefix/checkout" && "$python" -m venv --system-site-packages venv &&
       venv/bin/pip install -q --no-build-isolation ./bindings/python)
    run_python=("$prefix/checkout/venv/bin/python") site= ;;
  *) echo "python_install_test.sh: target or venv, not '$how'" >&2; exit 2 ;;
esac

# From /, as a user of the install: its bin first on PATH, nothing else.
code='
import sys, zerod
prefix = sys.argv[1]
lib = zerod._lib.lib._name
assert lib.startswith(prefix + "/"), f"loaded {lib}, not one under {prefix}"
assert not zerod.__file__.startswith(sys.argv[2]), f"imported {zerod.__file__} from the checkout"
with zerod.connect("embedded:") as c:
    assert c.info.embedded
print(f"python install test: zerod {zerod.__version__} from {zerod.__file__} loaded {lib}")
'
(cd / && env -u LD_LIBRARY_PATH -u ZEROD_LIB -u PYTHONPATH PATH="$prefix/bin:/usr/bin:/bin" \
   ${site:+PYTHONPATH="$site"} "${run_python[@]}" -c "$code" "$prefix" "$src_dir")
echo "python install test ($how): ok"
