"""A job that takes snapshots runs its daemon supervised (`zerod run`
restarts a daemon that dies). Stopping the job is not a death: SIGTERM to
`zerod run`, or to its daemon, ends the job without a restart (both used to
restart it, up to --restarts times: `zerod serve` takes SIGTERM itself and
exits 0, which the supervisor did not tell from a crash). SIGKILL to the
daemon still restarts it.

    supervised_stop.py <zerod>
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

zerod = sys.argv[1]
# A rank that ends with status 3 as soon as its daemon stops answering
# (as a trainer does when its connection breaks), or with 0 after 8 s.
RANK = """
import os, socket, sys, time
path = os.environ["ZEROD_ENDPOINT"][len("unix:"):]
t0 = time.time()
while time.time() - t0 < 8:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
    except OSError:
        sys.exit(3)
    finally:
        s.close()
    time.sleep(0.2)
"""


def fail(why, err=""):
    print("supervised_stop: FAILED:", why)
    print(err)
    sys.exit(1)


def run(tmp, kill):
    """Starts a 1-rank job (RANK), delivers kill(run_pid,
    daemon_pid) once the daemon serves, and returns (exit status, stderr)."""
    job = f"{tmp}/job.lua"
    with open(job, "w") as f:
        f.write(f'return {{ optimizer = {{ type = "sgd", lr = 0.1 }}, snapshot = {{ path = "{tmp}/snaps", every = 5 }} }}\n')
    p = subprocess.Popen([zerod, "run", "--nproc", "1", "--restarts", "1", "--job", job, "--", sys.executable, "-c",
                          RANK],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = ""
    deadline = time.time() + 30
    daemon = None
    while time.time() < deadline and daemon is None:
        line = p.stderr.readline()
        err += line
        m = re.search(r"zerod run: daemon pid (\d+)", line)
        if m:
            daemon = int(m.group(1))
    if daemon is None:
        p.kill()
        fail("the daemon never started", err)
    time.sleep(0.5)
    t0 = time.time()
    kill(p.pid, daemon)
    try:
        rest = p.communicate(timeout=60)[1]
    except subprocess.TimeoutExpired:
        p.kill()
        fail("zerod run did not end within 60 s", err + p.communicate()[1])
    return p.returncode, err + rest, time.time() - t0


with tempfile.TemporaryDirectory(prefix="zerod-stop-") as tmp:
    for name, kill in (("SIGTERM to zerod run", lambda run_pid, d: os.kill(run_pid, signal.SIGTERM)),
                       ("SIGTERM to its daemon", lambda run_pid, d: os.kill(d, signal.SIGTERM))):
        os.makedirs(f"{tmp}/{len(name)}")
        rc, err, took = run(f"{tmp}/{len(name)}", kill)
        if "restarting" in err or len(re.findall(r"daemon pid \d+", err)) != 1:
            fail(f"{name}: the job was restarted", err)
        if took > 20:
            fail(f"{name}: zerod run took {took:.1f} s to end", err)
        print(f"supervised_stop: {name}: ended in {took:.1f} s (status {rc}), no restart")
    # A daemon killed outright is a death: restarted once, and the restarted
    # rank ends the job.
    os.makedirs(f"{tmp}/kill")
    rc, err, _ = run(f"{tmp}/kill", lambda run_pid, d: os.kill(d, signal.SIGKILL))
    if "restarting" not in err:
        fail("SIGKILL to the daemon: not restarted", err)

    # `zerod run` killed outright (SIGKILL: nothing of it runs): its daemon
    # stops too, and so its ranks. Both used to go on without a launcher.
    def gone(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
        except OSError:
            return True
    os.makedirs(f"{tmp}/runkill")
    seen = {}

    def kill_run(run_pid, d):
        seen["daemon"] = d
        os.kill(run_pid, signal.SIGKILL)
    rc, err, _ = run(f"{tmp}/runkill", kill_run)
    t0 = time.time()
    while time.time() - t0 < 10 and not gone(seen["daemon"]):
        time.sleep(0.1)
    if not gone(seen["daemon"]):
        os.kill(seen["daemon"], signal.SIGKILL)
        fail("SIGKILL to zerod run: its daemon was still running 10 s later", err)
    print("supervised_stop: SIGKILL to zerod run: its daemon stopped")
    print("supervised_stop: SIGKILL to the daemon: restarted; the stops were not")
