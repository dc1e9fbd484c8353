"""Ranks started by another launcher than `zerod run` (issue 36 §1): each
rank finds its node's daemon, or the first of them starts it on demand
(libzerod/src/node_daemon.h), and it ends when the ranks are gone. Every
launcher that installs here trains the same GPT as `zerod run --nproc 2`,
step for step, bit for bit: torchrun, mpirun (Open MPI), srun (its
environment, as Slurm sets it: Slurm itself does not install here),
`accelerate launch` and Lightning's own launcher (Trainer(devices=2)).
ZerodAccelerator's loop trains as under `zerod run` under accelerate launch,
mpirun and srun's environment, and a zerod.deepspeed loop under DeepSpeed's
own launcher (deepspeed.launcher.launch). A rank that dies is named with its pid and no daemon
is left behind, and the next launch removes the files of one that ended (keeping a week a log
that says more, also one a launch on the same key would have started over); what cannot be served
is refused, saying why.
"""
import base64
import glob
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import ZEROD, rank_env, reserved_port, zerod_run

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "jobs", "gpt_adam_job.lua")
RANK = os.path.join(HERE, "launcher_rank.py")
STEPS = 6
DS_CONFIG = "adam_l2_stage2_warmupdecay"  # test_deepspeed_side_by_side's: stage 2, Adam, a warm-up then decay


def launch_env(tmp_path):
    env = rank_env()
    for k in list(env):  # nothing of an enclosing launcher or zerod run
        if k in ("ZEROD_ENDPOINT", "ZEROD_RANK", "ZEROD_WORLD_SIZE", "ZEROD_LOCAL_RANK", "ZEROD_LOCAL_WORLD_SIZE",
                 "ZEROD_JOB", "ZEROD_JOB_KEY", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                 "MASTER_ADDR", "MASTER_PORT") or k.startswith(("OMPI_", "PMIX_", "SLURM_", "PMI_")):
            del env[k]
    # The on-demand daemons of this test in a directory of its own, short
    # enough for a socket path (else they go under /tmp/zerod-launch-<uid>).
    env["XDG_RUNTIME_DIR"] = short_dir()
    return env


def short_dir():
    return tempfile.mkdtemp(prefix="zl-", dir="/tmp")


def daemons(env):
    """The on-demand daemons serving sockets under this test's directory."""
    out = subprocess.run(["pgrep", "-af", "zerod serve --until-done"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if env["XDG_RUNTIME_DIR"] in line]


def no_daemon_left(env, within=10.0):
    deadline = time.time() + within
    while daemons(env) and time.time() < deadline:
        time.sleep(0.1)
    assert not daemons(env), f"an on-demand daemon outlived its ranks: {daemons(env)}"


def run(cmd, env, timeout=300):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def ranks_of(out_dir, world=2):
    got = {}
    for r in range(world):
        path = out_dir / f"rank{r}.txt"
        assert path.exists(), f"rank {r} wrote nothing"
        got[r] = path.read_text().splitlines()
    return got


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """`zerod run --nproc 2`: what every launcher must reproduce."""
    tmp = tmp_path_factory.mktemp("zerod_run")
    out = tmp / "out"
    out.mkdir()
    env = launch_env(tmp)
    code, text = run([ZEROD, "run", "--nproc", "2", "--job", JOB, "--", sys.executable, RANK, JOB, str(out),
                      str(STEPS)], env)
    assert code == 0, text
    got = ranks_of(out)
    assert got[0][0] == "rank 0 of 2" and got[1][0] == "rank 1 of 2"
    assert len(got[0]) == STEPS + 2
    return got


def check_same(got, reference):
    for r in (0, 1):
        assert got[r] == reference[r], f"rank {r}:\n{got[r]}\nzerod run:\n{reference[r]}"


def test_a_reserved_port_is_kept_from_others_but_not_from_the_launchers_store():
    """conftest.reserved_port, where the launches of the Python tests take
    their MASTER_PORT: while the test holds it, a socket that binds it as
    most programs do (no SO_REUSEADDR) is refused; the port looked up and
    closed that it replaces was free for anyone. torch's TCPStore, what a
    launcher listens with there, still binds it and serves."""
    import errno
    import socket
    from datetime import timedelta

    import torch.distributed

    with reserved_port() as port:
        with socket.socket() as other:
            with pytest.raises(OSError) as taken:
                other.bind(("", port))
            assert taken.value.errno == errno.EADDRINUSE
        store = torch.distributed.TCPStore("127.0.0.1", port, 1, True, timeout=timedelta(seconds=30))
        store.set("k", "v")
        assert store.get("k") == b"v" and store.port == port
        del store


def test_torchrun(reference, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    env = launch_env(tmp_path)
    code, text = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", RANK,
                      JOB, str(out), str(STEPS)], env)
    assert code == 0, text
    check_same(ranks_of(out), reference)
    no_daemon_left(env)
    logs = glob.glob(os.path.join(env["XDG_RUNTIME_DIR"], "zerod-launch", "job-*.log"))
    assert len(logs) == 1, f"one daemon for the node, not {len(logs)}"
    assert "every rank has left; stopping" in open(logs[0]).read()


