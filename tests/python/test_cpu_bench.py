"""The CPU benchmark programs (bench/, not bench/gpu) compare like with like:
tiny runs whose figures mean nothing, checked for what each prints its
ratios against. Runs under the venv (torch 2.x, DeepSpeed 0.19.x), the
peers' versions a user would install."""
import importlib.util
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time

import pytest

from conftest import ROOT, ZEROD, rank_env

BIN = os.path.dirname(os.path.abspath(ZEROD))
BENCH = os.path.join(ROOT, "bench")


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_onebit_table_sets_every_row_against_the_fastest_adam():
    table = load(os.path.join(BENCH, "onebit", "table.py"), "onebit_table")
    # Figures of the 2026-11-25 11:53 run (docs/onebit.md): stage 2's Adam
    # sends 150 MB and is the slowest, so against it stage 2 would look best.
    argv = [str(int(0.952e9)), "25e6"]
    for stage, name, mean, net in (("0", "adam", 971.3, 100e6), ("1", "adam", 1006.3, 100e6),
                                   ("2", "adam", 1443.4, 150e6), ("2", "onebit_adam_replay", 166.8, 3.13e6)):
        argv += [stage, name, str(mean), str(mean), str(net), "0"]
    text = table.table(*table.parse(argv))
    assert "stage 0's (mean 971.3 ms)" in text, text
    row = next(line for line in text.splitlines() if line.startswith("onebit_adam_replay"))
    fewer, best, same = (float(x) for x in row.split()[-3:])
    assert best == pytest.approx(971.3 / 166.8, abs=0.01), text  # 5.82, not 8.65
    assert same == pytest.approx(1443.4 / 166.8, abs=0.01), text
    assert fewer == pytest.approx(100e6 / 3.13e6, abs=0.1), text  # the constant 4 B/param
    adam2 = next(line for line in text.splitlines() if line.startswith("adam") and "1443.4" in line)
    fewer, best, same = (float(x) for x in adam2.split()[-3:])
    assert (fewer, best, same) == (pytest.approx(0.7), pytest.approx(0.67, abs=0.01), 1.0), text


def test_onebit_run_sh_prints_through_the_table():
    script = open(os.path.join(BENCH, "onebit", "run.sh")).read()
    assert '"$here/table.py"' in script
    assert "x faster" not in script


