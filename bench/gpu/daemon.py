"""The daemon on a GPU (issue 32 section 4), in one run, three tables:

steps    the GPT of model.py (default 1.3B, 24 x 2048, 4 x 1024 tokens a
         micro-batch, bf16) at ZeRO stage 3 in the GPU's memory, trained by
         step.py three ways: embedded (the engine in the trainer's process),
         under `zerod run --nproc 1` (the daemon owns the state, the rank
         maps it), and under `zerod run --nproc 2` with both ranks on the one
         GPU, each its own process. Per row: the step (median of steps 3 on),
         x embedded (target <= 1.05 for the daemon's 1 rank), tokens/s of all
         ranks, and the model state zerod keeps on the device per rank after
         a step, in bytes a parameter, against DESIGN.md section 4's
         (2 + 2 + 12) / N (target: within 5% at stage 3).
latency  bench_daemon_latency --device cuda: the time of a
         zd_forward_begin + zd_forward_end pair, median and p99, embedded and
         through the daemon (socket, call ring), 2 ranks, stages 0 and 3,
         beside the time DeepSpeed ZeRO's forward hooks add to the same
         module (its deepspeed_hooks.py, in this Python; one line says why
         where it cannot).
cpp      the C++ GPT of examples/cpp (cuBLAS GEMMs and CUDA kernels of its
         own, through zerod.h) against the PyTorch GPT of examples/python
         (the same model, fp32) through zerod.torch: tokens/s of all ranks,
         the same job (examples/cpp/gpt_job.lua: stage 3, optimizer on the
         host), text and sizes, embedded and under `zerod run --nproc 2`.

    python3 bench/gpu/daemon.py [--parts steps,latency,cpp] [--modes zerod3]
                                [--layers 24 --embd 2048 --seq 1024 --micro 4] [--steps 6]
                                [--latency-iters 5000] [--cpp-steps 60] [--timeout 240] [--budget 420]

Each row is printed as its run ends, bench_daemon_latency's lines as it
prints them: a run.sh part cut at its time keeps every figure measured
before. --budget (run.sh: the time left) caps each run at the time left of
it; a run that would start with under MIN_RUN_S left is skipped, and named.

zerod and the programs beside it come from ZEROD_LIB's build (run.sh's
build-gpu), or --zerod. On the CPU (ZEROD_BENCH_DEVICE=cpu, the drivers'
smoke test) everything runs on the cpu device; its figures mean nothing.
"""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time

from common import fmt_params, run, stream
from step import parser as step_parser
from step import zerod_job

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "examples", "python"))
from corpus import load_corpus  # noqa: E402

DEVICE = os.environ.get("ZEROD_BENCH_DEVICE", "cuda")
TARGET_X_EMBEDDED = 1.05
TARGET_FORMULA = 0.05
JSON_LINE = re.compile(r"^\[rank (\d+)\] (\{.*\})$", re.M)
# Not worth starting a run with less left than this: setup alone takes longer.
MIN_RUN_S = 30


def default_zerod():
    lib = os.environ.get("ZEROD_LIB")
    if lib:
        exe = os.path.join(os.path.dirname(os.path.realpath(lib)), "..", "bin", "zerod")
        if os.path.exists(exe):
            return os.path.normpath(exe)
    return shutil.which("zerod") or os.path.join(ROOT, "build", "bin", "zerod")


def formula_bytes_per_param(mode, world):
    """DESIGN.md section 4: a 16-bit working copy, 16-bit gradients and 12
    bytes of fp32 master and Adam moments a parameter; stage 3 divides all
    of it by the ranks, stage 0 none. Offloaded modes keep less on the
    device than any stage's row: no formula."""
    return {"zerod0": 16.0, "zerod3": 16.0 / world}.get(mode)


def run_time(a):
    """The seconds the next run may take: --timeout, or less where less of
    the --budget is left; None when too little is left to start one."""
    if a.deadline is None:
        return a.timeout
    left = a.deadline - time.time()
    return min(a.timeout, left) if left >= MIN_RUN_S else None


def skipped(what, a):
    print(f"{what}: skipped, under {MIN_RUN_S} s left of the {a.budget:.0f} s budget", flush=True)


