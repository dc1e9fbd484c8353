"""Shared by the GPU benchmark drivers: one run of step.py in a fresh
process, with a time limit, its JSON line back."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(mode, layers, embd, steps, timeout, extra=()):
    cmd = [sys.executable, os.path.join(HERE, "step.py"), "--mode", mode, "--layers", str(layers), "--embd",
           str(embd), "--steps", str(steps), *extra]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"mode": mode, "layers": layers, "ok": False, "error": f"over {timeout} s"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
    return {"mode": mode, "layers": layers, "ok": False, "error": f"exit {p.returncode}: " + " | ".join(tail)}


def fmt_params(n):
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"