def test_gpt_step_gives_deepspeed_per_block_gathers_and_its_default_overlap():
    bench = load(os.path.join(BENCH, "gpt_step", "bench_gpt_step.py"), "bench_gpt_step")

    class Args:
        batch = 2
    zero = bench.ds_config(Args, "none", "/tmp")["zero_optimization"]
    assert "overlap_comm" not in zero, zero  # DeepSpeed's stage-3 default: True
    p = subprocess.run([sys.executable, os.path.join(BENCH, "gpt_step", "bench_gpt_step.py"), "--variants", "stage3",
                        "--rounds", "1", "--steps", "1", "--warmup", "1", "--batch", "2"],
                       env=rank_env(), capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "gathering per Block (set_z3_leaf_modules" in out, out
    assert "overlap_comm at its default" in out, out
    assert re.search(r"^stage 3, daemon .* [\d.]+x +[\d.]+x ", out, re.M), out


def fake_fio(tmp_path, read_fails):
    """A fio that writes nothing and reports 1 GB/s, and fails reads if asked."""
    fio = tmp_path / "fio"
    fio.write_text("#!/bin/sh\n"
                   f"case \"$*\" in *--rw=read*) [ {int(read_fails)} = 1 ] && exit 1;; esac\n"
                   "rw=write; case \"$*\" in *--rw=read*) rw=read;; esac\n"
                   "echo '{\"jobs\": [{\"'$rw'\": {\"bw_bytes\": 1000000000}}]}'\n")
    fio.chmod(fio.stat().st_mode | stat.S_IXUSR)
    return str(tmp_path)


@pytest.mark.parametrize("read_fails", [False, True])
def test_checkpoint_bench_has_a_direct_limit_and_survives_a_failed_fio_read(tmp_path, read_fails):
    env = rank_env()
    env["PATH"] = fake_fio(tmp_path, read_fails) + os.pathsep + env["PATH"]
    p = subprocess.run([sys.executable, os.path.join(BENCH, "checkpoint", "bench_checkpoint.py"), "--params", "1e5",
                        "--dir", str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert re.search(r"x fio direct +x fio buffered", out), out
    assert "every read cold" in out, out
    save = re.search(r"^zd_model_save \(write, fsync\) +[\d.]+ +([\d.]+) +([\d.]+) +([\d.]+)$", out, re.M)
    assert save and float(save.group(2)) == pytest.approx(float(save.group(1)), abs=0.02), out
    load_row = re.search(r"^zd_model_load .* ([\d.]+|-) +([\d.]+|-)$", out, re.M)
    assert load_row, out
    assert (load_row.group(1) == "-") == read_fails, out
    if read_fails:
        assert "read failed" in out, out


def test_checkpoint_bench_drops_the_files_from_the_page_cache(tmp_path):
    if not os.path.exists("/usr/bin/fincore"):
        pytest.skip("no fincore (util-linux) to count cached pages with")
    bench = load(os.path.join(BENCH, "checkpoint", "bench_checkpoint.py"), "bench_checkpoint")
    f = tmp_path / "shard"
    f.write_bytes(b"\1" * (8 << 20))
    cached = lambda: int(subprocess.run(["fincore", "-nbo", "RES", str(f)], capture_output=True,  # noqa: E731
                                        text=True, check=True).stdout.split()[0])
    assert cached() > 0
    bench.drop_cached(str(tmp_path))
    assert cached() == 0


def test_torch_adamw_tries_the_fused_cpu_adamw():
    import torch
    if tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2]) < (2, 4):
        pytest.skip(f"torch {torch.__version__} has no fused CPU AdamW")
    p = subprocess.run([sys.executable, os.path.join(BENCH, "cpu_adam", "torch_adamw.py"), "--params", "1e5",
                        "--steps", "2"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert re.search(r"^fused=True [\d.e+]+$", p.stdout, re.M), p.stdout
    assert f"torch {torch.__version__}" in p.stdout, p.stdout


def venv_torch():
    import torch
    return torch.__version__


def test_bench_cpu_adam_runs_torch_in_the_venv():
    exe = os.path.join(BIN, "bench_cpu_adam")
    if not os.path.exists(exe):
        pytest.skip(f"{exe} is not built")
    p = subprocess.run([exe, "--params", "1e5", "--steps", "2", "--warmup", "1", "--threads", "1", "--rounds", "1",
                        "--no-deepspeed", "--no-tiles"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"torch {venv_torch()} threads=1 (" in p.stdout, p.stdout
    assert "venv/bin/python)" in p.stdout, p.stdout
    assert "best of foreach/fused" in p.stdout, p.stdout


def test_bench_offload_step_sets_torch_against_the_whole_update():
    exe = os.path.join(BIN, "bench_offload_step")
    if not os.path.exists(exe):
        pytest.skip(f"{exe} is not built")
    p = subprocess.run([exe, "--params", "2e6", "--layers", "2", "--steps", "1", "--dir", "/var/tmp"],
                       capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    rows = {m.group(1): float(m.group(2)) for m in
            re.finditer(r"^(host, overlap off|nvme, overlap off) +[\d.]+ +([\d.]+) ", out, re.M)}
    assert set(rows) == {"host, overlap off", "nvme, overlap off"}, out
    m = re.search(r"torch \S+ threads=\d+, (\S+)\), same parameters in RAM: ([\d.]+) ms per step\n"
                  r"  zd_step with offload.overlap off .* host ([\d.]+)x, nvme ([\d.]+)x", out)
    assert m, out
    assert m.group(1).endswith("venv/bin/python"), out
    torch_ms = float(m.group(2))

    def from_rounded(row, ratio):  # printed to 0.1 ms and 0.01x: the ratio the rounded figures allow
        lo, hi = (rows[row] - 0.05) / (torch_ms + 0.05), (rows[row] + 0.05) / max(torch_ms - 0.05, 1e-9)
        return lo - 0.005 <= float(ratio) <= hi + 0.005
    assert from_rounded("host, overlap off", m.group(3)), out
    assert from_rounded("nvme, overlap off", m.group(4)), out


# Runs a command under a Python of its own, whose RUSAGE_CHILDREN then holds
# that command's peak resident memory alone: [exit status, output, bytes].
PEAK_RSS = """import json, resource, subprocess, sys
p = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(json.dumps([p.returncode, p.stdout + p.stderr, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024]))
"""
# What a bench process holds besides its buffers: libraries, thread stacks.
BASELINE_BYTES = 32 << 20


def peak_rss(*cmd):
    p = subprocess.run([sys.executable, "-c", PEAK_RSS, *cmd], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout)


def help_text(exe):
    p = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    return " ".join(p.stdout.split())  # the figures may wrap


@pytest.mark.parametrize("bench", ["bench_cpu_adam", "bench_comm_local"])
def test_bench_needs_no_more_memory_than_its_usage_says(bench):
    """--help says how much memory a run needs, to size a run by; the run
    (peers left out: their processes come after ours, or beside them with
    their own figure) stays within 1.2 times that plus the process's own."""
    exe = os.path.join(BIN, bench)
    if not os.path.exists(exe):
        pytest.skip(f"{exe} is not built")
    text = help_text(exe)
    if bench == "bench_cpu_adam":
        per_param = re.search(r"Needs about (\d+)\*N bytes", text)
        assert per_param, text
        params = 10**7
        figure = int(per_param.group(1)) * params
        cmd = [exe, "--params", str(params), "--steps", "1", "--warmup", "0", "--threads", "1", "--rounds", "1",
               "--no-torch", "--no-deepspeed"]
    else:
        per_rank = re.search(r"Needs about (\d+) \* N \* MiB of memory for N ranks", text)
        assert per_rank, text
        mib, ranks = 32, 4
        figure = int(per_rank.group(1)) * ranks * (mib << 20)
        cmd = [exe, "--mib", str(mib), "--ranks", str(ranks), "--iters", "1", "--warmup", "0", "--no-peer"]
    rc, out, peak = peak_rss(*cmd)
    assert rc == 0, out
    assert peak <= 1.2 * figure + BASELINE_BYTES, (peak / 2**20, figure / 2**20, out)


def processes_naming(text):
    """The command lines of the processes running now that hold `text`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{pid}: {cmdline}")
    return found


def zerod_wrapper(tmp_path, nproc=None):
    """A --zerod for bench_daemon_latency that writes the daemon's arguments
    to serve.args and runs this build's zerod; with nproc, serving that many
    ranks whatever the bench asked for."""
    args = tmp_path / "serve.args"
    wrapper = tmp_path / "zerod"
    serve = f'shift 3\nexec "{ZEROD}" serve --nproc {nproc} "$@"' if nproc else f'exec "{ZEROD}" "$@"'
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> "{args}"\n{serve}\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper), args


def socket_of(args):
    words = args.read_text().split()
    return words[words.index("--socket") + 1]


def assert_daemon_gone(sock, out):
    # The daemon is reaped before the bench exits: none may hold the socket.
    assert not processes_naming(sock), (processes_naming(sock), out)
    assert not os.path.exists(os.path.dirname(sock)), (sock, out)


def test_bench_daemon_latency_takes_its_daemon_down_when_a_rank_fails(tmp_path):
    """A daemon serving 1 rank where the bench runs 2: both ranks' zd_connect
    fails. The bench says so and exits 1, its daemon and folder gone."""
    exe = os.path.join(BIN, "bench_daemon_latency")
    if not os.path.exists(exe):
        pytest.skip(f"{exe} is not built")
    wrapper, args = zerod_wrapper(tmp_path, nproc=1)
    p = subprocess.run([exe, "--iters", "100", "--ranks", "2", "--no-deepspeed", "--zerod", wrapper],
                       capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "a rank died before reporting" in out, out
    assert_daemon_gone(socket_of(args), out)


def test_bench_daemon_latency_stopped_takes_its_daemon_down(tmp_path):
    """SIGTERM while the daemon's rows run (iterations enough for minutes):
    the bench stops its daemon, removes its folder and exits 128 + 15, and
    its rank processes end with it."""
    exe = os.path.join(BIN, "bench_daemon_latency")
    if not os.path.exists(exe):
        pytest.skip(f"{exe} is not built")
    wrapper, args = zerod_wrapper(tmp_path)
    p = subprocess.Popen([exe, "--iters", "2000000", "--ranks", "1", "--no-deepspeed", "--zerod", wrapper],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not args.exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert args.exists(), p.poll()
        sock = socket_of(args)
        while not os.path.exists(sock) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the rank connected and calling
        p.send_signal(signal.SIGTERM)
        out = p.communicate(timeout=60)[0]
    finally:
        p.kill()
    assert p.returncode == 128 + signal.SIGTERM, out
    assert_daemon_gone(sock, out)
    deadline = time.monotonic() + 10
    while processes_naming(wrapper) and time.monotonic() < deadline:  # a rank's command line is the bench's
        time.sleep(0.1)
    assert not processes_naming(wrapper), processes_naming(wrapper)


def test_bench_daemon_latency_runs_deepspeeds_peer_in_the_python_it_is_given(tmp_path):
    """--python names the Python of DeepSpeed's peer, where the build's venv
    and /usr/bin/python3 have no torch (the GPU image: bench/gpu/daemon.py
    passes its own). A stand-in that says what it was asked to run and
    fails: the DeepSpeed line quotes it, and zerod's rows are all there."""
    exe = os.path.join(BIN, "bench_daemon_latency")
    if not os.path.exists(exe):
        pytest.skip(f"{exe} is not built")
    python = tmp_path / "python"
    python.write_text('#!/bin/sh\necho "stand-in python ran $(basename "$1")"\nexit 3\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    p = subprocess.run([exe, "--iters", "100", "--ranks", "1", "--python", str(python)], capture_output=True,
                       text=True, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert re.findall(r"^DeepSpeed: .*$", out, re.M) == ["DeepSpeed: not measured (stand-in python ran "
                                                         "deepspeed_hooks.py)"], out  # tried once, at stage 0
    assert len(re.findall(r"^[03] +(embedded|daemon|ring), ", out, re.M)) == 8, out


def test_bench_offload_step_says_why_torch_failed(tmp_path):
    """torch that imports but fails (here: a torch package ahead of the
    venv's on PYTHONPATH, whose first call raises) is not "torch not found":
    the row says how the script ended and its error's own words."""
    exe = os.path.join(BIN, "bench_offload_step")
    if not os.path.exists(exe):
        pytest.skip(f"{exe} is not built")
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        '__version__ = "9.9"\n'
        "def set_num_threads(n):\n"
        '    raise RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 400000000 bytes")\n')
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "fake"))
    p = subprocess.run([exe, "--params", "1e5", "--layers", "1", "--steps", "1", "--no-deepspeed", "--dir",
                        str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert re.search(r"torch\.optim\.AdamW: not measured \(\S+: exit status 1: RuntimeError: DefaultCPUAllocator: "
                     r"not enough memory: you tried to allocate 400000000 bytes\)", out), out
    assert "torch not found" not in out, out
