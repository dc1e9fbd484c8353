"""torchrun on two hosts, with no `zerod run` and nothing of zerod's set up
by hand (issue 36 §1): each host is a network namespace of its own (an
address on a bridge, its own hostname and its own runtime directory), and
on each `torchrun --nnodes 2 --node_rank K --master_addr <host 0>` starts two
ranks of launcher_rank.py. The first rank on each host starts that host's
daemon (libzerod/src/node_daemon.h); host 0's starts an Open MPI name server
and hands it to host 1 over TCP at MASTER_ADDR:MASTER_PORT+1 (`zerod
join`); the daemons join through it (plugins/comm/mpi/join.h).

Checked: the 4 ranks train as `zerod run --nproc 4` does (the mpi plugin
sums in another order: within 1e-5); a rank of host 1 that dies is named
with its pid by its daemon and the ranks of both hosts end, no daemon or
name server left on either; a rank of host 1 that hangs makes host 0's
ranks time out naming it; a torchrun restart (--max-restarts 1) after a
rank died resumes on both hosts from the snapshot and ends as a run that
was not interrupted; Lightning's Trainer(devices=1, num_nodes=2) under
`torchrun --nproc_per_node 1` on each host trains as `zerod run --nproc 2`
(skipped where Lightning is not installed).

Needs root (network namespaces); skipped saying so without it.
"""
import glob
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import ZEROD, rank_env

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "jobs", "gpt_adam_job.lua")
RANK = os.path.join(HERE, "launcher_rank.py")
STEPS = 6
# What the ranks say when rank 3 of host 1 hangs: whichever daemon's wait
# ends first tells the others (a failure notice), so either node 0's view
# (node 1, its ranks, host and daemon's pid) or node 1's own (rank 3).
HANG_DIAGNOSIS = re.compile(r"not arrived: (rank 3 |node 1 \(ranks 2-3, host \S+host1, pid \d+\))")


def sh(*cmd, check=True):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {p.stderr.strip()}")
    return p