def test_torchrun_twice_in_a_row(reference, tmp_path):
    """torchrun's default rendezvous repeats between launches: a second
    launch right after the first still trains (its own daemon, or the first
    one's while it lingers). Both launch on one port, as torchrun's default
    would repeat: a reserved one (a fixed port may be another run's)."""
    env = launch_env(tmp_path)
    with reserved_port() as port:
        for i in range(2):
            out = tmp_path / f"out{i}"
            out.mkdir()
            code, text = run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                              "--master_port", str(port), RANK, JOB, str(out), str(STEPS)], env)
            assert code == 0, text
            check_same(ranks_of(out), reference)
    no_daemon_left(env)


def mpirun_two(env, *exported):
    """The start of an `mpirun -np 2` command line as these tests run it
    (skipped without Open MPI): as root, oversubscribed on a small machine
    (set in `env`), passing ZEROD_LIB, PYTHONPATH, XDG_RUNTIME_DIR and
    `exported` on to the ranks."""
    mpirun = shutil.which("mpirun")
    if not mpirun:
        pytest.skip("no mpirun (Debian: openmpi-bin)")
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    cmd = [mpirun, "-np", "2", "--bind-to", "none"]
    for name in ("ZEROD_LIB", "PYTHONPATH", "XDG_RUNTIME_DIR", *exported):
        cmd += ["-x", name]
    return cmd