def under_daemon(a, mode, nproc, job_dir, timeout):
    """step.py under `zerod run --nproc N` (every rank on the one GPU):
    each rank's JSON line, or a failed row."""
    args = ["--mode", mode, "--layers", str(a.layers), "--embd", str(a.embd), "--seq", str(a.seq), "--micro",
            str(a.micro), "--steps", str(a.steps)]
    if DEVICE != "cuda":
        args += ["--device", DEVICE]
    job = os.path.join(job_dir, f"{mode}.lua")
    with open(job, "w") as f:
        f.write(zerod_job(step_parser().parse_args(args)))
    cmd = [a.zerod, "run", "--nproc", str(nproc), "--job", job, "--", sys.executable, os.path.join(HERE, "step.py"),
           *args]
    rc, out = stream(cmd, timeout)
    if rc is None:
        return [{"mode": mode, "ok": False, "error": f"over {timeout:.0f} s"}]
    ranks = {int(r): json.loads(j) for r, j in JSON_LINE.findall(out)}
    if rc != 0 or len(ranks) != nproc:
        tail = " | ".join(out.strip().splitlines()[-3:])
        return [{"mode": mode, "ok": False, "error": f"zerod run exit {rc}: {tail}"}]
    return [ranks[r] for r in sorted(ranks)]


def steps_table(a):
    print(f"\nthe daemon against embedded: GPT {a.layers} x {a.embd}, {a.micro} x {a.seq} tokens a micro-batch per "
          f"rank, bf16, {a.steps} steps, on {DEVICE}; targets: daemon 1 rank <= {TARGET_X_EMBEDDED}x embedded, "
          f"device bytes per rank within {TARGET_FORMULA:.0%} of DESIGN.md section 4")
    print(f"{'mode':<8} {'where':<26} {'ok':<4} {'step ms':>9} {'x embedded':>11} {'tok/s':>9} {'dev B/param':>12} "
          f"{'formula':>8} {'x formula':>10}  loss first -> last / note")
    with tempfile.TemporaryDirectory(prefix="zerod-bench-daemon-") as job_dir:
        for mode in a.modes.split(","):
            base = params = None
            for where, n in (("embedded, 1 rank", 1), ("daemon, 1 rank", 1), ("daemon, 2 ranks, one GPU", 2)):
                timeout = run_time(a)
                if timeout is None:
                    skipped(f"{mode} {where}", a)
                    continue
                if where.startswith("embedded"):
                    ranks = [run(mode, a.layers, a.embd, a.steps, timeout,
                                 extra=["--seq", str(a.seq), "--micro", str(a.micro)])]
                    base = ranks[0].get("step_ms")
                else:
                    ranks = under_daemon(a, mode, n, job_dir, timeout)
                params = params or ranks[0].get("params")
                steps_row(mode, where, n, ranks, base)
            if params:
                print(f"         ({fmt_params(params)} parameters)", flush=True)


def steps_row(mode, where, n, ranks, base):
    """One row of the steps table, printed as its run ends; base: the
    embedded row's step (None when it did not run)."""
    nan = float("nan")
    ok = all(r.get("ok") for r in ranks)
    ms = max(r.get("step_ms") or nan for r in ranks)  # a step ends when the slowest rank's does
    x = ms / base if ok and base else nan
    tok = sum(r.get("tokens_per_s", 0) for r in ranks) if ok else 0
    params = ranks[0].get("params")
    dev = sum(r.get("zerod_device_bytes", 0) for r in ranks) / len(ranks) / params if ok and params else nan
    want = formula_bytes_per_param(mode, n)
    notes = []
    if ok:
        notes.append(f"{ranks[0]['loss_first']:.3f} -> {ranks[0]['loss_last']:.3f}")
        if where.startswith("daemon, 1") and base:
            notes.append(f"x embedded {'met' if x <= TARGET_X_EMBEDDED else 'MISSED'}")
        if want:
            notes.append(f"formula {'met' if abs(dev / want - 1) <= TARGET_FORMULA else 'MISSED'}")
    notes += [r["error"] for r in ranks if r.get("error")]
    print(f"{mode:<8} {where:<26} {('yes' if ok else 'NO'):<4} {ms:>9.1f} {x:>11.2f} {tok:>9} "
          f"{dev:>12.2f} {want or nan:>8.2f} {dev / want if want else nan:>10.3f}  {'; '.join(notes)}", flush=True)


def latency_table(a):
    exe = os.path.join(os.path.dirname(a.zerod), "bench_daemon_latency")
    print(f"\nzd_forward_begin + zd_forward_end on the {DEVICE} device (bench_daemon_latency)", flush=True)
    timeout = run_time(a)
    if timeout is None:
        skipped("bench_daemon_latency", a)
        return

    def show(line):
        if not line.startswith("zerod serve: stopping"):
            print(line, flush=True)

    # DeepSpeed's peer in this Python: the bench's own choice (the build's
    # venv, else /usr/bin/python3) has no torch on the GPU image, whose
    # torch and DeepSpeed are in the environment run.sh's python3 is.
    rc, _ = stream([exe, "--device", DEVICE, "--iters", str(a.latency_iters), "--ranks", "2", "--zerod", a.zerod,
                    "--python", sys.executable], timeout, on_line=show)
    if rc is None:
        print(f"bench_daemon_latency: over {timeout:.0f} s", flush=True)
    elif rc != 0:
        print(f"bench_daemon_latency: exit {rc}", flush=True)


