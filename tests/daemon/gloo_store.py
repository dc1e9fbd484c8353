"""The gloo store beside zerod (bindings/python/zerod/_gloo.py) between runs.

A store file that a run which crashed left in a lasting directory (`zerod
serve`'s socket directory, `zerod run --socket`'s) made the next run of the
same ids fail: a rank that came first read the dead run's addresses
(`Gloo connectFullMesh failed ... Connection refused`). Now a new run
replaces a store nobody holds, the last rank of a run removes it at exit,
and `zerod run` removes its run's store at its end whatever the ranks did.

    gloo_store.py <zerod> <job.lua> <python with torch> <bindings/python>

Exits 77 (skipped) when that python cannot import torch.
"""
import os
import subprocess
import sys
import tempfile
import time

zerod, job, python, bindings = sys.argv[1:5]
try:
    has_torch = subprocess.run([python, "-c", "import torch.distributed"], capture_output=True).returncode == 0
except OSError:  # no such python (no virtual environment)
    has_torch = False
if not has_torch:
    print(f"gloo_store: SKIPPED: {python} cannot import torch")
    sys.exit(77)

# One rank: meets the others through init_gloo, sums, and ends as asked:
# "crash" without any cleanup (os._exit, as a killed rank would), "exit" normally.
RANK = """
import os, sys, torch
from zerod._gloo import init_gloo
init_gloo(int(os.environ["R"]), 2, "accelerate")
t = torch.tensor([float(os.environ["R"]) + 1])
torch.distributed.all_reduce(t)
print("sum", int(t.item()), flush=True)
if os.environ["END"] == "crash":
    os._exit(0)
"""


def fail(why, out=""):
    print("gloo_store: FAILED:", why)
    print(out[-3000:])
    sys.exit(1)


def stores(d):
    return sorted(n for n in os.listdir(d) if "store" in n)


def job_of_two(d, end, late=0.0, env=None):
    """Ranks 1 and 0 of one job, rank 0 `late` seconds after rank 1."""
    base = dict(os.environ, ZEROD_ENDPOINT=f"unix:{d}/zerod.sock", ZEROD_JOB_KEY="gloo-store-test",
                PYTHONPATH=bindings, END=end, OMP_NUM_THREADS="1")
    for k in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "ZEROD_RUN_ID", "SLURM_JOB_ID"):
        base.pop(k, None)
    base.update(env or {})
    procs = []
    try:
        for r in (1, 0):
            if r == 0 and late:
                time.sleep(late)
            procs.append(subprocess.Popen([python, "-c", RANK], env=dict(base, R=str(r)), stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        outs = []
        for p in procs:
            out, _ = p.communicate(timeout=60)
            outs.append(out)
            if p.returncode != 0 or "sum 3" not in out:
                fail(f"a rank of a run ({end}, rank 0 {late} s late) exited {p.returncode}", out)
        return outs
    except subprocess.TimeoutExpired:
        fail(f"a run ({end}, rank 0 {late} s late) did not end within 60 s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


with tempfile.TemporaryDirectory(prefix="zerod-gloo-store-") as d:
    # A daemon's lasting directory: a run that crashed leaves its store.
    job_of_two(d, "crash")
    if not stores(d):
        fail("the crashed run left no store: the test does not test anything")
    # The next runs of the same ids, rank 1 first, crash too: none may meet
    # a dead run's store. (What a stale store does depends on what it holds
    # and on timing: the ranks failed to connect, or hung, or, now and then,
    # got through. Three runs: before the fix, at least one failed in every
    # try.)
    for late in (2.0, 1.0, 2.0):
        job_of_two(d, "crash", late=late)
    job_of_two(d, "exit", late=2.0)
    print("gloo_store: a run after one that crashed meets a fresh store")
    # A run that ends normally leaves nothing for the next one.
    if stores(d):
        fail(f"a run that ended left {stores(d)} in {d}")
    job_of_two(d, "exit", late=1.0)
    if stores(d):
        fail(f"a run that ended left {stores(d)} in {d}")
    print("gloo_store: a run that ends removes its store")

    # zerod run with a socket in a lasting directory: the run's store goes at
    # the end, even when the ranks end without cleaning up.
    cmd = [zerod, "run", "--nproc", "2", "--socket", f"{d}/zerod.sock", "--job", job, "--", python, "-c",
           "import os; os.environ['R'] = os.environ['ZEROD_RANK']\n" + RANK]
    env = dict(os.environ, PYTHONPATH=bindings, END="crash", OMP_NUM_THREADS="1")
    for k in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "ZEROD_JOB_KEY"):
        env.pop(k, None)
    for _ in range(2):
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
        except subprocess.TimeoutExpired:
            fail("zerod run did not end within 180 s")
        if p.returncode != 0 or p.stdout.count("sum 3") != 2:
            fail(f"zerod run exited {p.returncode}", p.stdout + p.stderr)
        if stores(d):
            fail(f"zerod run left {stores(d)} in {d}", p.stderr)
    print("gloo_store: zerod run removes its run's store")
print("gloo_store: stale stores are replaced and every run removes its own")