def test_mpirun(reference, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    env = launch_env(tmp_path)
    code, text = run(mpirun_two(env) + [sys.executable, RANK, JOB, str(out), str(STEPS)], env)
    assert code == 0, text
    check_same(ranks_of(out), reference)
    no_daemon_left(env)


def test_two_launches_share_one_serve_jobs(reference, tmp_path):
    """A user's long-running `zerod serve --jobs`: a torchrun launch and an
    mpirun launch at the same time, both pointed at it with ZEROD_ENDPOINT,
    are two jobs (each has a rank 0 and a rank 1) and each trains as `zerod
    run --nproc 2` does; the daemon serves on after them until SIGTERM."""
    env = launch_env(tmp_path)
    mpirun = mpirun_two(env, "ZEROD_ENDPOINT")
    sock = os.path.join(env["XDG_RUNTIME_DIR"], "serve.sock")
    log = open(tmp_path / "serve.log", "w")
    serve = subprocess.Popen([ZEROD, "serve", "--jobs", "--socket", sock], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 10
        while not os.path.exists(sock) and time.time() < deadline:
            time.sleep(0.05)
        assert os.path.exists(sock), open(tmp_path / "serve.log").read()
        env["ZEROD_ENDPOINT"] = "unix:" + sock
        outs = [tmp_path / "torchrun", tmp_path / "mpirun"]
        for o in outs:
            o.mkdir()
        cmds = [[sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", RANK, JOB,
                 str(outs[0]), str(STEPS)],
                mpirun + [sys.executable, RANK, JOB, str(outs[1]), str(STEPS)]]
        procs = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for c in cmds]
        texts = [p.communicate(timeout=300)[0] for p in procs]
        for p, t in zip(procs, texts):
            assert p.returncode == 0, t
        for o in outs:
            check_same(ranks_of(o), reference)
        assert serve.poll() is None, "zerod serve --jobs ended with its jobs"
        assert not daemons(env), "the ranks started a daemon of their own beside the one they were pointed at"
        status = subprocess.run([ZEROD, "status", "--socket", sock], env=env, capture_output=True, text=True)
        assert status.returncode == 0, status.stderr
        assert "serving 0 jobs; their planned model state holds 0 B" in status.stdout, status.stdout
    finally:
        serve.send_signal(signal.SIGTERM)
        code = serve.wait(timeout=30)
        log.close()
    text = open(tmp_path / "serve.log").read()
    assert code == 0, text
    assert text.count("zerod serve: serving job") == 2, text


def test_srun_environment(reference, tmp_path):
    """What srun sets for a 2-task step on one node (Slurm does not install
    here): the ranks read it as they read srun's."""
    out = tmp_path / "out"
    out.mkdir()
    env = launch_env(tmp_path)
    procs = []
    for r in range(2):
        e = dict(env, SLURM_JOB_ID="4242", SLURM_STEP_ID="0", SLURM_STEP_NUM_TASKS="2", SLURM_PROCID=str(r),
                 SLURM_LOCALID=str(r), SLURM_NODEID="0", SLURM_STEP_TASKS_PER_NODE="2")
        procs.append(subprocess.Popen([sys.executable, RANK, JOB, str(out), str(STEPS)], env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    texts = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], texts
    check_same(ranks_of(out), reference)
    no_daemon_left(env)


ACCELERATE_RANK = os.path.join(HERE, "accelerate_rank.py")


@pytest.fixture(scope="module")
def accelerate_reference(tmp_path_factory):
    """ZerodAccelerator's loop as the ranks of `zerod run --nproc 2`: each
    rank's losses and learning rates, which every other launcher must
    reproduce bit for bit."""
    tmp = tmp_path_factory.mktemp("accelerate_zerod_run")
    out = tmp / "out"
    out.mkdir()
    job = tmp / "job.lua"
    job.write_text("return { zero = { stage = 3 } }\n")  # checked by zerod run; the accelerator brings its own
    code, text = run([ZEROD, "run", "--nproc", "2", "--job", str(job), "--", sys.executable, ACCELERATE_RANK,
                      str(tmp / "state"), "save", str(out)], launch_env(tmp))
    assert code == 0, text
    got = {r: (out / f"rank{r}.txt").read_text() for r in (0, 1)}
    assert got[0].count("loss") >= 4 and got[0] != got[1]  # each rank its own half of every batch
    return got


def check_accelerate_ranks(out, reference, state):
    for r in (0, 1):
        assert (out / f"rank{r}.txt").read_text() == reference[r], f"rank {r}"
    # Accelerate's own state of each process: one rank each, not two rank 0s.
    states = sorted(f for f in os.listdir(state) if f.startswith("random_states"))
    assert states == ["random_states_0.pkl", "random_states_1.pkl"], sorted(os.listdir(state))


def test_accelerate_launch(accelerate_reference, tmp_path):
    """`accelerate launch` (torchrun inside) with ZerodAccelerator: the
    losses of the same loop under `zerod run`, bit for bit."""
    env = launch_env(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    accelerate = os.path.join(os.path.dirname(sys.executable), "accelerate")
    # --multi_gpu is accelerate launch's torchrun launcher; without a GPU
    # the ranks run Accelerate's multi-CPU mode. Its port is given: its
    # default is a fixed 29500.
    with reserved_port() as port:
        code, text = run([accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                          "--main_process_port", str(port), "--mixed_precision", "no", "--dynamo_backend", "no",
                          ACCELERATE_RANK, str(tmp_path / "state"), "save", str(out)], env)
    assert code == 0, text
    check_accelerate_ranks(out, accelerate_reference, tmp_path / "state")
    no_daemon_left(env)


def test_accelerate_under_mpirun(accelerate_reference, tmp_path):
    """ZerodAccelerator's ranks started by mpirun: Accelerate sees 2
    processes (it read 1 and trained each rank on the whole dataset while
    zerod joined them as 2 ranks) and the losses are `zerod run`'s."""
    out = tmp_path / "out"
    out.mkdir()
    env = launch_env(tmp_path)
    code, text = run(mpirun_two(env, "OMP_NUM_THREADS") + ["--wdir", str(tmp_path), sys.executable, ACCELERATE_RANK,
                                                          str(tmp_path / "state"), "save", str(out)], env)
    assert code == 0, text
    check_accelerate_ranks(out, accelerate_reference, tmp_path / "state")
    no_daemon_left(env)


def test_accelerate_under_srun_environment(accelerate_reference, tmp_path):
    """ZerodAccelerator's ranks with what srun sets for a 2-task step on one
    node: Accelerate, which reads none of Slurm's variables, sees 2
    processes, and the losses are `zerod run`'s."""
    out = tmp_path / "out"
    out.mkdir()
    env = launch_env(tmp_path)
    procs = []
    for r in range(2):
        e = dict(env, SLURM_JOB_ID="4243", SLURM_STEP_ID="0", SLURM_STEP_NUM_TASKS="2", SLURM_PROCID=str(r),
                 SLURM_LOCALID=str(r), SLURM_NODEID="0", SLURM_STEP_TASKS_PER_NODE="2")
        procs.append(subprocess.Popen([sys.executable, ACCELERATE_RANK, str(tmp_path / "state"), "save", str(out)],
                                      env=e, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    texts = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], texts
    check_accelerate_ranks(out, accelerate_reference, tmp_path / "state")
    no_daemon_left(env)


def test_accelerate_refuses_a_process_count_other_than_zerods(tmp_path):
    """prepare() where zerod joined this process as one of 2 ranks but
    Accelerate sees 1 process (a launcher whose variables neither reads
    alike): refused naming both counts, not trained on the whole dataset as
    half of a job."""
    script = """if True:
        import torch
        from zerod.accelerate import ZerodAccelerator

        class JoinedAsOneOfTwo:  # what zerod's client says
            rank, world_size = 0, 2

        accelerator = ZerodAccelerator(client=JoinedAsOneOfTwo(), cpu=True)
        model = torch.nn.Linear(2, 2)
        accelerator.prepare(model, torch.optim.AdamW(model.parameters()))
    """
    code, text = run([sys.executable, "-c", script], launch_env(tmp_path))
    assert code != 0 and "InvalidArgumentError" in text and "ZerodAccelerator.prepare: zerod joined this process " \
        "as rank 0 of 2, but Accelerate sees 1 process(es)" in text, text


DS_RANK = os.path.join(HERE, "ds_rank.py")


def test_deepspeeds_own_launcher(tmp_path):
    """`deepspeed train.py` runs deepspeed.launcher.launch on each node,
    which sets torchrun's RANK/WORLD_SIZE/LOCAL_RANK but the node's ranks as
    LOCAL_SIZE (no LOCAL_WORLD_SIZE): a zerod.deepspeed script under it
    trains as the ranks of `zerod run` do, step for step, where its ranks
    were refused, read as torchrun's that do not say how many run on the
    node."""
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("no DeepSpeed in this environment")
    env = launch_env(tmp_path)
    job = tmp_path / "job.lua"
    job.write_text("return { zero = { stage = 2 } }\n")  # checked by zerod run; initialize brings its config
    code, want, text = zerod_run(2, str(job), DS_RANK, DS_CONFIG, env=env)
    assert code == 0, text
    logs = tmp_path / "logs"
    # What the `deepspeed` command runs on one node of two processes (its
    # hostfile's slots, base64 JSON); --no_local_rank: ds_rank.py takes no
    # --local_rank argument; each rank's output into a file of its own.
    world_info = base64.urlsafe_b64encode(json.dumps({"localhost": [0, 1]}).encode()).decode()
    with reserved_port() as port:
        code, text = run([sys.executable, "-m", "deepspeed.launcher.launch", f"--world_info={world_info}",
                          "--master_port", str(port), "--no_local_rank", "--enable_each_rank_log", str(logs),
                          DS_RANK, DS_CONFIG], env)
    assert code == 0, text
    for r in (0, 1):
        (log,) = glob.glob(str(logs / f"*_rank{r}.log"))
        got = [line for line in open(log).read().splitlines() if line.startswith("loss ")]
        assert len(got) == 12 and got == [line for line in want[r] if line.startswith("loss ")], f"rank {r}"
    no_daemon_left(env)


def test_lightnings_own_launcher(tmp_path):
    """Trainer(devices=2, strategy="zerod_stage_3_offload") started as one
    process: Lightning starts the second, and the two train as the ranks
    of `zerod run --nproc 2` do, bit for bit."""
    env = launch_env(tmp_path)
    script = os.path.join(HERE, "lightning_rank.py")
    job = tmp_path / "job.lua"
    job.write_text("return { zero = { stage = 3 } }\n")  # checked by zerod run; the strategy brings its own
    outs = {}
    for how in ("zerod_run", "lightning"):
        out = tmp_path / how
        out.mkdir()
        e = dict(env, LIGHTNING_RANK_OUT=str(out))
        cmd = [sys.executable, script, "zerod_stage_3_offload", str(tmp_path / f"ckpt_{how}")]
        if how == "zerod_run":
            cmd = [ZEROD, "run", "--nproc", "2", "--job", str(job), "--"] + cmd
            code, text = run(cmd, e)
        else:
            # Lightning's launcher takes MASTER_PORT where it is set; else it
            # looks a port up and closes it, for rank 0 to bind seconds later.
            with reserved_port() as port:
                code, text = run(cmd, dict(e, MASTER_PORT=str(port)))
        assert code == 0, text
        outs[how] = [(out / f"rank{r}.txt").read_text() for r in (0, 1)]
    assert outs["zerod_run"][0].count("loss") >= 4
    assert outs["lightning"] == outs["zerod_run"]
    no_daemon_left(env)


def test_a_dead_rank_is_named_and_no_daemon_is_left(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    env = launch_env(tmp_path)
    code, text = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", RANK,
                      JOB, str(out), str(STEPS), "2"], env)
    assert code != 0, text
    logs = glob.glob(os.path.join(env["XDG_RUNTIME_DIR"], "zerod-launch", "job-*.log"))
    assert len(logs) == 1
    no_daemon_left(env)
    log = open(logs[0]).read()
    assert "rank 1 (pid " in log and "is gone" in log, log


def launch_files(env):
    """The on-demand daemons' files under this test's directory, by name."""
    return set(os.listdir(os.path.join(env["XDG_RUNTIME_DIR"], "zerod-launch")))


def where_pids_mean_something(boot_id=None, pid_ns=None):
    """What a launch's starter records in its lock with its daemon's pid:
    this boot's id and this pid namespace, or those given."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        here = f.read().strip()
    return f"{boot_id or here} {pid_ns or os.stat('/proc/self/ns/pid').st_ino}"


def test_a_launch_removes_the_files_of_launches_that_ended(tmp_path):
    """Every launch has a key of its own (torchrun's run id), and each left
    its job-<hash>.lock and .log behind for good. The rank that starts a
    daemon removes those of launches whose daemon has ended, under each
    one's lock; a log that says more than the daemon's start and its stop
    (a rank gone; no stop line: a daemon killed; nothing at all) stays a
    week, for the user to read, as does a log set aside by a launch on the
    same key. Nothing of a daemon that still runs, or of a launch whose
    rank holds its lock, is touched; nor of a launch of another host or pid
    namespace sharing the directory (its pid says nothing here: another
    boot id, another pid namespace), nor of a lock that records no daemon
    (for a week), but a log older than a week."""
    import fcntl
    import socket

    env = launch_env(tmp_path)
    where = os.path.join(env["XDG_RUNTIME_DIR"], "zerod-launch")
    os.mkdir(where, 0o700)
    started = ("zerod serve: listening on /x.sock for ranks 0..1 of 2 (job job.lua)\n"
               "  ranks connect with ZEROD_ENDPOINT=unix:/x.sock ZEROD_RANK=<r> ZEROD_WORLD_SIZE=2\n")
    quiet = started + "zerod serve: every rank has left; stopping\n"
    told = quiet.replace("zerod serve: every", "zerod[warn] rank 1 (pid 4711) is gone\nzerod serve: every")
    gone = subprocess.Popen(["true"])
    gone.wait()
    ended = f"{gone.pid} {where_pids_mean_something()}\n"
    week_ago = time.time() - 8 * 86400

    def fake(name, log, lock=ended, days_old=0):
        base = os.path.join(where, "job-" + name)
        with open(base + ".lock", "w") as f:
            f.write(lock)
        with open(base + ".log", "w") as f:
            f.write(log)
        if days_old:
            then = time.time() - days_old * 86400
            os.utime(base + ".log", (then, then))
        return base

    fake("00000000000000a1", quiet)                # ended well
    fake("00000000000000a2", told)                 # a rank was gone
    fake("00000000000000a3", told, days_old=8)     # ... over a week ago
    running = fake("00000000000000a4", quiet)      # its daemon still runs
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", running + ".sock"])
    with open(running + ".lock", "w") as f:
        f.write(f"{alive.pid} {where_pids_mean_something()}\n")
    starting = fake("00000000000000a5", quiet)     # a rank of it holds its lock
    held = open(starting + ".lock")
    fcntl.flock(held, fcntl.LOCK_EX)
    fake("00000000000000a6", started)              # killed: no stop line
    fake("00000000000000a7", "")                   # nothing said
    another_boot = "00000000-1111-2222-3333-444444444444"
    for name, there in (("00000000000000a8", where_pids_mean_something(boot_id=another_boot)),
                        ("00000000000000a9", where_pids_mean_something(pid_ns=1))):
        elsewhere = fake(name, quiet, lock=f"{gone.pid} {there}\n")  # another host's or container's
        with socket.socket(socket.AF_UNIX) as stale:  # as its daemon left it, to this host's eyes
            stale.bind(elsewhere + ".sock")
    fake("00000000000000b1", quiet, lock="what\n")  # no daemon recorded ...
    old_unknown = fake("00000000000000b2", told, lock="", days_old=8)  # ... for over a week
    os.utime(old_unknown + ".lock", (week_ago, week_ago))
    for name, when in (("00000000000000a2.20261101-101010.log", 0), ("00000000000000a2.20261001-101010.log", week_ago)):
        with open(os.path.join(where, "job-" + name), "w") as f:  # set aside by a launch on a's key
            f.write(told)
        if when:
            os.utime(os.path.join(where, "job-" + name), (when, when))
    fakes = launch_files(env)
    try:
        launches = []
        for i in range(2):
            out = tmp_path / f"out{i}"
            out.mkdir()
            code, text = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                              RANK, JOB, str(out), "2"], env)
            assert code == 0, text
            no_daemon_left(env)
            launches.append({n for n in launch_files(env) - fakes if n.endswith(".lock")})
    finally:
        alive.kill()
        alive.wait()
        held.close()
    first, second = launches
    assert len(first) == 1 and len(second) == 1 and first != second, launches
    own = {n[:-5] + ext for n in second for ext in (".lock", ".log")}
    kept = {"job-00000000000000a2.log", "job-00000000000000a4.lock", "job-00000000000000a4.log",
            "job-00000000000000a5.lock", "job-00000000000000a5.log", "job-00000000000000a6.log",
            "job-00000000000000a7.log", "job-00000000000000b1.lock", "job-00000000000000b1.log",
            "job-00000000000000a2.20261101-101010.log"}
    kept |= {f"job-00000000000000{n}{ext}" for n in ("a8", "a9") for ext in (".lock", ".log", ".sock")}
    assert launch_files(env) == own | kept, "the first launch's files, a1, a3, b2 and the old set-aside log went"
    assert "every rank has left; stopping" in open(os.path.join(where, next(iter(second))[:-5] + ".log")).read()


def test_a_launch_on_the_key_of_the_one_before_keeps_what_its_log_said(tmp_path):
    """torchrun on a fixed --master-port (its static rendezvous: run id
    "none"), like DeepSpeed's launcher on MASTER_PORT 29500 or a fixed
    ZEROD_JOB_KEY, gives every launch the same key, so the same
    job-<hash>.log, which the next daemon started on afresh: a rank gone in
    the first launch was lost at the second, not kept a week. The starter
    sets such a log aside as job-<hash>.<when>.log first."""
    env = launch_env(tmp_path)
    with reserved_port() as port:
        for i, (steps, die) in enumerate(((str(STEPS), ["2"]), ("2", []))):
            out = tmp_path / f"out{i}"
            out.mkdir()
            code, text = run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                              "--master_port", str(port), RANK, JOB, str(out), steps] + die, env)
            assert (code == 0) == (not die), text
            no_daemon_left(env)
    where = os.path.join(env["XDG_RUNTIME_DIR"], "zerod-launch")
    assert len(glob.glob(os.path.join(where, "job-*.lock"))) == 1, "both launches on one key"
    logs = {os.path.basename(p): open(p).read() for p in glob.glob(os.path.join(where, "job-*.log"))}
    assert len(logs) == 2, logs
    assert any("rank 1 (pid " in text and "is gone" in text for text in logs.values()), logs


def test_a_torchrun_restart_resumes_from_the_snapshot(reference, tmp_path):
    """torchrun --max-restarts 1: rank 1 dies at step 5 of its first
    attempt; torchrun starts both again (a new restart count: a new node
    daemon, the first one gone with its ranks), they resume from the newest
    snapshot (every 2 steps) and end with the weights of a run that was not
    interrupted, every step after the resume the same bits."""
    env = launch_env(tmp_path)
    job_text = open(JOB).read().replace("zero = { stage = 1 },",
                                        "zero = { stage = 1 },\n  snapshot = { path = os.getenv('SNAPS'), every = 2 },")
    assert "snapshot" in job_text
    job = tmp_path / "job.lua"
    job.write_text(job_text)
    results = {}
    for how, die in (("straight", []), ("restarted", ["5"])):
        out = tmp_path / how
        out.mkdir()
        e = dict(env, SNAPS=str(tmp_path / f"snaps_{how}"))
        code, text = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "--max-restarts", "1", RANK, str(job), str(out), str(STEPS)] + die, e)
        assert code == 0, text
        results[how] = ranks_of(out)
    for r in (0, 1):
        straight, restarted = results["straight"][r], results["restarted"][r]
        assert restarted[1].startswith("resumed at "), restarted
        at = int(restarted[1].split()[-1])
        assert at in (2, 4), restarted
        assert restarted[2:] == straight[1 + at:], f"rank {r}: {restarted} vs {straight}"
        assert straight[-1] == reference[r][-1]  # the snapshots change nothing
    no_daemon_left(env)


def test_a_hang_is_diagnosed(tmp_path):
    """Rank 1 stops answering at step 2: rank 0's step times out (the job's
    comm.timeout) naming the collective and that rank 1 has not arrived."""
    env = launch_env(tmp_path)
    job = tmp_path / "job.lua"
    job.write_text(open(JOB).read().replace("zero = { stage = 1 },", "zero = { stage = 1 },\n  comm = { timeout = 4 },"))
    out = tmp_path / "out"
    out.mkdir()
    code, text = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", RANK,
                      str(job), str(out), str(STEPS)], dict(env, HANG_AT="2"), timeout=120)
    assert code != 0
    assert "ZD_ERR_TIMEOUT" in text and "not arrived: rank 1" in text, text[-3000:]
    no_daemon_left(env)


def refused(env):
    code = ("import zerod\n"
            "try:\n    zerod.connect()\nexcept zerod.ZerodError as e:\n    print(e)\nelse:\n    print('connected')\n")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    return p.stdout + p.stderr


def test_what_cannot_be_served_is_refused_saying_why(tmp_path):
    env = launch_env(tmp_path)
    torchrun = dict(env, RANK="1", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", MASTER_ADDR="10.0.0.1",
                    MASTER_PORT="29500", ZEROD_JOB=JOB)
    # Several nodes: torchrun always says which node (GROUP_RANK); without it
    # nothing does. Without MASTER_ADDR/MASTER_PORT (srun, mpirun) nothing
    # says where node 0 hands out its name server.
    text = refused(torchrun)
    assert "does not say which node this is; set ZEROD_NODE_RANK (0..1)" in text, text
    text = refused({k: v for k, v in torchrun.items() if k not in ("MASTER_ADDR", "MASTER_PORT")})
    assert "2 of them on this node" in text and "ZEROD_RENDEZVOUS=" in text and "ZEROD_OMPI_SERVER=" in text \
        and "zerod run --nproc 2" in text, text
    text = refused(dict(torchrun, WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", ZEROD_JOB=""))
    assert "needs the job script" in text and "ZEROD_JOB" in text, text
    text = refused(dict(torchrun, WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", ZEROD_NO_NODE_DAEMON="1"))
    assert "ZEROD_NO_NODE_DAEMON" in text and "zerod run" in text, text
    # A directory for the daemons' sockets that others may write is not used.
    open_dir = short_dir()
    os.mkdir(os.path.join(open_dir, "zerod-launch"))
    os.chmod(os.path.join(open_dir, "zerod-launch"), 0o777)
    text = refused(dict(torchrun, WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", XDG_RUNTIME_DIR=open_dir))
    assert "of this user's alone" in text, text
    # Lightning's own launcher across 2 nodes with no MASTER_ADDR: refused
    # before any process group waits for the other node.
    code = ("import torch, lightning.pytorch as pl, zerod.lightning\n"
            "from test_lightning import LitGPT, Windows\n"
            "t = pl.Trainer(strategy='zerod_stage_3_offload', accelerator='cpu', devices=1, num_nodes=2,\n"
            "               max_epochs=1, logger=False, enable_progress_bar=False)\n"
            "t.fit(LitGPT(), torch.utils.data.DataLoader(Windows(), batch_size=4))\n")
    p = subprocess.run([sys.executable, "-c", code], env=dict(env, MASTER_PORT="29533"), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode != 0 and "MASTER_ADDR and MASTER_PORT are not both set" in p.stderr, p.stderr[-3000:]
    # A job script with an error: the daemon's own report comes back.
    bad = tmp_path / "bad.lua"
    bad.write_text("return { optimizer = { type = 'adamw', lr = 1e-3 }, zero = { stag = 1 } }\n")
    text = refused(dict(torchrun, WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", ZEROD_JOB=str(bad)))
    assert "exited before it served" in text and "stag" in text, text
