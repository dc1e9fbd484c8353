"""Ctrl-C in a trainer leaves the daemon and the other ranks in a clean
state: the interrupted rank exits, the others get PeerLostError naming it
from their next call (at once, not after the collective timeout), `zerod run`
reports it and exits, and a `zerod serve` daemon goes on to serve the next job."""
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import EXAMPLES, HERE, ZEROD, rank_env, serve, served_ranks, split_ranks, zerod_run

SCRIPT = os.path.join(HERE, "interrupt_rank.py")
STAGE3 = ('return { optimizer = { type = "adamw", lr = 1e-3 }, '
          'zero = { stage = 3, param_persistence_threshold = 0 } }')


def gone(pid):
    try:
        os.kill(pid, 0)
        return False
    except ProcessLookupError:
        return True


def pids(ranks):
    return [int(line.split()[3]) for lines in ranks.values() for line in lines if line.startswith("rank ")
            and " pid " in line]


@pytest.mark.parametrize("where", ["forward", "backward", "step"])
def test_ctrl_c_in_one_rank(where, tmp_job):
    start = time.monotonic()
    rc, ranks, out = zerod_run(2, tmp_job(STAGE3), SCRIPT, env=rank_env(INTERRUPT=f"1:{where}"), timeout=120)
    assert time.monotonic() - start < 60, "a rank waited for the collective timeout"
    assert rc != 0
    assert any(line == "KeyboardInterrupt" for line in ranks[1]), out
    assert any("zerod.PeerLostError: ZD_ERR_PEER_LOST" in line and "rank 1" in line for line in ranks[0]), out
    assert "zerod run: rank 1 (pid" in out and "SIGINT" in out, out
    assert all(gone(p) for p in pids(ranks))


def wait_for(proc_lines, pattern, proc, timeout=60):
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if pattern(seen):
            return seen
    pytest.fail("did not see the expected output:\n" + "".join(seen))


def test_ctrl_c_to_zerod_run_stops_every_rank(tmp_job):
    proc = subprocess.Popen([ZEROD, "run", "--nproc", "2", "--job", tmp_job(STAGE3), "--", sys.executable, SCRIPT],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=rank_env())
    seen = wait_for(None, lambda s: sum("] step 2" in line for line in s) == 2, proc)
    proc.send_signal(signal.SIGINT)  # what the terminal's Ctrl-C sends
    rest, _ = proc.communicate(timeout=60)
    ranks = split_ranks("".join(seen) + rest)
    assert proc.returncode == 128 + signal.SIGINT, "".join(seen) + rest
    assert all(gone(p) for p in pids(ranks))


def test_ctrl_c_at_the_terminal_lets_a_supervised_job_save(tmp_path, tmp_job):
    """A job that takes snapshots runs its daemon supervised. A terminal's
    Ctrl-C (SIGINT to zerod run's whole process group) reaches the rank once,
    through zerod run, as without snapshots, and the daemon serves it until
    it ends: its checkpoint on Ctrl-C is saved. The daemon used to be in
    zerod run's group, and zerod run also stopped it at the first signal:
    it stopped at once, and the save failed with PeerLostError."""
    job = tmp_job(f'return {{ optimizer = {{ type = "adamw", lr = 1e-3 }}, '
                  f'snapshot = {{ path = "{tmp_path}/snaps", every = 1000 }} }}')
    proc = subprocess.Popen([ZEROD, "run", "--nproc", "1", "--job", job, "--", sys.executable, SCRIPT],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env=rank_env(SAVE_ON_CTRL_C=tmp_path / "ckpt"))
    seen = wait_for(None, lambda s: any("] step 2" in line for line in s), proc)
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal's Ctrl-C sends
    rest, _ = proc.communicate(timeout=60)
    out = "".join(seen) + rest
    assert "daemon pid" in out, "the daemon was not supervised: " + out
    assert "rank 0 saved at step" in out and "PeerLostError" not in out, out
    assert proc.returncode == 0, out
    assert (tmp_path / "ckpt" / "latest").exists(), out


def test_the_main_job_leaves_cleanly_on_ctrl_c(tmp_path):
    job = os.path.join(EXAMPLES, "gpt_job.lua")
    proc = subprocess.Popen([ZEROD, "run", "--nproc", "2", "--job", job, "--", sys.executable,
                             os.path.join(EXAMPLES, "train_gpt.py"), "--max-chars", "50000", "--layers", "1",
                             "--embd", "32", "--steps", "100000"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=rank_env())
    seen = wait_for(None, lambda s: any("model:" in line for line in s), proc)
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    out = "".join(seen) + rest
    assert proc.returncode == 128 + signal.SIGINT, out
    for r in (0, 1):
        assert f"rank {r}: interrupted at step" in out, out
    assert "Traceback" not in out, out


def test_serve_daemon_serves_the_next_job_after_an_interrupted_one(tmp_path, tmp_job):
    sock = str(tmp_path / "zerod.sock")
    job = tmp_job(STAGE3)
    daemon = serve(2, job, sock)
    try:

        def ranks(interrupt, steps):
            done = served_ranks(sock, job, [sys.executable, SCRIPT, str(steps)], INTERRUPT=interrupt)
            return [out for _, out in done], [rc for rc, _ in done]

        (out0, out1), codes = ranks("1:backward", 1000)
        assert codes == [1, -signal.SIGINT], out0 + out1
        assert "zerod.PeerLostError" in out0 and "KeyboardInterrupt" in out1
        (out0, out1), codes = ranks("", 5)
        assert codes == [0, 0], out0 + out1
        assert "rank 0 done" in out0 and "rank 1 done" in out1
        assert daemon.poll() is None, "the daemon exited"
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
