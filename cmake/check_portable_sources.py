#!/usr/bin/env python3
"""Checks that sources build on more than the GCC and x86-64 they are built with.

The default build compiles with the system GCC on x86-64, so two kinds of
breakage never show in it: x86-only code outside its guards (an unguarded
`#include <immintrin.h>` or `__builtin_cpu_supports`, which fail the whole
build on aarch64), and GCC-only builtins (`__builtin_cpu_supports("f16c")`,
which clang 14, the fuzz build's compiler, refuses; docs/fuzzing.md).

Each C++ source under the given folders is syntax-checked with clang
(`-fsyntax-only`, warnings off: only errors count) twice, with the flags
the build's compile_commands.json gives it:
  - natively, every source, the ISA ones (-mavx2 ...) included;
  - for aarch64-linux-gnu, the sources an aarch64 build compiles: those
    the build gives x86 instruction-set flags (-mavx2 ...;
    cmake/IsaSources.cmake) are left out, and
    the defines that say they are there (`ZEROD_*_X86=1`, `ZEROD_*_AVX2=1`)
    are set to 0, as an aarch64 configure sets them.
The aarch64 check needs aarch64 C and C++ headers (Debian:
libc6-dev-arm64-cross, libstdc++-12-dev-arm64-cross). A library's own
multiarch header (hwloc's autogen/config.h) has no aarch64 copy there, so
the host's multiarch folder is searched last (-idirafter).

Usage: check_portable_sources.py --build <build dir> --root <repository>
                                 --clang <clang++> --under <folder>...
Exit status 0 when every source passes both checks, 1 when one fails (each
printed with clang's errors), 77 when the native check passed but the
aarch64 one cannot run here (no aarch64 headers; the reason printed).
"""

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

SKIP_EXIT = 77
AARCH64 = "aarch64-linux-gnu"
HOST_MULTIARCH = "/usr/include/x86_64-linux-gnu"

# A define that says an x86-only source is in the build (cmake/IsaSources.cmake,
# plugins/optimizers/kernels/CMakeLists.txt): 0 on any other architecture.
X86_DEFINE_RE = re.compile(r"^-D(\w+_(?:X86|AVX2|AVX512))=1$")
# The flags an x86-only source is built with (-mavx2 -mfma -mf16c, -mavx512f ...).
X86_ISA_FLAG_RE = re.compile(r"^-m(?:avx|f16c|fma|sse|bmi|pclmul|aes)")


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--build", required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--clang", required=True)
    p.add_argument("--under", action="append", required=True, help="folder under --root to check")
    return p.parse_args()


def compile_args(entry):
    """The compiler arguments of one compile_commands.json entry, without the
    compiler, the output and the source itself."""
    args = entry["arguments"][1:] if "arguments" in entry else shlex.split(entry["command"])[1:]
    kept = []
    i = 0
    while i < len(args):
        if args[i] in ("-o", "-c", "-MF", "-MT", "-MQ"):
            i += 2
            continue
        if args[i] in ("-MD", "-MMD") or args[i] == entry["file"]:
            i += 1
            continue
        kept.append(args[i])
        i += 1
    return kept


def is_x86_only(args):
    return any(X86_ISA_FLAG_RE.match(a) for a in args)


def for_aarch64(args):
    out = []
    for a in args:
        m = X86_DEFINE_RE.match(a)
        out.append(f"-D{m.group(1)}=0" if m else a)
    return ["--target=" + AARCH64, "-idirafter", HOST_MULTIARCH] + out


def sources(build, root, folders):
    """(file, directory, args) for each C++ source under the folders, once each."""
    db = os.path.join(build, "compile_commands.json")
    if not os.path.isfile(db):
        sys.exit(f"no {db}: the top-level CMakeLists.txt sets CMAKE_EXPORT_COMPILE_COMMANDS; "
                 "configure with a Makefile or Ninja generator")
    with open(db) as f:
        entries = json.load(f)
    prefixes = [os.path.join(os.path.realpath(root), d.strip("/")) + os.sep for d in folders]
    seen = set()
    found = []
    for e in entries:
        path = os.path.realpath(os.path.join(e["directory"], e["file"]))
        if not path.endswith(".cpp") or not any(path.startswith(p) for p in prefixes):
            continue
        args = compile_args(e)
        key = (path, tuple(args))
        if key not in seen:
            seen.add(key)
            found.append((path, e["directory"], args))
    return found


def syntax_check(clang, directory, args, path):
    cmd = [clang, "-fsyntax-only", "-w"] + args + [path]
    r = subprocess.run(cmd, cwd=directory, capture_output=True, text=True)
    return r.returncode == 0, r.stderr


def check_all(clang, jobs, label):
    """Syntax-checks every (path, directory, args); prints each failure.
    Returns the number that failed."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = list(pool.map(lambda j: (j[0],) + syntax_check(clang, j[1], j[2], j[0]), jobs))
    failed = [(path, err) for path, ok, err in results if not ok]
    for path, err in failed:
        errors = [line for line in err.splitlines() if "error:" in line or line.startswith("In file included from")]
        print(f"FAIL ({label}): {path}")
        for line in errors[:10]:
            print(f"    {line}")
    print(f"{label}: {len(jobs) - len(failed)} of {len(jobs)} sources pass")
    return len(failed)


def aarch64_unavailable(clang):
    """Why clang cannot syntax-check C++ for aarch64 here, or None when it can
    (and the check really is not x86: <immintrin.h> must fail there)."""
    with tempfile.TemporaryDirectory() as tmp:
        std = os.path.join(tmp, "std.cpp")
        with open(std, "w") as f:
            f.write("#include <cstdint>\n#include <vector>\n")
        ok, err = syntax_check(clang, tmp, ["--target=" + AARCH64, "-std=c++20"], std)
        if not ok:
            return ("no aarch64 C++ headers for clang (Debian: apt-get install libc6-dev-arm64-cross "
                    "libstdc++-12-dev-arm64-cross, in scripts/common.sh's ZEROD_PACKAGES): "
                    + err.strip().splitlines()[0])
        x86 = os.path.join(tmp, "x86.cpp")
        with open(x86, "w") as f:
            f.write("#include <immintrin.h>\n")
        ok, _ = syntax_check(clang, tmp, ["--target=" + AARCH64], x86)
        if ok:
            sys.exit("the aarch64 check accepts <immintrin.h>: it would not catch x86-only code")
    return None


def main():
    a = parse_args()
    found = sources(a.build, a.root, a.under)
    if not found:
        sys.exit(f"no C++ sources under {', '.join(a.under)} in {a.build}/compile_commands.json")
    failures = check_all(a.clang, found, "native clang")
    why_not = aarch64_unavailable(a.clang)
    if why_not is None:
        portable = [(p, d, for_aarch64(args)) for p, d, args in found if not is_x86_only(args)]
        failures += check_all(a.clang, portable, AARCH64)
    if failures:
        print(f"{failures} failed: x86-only code needs a ZEROD_KIT_CPU_X86 guard, and CPU features come from "
              "zerod::cpu::features() (zerod/kit/cpu.h)")
        return 1
    if why_not is not None:
        print(f"SKIPPED the aarch64 check: {why_not}")
        return SKIP_EXIT
    print("every source builds with clang, natively and for aarch64")
    return 0


if __name__ == "__main__":
    sys.exit(main())
