# Shared by the scripts in this folder: installs the Debian packages zerod
# needs when they are missing, and configures and builds the tree.
# Source it; do not run it.

ZEROD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ZEROD_BUILD_DIR=${ZEROD_BUILD_DIR:-$ZEROD_ROOT/build}
ZEROD_JOBS=${ZEROD_JOBS:-$(nproc)}

# Everything zerod builds and tests with, from Debian 12's archive.
ZEROD_PACKAGES=(
  build-essential cmake ninja-build pkg-config
  liblua5.4-dev libhwloc-dev libaio-dev libprotobuf-dev protobuf-compiler
  libgtest-dev abigail-tools
  # the definitions localedef compiles de_DE.UTF-8 from: the tests that
  # write a trace and a checkpoint under a comma-decimal locale (skipped
  # without it; tests/harness/comma_locale.h)
  locales
  # the Python bindings, their tests and the PyTorch examples (Debian's
  # torch does its matrix math through the system BLAS: OpenBLAS, or every
  # GEMM runs on the reference BLAS, about 25x slower)
  python3 python3-numpy python3-torch libopenblas0-pthread python3-pytest python3-tqdm
  # `zerod plot` (the trace's PNGs: memory per tier, step time, loss)
  python3-matplotlib
  # the offline `pip install ./bindings/python` the README offers (tested)
  python3-pip python3-setuptools python3-wheel
  # scripts/python-venv.sh (the DeepSpeed and PyTorch 2.x columns of the
  # benchmarks): venv, and the headers DeepSpeed's CPU Adam op builds with
  python3-venv python3-dev
  # the benchmarks' yardstick for disk speed (bench/nvme, bench/offload_step)
  fio
  # the mpi comm plugin (daemons across nodes), its tests across network
  # namespaces (ip, tc) and the yardstick for its link speed (bench/comm_mpi)
  openmpi-bin libopenmpi-dev iproute2 iperf3
  # the fuzz build (cmake --preset fuzz, bench/fuzz/run.sh): clang and its
  # libFuzzer and sanitizer runtimes
  clang-14 libclang-rt-14-dev
  # the aarch64 C and C++ headers clang syntax-checks the kernels and
  # plugins against (house.portable_sources: x86-only code must be guarded)
  libc6-dev-arm64-cross libstdc++-12-dev-arm64-cross
)
# The Rust crate needs cargo; a rustup install on PATH is used when there is
# one, else Debian's.
command -v cargo >/dev/null 2>&1 || ZEROD_PACKAGES+=(cargo)

zerod_log() { printf '\033[1m[zerod]\033[0m %s\n' "$*"; }

# Installs the named packages that are not installed yet (apt-get, as root;
# through sudo when not root). ZEROD_SKIP_INSTALL=1: none (a machine with no
# network, whose build finds its dependencies elsewhere: bench/gpu/run.sh main).
zerod_install_packages() {
  [ "${ZEROD_SKIP_INSTALL:-0}" = 1 ] && return 0
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  zerod_log "installing missing Debian packages: ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "need root (or sudo) to apt-get install: ${missing[*]}" >&2; return 1; }
    sudo="sudo"
  fi
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# Configures (once) and builds the given targets (default: all).
zerod_build() {
  if [ ! -f "$ZEROD_BUILD_DIR/build.ninja" ]; then
    zerod_log "configuring $ZEROD_BUILD_DIR"
    cmake -S "$ZEROD_ROOT" -B "$ZEROD_BUILD_DIR" -G Ninja ${ZEROD_CMAKE_ARGS:-}
  fi
  zerod_log "building ${*:-everything} with $ZEROD_JOBS jobs"
  cmake --build "$ZEROD_BUILD_DIR" -j "$ZEROD_JOBS" ${1:+--target "$@"}
}
