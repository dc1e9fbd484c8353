"""The C++ GPT against PyTorch, step for step: train_gpt (or
train_gpt_cuda) through zerod in three ways, examples/python/gpt.py with
torch.optim.AdamW on the same initial weights and batches, and every
step's loss and gradient norm compared.

    python3 compare.py --trainer build/bin/train_gpt --zerod build/bin/zerod [--device cpu|cuda]
                       [--steps 20] [--tolerance 1e-5]

The three ways, all with examples/cpp/gpt_job.lua's optimizer and
schedule:
  embedded, ZeRO stage 0      (the job with stage 0 and no offload)
  embedded, ZeRO stage 3      (the job with no offload)
  zerod run --nproc 2, stage 3 with the optimizer in the host tier (the
                              job as it is; rank 0 prints the loss of its
                              half of the batch, held to the same half in
                              torch)
The first run writes the weights and batches (--dump) the reference trains
on, and the learning rates it prints are the ones the reference uses (the
schedule is zerod's). It passes when every step's loss and gradient norm
(before clipping) are within --tolerance, relative, of torch's
(tests/example_cpp/CMakeLists.txt says why 1e-5 on the CPU). The reference
runs on the GPU when --device is cuda and torch sees one, else on the CPU.
Exit status 0: pass, 1: fail, 77: the device cannot be used here (the
trainer says why; ctest shows SKIPPED).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import reference  # noqa: E402

SKIP = 77
STEP = re.compile(r"^(?:\[rank 0\] )?step +\d+  loss (\S+)  lr (\S+)  grad_norm (\S+)", re.M)


def job_variant(text, zero):
    """gpt_job.lua with its zero line replaced and its offload line removed."""
    text, n = re.subn(r"^  zero = \{[^\n]*\},\n", f"  zero = {{ {zero} }},\n", text, flags=re.M)
    text, m = re.subn(r"^  offload = \{[^\n]*\},\n", "", text, flags=re.M)
    assert n == 1 and m == 1, "gpt_job.lua no longer has one `zero = {...},` and one `offload = {...},` line"
    return text


def run(cmd, env=None):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if p.returncode == SKIP:
        print(p.stdout.strip())
        sys.exit(SKIP)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited with {p.returncode}:\n{p.stdout}")
    return p.stdout


def steps_of(output, steps):
    """[(loss, lr, gradient norm)] per step from a trainer's output."""
    rows = [tuple(float(x) for x in row) for row in STEP.findall(output)]
    if len(rows) != steps:
        sys.exit(f"expected {steps} step lines, got {len(rows)}:\n{output}")
    return rows


def settings(zerod, job):
    """The optimizer settings `zerod check` resolves for the job."""
    out = run([zerod, "check", job])
    def get(key):
        m = re.search(rf"^  {re.escape(key)} += (.*?)\s{{2,}}\(", out, re.M)
        if not m:
            sys.exit(f"`zerod check {job}` prints no {key}:\n{out}")
        return m.group(1)
    want = {"optimizer.type": '"adamw"', "precision": '"fp32"', "gradient_accumulation_steps": "1"}
    for key, value in want.items():
        if get(key) != value:
            sys.exit(f"the reference trains {key} = {value} only, the job has {get(key)}")
    betas = [float(b) for b in get("optimizer.betas").strip("{}").split(",")]
    return dict(betas=tuple(betas), eps=float(get("optimizer.eps")),
                weight_decay=float(get("optimizer.weight_decay")), clip=float(get("gradient_clipping")))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trainer", required=True)
    p.add_argument("--zerod", required=True)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--tolerance", type=float, default=1e-5)
    a = p.parse_args()

    with open(os.path.join(HERE, "gpt_job.lua")) as f:
        job_text = f.read()
    with tempfile.TemporaryDirectory(prefix="cpp-gpt-") as tmp:
        jobs = {}
        for name, zero in (("stage0", "stage = 0"), ("stage3", "stage = 3, param_persistence_threshold = 0")):
            jobs[name] = os.path.join(tmp, f"{name}.lua")
            with open(jobs[name], "w") as f:
                f.write(job_variant(job_text, zero))
        jobs["daemon"] = os.path.join(HERE, "gpt_job.lua")
        hyper = settings(a.zerod, jobs["daemon"])
        for name in ("stage0", "stage3"):
            if settings(a.zerod, jobs[name]) != hyper:
                sys.exit(f"{name}'s optimizer settings differ from gpt_job.lua's")

        common = ["--device", a.device, "--steps", str(a.steps)]
        # Embedded runs are embedded even under another `zerod run`.
        env = {k: v for k, v in os.environ.items() if k not in ("ZEROD_JOB", "ZEROD_ENDPOINT")}
        runs = {}
        runs["embedded, stage 0"] = steps_of(
            run([a.trainer, "--job", jobs["stage0"], "--dump", tmp, *common], env), a.steps)
        runs["embedded, stage 3"] = steps_of(run([a.trainer, "--job", jobs["stage3"], *common], env), a.steps)
        runs["zerod run --nproc 2, stage 3, host optimizer"] = steps_of(
            run([a.zerod, "run", "--nproc", "2", "--job", jobs["daemon"], "--", a.trainer, *common], env), a.steps)
        lrs = [lr for _, lr, _ in runs["embedded, stage 0"]]
        for name, rows in runs.items():
            if [lr for _, lr, _ in rows] != lrs:
                sys.exit(f"{name} printed other learning rates than embedded stage 0")

        ref_device = "cuda" if a.device == "cuda" and torch.cuda.is_available() else "cpu"
        ref = reference.train(tmp, lrs, device=ref_device, **hyper)

    print(f"C++ GPT ({a.device}) through zerod against examples/python/gpt.py with torch.optim.AdamW "
          f"(torch {torch.__version__} on {ref_device}), {a.steps} steps: each step's loss, and its relative "
          "difference from torch's")
    print("(torch's loss of the global batch, and of rank 0's half of it: what rank 0 of `zerod run` prints)")
    print(f"{'step':>4}  {'torch':>10}  {'torch r0/2':>10}  " + "  ".join(f"{n[:24]:>24}" for n in runs))
    worst = {name: [0.0, 0.0] for name in runs}  # loss, gradient norm
    for i in range(a.steps):
        cells = []
        for name, rows in runs.items():
            loss, _, norm = rows[i]
            want = ref[i][1] if name.startswith("zerod run") else ref[i][0]
            rel = abs(loss - want) / abs(want)
            worst[name][0] = max(worst[name][0], rel)
            worst[name][1] = max(worst[name][1], abs(norm - ref[i][2]) / abs(ref[i][2]))
            cells.append(f"{loss:.7f} ({rel:.1e})")
        print(f"{i + 1:>4}  {ref[i][0]:>10.7f}  {ref[i][1]:>10.7f}  " + "  ".join(f"{c:>24}" for c in cells))
    failed = False
    for name, (loss, norm) in worst.items():
        ok = max(loss, norm) <= a.tolerance
        failed |= not ok
        print(f"{name}: worst relative difference {loss:.2e} in the loss, {norm:.2e} in the gradient's norm "
              f"({'within' if ok else 'OVER'} {a.tolerance:g})")
    print("C++ GPT matches PyTorch" if not failed else "C++ GPT does NOT match PyTorch")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