def corpus_file(path):
    """The PyTorch trainer's default corpus, written where the C++ trainer
    reads it: both read the same characters and have the same vocabulary."""
    with open(path, "w") as f:
        f.write(load_corpus(None, 1_000_000)[0])


def cpp_table(a):
    exe = os.path.join(os.path.dirname(a.zerod), "train_gpt_cuda" if DEVICE == "cuda" else "train_gpt")
    job = os.path.join(ROOT, "examples", "cpp", "gpt_job.lua")
    size = ["--layers", str(a.cpp_layers), "--heads", str(a.cpp_heads), "--embd", str(a.cpp_embd), "--block",
            str(a.cpp_block), "--steps", str(a.cpp_steps)]
    print(f"\nthe C++ GPT (examples/cpp) against the PyTorch GPT through zerod: {a.cpp_layers} layers, width "
          f"{a.cpp_embd}, context {a.cpp_block}, {a.cpp_batch} sequences a rank a step, fp32, {a.cpp_steps} steps, "
          f"examples/cpp/gpt_job.lua (stage 3, optimizer on the host), on {DEVICE}")
    print(f"{'trainer':<9} {'where':<22} {'tok/s':>10} {'x PyTorch':>10}  final loss / note", flush=True)
    with tempfile.TemporaryDirectory(prefix="zerod-bench-cpp-") as d:
        text = os.path.join(d, "corpus.txt")
        corpus_file(text)
        for nproc in (1, 2):
            where = "embedded, 1 rank" if nproc == 1 else f"daemon, {nproc} ranks"
            launch = [] if nproc == 1 else [a.zerod, "run", "--nproc", str(nproc), "--job", job, "--"]
            cpp = [*launch, exe, "--job", job, "--device", DEVICE, "--text", text, "--batch",
                   str(a.cpp_batch * nproc), "--quiet", *size]
            py = [*launch, sys.executable, os.path.join(ROOT, "examples", "python", "train_gpt.py"), "--job", job,
                  "--device", DEVICE, "--text", text, "--batch", str(a.cpp_batch), "--sample-chars", "0", *size]
            got = {}
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                x for x in (os.path.join(ROOT, "bindings", "python"), os.environ.get("PYTHONPATH")) if x))
            for name, cmd, pattern, per_rank in (
                    ("PyTorch", py, r"([\d,]+) tokens/s; loss [\d.]+ -> ([\d.]+)", False),
                    ("C++", cpp, r"final loss ([\d.]+) .*?([\d.]+) tokens/s per rank", True)):
                timeout = run_time(a)
                if timeout is None:
                    skipped(f"{name} {where}", a)
                    continue
                rc, out = stream(cmd, timeout, env=env)
                if rc is None:
                    print(f"{name:<9} {where:<22} {'-':>10} {'-':>10}  over {timeout:.0f} s", flush=True)
                    continue
                m = re.search(pattern, out)
                if rc != 0 or not m:
                    tail = " | ".join(out.strip().splitlines()[-3:])
                    print(f"{name:<9} {where:<22} {'-':>10} {'-':>10}  exit {rc}: {tail}", flush=True)
                    continue
                if per_rank:
                    loss, tok = float(m.group(1)), float(m.group(2)) * nproc
                else:
                    tok, loss = float(m.group(1).replace(",", "")), float(m.group(2))
                got[name] = tok
                x = tok / got["PyTorch"] if "PyTorch" in got else float("nan")
                print(f"{name:<9} {where:<22} {tok:>10.0f} {x:>10.2f}  {loss:.3f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="steps,latency,cpp")
    ap.add_argument("--modes", default="zerod3", help="step.py's zerod modes for the steps table")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--embd", type=int, default=2048)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--latency-iters", type=int, default=5000)
    ap.add_argument("--cpp-layers", type=int, default=8)
    ap.add_argument("--cpp-heads", type=int, default=8)
    ap.add_argument("--cpp-embd", type=int, default=512)
    ap.add_argument("--cpp-block", type=int, default=256)
    ap.add_argument("--cpp-batch", type=int, default=16, help="sequences a rank a step")
    ap.add_argument("--cpp-steps", type=int, default=60)
    ap.add_argument("--timeout", type=float, default=240, help="seconds a run may take")
    ap.add_argument("--budget", type=float, help="seconds for the whole run: each run is capped at what is left, "
                                                 "and one that would start with too little left is skipped")
    ap.add_argument("--zerod", default=default_zerod())
    a = ap.parse_args()
    a.deadline = time.time() + a.budget if a.budget is not None else None
    parts = a.parts.split(",")
    if "steps" in parts:
        steps_table(a)
    if "latency" in parts:
        latency_table(a)
    if "cpp" in parts:
        cpp_table(a)


if __name__ == "__main__":
    main()
