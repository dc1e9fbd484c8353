"""A trainer the Python tests run through zerod, embedded or as one of the
ranks of `zerod run`: trains a model of models.py on this rank's slice of
each global batch and prints one line per step, "loss <step> <value>",
then "state <checksum>" of the full fp32 weights.

    train_rank.py <gpt|skip|tied> <fp32|bf16> <steps> [job.lua]

A job that keeps its state in the daemon resumes where it stands (the
steps before it are not run again: "resumed at step N"). With
ZEROD_TEST_DIE_AT=K rank 1 kills itself (SIGKILL) in step K, between its
forward and its backward (on a GPU with the forward's kernels queued on
its stream). With ZEROD_TEST_DIE_IN_STEP=K rank 1 is killed inside zd_step
of step K instead (die_in_zd_step; on a GPU its record of kTrainerDone
queued behind GPU work), and rank 0 on the cpu device holds its own
zd_step of step K back until the daemon has marked rank 1 lost
(hold_until_the_daemon_lost_rank_1); both watch the daemon through
`zerod status`, ZEROD_TEST_ZEROD being the binary. With
ZEROD_TEST_STEP_ON_A_THREAD=1 each engine.step() runs on a new thread,
which has never touched CUDA. cuda_rank.py runs the same on the GPU.
"""
import os
import signal
import subprocess
import sys
import threading
import time

import torch

import zerod.torch
from models import batch, loss_of, make


# The killer of rank 1 ($1: its pid; $2: the zerod binary): SIGKILLs it once
# `zerod status` shows it inside the daemon's side of its step (its row:
# rank, pid, step, "in step for ... s"), where it stays until the kill,
# held by rank 0 (the cpu device) or by its record behind GPU work. Not
# seen there within 60 s: says so on rank 1's output and leaves it alive,
# which the test reports ("rank 1 did not die as the test asked").
KILL_INSIDE_ZD_STEP = r"""
deadline=$(($(date +%s) + 60))
until "$2" status 2>/dev/null | grep -Eq "^  1 +$1 +[-0-9]+ +in step "; do
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "train_rank.py: rank 1 (pid $1) was not seen inside zd_step within 60 s; not killed" >&2
    exit 1
  fi
  sleep 0.05
done
kill -KILL "$1"
"""


def die_in_zd_step(device, zerod):
    """Has another process SIGKILL this one inside the zd_step called next,
    once the daemon shows it there (KILL_INSIDE_ZD_STEP; `zerod` the
    binary). Another process, not a thread: this one's threads wait for the
    call. On a GPU, first queues about 15 s of GPU work on this rank's
    stream (torch.cuda._sleep, 3e10 cycles at 2 GHz at most): the step's
    record of kTrainerDone, made when the call starts, sits behind that
    work and never runs, while the daemon's side of zd_step waits for it
    (daemon/server/trainer_gone_watch.h). On the cpu device that side waits
    in the step's first collective for rank 0, which holds back
    (hold_until_the_daemon_lost_rank_1)."""
    if device.type == "cuda":
        torch.cuda._sleep(30_000_000_000)
    subprocess.Popen(["sh", "-c", KILL_INSIDE_ZD_STEP, "kill-inside-zd-step", str(os.getpid()), zerod])


def hold_until_the_daemon_lost_rank_1(zerod):
    """Rank 0 on the cpu device, before its zd_step of the step in which rank
    1 dies: nothing else holds rank 1's side of that step in the daemon, so
    were rank 0 there, the two would apply it before the kill. Held until
    `zerod status` (`zerod` the binary) shows the model broken by rank 1's
    loss: the daemon marks the model broken in the same critical section
    in which it keeps the reason that status reads, and refuses every call
    after it, so rank 0's zd_step fails at its start. Not the kill, nor
    the daemon's log line that the connection closed: each comes before
    the daemon has marked the model broken, and the time between is the
    daemon's own (its hangup thread's), longer on a loaded machine."""
    deadline = time.monotonic() + 60
    while True:
        status = subprocess.run([zerod, "status"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True).stdout
        if "BROKEN: rank 1 was lost" in status:
            return
        assert time.monotonic() < deadline, \
            f"the daemon did not mark rank 1 lost within 60 s; `zerod status` says:\n{status}"
        time.sleep(0.05)


def on_a_new_thread(call):
    """call() on a thread of its own, which has never touched CUDA (no
    context current there): libzerod makes the rank's GPU current itself."""
    out = {}

    def run():
        try:
            out["result"] = call()
        except BaseException as e:  # raised again on the caller's thread
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["result"]


def main(device=torch.device("cpu")):
    kind, precision, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    job = sys.argv[4] if len(sys.argv) > 4 else None  # None: ZEROD_JOB from `zerod run`
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    torch.set_num_threads(1)
    engine = zerod.torch.initialize(make(kind).to(device), job=job, dtype=dtype)
    assert engine.device.type == device.type, engine.device
    start = engine.global_steps
    if start:
        print(f"resumed at step {start}", flush=True)
    die_at = int(os.environ.get("ZEROD_TEST_DIE_AT", -1))
    die_in_step = int(os.environ.get("ZEROD_TEST_DIE_IN_STEP", -1))
    zerod_binary = os.environ.get("ZEROD_TEST_ZEROD", "zerod")
    step_on_a_thread = os.environ.get("ZEROD_TEST_STEP_ON_A_THREAD") == "1"
    for step in range(start, steps):
        inputs, y = batch(kind, step, engine.rank, engine.world_size)
        inputs = tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in inputs)
        loss = loss_of(kind, engine, inputs, y.to(device), dtype)
        if step == die_at and engine.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        engine.backward(loss)
        if step == die_in_step and engine.rank == 1:
            die_in_zd_step(device, zerod_binary)
        if step == die_in_step and engine.rank == 0 and device.type == "cpu":
            hold_until_the_daemon_lost_rank_1(zerod_binary)
        if step_on_a_thread:
            on_a_new_thread(engine.step)
        else:
            engine.step()
        print(f"loss {step} {loss.item():.9g}", flush=True)
    state = engine.state_dict()
    print(f"state {sum(float(v.double().abs().sum()) for v in state.values()):.9g}")


if __name__ == "__main__":
    main()
