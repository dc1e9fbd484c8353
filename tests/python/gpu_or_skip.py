"""Runs pytest on the given test file where this machine can train on a
GPU: torch sees one and libzerod has the cuda device. Elsewhere it prints
why not and exits 77, which ctest reports as SKIPPED (SKIP_RETURN_CODE).

    gpu_or_skip.py [--needs module,module...] <pytest arguments>

--needs: Python modules the suite imports besides torch (lightning,
accelerate); one that is missing is a reason to skip too."""
import importlib.util
import subprocess
import sys

import torch

import zerod
from zerod.errors import ZerodError

SKIP = 77


def why_not():
    if not torch.cuda.is_available():
        return "torch sees no CUDA GPU on this machine"
    try:
        client = zerod.connect("embedded:")
        client.create_model(script_text="return {}", device="cuda").close()
        client.close()
    except ZerodError as e:
        return f"libzerod cannot open the cuda device: {e}"
    return None


args = sys.argv[1:]
needs = []
if args[:1] == ["--needs"]:
    needs, args = args[1].split(","), args[2:]
reason = why_not()
missing = [m for m in needs if importlib.util.find_spec(m) is None]
if not reason and missing:
    reason = f"{sys.executable} cannot import {', '.join(missing)}"
if reason:
    print(f"SKIPPED: {reason}")
    sys.exit(SKIP)
sys.exit(subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]))
