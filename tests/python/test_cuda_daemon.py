"""The daemon on a GPU (issue 32): ranks in their own processes train on
GPU memory the daemon owns. Under `zerod run`, each rank's device pool is
CUDA memory the daemon allocated and exported to the rank (a file
descriptor over the socket), its views are device pointers in the rank's
process, and the rank's stream and the daemon's are ordered through
stream signals in a host page both map (engine/device/cuda_shared.h);
zerod.torch wraps the views with DLPack as it does
embedded.

The reference is the same job embedded on the same GPU, and plain PyTorch's
AdamW on the whole global batch there (models.torch_reference):
  - 1 rank under the daemon against embedded: the same kernels on the same
    values in the same order, so the same losses within what a GPU's
    backward leaves to chance (fp32 1e-5, bf16 2e-3 relative);
  - 2 ranks on one GPU (each its own process) against plain PyTorch on the
    global batch, with test_parity.py's tolerances (fp32 1e-4; bf16 every
    step 5%, every 10-step mean 2%), at stage 3 with and without the
    optimizer on the host, and the two ranks ending with the same weights;
  - a rank killed mid-step, whose job keeps its state in the daemon: the
    ranks started again resume on the GPU and match the uninterrupted job;
    killed between its forward and its backward, and inside zd_step with
    its record queued behind GPU work (the daemon's side of the step
    waiting for it);
  - zd_step called from a thread that never touched CUDA.

ctest runs this through gpu_or_skip.py: SKIPPED, with the reason, where
torch sees no GPU or libzerod has no cuda device; a plain pytest run skips
it with the same reason.
"""
import subprocess
import sys

import pytest
import torch

from conftest import HERE, losses_match, rank_env, zerod_run
from gpu_or_skip import skip_module_without_gpu
from kept_state import DIE_AT, keeping, killed_rank_resumes
from models import job, torch_reference

skip_module_without_gpu()

STEPS = 30


def losses_of(lines):
    return [float(line.split()[2]) for line in lines if line.startswith("loss ")]


def cuda_job(precision, stage, offload=False):
    # The job models.job writes, on the GPU.
    return job(precision, stage, offload=offload).replace("return {", 'return {\n  device = "cuda",', 1)


def embedded(kind, precision, path):
    p = subprocess.run([sys.executable, f"{HERE}/cuda_rank.py", kind, precision, str(STEPS), path],
                       capture_output=True, text=True, env=rank_env(), timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return losses_of(p.stdout.splitlines())


def under_daemon(nproc, kind, precision, path):
    rc, ranks, out = zerod_run(nproc, path, f"{HERE}/cuda_rank.py", kind, precision, STEPS, timeout=300)
    assert rc == 0, out
    per_rank = [losses_of(ranks[r]) for r in range(nproc)]
    states = [[line for line in ranks[r] if line.startswith("state")] for r in range(nproc)]
    assert all(s == states[0] for s in states), "the ranks ended with different weights"
    return [sum(v) / nproc for v in zip(*per_rank)]


@pytest.mark.parametrize("stage,offload", [(0, False), (3, False), (3, True)])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_one_rank_under_the_daemon_trains_as_embedded(precision, stage, offload, tmp_job):
    path = tmp_job(cuda_job(precision, stage, offload))
    want = embedded("gpt", precision, path)
    got = under_daemon(1, "gpt", precision, path)
    assert len(got) == len(want) == STEPS
    tol = 1e-5 if precision == "fp32" else 2e-3
    worst = max(abs(g - w) / max(1.0, abs(w)) for g, w in zip(got, want))
    print(f"{precision} stage {stage}{' +host' if offload else ''}: daemon vs embedded, worst {worst:.2e}")
    assert worst <= tol, f"{got} vs {want}"


@pytest.mark.parametrize("offload", [False, True])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_two_ranks_on_one_gpu_train_as_plain_pytorch(precision, offload, tmp_job):
    got = under_daemon(2, "gpt", precision, tmp_job(cuda_job(precision, 3, offload)))
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    worst = losses_match(got, torch_reference("gpt", dtype, STEPS, device="cuda"), precision)
    print(f"{precision} 2 ranks on one GPU{' +host' if offload else ''}: vs plain PyTorch, worst {worst:.2e}")


@pytest.mark.parametrize("in_step", [False, True], ids=["between_forward_and_backward", "in_zd_step"])
def test_a_killed_rank_leaves_the_state_on_the_gpu_and_the_ranks_resume(in_step, tmp_job, tmp_path):
    """Issue 32 section 1: a trainer killed mid-step (between its forward and
    its backward, kernels still queued on its stream) leaves the daemon's
    GPU state intact; with daemon.keep_state the ranks that start again
    resume there, at the step after the last one applied, and train on as
    an uninterrupted job does (fp32, within 1e-5). Also the release of a
    stream signal whose recording process died (interprocess events, which
    did this before, hung here on an H200).

    in_zd_step: the trainer is killed while its zd_step waits for the
    daemon, its record of kTrainerDone queued behind 15 s of GPU work
    (torch.cuda._sleep): the daemon's session thread is then inside that
    step, blocked on the CPU behind its stream's wait for the record, and
    only the connection's hangup watch (daemon/server/trainer_gone_watch.h)
    can release it. Without it (as read from the code; not yet run on a
    GPU) that thread never returns: rank 1 is never freed, so the resumed
    rank 1 is refused as still connected, and zerod serve does not stop on
    SIGTERM (Server::stop joins that thread). The hangup during zd_step
    also marks rank 1 lost at once, which breaks the model before the step
    applies (its collectives fail), so the ranks resume at that step, as
    python.kept_state's in-step case does on the cpu device; the daemon's
    log says the record never ran."""
    # 90 s: the resumed ranks take well under a minute on a GPU, and a
    # hang (an H200 saw one, 2026-11-27) spends GPU time that is scarce.
    worst = killed_rank_resumes("cuda_rank.py", tmp_job(keeping(cuda_job("fp32", 3))), tmp_path,
                                resume_timeout=90, in_step=in_step, gpu=True)
    print(f"killed {'in zd_step' if in_step else 'mid-step'} of step {DIE_AT}, resumed on the GPU: against the "
          f"uninterrupted job, worst {worst:.2e}")
    assert worst <= 1e-5


def test_zd_step_from_a_thread_that_never_touched_cuda(tmp_job):
    """Each engine.step() on a new thread, with no CUDA context current
    there: libzerod makes the rank's GPU current itself around its record
    of kTrainerDone and its wait for kZerodDone (trainer_link.cpp,
    OnRankGpu). Without that, as read from the code (not yet run on a
    GPU), the driver refuses the record on the default stream (no current
    context), or it goes to whichever GPU the thread has current."""
    rc, ranks, out = zerod_run(1, tmp_job(cuda_job("fp32", 0)), f"{HERE}/cuda_rank.py", "gpt", "fp32", 5,
                               timeout=300, env=rank_env(ZEROD_TEST_STEP_ON_A_THREAD=1))
    assert rc == 0, out
    assert len(losses_of(ranks[0])) == 5, out
