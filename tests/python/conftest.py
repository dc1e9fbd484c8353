"""Shared by the Python tests: where things are, and `zerod run` for tests
that need ranks. Run from the repository root with
    PYTHONPATH=bindings/python /usr/bin/python3 -m pytest -q tests/python
(ctest sets PYTHONPATH, ZEROD_LIB and PATH itself).
"""
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time

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


@contextlib.contextmanager
def reserved_port():
    """A free TCP port, kept from other processes' sockets while the block
    runs, for a child process to listen on (MASTER_PORT): `with
    reserved_port() as port:` around the child's whole run.

    A port only looked up (bind to port 0, close) is anyone's again at once:
    on a loaded machine (a parallel ctest run, other tests' gloo
    connections) the kernel can hand it to another socket before the child
    binds it, seconds later, and the child fails with "address already in
    use". Held bound on every address with SO_REUSEADDR and never listening,
    the port is skipped when the kernel picks one for a bind to port 0 or a
    connect, and a bind of it without SO_REUSEADDR fails; the child's
    listener (torch's TCPStore, zerod's rendezvous: SO_REUSEADDR both) still
    binds and listens on it."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("", 0))
        yield s.getsockname()[1]


def serve(nproc, job, sock):
    """Starts `zerod serve --nproc N --job job --socket sock` and returns its
    process once it listens; the caller stops it (SIGTERM)."""
    daemon = subprocess.Popen([ZEROD, "serve", "--nproc", str(nproc), "--job", job, "--socket", sock],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for _ in range(200):
        if os.path.exists(sock):
            return daemon
        if daemon.poll() is not None:
            break
        time.sleep(0.05)
    daemon.kill()
    raise AssertionError("zerod serve did not start: " + daemon.communicate()[0])


def served_ranks(sock, job, command, nproc=2, timeout=60, **env):
    """Runs `command` as ranks 0..nproc-1 of the daemon at `sock` (each with
    `env` added) and returns [(exit status, output)] by rank. `timeout`
    is for all of them together: past it, subprocess.TimeoutExpired, and
    every rank still running is killed (never left behind)."""
    deadline = time.monotonic() + timeout
    procs = []
    try:
        for r in range(nproc):
            procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                          env=rank_env(ZEROD_ENDPOINT=f"unix:{sock}", ZEROD_RANK=r,
                                                       ZEROD_WORLD_SIZE=nproc, ZEROD_JOB=job, **env)))
        outs = [p.communicate(timeout=max(0.0, deadline - time.monotonic()))[0] for p in procs]
        return [(p.returncode, out) for p, out in zip(procs, outs)]
    finally:
        alive = [p for p in procs if p.poll() is None]
        for p in alive:
            p.kill()
        for p in alive:
            try:  # reaped, its pipe closed
                p.communicate(timeout=10)
            except (subprocess.TimeoutExpired, ValueError, OSError):
                pass


def split_ranks(output):
    ranks = {}
    for line in output.splitlines():
        if line.startswith("[rank "):
            head, _, rest = line.partition("] ")
            ranks.setdefault(int(head[6:]), []).append(rest)
    return ranks


def losses_match(got, want, precision):
    """Asserts a zerod loss curve matches plain PyTorch's (test_parity.py's
    tolerances, and why): fp32 every step within 1e-4; bf16 every step
    within 5% and every 10-step mean within 2%. Returns the worst step's
    relative difference."""
    assert len(got) == len(want), f"{len(got)} losses against {len(want)}"
    assert sum(want[-10:]) < 0.9 * sum(want[:10]), "the reference did not learn: the test proves nothing"
    if precision == "fp32":
        worst = max(abs(g - w) / max(1.0, abs(w)) for g, w in zip(got, want))
        assert worst <= 1e-4, f"fp32 losses differ by {worst:.2e}: {got} vs {want}"
        return worst
    worst = max(abs(g - w) / abs(w) for g, w in zip(got, want))
    assert worst <= 0.05, f"bf16 losses differ by {worst:.1%} at one step: {got} vs {want}"
    for i in range(0, len(want), 10):
        g, w = sum(got[i:i + 10]), sum(want[i:i + 10])
        assert abs(g - w) <= 0.02 * abs(w), f"bf16 mean loss of steps {i}-{i + 9}: {g / 10} vs {w / 10}"
    return worst


@pytest.fixture
def tmp_job(tmp_path):
    """Writes a job script's text to a file and returns its path."""
    def write(text, name="job.lua"):
        path = tmp_path / name
        path.write_text(text)
        return str(path)
    return write
