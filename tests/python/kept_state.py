"""A rank killed mid-step under a daemon whose job keeps its state
(daemon.keep_state): the daemon keeps the model where it is (host memory,
or the GPU's), and the ranks started again resume at the step after the
last one applied and train on as the uninterrupted job does. Run on the
cpu device by test_kept_state.py and on a GPU by test_cuda_daemon.py."""
import signal
import subprocess
import sys

from conftest import HERE, ZEROD, serve, served_ranks, zerod_run

STEPS, DIE_AT = 10, 5


def losses(lines):
    return {int(line.split()[1]): float(line.split()[2]) for line in lines if line.startswith("loss ")}


def keeping(job_text):
    """The job, keeping its state in the daemon, and failing a lost rank's
    peers within 20 s."""
    return job_text.replace("return {", "return {\n  daemon = { keep_state = true },\n  comm = { timeout = 20 },", 1)


def killed_rank_resumes(rank_script, job, tmp_path, resume_timeout=180, in_step=False, gpu=False):
    """rank_script (train_rank.py's arguments) under `zerod serve` with `job`
    (a path; keeping its state): rank 1 dies in step DIE_AT, between its
    forward and its backward, and the ranks started again resume there,
    within resume_timeout seconds. in_step: rank 1 dies inside that step's
    zd_step instead (ZEROD_TEST_DIE_IN_STEP), killed once `zerod status`
    shows it there, the daemon's side of the step waiting in its first
    collective for rank 0, which holds its own step back until `zerod
    status` shows rank 1 lost (the cpu device), or, on a GPU, behind its
    stream's wait for the record of kTrainerDone that rank 1 queued behind
    GPU work.
    The hangup during zd_step marks rank 1 lost at once
    (daemon/server/trainer_gone_watch.h), which breaks the model before
    that step applies: the collectives before the update fail, on both
    ranks, and they resume at DIE_AT as well. The daemon's log names the
    call, and on a GPU says that the dead rank's record never ran and its
    wait was released. Returns the resumed losses' worst relative
    difference from the uninterrupted job's."""
    command = [sys.executable, f"{HERE}/{rank_script}", "gpt", "fp32", str(STEPS)]
    die = {"ZEROD_TEST_DIE_IN_STEP": DIE_AT, "ZEROD_TEST_ZEROD": ZEROD} if in_step else {"ZEROD_TEST_DIE_AT": DIE_AT}
    rc, ranks, out = zerod_run(2, job, *command[1:], timeout=300)
    assert rc == 0, out
    want = losses(ranks[0])
    sock = str(tmp_path / "zerod.sock")
    daemon = serve(2, job, sock)
    try:
        (rc0, out0), (rc1, out1) = served_ranks(sock, job, command, timeout=180, **die)
        assert rc1 == -signal.SIGKILL, f"rank 1 did not die as the test asked (exit status {rc1}): {out1}"
        assert rc0 != 0 and "PeerLostError" in out0, out0
        resumed = served_ranks(sock, job, command, timeout=resume_timeout)
        for r, (rc, text) in enumerate(resumed):
            assert rc == 0, f"rank {r}: {text}"
            assert f"resumed at step {DIE_AT}" in text, f"rank {r}: {text}"
        got = losses(resumed[0][1].splitlines())
        assert sorted(got) == list(range(DIE_AT, STEPS)), resumed[0][1]
        worst = max(abs(got[s] - want[s]) / max(1.0, abs(want[s])) for s in got)
    finally:
        log = stopped(daemon)
    if in_step:
        assert "its connection closed during zd_step" in log, log
        if gpu:
            assert "its last record on its GPU stream never ran" in log, log
    return worst


def stopped(daemon):
    """Stops `zerod serve` (SIGTERM) and returns its log."""
    daemon.terminate()
    try:
        return daemon.communicate(timeout=30)[0]
    except subprocess.TimeoutExpired:
        daemon.kill()
        raise AssertionError("zerod serve did not stop within 30 s of SIGTERM: " + daemon.communicate()[0])
