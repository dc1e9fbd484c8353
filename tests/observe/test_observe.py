"""Observing a running job as a user would: the daemon's Prometheus
metrics scraped with a real HTTP client (urllib) over TCP and with
http.client over a unix socket while the ranks are alive, `zerod top` on a
pseudo-terminal, and the trace and its plots from a Python trainer that
reports its tokens and loss."""
import http.client
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
BINDINGS = os.path.join(ROOT, "bindings", "python")
sys.path.insert(0, BINDINGS)
ZEROD = os.environ.get("ZEROD_CLI") or os.path.join(ROOT, "build", "bin", "zerod")
JOB = os.path.join(HERE, "jobs", "metrics.lua")
STEPS, PAUSE = 12, 6


def metrics_of(text):
    """{(name, frozenset(labels)): value} of Prometheus text."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'([a-z_]+)(?:\{(.*)\})? (\S+)$', line)
        assert m, f"not a Prometheus sample line: {line!r}"
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def value(ms, name, **labels):
    want = {(k, str(v)) for k, v in labels.items()}
    hits = [v for (n, ls), v in ms.items() if n == name and want <= ls]
    assert hits, f"no {name} {labels} in the metrics"
    return hits[0] if len(hits) == 1 else hits


class PausedJob:
    """`zerod run --nproc 2` of observe_rank.py, paused after step PAUSE."""

    def __init__(self, tmp, metrics, trace=None):
        self.go = os.path.join(tmp, "go")
        self.socket = os.path.join(tmp, "zerod.sock")
        env = dict(os.environ, OBSERVE_PAUSE_AT=str(PAUSE), OBSERVE_GO=self.go,
                   PYTHONPATH=os.pathsep.join(p for p in (BINDINGS, os.environ.get("PYTHONPATH")) if p),
                   OMP_NUM_THREADS="1")
        cmd = [ZEROD, "run", "--nproc", "2", "--socket", self.socket, "--metrics", metrics]
        if trace:
            cmd += ["--trace", trace]
        cmd += ["--job", JOB, "--", sys.executable, os.path.join(HERE, "observe_rank.py"), str(STEPS)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                     cwd=tmp)
        self.lines = []
        self.where = None
        paused = 0
        deadline = time.time() + 120
        while paused < 2 and time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            m = re.search(r"zerod run: metrics at (\S+)", line)
            if m:
                self.where = m.group(1)
            paused += "paused at step" in line
        assert paused == 2, "the ranks did not reach the pause:\n" + "".join(self.lines)

    def finish(self):
        open(self.go, "w").close()
        out, _ = self.proc.communicate(timeout=120)
        self.lines.append(out)
        assert self.proc.returncode == 0, "".join(self.lines)
        return "".join(self.lines)


def check_figures(ms):
    for rank in (0, 1):
        r = {"model": 0, "rank": rank}
        assert value(ms, "zerod_steps_total", **r) == PAUSE
        assert value(ms, "zerod_step", **r) == PAUSE
        assert value(ms, "zerod_step_seconds_count", **r) == PAUSE
        assert value(ms, "zerod_step_seconds_bucket", le="+Inf", **r) == PAUSE
        assert value(ms, "zerod_step_seconds_sum", **r) > 0
        assert value(ms, "zerod_tokens_total", **r) == 256 * PAUSE
        assert value(ms, "zerod_samples_total", **r) == 8 * PAUSE
        assert value(ms, "zerod_loss", **r) > 0
        assert value(ms, "zerod_rank_connected", **r) == 1
        # Four 64x64 f32 modules, stage 3 on 2 ranks: the master and Adam's two moments of
        # half of them on the host; the device holds this rank's shard.
        assert value(ms, "zerod_memory_bytes", tier="host", kind="master", **r) == 4 * 64 * 64 * 4 / 2
        assert value(ms, "zerod_memory_bytes", tier="host", kind="optimizer", **r) == 2 * 4 * 64 * 64 * 4 / 2
        assert value(ms, "zerod_memory_peak_bytes", tier="device", **r) > 0
        assert value(ms, "zerod_memory_budget_bytes", tier="host", **r) == 64 << 20
        # The cpu device's pool in pages: at least its live blocks, at most its peak and the
        # pages the blocks share with free space (a few KiB blocks, 4 KiB pages).
        device_now = sum(value(ms, "zerod_memory_bytes", tier="device", kind=k, **r)
                         for k in ("params", "grads", "master", "optimizer", "buffers"))
        resident = value(ms, "zerod_device_pool_resident_bytes", **r)
        assert device_now <= resident <= value(ms, "zerod_memory_peak_bytes", tier="device", **r) + (64 << 10)
        # Every rank in this daemon on the local plugin and the cpu device: stage 3's gathers copy
        # the peers' shards one-sided, without the plugin, and still count as the all-gathers they
        # replace. A gather sends this rank's shard of a module (64x64 f32 / 2 ranks) to the other
        # rank, and so does each step's reduce-scatter of every module's gradient: at least that
        # much was sent (the gathers alone were once missing, a third of the traffic).
        shard = 64 * 64 * 4 // 2
        gathers = sum(value(ms, "zerod_gathers_total", prefetched=p, **r) for p in ("true", "false"))
        assert value(ms, "zerod_comm_sent_bytes_total", **r) >= (gathers + 4 * PAUSE) * shard
        # One collective a gather, and at least one reduce-scatter a step (its bucket holds modules).
        assert value(ms, "zerod_comm_collectives_total", **r) >= gathers + PAUSE
        assert value(ms, "zerod_optimizer_seconds_total", tier="host", **r) > 0
        assert value(ms, "zerod_prefetch_wait_seconds_total", **r) >= 0
        assert value(ms, "zerod_gathers_total", prefetched="true", **r) > 0, "from step 2 on, modules are prefetched"
        assert value(ms, "zerod_peer_wait_seconds_total", **r) >= 0
        assert value(ms, "zerod_late_arrivals_total", late_rank=1 - rank, **r) >= 0
        # The optimizer is on the host, but this job's update stays inside zd_step: with its
        # gathers reading every rank's shards one-sided it cannot run behind it (docs/offload.md,
        # "The overlapped update"), so no forward waits for it. The figures are there all the
        # same; tests/engine/overlap_test.cpp (OverlapCounters) has a forward wait for it.
        assert value(ms, "zerod_overlapped_updates_total", **r) == 0
        assert value(ms, "zerod_update_wait_seconds_total", **r) == 0
    # What left the node is the node's figure: one sample per model, no rank label (a sample per
    # rank would repeat it, and sum() would count it twice). One node here: nothing left it.
    net = [(labels, v) for (n, labels), v in ms.items() if n == "zerod_comm_network_sent_bytes_total"]
    assert net == [(frozenset({("model", "0")}), 0.0)], net
    assert value(ms, "zerod_uptime_seconds") > 0


def test_metrics_over_tcp_while_the_ranks_run(tmp_path):
    job = PausedJob(str(tmp_path), "127.0.0.1:0")
    try:
        assert job.where and job.where.startswith("http://127.0.0.1:"), "".join(job.lines)
        with urllib.request.urlopen(job.where, timeout=10) as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = r.read().decode()
        assert "# TYPE zerod_step_seconds histogram" in text
        check_figures(metrics_of(text))
        base = job.where.rsplit("/", 1)[0]
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(base + "/nothing", timeout=10)
        assert e.value.code == 404
    finally:
        job.finish()


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=10)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(self.path)


def test_metrics_over_a_unix_socket_and_zerod_top_on_a_terminal(tmp_path):
    path = str(tmp_path / "metrics.sock")
    job = PausedJob(str(tmp_path), "unix:" + path)
    try:
        c = UnixHTTPConnection(path)
        c.request("GET", "/metrics")
        r = c.getresponse()
        assert r.status == 200
        check_figures(metrics_of(r.read().decode()))

        # zerod top on a pseudo-terminal, as over ssh: frames redrawn in place, q quits.
        pid, fd = pty.fork()
        if pid == 0:
            os.execv(ZEROD, [ZEROD, "top", "--socket", job.socket, "--interval", "0.2"])
        out = b""
        deadline = time.time() + 20
        while time.time() < deadline and out.count(b"\x1b[H") < 4:
            if select.select([fd], [], [], 0.5)[0]:
                try:
                    out += os.read(fd, 65536)
                except OSError:
                    break
        os.write(fd, b"q")
        status = None
        deadline = time.time() + 10
        while time.time() < deadline:
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    out += os.read(fd, 65536)
                except OSError:
                    pass
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
        if status is None or not os.WIFEXITED(status):
            os.kill(pid, signal.SIGKILL)
            pytest.fail("zerod top did not quit on q:\n" + out.decode(errors="replace"))
        text = out.decode(errors="replace")
        assert os.WEXITSTATUS(status) == 0, text
        assert text.count("\x1b[H") >= 4, "frames are redrawn from the top left:\n" + text
        assert "\x1b[?25l" in text and text.rstrip().endswith("\x1b[?25h"), "the cursor is hidden, then restored"
        frame = text.split("\x1b[H")[-1]
        assert "zerod top: daemon pid" in frame
        assert re.search(r"\n  0 +6 +0\.0 ", frame) and re.search(r"\n  1 +6 +0\.0 ", frame), \
            "both ranks at step 6, paused (0 steps/s):\n" + frame
        assert "host   [" in frame and "64.0 MiB" in frame, "the host tier against its budget:\n" + frame
        assert "prefetch wait" in frame and "peers" in frame, frame
    finally:
        job.finish()


def test_trace_and_plots_of_a_reporting_trainer(tmp_path):
    trace = str(tmp_path / "out" / "trace.json")
    job = PausedJob(str(tmp_path), "127.0.0.1:0", trace=trace)
    log = job.finish()
    assert "trace: steps 2-5 of ranks 0-1 written to" in log or os.path.exists(trace), log
    from zerod import trace as ztrace
    tr = ztrace.load(trace)
    assert ztrace.check(tr) == []
    assert tr.ranks == [0, 1]
    assert sorted(tr.steps(0)) == [2, 3, 4, 5]
    assert len(tr.reports) == 2 * STEPS, "every report of the run, not only the traced steps"
    assert all(r["tokens"] == 256 and r["loss"] > 0 for r in tr.reports)
    rows = ztrace.breakdown(tr, 0)
    assert [r["step"] for r in rows] == [2, 3, 4, 5]
    for r in rows:
        parts = sum(r[p] for p in ztrace.PARTS)
        assert abs(parts - r["total"]) < 0.01 * r["total"] + 1e-3, r
        assert r["optimizer"] > 0 and r["compute"] > 0, r

    pytest.importorskip("matplotlib", reason="python3-matplotlib is not installed")
    out = subprocess.run([ZEROD, "plot", trace, "--check", "--out", str(tmp_path / "png")], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    paths = out.stdout.split()
    assert [os.path.basename(p) for p in paths] == ["trace-memory.png", "trace-steps.png", "trace-loss.png"]
    import matplotlib.image
    for p in paths:
        img = matplotlib.image.imread(p)
        assert img.shape[0] > 300 and img.shape[1] > 800, p
        # Not blank: many distinct colours, and ink on a good part of the canvas.
        flat = (img[..., :3] * 255).astype(int).reshape(-1, 3)
        colors = {tuple(c) for c in flat[::37]}
        assert len(colors) > 20, f"{p}: {len(colors)} colours"
        assert (flat.sum(axis=1) < 600).mean() > 0.02, f"{p} is nearly blank"


def test_the_traced_memory_reaches_the_ledgers_peak(tmp_path):
    """Stage 2 allocates its reduce buffers inside zd_step and frees them
    before it returns: the trace's memory counter still reaches each rank's
    ledger peak (it holds the most held between two calls' returns)."""
    trace = str(tmp_path / "trace.json")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (BINDINGS, os.environ.get("PYTHONPATH")) if p),
               OMP_NUM_THREADS="1")
    out = subprocess.run([ZEROD, "run", "--nproc", "2", "--trace", trace, "--job",
                          os.path.join(HERE, "jobs", "stage2_every_step.lua"), "--", sys.executable,
                          os.path.join(HERE, "observe_rank.py"), "3"],
                         capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    peaks = {int(r): int(b) for r, b in re.findall(r"rank (\d) device peak (\d+)", out.stdout)}
    assert sorted(peaks) == [0, 1], out.stdout
    from zerod import trace as ztrace
    tr = ztrace.load(trace)
    assert ztrace.check(tr) == []
    for rank, peak in peaks.items():
        traced = max(point["device"] for _, point in tr.memory(rank))
        assert traced == peak, f"rank {rank}: the trace's device curve peaks at {traced} B, the ledger at {peak} B"


def format_bytes(b):
    """zerod's way of writing bytes (kit/include/zerod/kit/text.h), two decimals."""
    if b < 1024:
        return f"{b} B"
    v, unit = b / 1024, "KiB"
    for bigger in ("MiB", "GiB", "TiB"):
        if v < 1024:
            break
        v, unit = v / 1024, bigger
    return f"{v:.2f} {unit}"


def test_status_shows_a_jobs_plan_and_its_peak(tmp_path):
    """`zerod serve --jobs` charges a model's planned state against
    --host-memory; at stage 2 with two micro-batches a step the steps also
    allocate short-lived buffers in the device tier, host RAM on the cpu
    device, which the plan does not hold. `zerod status` says the charge is
    the plan and shows beside it the peak the ranks reached."""
    sock = str(tmp_path / "serve.sock")
    go = str(tmp_path / "go")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (BINDINGS, os.environ.get("PYTHONPATH")) if p),
               OMP_NUM_THREADS="1")
    for v in ("ZEROD_ENDPOINT", "ZEROD_RANK", "ZEROD_WORLD_SIZE", "ZEROD_JOB", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(v, None)
    serve = subprocess.Popen([ZEROD, "serve", "--jobs", "--socket", sock], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    rank = None
    try:
        deadline = time.time() + 10
        while not os.path.exists(sock) and time.time() < deadline:
            time.sleep(0.05)
        assert os.path.exists(sock), "zerod serve --jobs did not listen"
        rank_env = dict(env, ZEROD_ENDPOINT="unix:" + sock, OBSERVE_PAUSE_AT="4", OBSERVE_GO=go,
                        ZEROD_JOB=os.path.join(HERE, "jobs", "stage2_accumulating.lua"))
        rank = subprocess.Popen([sys.executable, os.path.join(HERE, "observe_rank.py"), "6"], env=rank_env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = rank.stdout.readline()
        assert "paused at step 4" in line, line + rank.stdout.read()
        status = subprocess.run([ZEROD, "status", "--socket", sock], capture_output=True, text=True, timeout=30)
        assert status.returncode == 0, status.stderr
        open(go, "w").close()
        out = rank.stdout.read()
        assert rank.wait(timeout=60) == 0, out
    finally:
        if rank and rank.poll() is None:
            rank.kill()
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=30)
    assert "serving 1 job; their planned model state holds" in status.stdout, status.stdout
    m = re.search(r"model 0: rank 0, (\d+\.\d\d \w+) planned, peak (\d+\.\d\d \w+)\n", status.stdout)
    assert m, status.stdout
    device, host = map(int, re.search(r"device peak (\d+) host peak (\d+)", out).groups())
    assert m.group(2) == format_bytes(device + host), f"the ledger's peaks: {device} + {host} B\n{status.stdout}"
    planned = re.search(r"holds (\d+\.\d\d \w+) of", status.stdout).group(1)
    assert m.group(1) == planned
    to_bytes = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    number = lambda text: float(text.split()[0]) * to_bytes[text.split()[1]]
    assert number(m.group(2)) > number(m.group(1)), "the steps' buffers come beside the plan:\n" + status.stdout


# --- the trace of an embedded model (one rank, in this process) -------------

def embedded_model(tmp_path, trace_steps, extra=""):
    """A one-parameter embedded model whose trace covers trace_steps."""
    zerod = pytest.importorskip("zerod")
    np = pytest.importorskip("numpy")
    client = zerod.Client("embedded:")
    job = (f'return {{ optimizer = {{ type = "adamw", lr = 1e-2 }}, {extra} '
           f'trace = {{ path = "{tmp_path}/trace.json", steps = {{{trace_steps[0]}, {trace_steps[1]}}} }} }}')
    model = client.create_model(script_text=job, script_name="job.lua")
    param = model.register_param("w", "m", (64,), init=np.ones(64, np.float32))
    model.finalize()
    return client, model, param


def train_step(model, param, grad=0.1):
    model.forward_begin(0)
    model.forward_end(0)
    model.backward_begin(0)
    model.grad_view(param).numpy()[:] = grad
    model.backward_end(0)
    return model.step()


def traced_steps(tmp_path):
    from zerod import trace as ztrace
    tr = ztrace.load(str(tmp_path / "trace.json"))
    assert ztrace.check(tr) == []
    return sorted(e["name"] for e in tr.events if e.get("cat") == "step")


def test_a_loaded_or_set_step_numbers_the_traced_steps_from_there(tmp_path):
    client, model, param = embedded_model(tmp_path / "first", (2, 3))
    for _ in range(10):
        train_step(model, param)
    model.save(str(tmp_path / "ckpt"))
    model.close()
    client.close()
    # A model that loads step 10 traces its steps 11 and 12, not 1 and 2.
    client, model, param = embedded_model(tmp_path, (11, 12))
    model.load(str(tmp_path / "ckpt"))
    assert [train_step(model, param).step for _ in range(3)] == [11, 12, 13]
    model.close()
    client.close()
    assert traced_steps(tmp_path) == ["step 11", "step 12"]
    # So does one set to step 20 by the trainer's own checkpoint.
    os.remove(tmp_path / "trace.json")
    client, model, param = embedded_model(tmp_path, (21, 21))
    model.set_step(20)
    assert train_step(model, param).step == 21
    model.close()
    client.close()
    assert traced_steps(tmp_path) == ["step 21"]


def test_a_skipped_fp16_step_is_one_step_in_the_trace(tmp_path):
    client, model, param = embedded_model(tmp_path, (1, 2), extra='precision = "fp16",')
    skipped = train_step(model, param, grad=float("inf"))
    assert skipped.skipped and skipped.step == 0, skipped
    assert train_step(model, param).applied
    assert train_step(model, param).applied
    model.close()
    client.close()
    # The overflowed window and the one that applied are one step 1.
    assert traced_steps(tmp_path) == ["step 1", "step 2"]


def test_the_breakdown_counts_a_compressed_step_as_the_optimizer():
    from zerod import trace as ztrace

    def span(cat, op, ts, dur, step=1):
        return {"ph": "X", "pid": 0, "tid": 1, "cat": cat, "name": op, "ts": ts, "dur": dur,
                "args": {"step": step, "op": op}}
    # What a 1-bit optimizer's zd_step records (engine/model/model_step.cpp).
    tr = ztrace.Trace({"traceEvents": [span("step", "step", 0.0, 100.0), span("call", "step", 50.0, 40.0),
                                       span("optimizer", "compressed step", 55.0, 30.0)]})
    (row,) = ztrace.breakdown(tr, 0)
    assert row["optimizer"] == pytest.approx(0.030)
    assert row["other zerod"] == pytest.approx(0.010)
