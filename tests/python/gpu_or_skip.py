"""Runs pytest on the given test file where this machine can train on a
GPU: torch sees one and libzerod has the cuda device. Elsewhere it prints
why not and exits 77, which ctest reports as SKIPPED (SKIP_RETURN_CODE)."""
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


reason = why_not()
if reason:
    print(f"SKIPPED: {reason}")
    sys.exit(SKIP)
sys.exit(subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
