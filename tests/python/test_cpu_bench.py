"""The CPU benchmark programs (bench/, not bench/gpu) compare like with like:
tiny runs whose figures mean nothing, checked for what each prints its
ratios against. Runs under the venv (torch 2.x, DeepSpeed 0.19.x), the
peers' versions a user would install."""
import importlib.util
import os
import re
import stat
import subprocess
import sys

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
