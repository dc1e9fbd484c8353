"""A daemon killed with SIGKILL in the middle of a job: `zerod run` restarts
it and the ranks, they resume from the newest snapshot, and every step from
there on prints the weights an uninterrupted run prints, bit for bit.

    daemon_restart.py <zerod> <resume_trainer>
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from restart_lib import failer, steps_of

zerod, trainer = sys.argv[1], sys.argv[2]
fail = failer("daemon_restart")
STEPS, EVERY = 40, 5


def job(snapshots):
    return f"""return {{
  zero = {{ stage = 3, param_persistence_threshold = 0 }},
  optimizer = {{ type = "adamw", lr = 0.01, weight_decay = 0.01 }},
  snapshot = {{ path = "{snapshots}", every = {EVERY}, keep = 2 }},
}}
"""



with tempfile.TemporaryDirectory(prefix="zerod-restart-") as tmp:
    paths = {}
    for name in ("plain", "killed"):
        os.makedirs(f"{tmp}/{name}")
        with open(f"{tmp}/{name}/job.lua", "w") as f:
            f.write(job(f"{tmp}/{name}/snapshots"))
        paths[name] = f"{tmp}/{name}/job.lua"
    # The reference: the same job, never interrupted.
    # Its daemon runs supervised (the job takes snapshots): `--trace` must
    # reach it.
    trace = f"{tmp}/plain/trace.json"
    ref = subprocess.run([zerod, "run", "--nproc", "2", "--trace", trace, "--job", paths["plain"], "--", trainer,
                          str(STEPS), "0"], capture_output=True, text=True, timeout=300)
    if ref.returncode != 0:
        fail("the uninterrupted run failed", ref.stdout, ref.stderr)
    try:
        with open(trace) as f:
            events = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError) as e:
        fail(f"zerod run --trace {trace} wrote no trace for a job that takes snapshots: {e}", ref.stderr)
    if not any(str(e.get("name", "")).startswith("step ") for e in events):
        fail(f"the trace of the supervised run holds no step ({len(events)} events)", ref.stderr)
    want = [steps_of(ref.stdout, r) for r in (0, 1)]
    if len(want[0]) != STEPS or len(want[1]) != STEPS:
        fail("the uninterrupted run printed too few steps", ref.stdout)

    # The run whose daemon dies.
    # With --trace: the restarted daemon writes its own trace beside the
    # first (it used to write over the first's file).
    killed_trace = f"{tmp}/killed/trace.json"
    p = subprocess.Popen([zerod, "run", "--nproc", "2", "--trace", killed_trace, "--job", paths["killed"], "--",
                          trainer, str(STEPS), "40"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err_lines, out_lines = [], []
    import threading

    def pump(stream, into):
        for line in stream:
            into.append(line)

    threads = [threading.Thread(target=pump, args=(p.stdout, out_lines)),
               threading.Thread(target=pump, args=(p.stderr, err_lines))]
    for t in threads:
        t.start()
    daemon_pid, killed_at = None, None
    deadline = time.time() + 120
    while time.time() < deadline and killed_at is None:
        time.sleep(0.05)
        for line in list(err_lines):
            m = re.search(r"zerod run: daemon pid (\d+)", line)
            if m and daemon_pid is None:
                daemon_pid = int(m.group(1))
        done = steps_of("".join(out_lines), 0)
        # Past a snapshot (step 2*EVERY), before the end: kill the daemon.
        if daemon_pid and done and max(done) >= 2 * EVERY + 2:
            os.kill(daemon_pid, signal.SIGKILL)
            killed_at = max(done)
    if killed_at is None:
        p.kill()
        fail("the run never reached the point to kill its daemon", "".join(out_lines), "".join(err_lines))
    rc = p.wait(timeout=300)
    for t in threads:
        t.join()
    out, err = "".join(out_lines), "".join(err_lines)
    if rc != 0:
        fail(f"zerod run exited with status {rc} after the daemon was killed", out, err)
    if "restart 1 of 3" not in err:
        fail("zerod run did not say it restarted the daemon", err)
    restart_trace = f"{tmp}/killed/trace.restart-1.json"
    if f"to {restart_trace} (" not in err:
        fail("zerod run did not say where the restarted daemon's trace goes", err)
    resumed = [int(m) for m in re.findall(r"\[rank 0\] resumed at (\d+)", out)]
    if not resumed or resumed[-1] % EVERY or resumed[-1] > killed_at:
        fail(f"the ranks did not resume from a snapshot (resumed at {resumed}, killed at step {killed_at})", out, err)
    start = resumed[-1]
    # The first daemon wrote the window (steps 2-6, --trace's default) before
    # it was killed. The restarted one resumed past it (its steps are
    # numbered from the snapshot's, not from 1): it records no step and
    # writes no file, rather than an empty one.
    def traced_steps(path, whose):
        """The steps a trace file holds, failing where it is not whole."""
        try:
            with open(path) as f:
                events = json.load(f)["traceEvents"]
        except (OSError, ValueError, KeyError) as e:
            fail(f"{whose} trace {path} is not there whole: {e}", err)
        return sorted({e["args"]["step"] for e in events if e.get("cat") == "step"})

    traced = traced_steps(killed_trace, "the first daemon's")
    if traced != [2, 3, 4, 5, 6]:
        fail(f"the first daemon's trace holds steps {traced}, not 2-6", err)
    if start >= 6 and os.path.exists(restart_trace):
        with open(restart_trace) as f:
            fail(f"the daemon restarted past the traced steps wrote {restart_trace}", f.read()[:2000], err)
    if start < 6:
        # Resumed inside the window: the restarted daemon traces the rest of it.
        again = traced_steps(restart_trace, "the restarted daemon's")
        if again != list(range(max(start + 1, 2), 7)):
            fail(f"the restarted daemon's trace holds steps {again}, not {max(start + 1, 2)}-6", err)
    got = [steps_of(out.split(f"resumed at {start}", 1)[1], r) for r in (0, 1)]
    for r in (0, 1):
        for s in range(start, STEPS):
            if got[r].get(s) != want[r][s]:
                fail(f"rank {r} step {s}: {got[r].get(s)} after the restart, {want[r][s]} uninterrupted", out)
    print(f"daemon_restart: the daemon killed at step {killed_at}, restarted; the ranks resumed at step {start} "
          f"and steps {start}..{STEPS - 1} match the uninterrupted run bit for bit on both ranks")
