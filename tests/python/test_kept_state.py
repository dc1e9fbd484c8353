"""zerod.torch under a daemon whose job keeps its state (daemon.keep_state):
a rank killed mid-step leaves the model with the daemon, and the ranks
started again resume it at the step after the last one applied, training
on exactly as the uninterrupted job does (the cpu device: the same bits).
test_cuda_daemon.py runs the same on a GPU."""
from kept_state import killed_rank_resumes, keeping
from models import job


def test_a_killed_rank_leaves_the_state_with_the_daemon_and_the_ranks_resume(tmp_job, tmp_path):
    assert killed_rank_resumes("train_rank.py", tmp_job(keeping(job("fp32", 3))), tmp_path) == 0.0


def test_a_rank_killed_inside_zd_step_leaves_that_step_unapplied(tmp_job, tmp_path):
    """Rank 1 killed while the daemon runs its zd_step, which waits in a
    collective for rank 0: the hangup during the call marks the rank lost
    at once, so the step fails on both ranks before its update, and the
    ranks resume at that step, not the one after it."""
    assert killed_rank_resumes("train_rank.py", tmp_job(keeping(job("fp32", 3))), tmp_path, in_step=True) == 0.0
