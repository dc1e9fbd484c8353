#!/usr/bin/env python3
"""Which OpenBLAS kernels the main job's torch should use on this CPU.

    scripts/openblas-coretype.py [--python PY]     prints a core name for
                                                   OPENBLAS_CORETYPE, or nothing

Debian's torch (python3-torch, what scripts/run-main.sh trains with) does
its matrix math through the system OpenBLAS, which picks its kernels from a
table of CPU models. A CPU newer than the table (Debian 12's OpenBLAS 0.3.21
and Intel's family 6 model 207, for one) is not in it, and OpenBLAS falls
back to its oldest x86-64 kernels, Prescott (SSE3): the main job then trains
about 3-4x slower (a GPT step 215 ms instead of 77 ms on such a machine,
issue 36). This script asks the BLAS torch actually loaded which kernels it
chose (openblas_get_corename); where that is the Prescott fallback and the
CPU's flags (/proc/cpuinfo, which the kernel clears for what the OS does not
enable) allow better, it takes the best kernels the flags allow (SkylakeX
for AVX-512 F/CD/BW/DQ/VL, Haswell for AVX2 + FMA, SandyBridge for AVX),
and before choosing them checks, in a separate process, that OpenBLAS
really runs them and that they compute what the fallback computes: the
GEMMs of a GPT step (forward, both backward products, attention's batched
products), each output within the rounding error a float32 product of that
length may carry (2 k eps |A||B|). Anything else (OpenBLAS recognised the
CPU, torch does not use OpenBLAS, the check fails) prints nothing, and the
job runs with what OpenBLAS chose itself.

Why this and not PyPI's torch for the main job: the main job runs on the
Debian packages scripts/common.sh installs, offline and without the
multi-gigabyte download of torch's wheels, and with the right kernels
Debian's torch was the faster of the two on that machine (77 ms a step
against PyPI torch 2.15's 90 ms).

The caller sets OPENBLAS_CORETYPE only where the user has not
(scripts/run-main.sh). Progress and reasons go to stderr.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

# OpenBLAS's kernels for a CPU it does not recognise (driver/others/dynamic.c).
FALLBACK = "Prescott"

# The kernels to choose instead, best first, and the CPU flags each needs.
CANDIDATES = [
    ("SkylakeX", {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}),
    ("Haswell", {"avx2", "fma"}),
    ("SandyBridge", {"avx"}),
]

# A kernel's result may differ from the fallback's by both products'
# rounding: at most 2 k eps |A||B| per element (k: the inner length).
FP32_EPS = 2.0 ** -23


def log(msg):
    print(f"[openblas-coretype] {msg}", file=sys.stderr, flush=True)


def cpu_flags(path="/proc/cpuinfo"):
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def candidate(flags, reported, candidates=CANDIDATES):
    """The kernels to ask for instead of `reported` (OpenBLAS's own
    choice), or None: only OpenBLAS's fallback for an unknown CPU is
    replaced, by the best kernels the flags allow."""
    if reported is None or reported.lower() != FALLBACK.lower():
        return None
    for name, needs in candidates:
        if needs <= flags:
            return name
    return None


# -- in the probed Python (torch imported) ---------------------------------

def _loaded_openblas():
    """The OpenBLAS this process mapped (torch's), or None."""
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            name = os.path.basename(path)
            if name.startswith(("libopenblas", "libblas.so")):
                import ctypes
                lib = ctypes.CDLL(path)
                if hasattr(lib, "openblas_get_corename"):
                    lib.openblas_get_corename.restype = ctypes.c_char_p
                    return path, lib.openblas_get_corename().decode()
    return None


def _inputs(torch):
    """The operands of the products of a step of the main job's GPT (1024
    tokens a rank, 128 wide, MLP 512, attention over 64 positions), fixed:
    (A, B) pairs, each product A @ B (batched for attention)."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(1024, 128, generator=g)
    w = torch.randn(512, 128, generator=g) * 0.05
    dy = torch.randn(1024, 512, generator=g)
    q = torch.randn(64, 64, 32, generator=g)
    kt = torch.randn(64, 32, 64, generator=g)
    return [(x, w.t()), (dy, w), (dy.t(), x), (q, kt)]


def _products(torch, inputs):
    (x, wt), (dy, w), (dyt, x2), (q, kt) = inputs
    return [torch.nn.functional.linear(x, wt.t()),  # forward: x W^T, as nn.Linear
            dy @ w,  # backward, input: dY W
            dyt @ x2,  # backward, weight: dY^T X
            torch.bmm(q, kt)]  # attention scores


def _probe(args):
    import time

    import torch
    torch.set_num_threads(1)
    found = _loaded_openblas()
    if found is None:
        print(json.dumps({"openblas": None}))
        return 0
    path, core = found
    inputs = _inputs(torch)
    results = _products(torch, inputs)
    # What these products cost on 1 thread (a rank's share).
    t0 = time.perf_counter()
    reps = 5
    for _ in range(reps):
        _products(torch, inputs)
    ms = (time.perf_counter() - t0) / reps * 1e3
    report = {"openblas": path, "core": core, "ms": ms}
    if args.compare:
        ref = torch.load(args.compare)
        worst = 0.0
        for (a, b), r, want in zip(inputs, results, ref):
            magnitude = a.abs() @ b.abs() if a.dim() == 2 else torch.bmm(a.abs(), b.abs())
            bound = 2 * a.shape[-1] * FP32_EPS * magnitude
            ratio = ((r - want).abs() / bound.clamp_min(1e-30)).max().item()
            if not ratio == ratio:  # NaN: a broken kernel
                ratio = float("inf")
            worst = max(worst, ratio)
        report["worst"] = worst  # <= 1: within the rounding bound
    else:
        torch.save(results, args.save)
    print(json.dumps(report))
    return 0


# -- the chooser -----------------------------------------------------------

def run_probe(python, coretype, save=None, compare=None, timeout=120):
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    env["OPENBLAS_NUM_THREADS"] = env["OMP_NUM_THREADS"] = "1"
    env.pop("OPENBLAS_VERBOSE", None)
    cmd = [python, os.path.abspath(__file__), "--probe"]
    cmd += ["--save", save] if save else ["--compare", compare]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{python} with OPENBLAS_CORETYPE={coretype or '(unset)'} exited {p.returncode}: "
                           f"{p.stderr.strip()[-500:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def choose(python, flags, assume_core=None, tolerance=1.0, candidates=CANDIDATES):
    """The core name to export, or None. For the tests, on a CPU OpenBLAS
    knows: assume_core takes OpenBLAS's own choice to have been this one;
    tolerance (in rounding bounds) and candidates replace the defaults."""
    with tempfile.TemporaryDirectory(prefix="zerod-openblas-") as tmp:
        ref_file = os.path.join(tmp, "fallback.pt")
        ref = run_probe(python, assume_core, save=ref_file)
        if not ref.get("openblas"):
            log(f"{python}'s torch does not use OpenBLAS: nothing to choose")
            return None
        core = ref["core"]
        pick = candidate(flags, core, candidates)
        if pick is None:
            log(f"OpenBLAS ({ref['openblas']}) runs its {core} kernels{'' if core.lower() != FALLBACK.lower() else ', and the CPU has nothing better'}: left as it is")
            return None
        log(f"OpenBLAS does not know this CPU and fell back to its {core} kernels; the CPU's flags allow {pick}: "
            "checking them")
        try:
            got = run_probe(python, pick, compare=ref_file)
        except (RuntimeError, subprocess.TimeoutExpired, ValueError) as e:
            log(f"OPENBLAS_CORETYPE={pick} did not run ({e}): keeping {core}")
            return None
        if (got.get("core") or "").lower() != pick.lower():
            log(f"OPENBLAS_CORETYPE={pick} gave {got.get('core')} kernels, not {pick}: keeping {core}")
            return None
        if not got["worst"] <= tolerance:
            log(f"{pick}'s products differ from {core}'s by {got['worst']:.3g}x the float32 rounding bound: "
                f"keeping {core}")
            return None
        log(f"{pick} computes what {core} does (within {got['worst']:.2f}x the float32 rounding bound) and runs "
            f"a step's products in {got['ms']:.1f} ms against {ref['ms']:.1f} ms: OPENBLAS_CORETYPE={pick}")
        return pick


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", default=sys.executable, help="the Python (with torch) the job runs")
    p.add_argument("--assume-core", help=argparse.SUPPRESS)
    p.add_argument("--cpuinfo", default="/proc/cpuinfo", help=argparse.SUPPRESS)
    p.add_argument("--tolerance", type=float, default=1.0, help=argparse.SUPPRESS)
    p.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--save", help=argparse.SUPPRESS)
    p.add_argument("--compare", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.probe:
        return _probe(args)
    try:
        pick = choose(args.python, cpu_flags(args.cpuinfo), args.assume_core, args.tolerance)
    except (RuntimeError, subprocess.TimeoutExpired, ValueError, OSError) as e:
        log(f"could not ask OpenBLAS ({e}): leaving its choice")
        pick = None
    if pick:
        print(pick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
