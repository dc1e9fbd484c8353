"""The GPU benchmark drivers (bench/gpu/: offload.py with its trace line
under each zerod row, largest.py, step.py's trace and trace_summary.py) run
end to end on the CPU with a tiny GPT, so that a session with a GPU spends
its minutes measuring, not finding a driver's bug (their figures here mean nothing; bench/gpu/README.md has the
GPU's). step.py takes a hidden --device; ZEROD_BENCH_DEVICE passes it
through common.run, and largest.py's hidden --ram-gib stands in for the
GPU's memory, which would otherwise stop the search. run.sh's tests part
is checked through --dry-run against this build's ctest list, and run.sh
itself runs from a copy with stand-ins for the GPU machine's tools on PATH
(nvidia-smi, cmake, ninja, gcc, pkg-config, python3's builds and drivers),
so that a call of the device tool does not find its bugs either."""
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT, rank_env

GPU = os.path.join(ROOT, "bench", "gpu")


def driver(script, *args, timeout=600, **env_extra):
    env = rank_env(ZEROD_BENCH_DEVICE="cpu", **env_extra)
    p = subprocess.run([sys.executable, os.path.join(GPU, script), *map(str, args)], env=env,
                       capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def test_offload_prints_a_table_per_size_with_every_row():
    rc, out = driver("offload.py", "--layers", 1, "--embd", 64, "--seq", 64, "--micro", 1, "--sizes", "64,128",
                     "--modes", "torch,zerod3_host,zerod3_params", "--steps", 4, "--timeout", 200,
                     "--zerod-args=--threads=1")  # one token, as run.sh's OFFLOAD_ARGS word-splits it
    assert rc == 0, out
    runs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [(r["tokens_per_step"], r["mode"], r["ok"]) for r in runs] == [
        (n, m, True) for n in (64, 128) for m in ("torch", "zerod3_host", "zerod3_params")], out
    # A traced zerod row's step time leaves out step 4, inside which zerod
    # writes the trace; torch's is the median of steps 3-4.
    assert [(r["mode"], r["timed_steps"]) for r in runs[:3]] == [
        ("torch", [3, 4]), ("zerod3_host", [3]), ("zerod3_params", [3])], out
    for n, gas in ((64, 1), (128, 2)):
        assert f"{n} tokens per step (1 x 64 x {gas} micro-batches)" in out, out
    rows = re.findall(r"^(torch|zerod3_host|zerod3_params) +yes +([\d.]+) +([\d.]+) .* ([\d.]+)  ", out, re.M)
    assert len(rows) == 6, out
    for mode, ms, x_torch, host in rows:
        assert float(ms) > 0 and float(x_torch) > 0, out
        if mode == "zerod3_host":
            # Issue 33 section 3: under 16.5 host bytes a parameter with fp32 state.
            assert 10 < float(host) <= 16.5, out
    # Under each zerod row, what its traced steps spent in zerod's calls.
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("zerod3_"):
            assert re.match(r"    trace: step [\d.]+ ms, in zerod's calls [\d.]+ ms \(step [\d.]+, .*\); inside them: "
                            r"\w.*; CPU update \d+ M params/s, [\d.]+ GB/s at 28 B a parameter$", lines[i + 1]), out
    assert sum(line.startswith("    trace: ") for line in lines) == 4, out


def test_largest_searches_each_mode_and_states_the_limit(tmp_path):
    # Each mode's share (60 s and more) leaves room for a second try after
    # the first (a try is not started with under 30 s left), even where the
    # first takes several times the 5-8 s it takes on a quiet 2-core VM.
    rc, out = driver("largest.py", "--embd", 64, "--modes", "zerod3_host,torch", "--budget", 120, "--timeout", 25,
                     "--ram-gib", 0.1, OUT=tmp_path)
    assert rc == 0, out
    for mode in ("zerod3_host", "torch"):
        tries = re.findall(rf"^  {mode}: \d+ layers \([\d.]+[MB]\): (trains|fails)", out, re.M)
        assert len(tries) >= 2 and tries[0] == "trains", out
    # Under run.sh (OUT set) every try's whole stderr lands in $OUT/rows.err,
    # a failed one's beyond the 3 lines its row quotes.
    err = (tmp_path / "rows.err").read_text()
    tried = re.findall(r"^  (zerod3_host|torch): (\d+) layers", out, re.M)
    logged = re.findall(r"^=== \S+ --mode (\w+) --layers (\d+) .*: (exit -?\d+|killed over \d+ s) after", err, re.M)
    assert [(m, n) for m, n, _ in logged] == tried, (out, err)
    row = re.search(r"^zerod3_host +([\d.]+[MB]) .* ([\d.]+[MB]) \(host RAM\) +(\d+)%", out, re.M)
    assert row, out
    assert re.search(r"^torch +[\d.]+[MB] +1\.0 ", out, re.M), out


def test_a_traced_step_is_summarised(tmp_path):
    trace = tmp_path / "trace.json"
    env = rank_env()
    p = subprocess.run([sys.executable, os.path.join(GPU, "step.py"), "--mode", "zerod3_host", "--layers", "2",
                        "--embd", "64", "--seq", "64", "--micro", "1", "--steps", "5", "--ckpt", "--device", "cpu",
                        "--trace", str(trace)], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and trace.exists(), p.stdout + p.stderr
    # Step 4 writes the trace (the window's last): the step time is steps 3 and 5.
    assert json.loads(p.stdout.splitlines()[-1])["timed_steps"] == [3, 5], p.stdout
    s = subprocess.run([sys.executable, os.path.join(GPU, "trace_summary.py"), str(trace), "--top", "40"],
                       capture_output=True, text=True, timeout=60)
    assert s.returncode == 0, s.stdout + s.stderr
    assert re.search(r"^steps \(ms\): [\d.]+, [\d.]+$", s.stdout, re.M), s.stdout
    for span in ("optimizer piece", "gather", "reduce bucket"):
        assert span in s.stdout, s.stdout


def test_every_zerod_mode_of_step_py_trains(tmp_path):
    """run.sh smoke's modes (DeepSpeed's aside: the venv's DeepSpeed would
    build its CPU Adam first, minutes here): each trains a tiny GPT 3 steps,
    the loss finite and falling, with its placement's host and NVMe bytes."""
    env = rank_env()
    for mode in ("torch", "zerod0", "zerod3", "zerod3_host", "zerod3_host_bf16", "zerod3_params", "zerod3_nvme_opt",
                 "zerod3_nvme"):
        p = subprocess.run([sys.executable, os.path.join(GPU, "step.py"), "--mode", mode, "--layers", "1", "--embd",
                            "64", "--seq", "64", "--micro", "1", "--steps", "3", "--device", "cpu", "--nvme",
                            str(tmp_path / mode)], env=env, capture_output=True, text=True, timeout=300)
        runs = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        assert p.returncode == 0 and len(runs) == 1 and runs[0]["ok"], (mode, p.stdout + p.stderr)
        r = runs[0]
        if mode.startswith("zerod3_"):
            assert r["zerod_host_bytes_per_param"] > 0, (mode, r)
            # The peak largest.py sizes its tries by is reported, and is no
            # less than what the host holds between steps.
            assert r["zerod_host_peak_bytes_per_param"] >= r["zerod_host_bytes_per_param"], (mode, r)
        assert ("zerod_nvme_bytes_per_param" in r) == ("nvme" in mode), (mode, r)
        if mode == "zerod3_host_bf16":
            assert r["zerod_host_bytes_per_param"] < 12, r  # bf16 m and v: 4 bytes less than fp32's 14
    # --ratio: part of the optimizer stays on the device (offload.ratio),
    # so the host holds less a parameter than with all of it there.
    full = None
    for ratio in (None, 0.5):
        p = subprocess.run([sys.executable, os.path.join(GPU, "step.py"), "--mode", "zerod3_host", "--layers", "1",
                            "--embd", "64", "--seq", "64", "--micro", "1", "--steps", "3", "--device", "cpu",
                            *(["--ratio", str(ratio)] if ratio else [])], env=env, capture_output=True, text=True,
                           timeout=300)
        runs = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        assert p.returncode == 0 and len(runs) == 1 and runs[0]["ok"], p.stdout + p.stderr
        if ratio is None:
            full = runs[0]["zerod_host_bytes_per_param"]
        else:
            assert runs[0]["ratio"] == 0.5, runs[0]
            assert runs[0]["zerod_host_bytes_per_param"] < 0.75 * full, (full, runs[0])


def test_daemon_measures_against_embedded_and_the_formula():
    """run.sh daemon (issue 32 section 4) with a tiny GPT: the daemon's rows
    beside embedded's, begin + end pairs, the C++ trainer beside the
    PyTorch GPT. On the cpu device the daemon's one rank trains the same
    bits as embedded, and zerod's device bytes per rank are DESIGN.md
    section 4's (2 + 2 + 12) / N plus the few small tensors every rank
    keeps whole."""
    rc, out = driver("daemon.py", "--layers", 2, "--embd", 128, "--seq", 64, "--micro", 1, "--steps", 4,
                     "--modes", "zerod3,zerod0", "--latency-iters", 300, "--cpp-layers", 2, "--cpp-heads", 2,
                     "--cpp-embd", 64, "--cpp-block", 32, "--cpp-batch", 4, "--cpp-steps", 10, "--timeout", 200)
    assert rc == 0, out
    rows = re.findall(r"^(zerod[03]) +(embedded, 1 rank|daemon, 1 rank|daemon, 2 ranks, one GPU) +(yes|NO) +([\d.]+) "
                      r"+([\d.]+) +(\d+) +([\d.]+) +([\d.]+) +([\d.]+)  ([\d.]+) -> ([\d.]+)", out, re.M)
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (m, w, "yes") for m in ("zerod3", "zerod0")
        for w in ("embedded, 1 rank", "daemon, 1 rank", "daemon, 2 ranks, one GPU")], out
    for mode, where, _, ms, x, tok, dev, want, ratio, first, last in rows:
        assert float(ms) > 0 and int(tok) > 0, out
        assert float(want) == (16.0 if mode == "zerod0" or "1 rank" in where else 8.0), out
        assert 1.0 <= float(ratio) <= 1.05, out
    by = {(r[0], r[1]): r for r in rows}
    for mode in ("zerod3", "zerod0"):
        assert by[(mode, "daemon, 1 rank")][9:] == by[(mode, "embedded, 1 rank")][9:], out
    latency = re.findall(r"^([03]) +(embedded, 1 rank|daemon, socket, 2 ranks|ring, synchronous end, 2 ranks|"
                         r"daemon, call ring, 2 ranks) +([\d.]+) +([\d.]+)$", out, re.M)
    assert len(latency) == 8, out
    cpp = re.findall(r"^(PyTorch|C\+\+) +(embedded, 1 rank|daemon, 2 ranks) +(\d+) +([\d.]+)  ([\d.]+)$", out, re.M)
    assert [(r[0], r[1]) for r in cpp] == [(t, w) for w in ("embedded, 1 rank", "daemon, 2 ranks")
                                           for t in ("PyTorch", "C++")], out


def test_daemon_prints_each_row_as_its_run_ends():
    """run.sh stops daemon.py at the call's deadline (SIGTERM): the rows
    measured by then are in its output already, each printed as its run
    ended (the embedded row seconds before the daemon's: a run of `zerod
    run` starts Python and torch), and the run in flight goes with it."""
    p = subprocess.Popen([sys.executable, os.path.join(GPU, "daemon.py"), "--parts", "steps", "--modes", "zerod3",
                          "--layers", "1", "--embd", "64", "--seq", "64", "--micro", "1", "--steps", "4",
                          "--timeout", "200"], env=rank_env(ZEROD_BENCH_DEVICE="cpu"), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    seen, at = [], {}
    try:
        for line in p.stdout:
            seen.append(line)
            row = re.match(r"zerod3 +(embedded, 1 rank|daemon, 1 rank) ", line)
            if row:
                at[row.group(1)] = time.monotonic()
            if "daemon, 1 rank" in at:
                p.send_signal(signal.SIGTERM)  # the 2 ranks' run has just begun
                break
        rest = p.communicate(timeout=30)[0]
    finally:
        p.kill()
    out = "".join(seen) + rest
    assert re.search(r"^zerod3 +embedded, 1 rank +yes ", out, re.M), out
    assert at["daemon, 1 rank"] - at["embedded, 1 rank"] > 1, out
    assert "daemon, 2 ranks" not in out, out
    assert p.returncode != 0, out


def test_daemon_keeps_to_its_budget():
    """--budget (run.sh gives the time left): each run is capped at what
    is left, and one that would start with under 30 s left is skipped.
    The steps rows take seconds here; the latency run after them, of
    iterations enough for an hour, is cut at the budget (or skipped, where
    the rows took more than 15 s), and the rows are printed either way."""
    start = time.monotonic()
    rc, out = driver("daemon.py", "--parts", "steps,latency", "--modes", "zerod3", "--layers", 1, "--embd", 64,
                     "--seq", 64, "--micro", 1, "--steps", 4, "--latency-iters", 10**9, "--timeout", 200,
                     "--budget", 45)
    took = time.monotonic() - start
    assert rc == 0, out
    assert re.search(r"^zerod3 +embedded, 1 rank +yes ", out, re.M), out
    assert re.search(r"^(bench_daemon_latency: over \d+ s|bench_daemon_latency: skipped, under 30 s left of the "
                     r"45 s budget)$", out, re.M), out
    assert took < 45 + 20, (took, out)


def test_daemon_runs_deepspeeds_latency_peer_in_its_own_python(tmp_path):
    """run.sh daemon's latency part on the GPU image: bench_daemon_latency's
    own choice for DeepSpeed's peer (build-gpu/venv, which run.sh never
    makes, else /usr/bin/python3) has no torch there, so the DeepSpeed line
    would only ever say "No module named 'torch'". daemon.py hands it its
    own Python (--python), run.sh's python3, whose environment has torch and
    DeepSpeed. A stand-in bench beside a stand-in zerod says what it was
    given; the bench's --python itself: python.cpu_bench."""
    for name, body in (("bench_daemon_latency", 'echo "bench_daemon_latency given: $*"'), ("zerod", "exit 1")):
        exe = tmp_path / name
        exe.write_text(f"#!/bin/sh\n{body}\n")
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    rc, out = driver("daemon.py", "--parts", "latency", "--latency-iters", 100, "--timeout", 60, "--zerod",
                     tmp_path / "zerod")
    assert rc == 0, out
    given = re.search(r"^bench_daemon_latency given: (.*)$", out, re.M)
    assert given, out
    words = given.group(1).split()
    assert "--python" in words and words[words.index("--python") + 1] == sys.executable, out


def build_dir():
    """This build's folder (ctest's ZEROD_LIB is its lib/libzerod.so)."""
    lib = os.environ.get("ZEROD_LIB")
    build = os.path.dirname(os.path.dirname(os.path.realpath(lib))) if lib else os.path.join(ROOT, "build")
    if not os.path.exists(os.path.join(build, "CTestTestfile.cmake")):
        pytest.skip(f"no ctest list in {build}")
    return build


def run_sh_dry(tmp_path, *parts, **env):
    """run.sh --dry-run from a copy of bench/gpu whose build-gpu/ is this
    build (the GPU machine's has the same test names)."""
    gpu = tmp_path / "bench" / "gpu"
    if not gpu.exists():
        shutil.copytree(GPU, gpu)
        (tmp_path / "build-gpu").symlink_to(build_dir())
    p = subprocess.run(["bash", str(gpu / "run.sh"), "--dry-run", *parts], env=dict(os.environ, **env),
                       capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def ctest_names(*selection):
    p = subprocess.run(["ctest", "--test-dir", build_dir(), "-N", *selection], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return re.findall(r"^ *Test +#\d+: (.*)$", p.stdout, re.M)


def test_run_sh_tests_stops_where_tests_r_matches_nothing(tmp_path):
    """ctest says "No tests were found!!!" and exits 0: run.sh counts first
    and its dry run stops (exit 2). A value-parameterised test is named by
    gtest's name alone (NO_PRETTY_VALUES), so '^NAME$' finds it."""
    rc, out = run_sh_dry(tmp_path, "tests", TESTS_R="^no_such_test$")
    assert rc == 2, out
    assert "matches no test in build-gpu/" in out and "TESTS_R='^NAME( |$)'" in out, out
    for name in ("device_engine.Placements/OnDevice.TrainsAsTheCpuDeviceDoes/cuda_stage3_device_f32",
                 "kernels.Plugins/CudaUpdate.MatchesScalarReference/adam_grad_f32_work_f32", "python.cuda_daemon"):
        for regex in (f"^{re.escape(name)}$", f"^{re.escape(name)}( |$)"):
            rc, out = run_sh_dry(tmp_path, "tests", TESTS_R=regex)
            assert rc == 0 and "(tests in build-gpu/ now: 1)" in out, (regex, out)


def test_run_sh_tests_runs_the_gpu_tests_alone(tmp_path):
    """The tests part selects every test that uses the GPU and none of the
    cpu, opaque or message cases beside them, which would start first and
    take the part's minutes."""
    rc, out = run_sh_dry(tmp_path, "tests")
    assert rc == 0, out
    m = re.search(r"1\. tests: ctest -R '([^']+)' -E '([^']+)' -j4 \(tests in build-gpu/ now: (\d+)\)", out)
    assert m, out
    chosen = set(ctest_names("-R", m.group(1), "-E", m.group(2)))
    assert len(chosen) == int(m.group(3)), out
    every = ctest_names()
    # With their own branch where there is a GPU.
    gpu_branch = {"abi.DeviceTest.AutoIsTheGpuWhereThereIsOne",
                  "offload.HostTier.ThisMachineIsBoundAndNotPageLockedWithoutAGpu", "cli.plan_honours_a_cuda_job",
                  "python.errors", "device.DeviceChoice.CudaWithoutAGpuIsAClearErrorAndAutoFallsBackToTheCpu"}
    gpu = {n for n in every if re.match(r"(device|device_engine|overlap)\.[^ ]*/cuda", n)
           or re.match(r"(device\.Cuda(Shared|Stream)|kernels\.[^ ]*CudaUpdate)\.", n)
           or re.match(r"(python\.cuda|example\.cpp_gpt_cuda)", n) or n in gpu_branch}
    assert gpu_branch <= set(every), sorted(gpu_branch - set(every))
    cpu = {n for n in every if re.match(r"(device|device_engine|overlap)\.[^ ]*/(cpu|opaque)", n)
           or re.match(r"device\.(CudaFailure|StreamSignals)\.|device_engine\.(DeviceBudget|DeviceStreams|Opaque"
                       r"|HostStagingBudget|Optimizers/CompressingOnDevice|CompressingOnDeviceReplay)", n)}
    assert {"python.cuda", "python.cuda_daemon", "python.cuda_integrations"} <= gpu, sorted(gpu)
    assert gpu <= chosen, sorted(gpu - chosen)
    assert not chosen & cpu, sorted(chosen & cpu)


def test_the_long_gpu_tests_start_first():
    """Registered last, they would start last on a fresh GPU machine (no
    timings yet) and be stopped by run.sh's TESTS_S: a COST puts them
    first in a parallel ctest."""
    p = subprocess.run(["ctest", "--test-dir", build_dir(), "--show-only=json-v1", "-R",
                        r"^(python\.cuda(_daemon|_integrations)?|example\.cpp_gpt_cuda_matches_pytorch)$"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    cost = {t["name"]: next((q["value"] for q in t.get("properties", []) if q["name"] == "COST"), None)
            for t in json.loads(p.stdout)["tests"]}
    assert {"python.cuda", "python.cuda_daemon", "python.cuda_integrations"} <= set(cost), cost
    assert all(c is not None and c >= 1000 for c in cost.values()), cost


def test_largest_never_tries_more_than_host_ram_holds(monkeypatch):
    """Issue 33 point 4 on the H200 (125 GiB of RAM, zerod3_host at 14.04
    host bytes a parameter): the jump after the first size that trains, and
    every try grown from it, fits in RAM with the trainer's own memory
    beside zerod's state; the search still ends at 90% of the machine's
    limit or more. A try past it (the quarter grown after the jump, 52
    layers: 150 GB) was killed for memory after minutes, and the budget ran
    out bisecting back."""
    monkeypatch.syspath_prepend(GPU)
    import largest

    ram, bpp, trainer = 125 * 2**30, 14.04, 4 * 2**30
    tried = []

    def fake_run(mode, layers, embd, steps, timeout, extra=(), log=None):
        n = largest.params_of(layers, embd)
        held = n * bpp + trainer
        tried.append((layers, held))
        if held > ram:
            return {"mode": mode, "layers": layers, "ok": False, "error": "exit -9: killed for memory"}
        return {"mode": mode, "layers": layers, "params": n, "ok": True, "zerod_host_bytes_per_param": bpp,
                "zerod_host_gib": n * bpp / 2**30, "host_peak_gib": held / 2**30}

    monkeypatch.setattr(largest, "run", fake_run)
    first = fake_run("zerod3_host", 2, 4096, 3, 420)
    jump = largest.layers_for(0.9 * largest.predicted(first, ram, 10**15), 4096)
    assert largest.params_of(jump, 4096) * bpp < ram
    tried.clear()
    a = type("Args", (), {"embd": 4096, "timeout": 420, "rows_err": None})()
    ok, bad, stopped = largest.search("zerod3_host", a, time.time() + 3600, ram, 10**15)
    assert all(held <= ram for _, held in tried), tried
    assert tried[1][0] == jump, tried
    assert ok["params"] >= 0.9 * largest.limit(ok, ram, 10**15)[0], (tried, ok)
    assert bad is None and stopped == "the next size is over the machine's limit", (tried, stopped)


def test_offload_table_sets_no_ratio_against_a_row_that_is_not_ok(monkeypatch, capsys):
    """step.py says ok false where the loss went NaN or did not fall: such a
    row's step time is no figure to meet or miss a target with, whether it
    is the zerod row or the torch or DeepSpeed row it is set against."""
    monkeypatch.syspath_prepend(GPU)
    import offload

    a = type("Args", (), {"micro": 4, "seq": 2048, "layers": 24, "embd": 2048, "steps": 4})()
    row = dict(params=10**9, tokens_per_s=1)
    rows = {"torch": dict(row, mode="torch", ok=True, step_ms=100.0),
            "zerod3_host": dict(row, mode="zerod3_host", ok=False, step_ms=110.0, loss_first=10.0,
                                loss_last=float("nan")),
            "zerod3_params": dict(row, mode="zerod3_params", ok=True, step_ms=120.0),
            "ds3_host": dict(row, mode="ds3_host", ok=True, step_ms=300.0),
            "ds3_params": dict(row, mode="ds3_params", ok=False, step_ms=400.0)}
    offload.table(64 * 1024, 8, a, rows)
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.split()[:1] and
             line.split()[0] in rows}
    assert re.match(r"zerod3_host +NO +110\.0 +nan +nan .* not ok: no ratio$", lines["zerod3_host"]), lines
    # Its torch ratio stands; the DeepSpeed row it would be set against is not ok.
    assert re.match(r"zerod3_params +yes +120\.0 +1\.20 +nan .*  x torch met, not ok: no ratio$",
                    lines["zerod3_params"]), lines
    assert "met" not in lines["zerod3_host"] and "MISSED" not in lines["zerod3_host"], lines
    assert "MISSED" not in lines["zerod3_params"] and "x DeepSpeed" not in lines["zerod3_params"], lines
    # And where torch's own row is not ok, no zerod row has an x torch.
    rows["torch"]["ok"] = False
    offload.table(64 * 1024, 8, a, rows)
    out = capsys.readouterr().out
    assert re.search(r"^zerod3_params +yes +120\.0 +nan ", out, re.M), out
    assert not re.search(r"x torch (met|MISSED)", out), out


def test_step_py_ends_the_last_step_on_step_1s_last_batch(monkeypatch):
    """ok (the loss fell) and the losses first and last compare the last
    micro-batch of step 1 with the last step's: the same batch, whatever
    the steps and the accumulation (min(4, (steps - 1) * gas) batches were
    another where that span is neither 4 or less nor a multiple of 4: 6,
    7, 9, 10, ...)."""
    monkeypatch.syspath_prepend(GPU)
    import step

    for steps in range(4, 11):
        for gas in (1, 2, 8):
            cycle = step.batch_cycle(steps, gas)
            assert 1 <= cycle <= 4, (steps, gas, cycle)
            first = step.batch_index(0, gas - 1, gas, cycle)
            last = step.batch_index(steps - 1, gas - 1, gas, cycle)
            assert first == last, (steps, gas, cycle, first, last)
    # As many batches as that allows: 4 where the span is a multiple of 4.
    assert [step.batch_cycle(s, 1) for s in (2, 3, 4, 5, 7, 8, 12, 13)] == [1, 2, 3, 4, 3, 1, 1, 4]


# Stand-ins for the GPU machine's tools, for run.sh in a copy (fake_run_sh):
# each says it was called in calls.log. FAKE_* variables steer them.
FAKES = {
    "nvidia-smi": """case "$*" in
  *compute_cap*) echo 9.0 ;;
  *) echo "name, memory.total [MiB]"; echo "NVIDIA H200, 143771 MiB" ;;
esac""",
    # The configure leaves build-gpu/ as it was where it fails (an earlier
    # call's binaries there on a warm machine).
    "cmake": """case " $* " in
  *" -S "*) [ "${FAKE_CONF_RC:-0}" = 0 ] || { echo "CMake Error: lua5.4 not found"; exit 1; }
            mkdir -p build-gpu; [ -f build-gpu/CTestTestfile.cmake ] || : >build-gpu/CTestTestfile.cmake ;;
  *" --build "*) mkdir -p build-gpu/lib build-gpu/bin && touch build-gpu/lib/libzerod.so build-gpu/bin/zerod ;;
esac""",
    "ninja": ":",
    "pkg-config": """exit "${FAKE_LUA_RC:-0}\"""",
    "gcc": """o=""; prev=""; for a in "$@"; do [ "$prev" = -o ] && o=$a; prev=$a; done
printf '#!/bin/sh\\necho "$OMP_NUM_THREADS threads: copy 60.0 GB/s, triad 70.0 GB/s"\\n' >"$o"; chmod +x "$o\"""",
    # python3: DeepSpeed's build takes FAKE_DS_S; offload.py and largest.py
    # say what they were given (offload.py: whether DeepSpeed's build had
    # ended as it started, then what the build wrote); the rest is Python.
    "python3": """case "$1 $2" in
  "-c "*CPUAdamBuilder*) sleep "${FAKE_DS_S:-0}"; echo built; exit 0 ;;
  "-c "*"import torch;"*) echo "torch (stand-in)"; exit 0 ;;
  "-c "*) exit 1 ;;
  "-m pip") exit 0 ;;
  *bench/gpu/largest.py*) echo "largest.py given: ${*:2}"; exit 0 ;;
  *bench/gpu/offload.py*)
    echo "offload.py given: ${*:2}"
    ready=""; prev=""; for a in "$@"; do [ "$prev" = --ds-ready ] && ready=$a; prev=$a; done
    [ -n "$ready" ] || exit 0
    [ -f "$ready" ] && echo "ds build ended as offload started: yes" || echo "ds build ended as offload started: no"
    for _ in $(seq 200); do [ -f "$ready" ] && break; sleep 0.1; done
    echo "ds-ready says: $(cat "$ready")"; exit 0 ;;
esac
exec "$REAL_PYTHON" "$@\"""",
}


def fake_run_sh(tmp_path, *parts, fakes=(), **env):
    """bench/gpu/run.sh PARTS from a copy of bench/gpu in tmp_path (the
    repository root there), the stand-ins of FAKES (and `fakes`, name ->
    script) first on PATH, $OUT in tmp_path/out. Returns (exit status, its
    output, what the stand-ins were called with)."""
    gpu = tmp_path / "bench" / "gpu"
    if not gpu.exists():
        shutil.copytree(GPU, gpu, ignore=shutil.ignore_patterns("__pycache__"))
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "calls.log"
    for name, body in {**FAKES, **dict(fakes)}.items():
        exe = bin_dir / name
        exe.write_text(f'#!/bin/bash\necho "{name} $*" >>"{calls}"\n{body}\n')
        exe.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "TESTS_", "OFFLOAD_", "LARGEST_"))}
    p = subprocess.run(["bash", str(gpu / "run.sh"), *parts], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120, env=dict(base, PATH=f"{bin_dir}:{os.environ['PATH']}", OUT=str(tmp_path / "out"),
                                         REAL_PYTHON=sys.executable, **env))
    return p.returncode, p.stdout + p.stderr, calls.read_text() if calls.exists() else ""


def test_run_sh_stops_at_once_without_the_build_dependencies(tmp_path):
    """Without .devdeps (bench/gpu/prepare.sh, carried) nor lua5.4 on the
    machine, a part that needs the build would have been skipped minutes
    in, after the configure failed: run.sh stops before anything runs, its
    dry run too, and says how to make and carry them."""
    for args in (("hostbw", "tests"), ("--dry-run", "hostbw", "tests")):
        start = time.monotonic()
        rc, out, calls = fake_run_sh(tmp_path, *args, FAKE_LUA_RC="1")
        assert rc == 2, (args, out)
        assert "run bench/gpu/prepare.sh" in out and 'carry=[".devdeps", ".whl"]' in out, (args, out)
        assert not re.search(r"^(cmake|gcc|nvidia-smi) ", calls, re.M), (args, calls)
        assert time.monotonic() - start < 20, (args, out)
    # hostbw alone needs no build; a machine with lua5.4 builds without .devdeps.
    assert fake_run_sh(tmp_path, "--dry-run", "hostbw", FAKE_LUA_RC="1")[0] == 0
    assert fake_run_sh(tmp_path, "--dry-run", "tests", FAKE_LUA_RC="0")[0] == 0
    # A carried .devdeps whose unpacking fails stops it as well, before the
    # configure (its eval of nothing let the build find no dependencies).
    (tmp_path / ".devdeps").mkdir()
    (tmp_path / ".devdeps" / "unpack.sh").write_text("echo 'dpkg-deb: error: not a Debian archive' >&2\nexit 2\n")
    (tmp_path / "calls.log").unlink()
    rc, out, calls = fake_run_sh(tmp_path, "tests", "hostbw", FAKE_LUA_RC="1")
    assert rc == 2 and "unpack.sh failed: dpkg-deb: error" in out, out
    assert not re.search(r"^(cmake|gcc) ", calls, re.M), calls


def test_run_sh_goes_on_where_ctest_cannot_read_the_test_list(tmp_path):
    """A test list ctest cannot read is not a regex that matches nothing:
    ctest's own error is printed, and the parts after tests still run (the
    call exits 2 at the end)."""
    ctest = """if [[ " $* " == *" -N "* ]]; then
  echo "Test project build-gpu"
  printf 'CMake Error at build-gpu/sub/CTestTestfile.cmake:2:\\n  Parse error.  Function missing ending ")".\\n' >&2
  exit 8
fi"""
    rc, out, calls = fake_run_sh(tmp_path, "tests", "hostbw", fakes={"ctest": ctest}, RUN_DEADLINE_S="100")
    assert rc == 2, out
    assert re.search(r"ctest -N cannot read build-gpu \(exit 8\): CMake Error at .* Parse error", out), out
    assert "matches no test" not in out, out
    assert "copy 60.0 GB/s" in out and (tmp_path / "out" / "hostbw.txt").exists(), out
    assert not re.search(r"^ctest (?!.*-N)", calls, re.M), calls  # no run of the tests
    rc, out, _ = fake_run_sh(tmp_path, "--dry-run", "tests", fakes={"ctest": ctest})
    assert rc == 2 and "ctest -N cannot read build-gpu (exit 8)" in out, out


def test_run_sh_runs_no_earlier_build_where_the_configure_failed(tmp_path):
    """On a warm machine build-gpu/ holds the last call's test list and
    library: a configure that fails now must not leave them to run as this
    code's. hostbw still runs, and the call exits 2 naming the parts not
    run (it exited 0, as if this code had been built and tested)."""
    (tmp_path / "build-gpu" / "lib").mkdir(parents=True)
    (tmp_path / "build-gpu" / "CTestTestfile.cmake").write_text('add_test(python.cuda "true")\n')
    (tmp_path / "build-gpu" / "lib" / "libzerod.so").write_text("")
    rc, out, calls = fake_run_sh(tmp_path, "tests", "offload", "hostbw", FAKE_CONF_RC="1",
                                 OFFLOAD_ARGS="--no-deepspeed", RUN_DEADLINE_S="100")
    assert rc == 2, out
    assert "the configure failed" in out, out
    for part in ("tests", "offload"):
        assert f"{part}: skipped, the configure failed (configure.log)" in out, out
    assert not re.search(r"^ctest |^cmake --build|offload\.py", calls, re.M), calls
    assert "copy 60.0 GB/s" in out, out
    assert re.search(r"exit 2: not run: tests \(the configure failed\), offload \(the configure failed\)", out), out


def test_run_sh_exits_2_where_a_part_was_not_built(tmp_path):
    """A compile error skips only the parts whose binaries it left out (the
    others run on), and the call exits 2 naming them; it exited 0."""
    cmake = """case " $* " in
  *" -S "*) mkdir -p build-gpu; : >build-gpu/CTestTestfile.cmake ;;
  *" --build "*) mkdir -p build-gpu/lib && touch build-gpu/lib/libzerod.so; exit 1 ;;
esac"""
    rc, out, calls = fake_run_sh(tmp_path, "nccl", "hostbw", fakes={"cmake": cmake}, RUN_DEADLINE_S="100")
    assert rc == 2, out
    assert "nccl: skipped, build-gpu/bin/test_comm_nccl_gpu was not built" in out, out
    assert "copy 60.0 GB/s" in out, out
    assert "exit 2: not run: nccl (build-gpu/bin/test_comm_nccl_gpu was not built)" in out, out


def test_run_sh_names_the_tests_the_stop_time_kept_from_starting(tmp_path):
    """ctest's summary counts only the tests it started: run.sh names the
    selected ones its --stop-time kept from starting. device.CudaShared.*
    and device.CudaStream.*, which the next GPU session reads first, start
    before the long tests (COST 1000), whose minutes would otherwise keep
    them out. Real ctest, over a test list of stand-ins."""
    build = tmp_path / "build-gpu"
    build.mkdir()
    tests = [(n, "sleep 30", 1000) for n in ("python.cuda", "python.cuda_daemon", "python.cuda_integrations",
                                              "example.cpp_gpt_cuda_matches_pytorch")]
    tests += [(n, "true", None) for n in ("device.CudaShared.A", "device.CudaShared.B", "device.CudaStream.C",
                                           "device.Devices/OnDevice.X/cuda", "overlap.Jobs/Overlap.Y/cuda",
                                           "device.Devices/OnDevice.X/cpu")]
    (build / "CTestTestfile.cmake").write_text("".join(
        f'add_test({n} "sh" "-c" "{cmd}")\n' + (f"set_tests_properties({n} PROPERTIES COST {c})\n" if c else "")
        for n, cmd, c in tests))
    rc, out, _ = fake_run_sh(tmp_path, "tests", TESTS_S="5", RUN_DEADLINE_S="100")
    assert rc == 0, out
    log = (tmp_path / "out" / "cuda-tests.log").read_text()
    started = re.findall(r"^ *Start +\d+: (\S+)", log, re.M)
    assert {"device.CudaShared.A", "device.CudaShared.B", "device.CudaStream.C"} <= set(started), log
    assert "not started before the stop time (2): device.Devices/OnDevice.X/cuda overlap.Jobs/Overlap.Y/cuda" \
        in out, (out, log)
    run_log = (tmp_path / "out" / "run.log").read_text()
    assert "not started before the stop time (2)" in run_log, run_log


def test_run_sh_starts_offload_before_deepspeeds_build_ends(tmp_path):
    """offload's zerod and torch rows need no DeepSpeed: run.sh hands it
    the file the background build writes as it ends (outside $OUT, which
    comes back 8 files at most), and offload.py's first DeepSpeed row waits
    for that. run.log has the build's own time."""
    rc, out, _ = fake_run_sh(tmp_path, "offload", FAKE_DS_S="5", RUN_DEADLINE_S="100",
                             OFFLOAD_ARGS="--modes zerod3_host,torch,ds3_host")
    assert rc == 0, out
    given = re.search(r"^offload\.py given: (.*)$", out, re.M)
    assert given, out
    words = given.group(1).split()
    assert "--budget" in words and "--ds-ready" in words, out
    ready = words[words.index("--ds-ready") + 1]
    assert not ready.startswith(str(tmp_path / "out")), out
    assert "ds build ended as offload started: no" in out, out
    assert re.search(r"^ds-ready says: 0 [5-9]$", out, re.M), out
    run_log = (tmp_path / "out" / "run.log").read_text()
    assert "waiting for DeepSpeed" not in run_log, run_log
    assert re.search(r"^\[ds build\] exit 0 after [5-9] s$", run_log, re.M), run_log
    assert not os.path.exists(ready), ready  # run.sh's scratch folder goes with it
    assert sorted(os.listdir(tmp_path / "out")) == ["build.log", "configure.log", "offload-ps.txt",
                                                   "offload.txt", "run.log"]


def test_run_sh_checks_the_time_left_after_waiting_for_deepspeed(tmp_path):
    """largest waits for DeepSpeed's build before its first try: the time
    left is what is left after that wait, or the part would start with
    less than MIN_PART_S."""
    rc, out, calls = fake_run_sh(tmp_path, "largest", FAKE_DS_S="5", RUN_DEADLINE_S="8", MIN_PART_S="5")
    assert rc == 0, out
    assert re.search(r"\[ds build\] exit 0 after [5-9] s \(waited [1-9] s\)", out), out
    skipped = re.search(r"largest: skipped, (-?\d+) s left of the 8 s", out)
    assert skipped and int(skipped.group(1)) < 5, out
    assert "largest.py" not in calls, calls


def offload_main(monkeypatch, capsys, *args):
    """offload.py's main with its rows stood in for: the rows it started
    (mode, and whether the --ds-ready file was there then), its output."""
    monkeypatch.syspath_prepend(GPU)
    import offload

    ready = None if "--ds-ready" not in args else args[args.index("--ds-ready") + 1]
    started = []

    def fake_run(mode, layers, embd, steps, timeout, extra=(), log=None):
        started.append((mode, bool(ready) and os.path.exists(ready)))
        return {"mode": mode, "ok": True, "step_ms": 1.0, "params": 10**6, "tokens_per_s": 1}

    monkeypatch.setattr(offload, "run", fake_run)
    monkeypatch.setattr(sys, "argv", ["offload.py", "--no-trace", *map(str, args)])
    offload.main()
    return started, capsys.readouterr().out


def test_offload_waits_for_deepspeeds_build_at_its_first_deepspeed_row(tmp_path, monkeypatch, capsys):
    ready = tmp_path / "ds-ready"
    timer = threading.Timer(1.5, lambda: ready.write_text("0 42\n"))
    timer.start()
    try:
        started, out = offload_main(monkeypatch, capsys, "--layers", 1, "--embd", 64, "--seq", 64, "--micro", 1,
                                    "--sizes", "64,128", "--modes", "torch,zerod3_host,ds3_host,ds3_params",
                                    "--budget", 100, "--ds-ready", ready)
    finally:
        timer.cancel()
    # The rows before the first DeepSpeed row start without waiting.
    assert started == [("torch", False), ("zerod3_host", False), ("ds3_host", True), ("ds3_params", True),
                       ("torch", True), ("zerod3_host", True), ("ds3_host", True), ("ds3_params", True)], started
    assert len(re.findall(r"^DeepSpeed's CPU Adam build: exit 0 after 42 s \(offload waited \d s for it\)$", out,
                          re.M)) == 1, out
    # The rows that ran while it compiled shared the CPU with it, and say so.
    beside = re.findall(r"^(\w+) +yes .*[ ;] ran beside DeepSpeed's CPU Adam build$", out, re.M)
    assert beside == ["torch", "zerod3_host"], out


def test_offload_keeps_to_its_budget_by_the_size_of_a_row(monkeypatch, capsys):
    """--budget 0 is a budget (it ran every row as if none were given), and
    a 1.3B row, 40-90 s with its setup, is not started with under 45 s
    left, where a small GPT's is with 30."""
    started, out = offload_main(monkeypatch, capsys, "--layers", 1, "--embd", 64, "--seq", 64, "--micro", 1,
                                "--sizes", "64", "--modes", "torch", "--budget", 0)
    assert started == [] and "skipped, under 30 s left of the 0 s budget: torch at 64" in out, out
    started, out = offload_main(monkeypatch, capsys, "--layers", 1, "--embd", 64, "--seq", 64, "--micro", 1,
                                "--sizes", "64", "--modes", "torch", "--budget", 40)
    assert started == [("torch", False)], out
    started, out = offload_main(monkeypatch, capsys, "--sizes", "8k", "--modes", "torch", "--budget", 40)
    assert started == [] and "skipped, under 45 s left of the 40 s budget: torch at 8k" in out, out
