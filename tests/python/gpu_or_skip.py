"""Runs pytest on the given test file where this machine can train on a
GPU: torch sees one and libzerod has the cuda device. Elsewhere it prints
why not and exits 77, which ctest reports as SKIPPED (SKIP_RETURN_CODE).

    gpu_or_skip.py [--needs module,module...] <pytest arguments>

--needs: Python modules the suite imports besides torch (lightning,
accelerate); one that is missing is a reason to skip too.

The GPU suites also call skip_module_without_gpu() at import, so that a
plain `pytest` run of them (not through ctest) reports them skipped with
the same reason instead of failing on a machine without a GPU."""
import importlib.util
import subprocess
import sys

import torch

import zerod
from zerod.errors import ZerodError

SKIP = 77


def why_not(needs=()):
    """Why this machine cannot run a GPU suite that imports `needs`, or None."""
    if not torch.cuda.is_available():
        return "torch sees no CUDA GPU on this machine"
    try:
        client = zerod.connect("embedded:")
        client.create_model(script_text="return {}", device="cuda").close()
        client.close()
    except ZerodError as e:
        return f"libzerod cannot open the cuda device: {e}"
    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    if missing:
        return f"{sys.executable} cannot import {', '.join(missing)}"
    return None


def skip_module_without_gpu(*needs):
    """Skips the calling test module, saying why, where why_not() has a reason."""
    import pytest

    reason = why_not(needs)
    if reason:
        pytest.skip(reason, allow_module_level=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    needs = []
    if args[:1] == ["--needs"]:
        needs, args = args[1].split(","), args[2:]
    reason = why_not(needs)
    if reason:
        print(f"SKIPPED: {reason}")
        sys.exit(SKIP)
    sys.exit(subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]))
