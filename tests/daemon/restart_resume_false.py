"""snapshot.resume = false keeps a job off an earlier run's snapshots, not off
its own: a daemon killed mid-run is restarted by `zerod run` and its ranks
resume from the newest snapshot this run wrote, bit for bit as an
uninterrupted run goes on from there (the restarted daemon used to read
resume = false from the same script and start the job over at step 0).

The snapshot path holds an earlier run's snapshots of later steps (20 and
25, of another learning rate): the run starts at step 0 anyway, and its
restart takes neither of them. A daemon killed before the run wrote any
snapshot starts the job over, again not from the earlier run's.

    restart_resume_false.py <zerod> <resume_trainer>
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from restart_lib import failer, steps_of

zerod, trainer = sys.argv[1], sys.argv[2]
fail = failer("restart_resume_false")
STEPS, EVERY = 30, 5


def job(path, lr, resume):
    return f"""return {{
  zero = {{ stage = 3, param_persistence_threshold = 0 }},
  optimizer = {{ type = "adamw", lr = {lr}, weight_decay = 0.01 }},
  snapshot = {{ path = "{path}", every = {EVERY}, keep = 2, resume = {"true" if resume else "false"} }},
}}
"""



def run(job_path, steps, ms=0):
    p = subprocess.run([zerod, "run", "--nproc", "2", "--job", job_path, "--", trainer, str(steps), str(ms)],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        fail(f"zerod run --job {job_path} failed", p.stdout, p.stderr)
    return p


def killed_run(job_path, until):
    """Runs the job (2 ranks, 30 ms a step), SIGKILLs its first daemon once
    until(rank 0's steps so far) holds, and returns (stdout, stderr, rank
    0's last step before the kill)."""
    p = subprocess.Popen([zerod, "run", "--nproc", "2", "--job", job_path, "--", trainer, str(STEPS), "30"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out_lines, err_lines = [], []
    pumps = [threading.Thread(target=lambda s=s, into=into: into.extend(s))
             for s, into in ((p.stdout, out_lines), (p.stderr, err_lines))]
    for t in pumps:
        t.start()
    daemon_pid, killed_at = None, None
    deadline = time.time() + 60
    while time.time() < deadline and killed_at is None and p.poll() is None:
        time.sleep(0.01)
        if daemon_pid is None:
            m = re.search(r"zerod run: daemon pid (\d+)", "".join(err_lines))
            daemon_pid = int(m.group(1)) if m else None
        done = steps_of("".join(out_lines), 0)
        if daemon_pid and until(done):
            os.kill(daemon_pid, signal.SIGKILL)
            killed_at = max(done) if done else -1
    if killed_at is None:
        p.kill()
    rc = p.wait(timeout=120)
    for t in pumps:
        t.join()
    out, err = "".join(out_lines), "".join(err_lines)
    if killed_at is None:
        fail("the run never reached the point to kill its daemon", out, err)
    if rc != 0:
        fail(f"zerod run exited with status {rc} after its daemon was killed", out, err)
    if "(restart 1 of 3)" not in err:
        fail("zerod run did not restart the daemon", err)
    return out, err, killed_at


with tempfile.TemporaryDirectory(prefix="zerod-resume-false-") as tmp:
    snaps = f"{tmp}/snaps"
    for name, text in (("earlier", job(snaps, 0.02, True)), ("job", job(snaps, 0.01, False)),
                       ("ref", job(f"{tmp}/ref-snaps", 0.01, False))):
        with open(f"{tmp}/{name}.lua", "w") as f:
            f.write(text)
    # The reference: the job uninterrupted, in a path of its own.
    ref = run(f"{tmp}/ref.lua", STEPS)
    want = [steps_of(ref.stdout, r) for r in (0, 1)]
    if len(want[0]) != STEPS or len(want[1]) != STEPS:
        fail("the uninterrupted run printed too few steps", ref.stdout)

    # An earlier run over the path (another learning rate) leaves steps 20, 25.
    def earlier_run():
        run(f"{tmp}/earlier.lua", 25)
        left = sorted(d for d in os.listdir(snaps) if d.startswith("step-"))
        if left != ["step-000000000020", "step-000000000025"]:
            fail(f"the earlier run left {left} under {snaps}")

    earlier_run()
    manifest = f"{snaps}/step-{2 * EVERY:012d}/zerod-checkpoint.txt"
    out, err, killed_at = killed_run(f"{tmp}/job.lua", lambda done: os.path.exists(manifest))
    # Before the kill: a fresh start at step 0, not the earlier run's step 25.
    first = out.split("resumed at", 1)[0]
    if steps_of(first, 0).get(0) != want[0][0]:
        fail("the run did not start at step 0 with resume = false over an earlier run's snapshots", out, err)
    if "they resume from this run's newest snapshot" not in err:
        fail("zerod run did not say the restart resumes from this run's snapshot", err)
    resumed = [int(s) for s in re.findall(r"\[rank 0\] resumed at (\d+)", out)]
    # Step N's snapshot holds N updates: the state after the line "step N-1".
    if len(resumed) != 1 or resumed[0] % EVERY or not 2 * EVERY <= resumed[0] <= killed_at + 1:
        fail(f"the restart did not resume from this run's newest snapshot (resumed at {resumed}; step "
             f"{2 * EVERY}'s snapshot was on disk, the daemon killed after the line of step {killed_at})", out, err)
    start = resumed[0]
    got = [steps_of(out.split(f"resumed at {start}", 1)[1], r) for r in (0, 1)]
    for r in (0, 1):
        for s in range(start, STEPS):
            if got[r].get(s) != want[r][s]:
                fail(f"rank {r} step {s}: {got[r].get(s)} after the restart, {want[r][s]} uninterrupted", out, err)

    # Killed before the run wrote a snapshot: the restart starts over.
    shutil.rmtree(snaps)
    earlier_run()
    out2, err2, killed_at2 = killed_run(f"{tmp}/job.lua", lambda done: len(done) >= 2)
    if killed_at2 >= EVERY - 1:
        fail(f"the daemon was killed after step {killed_at2}, past the first snapshot", out2, err2)
    if "this run wrote no snapshot yet, so they start the job over" not in err2:
        fail("zerod run did not say the restart starts the job over", err2)
    if "resumed at" in out2:
        fail("the restart of a run that wrote no snapshot resumed from the earlier run's", out2, err2)
    lines0 = [line for line in out2.splitlines() if line.startswith("[rank 0] step ")]
    last = f"[rank 0] step {STEPS - 1} {want[0][STEPS - 1]}"
    if lines0.count(f"[rank 0] step 0 {want[0][0]}") != 2 or lines0[-1] != last:
        fail("the restart did not start the job over and run it as an uninterrupted run does", out2, err2)
    print(f"restart_resume_false: killed at step {killed_at}, the restart resumed at step {start} (this run's), "
          f"steps {start}..{STEPS - 1} match the uninterrupted run; killed at step {killed_at2} before any "
          f"snapshot, it started over; the earlier run's steps 20 and 25 were never resumed")
