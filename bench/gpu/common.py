"""Shared by the GPU benchmark drivers: one run of step.py in a fresh
process, with a time limit, its JSON line back."""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
NVME = "/tmp/zerod-bench-nvme"
# The process group of the row running now, for the SIGTERM handler below.
_row_group = None


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _on_sigterm(signum, frame):
    # The driver is being stopped (run.sh's `timeout`, which signals its own
    # process group, not the row's): the row and what it started go too.
    if _row_group is not None:
        _kill_group(_row_group)
    raise SystemExit(128 + signum)


def _own_group():
    # A process group of its own, so that a timed-out row goes with
    # everything it started (DeepSpeed's ninja and cc1plus, which would
    # otherwise compile on and keep torch's FileBaton lock on its extension
    # folder), but the same session: the device tool ends a command's
    # leftover processes only where they did not start a session of their own.
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}


def clear_stale_extension_locks():
    """A torch extension's build killed with its row (DeepSpeed's CPU Adam
    at first use) leaves its FileBaton lock, and the next row's load of it
    would wait on that for good. A lock is stale when no process works in
    its folder (torch runs ninja there). Only where torch locks by the
    file's existence (FileBaton): a newer torch holds a flock on it, which
    the kernel drops with its holder, and removing that file would let two
    builds in at once. Returns the locks removed."""
    try:
        import torch.utils.cpp_extension as cpp_extension
    except Exception:
        return []
    if not hasattr(cpp_extension, "FileBaton"):
        return []
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.expanduser("~/.cache/torch_extensions")
    locks = [os.path.join(d, "lock") for pattern in ("*", "*/*") for d in glob.glob(os.path.join(root, pattern))
             if os.path.isfile(os.path.join(d, "lock"))]
    if not locks:
        return []
    busy = set()
    for cwd in glob.glob("/proc/[0-9]*/cwd"):
        try:
            busy.add(os.readlink(cwd))
        except OSError:
            pass
    removed = []
    for lock in locks:
        if os.path.dirname(lock) not in busy:
            try:
                os.remove(lock)
                removed.append(lock)
            except OSError:
                pass
    return removed


def _log_row(log, cmd, rc, secs, stdout, stderr):
    if not log:
        return
    try:
        with open(log, "a") as f:
            f.write(f"=== {' '.join(cmd[1:])}: {rc} after {secs:.0f} s\n")
            f.write(stderr or "")
            if stdout and not any(line.startswith("{") for line in stdout.splitlines()):
                f.write(stdout)
            f.write("\n")
    except OSError as e:
        print(f"cannot append to {log}: {e}", file=sys.stderr)


def _watch_sigterm():
    # run.sh's `timeout` stops a driver with SIGTERM: the run in flight
    # (its own process group) must go with it.
    try:
        signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread
        pass


def stream(cmd, timeout, on_line=None, env=None):
    """cmd in a fresh process (its own process group), its stdout and
    stderr together, each line handed to on_line as it comes: a run that
    is stopped (its time up, or the driver's) has still shown what it
    printed. After `timeout` seconds it goes with everything it started.
    Returns (its exit status, or None when its time ran out; its output)."""
    global _row_group
    _watch_sigterm()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                         **_own_group())
    _row_group = p.pid
    lines = []

    def read():
        for line in p.stdout:
            lines.append(line)
            if on_line:
                on_line(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        rc = p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        _kill_group(p.pid)
        _row_group = None
    # Its group is gone, so the pipe closes (unless something it started
    # left the group: then what it printed so far).
    reader.join(10)
    return rc, "".join(lines)


def run(mode, layers, embd, steps, timeout, extra=(), nvme=NVME, log=None):
    """One row: step.py in a fresh process (its own process group) for at
    most `timeout` seconds. Its JSON line, or a failed row ({"ok": False,
    "error": ...}). `log`: a file each row's stderr is appended to."""
    global _row_group
    cmd = [sys.executable, os.path.join(HERE, "step.py"), "--mode", mode, "--layers", str(layers), "--embd",
           str(embd), "--steps", str(steps), "--nvme", nvme, *extra]
    # The drivers' smoke test runs them on the CPU (tests/python/test_gpu_bench_on_cpu.py).
    if os.environ.get("ZEROD_BENCH_DEVICE"):
        cmd += ["--device", os.environ["ZEROD_BENCH_DEVICE"]]
    _watch_sigterm()
    start = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **_own_group())
    _row_group = p.pid
    try:
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(p.pid)
            try:  # what it printed before; its group is gone, so the pipes close
                stdout, stderr = p.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                stdout, stderr = "", ""
            for lock in clear_stale_extension_locks():
                stderr = (stderr or "") + f"\nremoved the stale lock {lock}\n"
            _log_row(log, cmd, f"killed over {timeout:.0f} s", time.time() - start, stdout, stderr)
            return {"mode": mode, "layers": layers, "ok": False, "error": f"over {timeout:.0f} s"}
    finally:
        # Whatever the row left running in its group (a compiler, a helper)
        # goes with it.
        _kill_group(p.pid)
        _row_group = None
        # A killed run leaves its NVMe files behind; the next would find
        # the disk fuller than it is.
        shutil.rmtree(nvme, ignore_errors=True)
    _log_row(log, cmd, f"exit {p.returncode}", time.time() - start, stdout, stderr)
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (stderr or stdout).strip().splitlines()[-3:]
    where = f" (all of it in {log})" if log else ""
    return {"mode": mode, "layers": layers, "ok": False,
            "error": f"exit {p.returncode}: " + " | ".join(tail) + where}


def fmt_params(n):
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"