class Hosts:
    """Two network namespaces on a bridge: 10.214.<n>.1 and .2."""

    def __init__(self):
        tag = os.getpid() % 100000
        self.prefix = f"zh{tag}"
        net = (os.getpid() // 7) % 200 + 20
        self.subnet = f"10.214.{net}.0/24"
        self.ns, self.ip, self.names, self.dirs = [], [], [], []
        self.bridge = f"{self.prefix}br"
        try:
            sh("ip", "netns", "add", f"{self.prefix}h0")
        except (RuntimeError, FileNotFoundError) as e:
            pytest.skip(f"cannot create a network namespace here ({e}): the two-host test needs root")
        self.ns.append(f"{self.prefix}h0")
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "link", "set", self.bridge, "up")
        for i in range(2):
            ns = f"{self.prefix}h{i}"
            if i:
                sh("ip", "netns", "add", ns)
                self.ns.append(ns)
            veth, peer = f"{self.prefix}v{i}", f"{self.prefix}p{i}"
            sh("ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
            sh("ip", "link", "set", peer, "master", self.bridge, "up")
            sh("ip", "link", "set", veth, "netns", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", ns, "addr", "add", f"10.214.{net}.{i + 1}/24", "dev", veth)
            sh("ip", "-n", ns, "link", "set", veth, "up")
            self.ip.append(f"10.214.{net}.{i + 1}")
            self.names.append(f"{self.prefix}host{i}")
            # Each host's own runtime directory (its on-demand daemons' sockets,
            # logs and name server URI), short enough for a socket path.
            self.dirs.append(tempfile.mkdtemp(prefix=f"zh{i}-", dir="/tmp"))

    def command(self, i, cmd):
        """cmd as host i runs it: in its namespace, with its hostname."""
        return ["ip", "netns", "exec", self.ns[i], "unshare", "--uts", "sh", "-c", 'hostname "$0"; exec "$@"',
                self.names[i]] + cmd

    def processes(self, pattern):
        """Processes of either host whose command line matches."""
        out = sh("pgrep", "-af", pattern, check=False).stdout
        return [line for line in out.splitlines() if any(d in line for d in self.dirs)]

    def close(self):
        for i in range(len(self.ns)):
            sh("ip", "link", "del", f"{self.prefix}p{i}", check=False)
        for ns in self.ns:
            pids = sh("ip", "netns", "pids", ns, check=False).stdout.split()
            for p in pids:
                try:
                    os.kill(int(p), 9)
                except OSError:
                    pass
            sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", self.bridge, check=False)
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def hosts():
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None:
        pytest.skip("the two-host test needs root and iproute2/util-linux (ip netns, unshare)")
    h = Hosts()
    yield h
    h.close()


# The first of the ports a launch takes in host 0's namespace (MASTER_PORT
# and MASTER_PORT + 1), two more for each launch: a daemon or name server of
# the launch before may still be leaving.
_MASTER_PORTS = itertools.count(20000, 2)


def master_port(h):
    """A port P of host 0 with P+1 free too (torchrun's store, zerod's
    rendezvous). The hosts are network namespaces of this test's own:
    nothing else on the machine binds there, and this test's own processes
    take the ports the kernel picks (the namespace's ephemeral range: gloo,
    Open MPI's daemons) or, Open MPI's TCP transport, the first free ones
    from 1024 up, a few per host. Between the two, a port is free there for
    certain. One looked up in this process's namespace (bind to port 0,
    close), as it was, said nothing about theirs and lay in that range."""
    port = next(_MASTER_PORTS)
    low = int(sh("ip", "netns", "exec", h.ns[0], "cat", "/proc/sys/net/ipv4/ip_local_port_range").stdout.split()[0])
    assert port + 1 < low, f"port {port} is inside host 0's ephemeral range (from {low}): pick lower ones"
    return port


def host_env(h, i, **extra):
    env = rank_env()
    # gloo (Lightning's own collectives) on the host's own link: the host's
    # name resolves to no address in its namespace.
    env["GLOO_SOCKET_IFNAME"] = f"{h.prefix}v{i}"
    for k in list(env):  # nothing of an enclosing launcher or zerod run
        if k.startswith(("ZEROD_", "OMPI_", "PMIX_", "SLURM_", "PMI_", "TORCHELASTIC_")) or k in (
                "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"):
            del env[k]
    env["XDG_RUNTIME_DIR"] = h.dirs[i]
    env["ZEROD_LIB"] = os.environ.get("ZEROD_LIB", "")
    # The daemons' mpiruns (and node 0's name server) between the hosts'
    # addresses only; as root, which Open MPI wants said twice.
    env.update(OMPI_MCA_btl="tcp,self", OMPI_MCA_pml="ob1", OMPI_MCA_btl_tcp_if_include=h.subnet,
               OMPI_MCA_oob_tcp_if_include=h.subnet, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def job_file(tmp_path, extra):
    text = open(JOB).read().replace("zero = { stage = 1 },", "zero = { stage = 1 },\n  " + extra)
    assert extra in text
    path = tmp_path / "job.lua"
    path.write_text(text)
    return str(path)


def torchrun_on_both(h, tmp_path, job, out, extra_args=(), timeout=300, nproc=2, rank_cmd=None, **env_extra):
    """Starts torchrun on both hosts at once, `nproc` ranks each of
    launcher_rank.py (or of rank_cmd); returns [(status, output)] per host."""
    port = master_port(h)
    procs = []
    for i in range(2):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(i),
               "--nproc_per_node", str(nproc), "--master_addr", h.ip[0], "--master_port", str(port), *extra_args,
               *(rank_cmd or [RANK, job, str(out), str(STEPS)])]
        log = open(tmp_path / f"host{i}.log", "w+")
        procs.append((subprocess.Popen(h.command(i, cmd), env=host_env(h, i, **env_extra), stdout=log,
                                       stderr=subprocess.STDOUT), log))
    results = []
    deadline = time.time() + timeout
    for p, log in procs:
        try:
            p.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.seek(0)
        results.append((p.returncode, log.read()))
        log.close()
    return results


def nothing_left(h, within=60.0):
    deadline = time.time() + within
    pattern = "zerod (serve|join)|ompi-server"
    while h.processes(pattern) and time.time() < deadline:
        time.sleep(0.2)
    assert not h.processes(pattern), f"left behind: {h.processes(pattern)}"


def daemon_logs(h):
    return {i: "\n".join(open(f).read() for f in glob.glob(os.path.join(h.dirs[i], "zerod-launch", "job-*.log")))
            for i in range(2)}


def losses(lines):
    return [float(line.split()[2]) for line in lines if line.startswith("loss ")]


def close(a, b, rel=1e-5):
    return len(a) == len(b) and all(abs(x - y) <= rel * max(1.0, abs(y)) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """`zerod run --nproc 4` on one machine, the job on the local backend."""
    tmp = tmp_path_factory.mktemp("zerod_run")
    out = tmp / "out"
    out.mkdir()
    env = rank_env()
    for k in ("ZEROD_ENDPOINT", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    p = subprocess.run([ZEROD, "run", "--nproc", "4", "--job", JOB, "--", sys.executable, RANK, JOB, str(out),
                        str(STEPS)], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return {r: (out / f"rank{r}.txt").read_text().splitlines() for r in range(4)}


def test_torchrun_on_two_hosts_trains_as_zerod_run(hosts, reference, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    job = job_file(tmp_path, 'comm = { backend = "mpi", timeout = 60 },')
    results = torchrun_on_both(hosts, tmp_path, job, out)
    logs = daemon_logs(hosts)
    for i, (code, text) in enumerate(results):
        assert code == 0, f"host {i}:\n{text[-3000:]}\ndaemon logs:\n{logs}"
    for r in range(4):
        got = (out / f"rank{r}.txt").read_text().splitlines()
        assert got[0] == f"rank {r} of 4", got
        assert close(losses(got), losses(reference[r])), f"rank {r}: {got}\nzerod run --nproc 4: {reference[r]}"
    assert re.search(r"zerod join: node 0 of 2: name server .* served on port \d+", logs[0]), logs[0]
    assert "zerod join: node 1 of 2: node 0's name server is " in logs[1], logs[1]
    nothing_left(hosts)


def test_a_dead_rank_on_host_1_ends_both_hosts(hosts, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    job = job_file(tmp_path, 'comm = { backend = "mpi", timeout = 30 },')
    t0 = time.time()
    results = torchrun_on_both(hosts, tmp_path, job, out, DIE_RANK=3, DIE_AT=2, timeout=240)
    took = time.time() - t0
    logs = daemon_logs(hosts)
    for i, (code, text) in enumerate(results):
        assert code != 0, f"host {i} ended well although rank 3 died:\n{text[-2000:]}"
    assert re.search(r"rank 3 \(pid \d+\)", logs[1]) and "is gone" in logs[1], logs[1]
    assert took < 180, f"the hosts took {took:.0f} s to end after rank 3 died"
    nothing_left(hosts)


def test_a_hang_on_host_1_is_diagnosed_on_host_0(hosts, tmp_path):
    """Rank 3 (host 1) stops answering at step 2: the ranks of host 0 time
    out (the job's comm.timeout) naming the node, its ranks and host."""
    out = tmp_path / "out"
    out.mkdir()
    # Long enough that ranks starting seconds apart on a busy machine (torch
    # imports) do not time out before the hang.
    job = job_file(tmp_path, 'comm = { backend = "mpi", timeout = 20 },')
    results = torchrun_on_both(hosts, tmp_path, job, out, HANG_RANK=3, HANG_AT=2, timeout=300)
    code0, text0 = results[0]
    assert code0 != 0, text0[-2000:]
    assert "ZD_ERR_TIMEOUT" in text0, text0[-3000:]
    assert HANG_DIAGNOSIS.search(text0), text0[-3000:]
    code1, text1 = results[1]
    assert code1 != 0
    assert HANG_DIAGNOSIS.search(text1), text1[-3000:]
    nothing_left(hosts)


def test_a_torchrun_restart_on_two_hosts_resumes_from_the_snapshot(hosts, reference, tmp_path):
    """torchrun --max-restarts 1 on both hosts: rank 3 dies at step 5 of the
    first attempt; both agents start their ranks again (a new restart
    count: new daemons, a new name server on host 0), which resume from the
    newest snapshot (every 2 steps, on the shared disk) and end where an
    uninterrupted run does."""
    out = tmp_path / "out"
    out.mkdir()
    snaps = tmp_path / "snaps"
    job = job_file(tmp_path, f'comm = {{ backend = "mpi", timeout = 30 }},\n  snapshot = {{ path = "{snaps}", every = 2 }},')
    results = torchrun_on_both(hosts, tmp_path, job, out, ["--max-restarts", "1"], DIE_RANK=3, DIE_AT=5, timeout=400)
    logs = daemon_logs(hosts)
    for i, (code, text) in enumerate(results):
        assert code == 0, f"host {i}:\n{text[-3000:]}\ndaemon logs:\n{logs}"
    for r in range(4):
        got = (out / f"rank{r}.txt").read_text().splitlines()
        assert got[1].startswith("resumed at "), got
        at = int(got[1].split()[-1])
        assert at in (2, 4), got
        assert close(losses(got), losses(reference[r])[at:]), f"rank {r}: {got}\nzerod run: {reference[r]}"
    nothing_left(hosts)


def test_lightning_under_torchrun_on_two_hosts_trains_as_zerod_run(hosts, tmp_path):
    """Trainer(devices=1, num_nodes=2, strategy="zerod_stage_3_offload")
    under `torchrun --nnodes 2 --nproc_per_node 1`, the form a node of one
    GPU needs (Lightning refuses devices above the node's GPUs): Lightning's
    torchrun environment says each rank's place (the strategy used to force
    its own launcher's: every rank was refused, and Trainer(devices=2) made
    host 1 rank 2 of 2 while host 0 waited in gloo for 30 minutes), the
    sampler splits every batch of 8 between the hosts, ModelCheckpoint
    writes (the hosts share this disk), and each rank's losses are those of
    `zerod run --nproc 2` with Trainer(devices=2) (the mpi plugin sums in
    another order: within 1e-5)."""
    pytest.importorskip("lightning", reason="Lightning is not installed in this venv")
    script = os.path.join(HERE, "lightning_rank.py")
    job = tmp_path / "job.lua"
    job.write_text("return { zero = { stage = 3 } }\n")  # checked by zerod run; the strategy brings its own
    ref = tmp_path / "zerod_run"
    ref.mkdir()
    env = rank_env(LIGHTNING_RANK_OUT=str(ref))
    for k in ("ZEROD_ENDPOINT", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    p = subprocess.run([ZEROD, "run", "--nproc", "2", "--job", str(job), "--", sys.executable, script,
                        "zerod_stage_3_offload", str(tmp_path / "ckpt_ref")], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = tmp_path / "out"
    out.mkdir()
    results = torchrun_on_both(hosts, tmp_path, None, out, nproc=1,
                               rank_cmd=[script, "zerod_stage_3_offload", str(tmp_path / "ckpt")],
                               LIGHTNING_RANK_OUT=out, LIGHTNING_NUM_NODES=2, ZEROD_TEST_WORLD=1)
    logs = daemon_logs(hosts)
    for i, (code, text) in enumerate(results):
        assert code == 0, f"host {i}:\n{text[-3000:]}\ndaemon logs:\n{logs}"
    for r in range(2):
        got = (out / f"rank{r}.txt").read_text().splitlines()
        want = (ref / f"rank{r}.txt").read_text().splitlines()
        assert got[-1] == want[-1] == "global_step 8", (got, want)
        assert len(losses(want)) == 16 and close(losses(got), losses(want)), \
            f"rank {r}: {got}\nzerod run --nproc 2: {want}"
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt"]
    assert "zerod join: node 1 of 2: node 0's name server is " in logs[1], logs[1]
    nothing_left(hosts)
