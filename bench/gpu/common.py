"""Shared by the GPU benchmark drivers: one run of step.py in a fresh
process, with a time limit, its JSON line back."""
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
NVME = "/tmp/zerod-bench-nvme"


def run(mode, layers, embd, steps, timeout, extra=(), nvme=NVME):
    cmd = [sys.executable, os.path.join(HERE, "step.py"), "--mode", mode, "--layers", str(layers), "--embd",
           str(embd), "--steps", str(steps), "--nvme", nvme, *extra]
    # The drivers' smoke test runs them on the CPU (tests/python/test_gpu_bench_on_cpu.py).
    if os.environ.get("ZEROD_BENCH_DEVICE"):
        cmd += ["--device", os.environ["ZEROD_BENCH_DEVICE"]]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        try:  # a compiler DeepSpeed started may hold the pipes open a while longer
            p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        return {"mode": mode, "layers": layers, "ok": False, "error": f"over {timeout:.0f} s"}
    finally:
        # A killed run leaves its NVMe files behind; the next would find
        # the disk fuller than it is.
        shutil.rmtree(nvme, ignore_errors=True)
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (stderr or stdout).strip().splitlines()[-3:]
    return {"mode": mode, "layers": layers, "ok": False, "error": f"exit {p.returncode}: " + " | ".join(tail)}


def fmt_params(n):
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"
