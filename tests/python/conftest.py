"""Shared by the Python tests: where things are, and `zerod run` for tests
that need ranks. Run from the repository root with
    PYTHONPATH=bindings/python /usr/bin/python3 -m pytest -q tests/python
(ctest sets PYTHONPATH, ZEROD_LIB and PATH itself).
"""
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
BINDINGS = os.path.join(ROOT, "bindings", "python")
EXAMPLES = os.path.join(ROOT, "examples", "python")

if BINDINGS not in sys.path:
    sys.path.insert(0, BINDINGS)
sys.path.insert(0, HERE)
sys.path.insert(0, EXAMPLES)

# `zerod` from PATH (ctest puts the build's first), else the build tree.
ZEROD = shutil.which("zerod") or os.path.join(ROOT, "build", "bin", "zerod")


def rank_env(**extra):
    """The environment of a trainer process: the bindings importable, one
    thread per rank (2 ranks share the machine)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (BINDINGS, HERE, EXAMPLES, env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def zerod_run(nproc, job, script, *args, timeout=240, env=None):
    """Runs `zerod run --nproc N --job job -- python3 script args` and
    returns (exit status, {rank: [output lines]}, the whole output)."""
    cmd = [ZEROD, "run", "--nproc", str(nproc), "--job", job, "--", sys.executable, script, *map(str, args)]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
                       env=env or rank_env())
    return p.returncode, split_ranks(p.stdout), p.stdout


def split_ranks(output):
    ranks = {}
    for line in output.splitlines():
        if line.startswith("[rank "):
            head, _, rest = line.partition("] ")
            ranks.setdefault(int(head[6:]), []).append(rest)
    return ranks


@pytest.fixture
def tmp_job(tmp_path):
    """Writes a job script's text to a file and returns its path."""
    def write(text, name="job.lua"):
        path = tmp_path / name
        path.write_text(text)
        return str(path)
    return write
