"""The main job (examples/python/train_gpt.py) end to end, shortened: 2
ranks under `zerod run` with its own job script (ZeRO stage 3), a smaller
model and corpus; the loss falls, rank 0 shows progress and memory, and
prints a sample. A --text file the Python prompt is not in, one too short
for the block, and --sample-chars 0. And README.md's DeepSpeed example
(examples/python/train_deepspeed.py) on one rank."""
import importlib.util
import json
import os
import re
import subprocess
import sys

from conftest import EXAMPLES, rank_env, zerod_run


def test_gpt_example_learns_on_two_ranks():
    rc, ranks, out = zerod_run(2, os.path.join(EXAMPLES, "gpt_job.lua"), os.path.join(EXAMPLES, "train_gpt.py"),
                               "--max-chars", 200000, "--layers", 2, "--embd", 64, "--steps", 120,
                               "--sample-chars", 60)
    assert rc == 0, out
    text = "\n".join(ranks[0])
    progress = r"train: 100%.*120/120.*loss \d\.\d+ .*k tok/s \| device [\d.]+\w+ host [\d.]+\w+ nvme"
    assert re.search(progress, text), text
    m = re.search(r"trained 120 steps in [\d.]+ s: [\d,]+ tokens/s; loss ([\d.]+) -> ([\d.]+)", text)
    assert m and float(m.group(2)) < float(m.group(1)) - 1.0, text
    assert "sample:\ndef " in text
    assert not [line for line in ranks.get(1, []) if line.strip()], "rank 1 should stay quiet"


def train_gpt(text_file, *args):
    """train_gpt.py alone (one rank, embedded) on text_file, a tiny model:
    (exit status, output)."""
    cmd = [sys.executable, os.path.join(EXAMPLES, "train_gpt.py"), "--text", str(text_file), "--layers", 1,
           "--heads", 2, "--embd", 16, "--batch", 4, *args]
    p = subprocess.run(list(map(str, cmd)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=120, env=rank_env())
    return p.returncode, p.stdout


def test_a_corpus_without_the_python_prompt_samples_from_its_own_start(tmp_path):
    # DNA with a few letters outside ASCII: no "d", "e", "f" or " " for the
    # "def " prompt (it raised KeyError: 'd' after the whole run).
    dna = tmp_path / "dna.txt"
    dna.write_text(("GATTACACGT" * 40 + "ÅÖ\n") * 8)
    rc, out = train_gpt(dna, "--steps", 2, "--block", 16, "--sample-chars", 8)
    assert rc == 0, out
    assert "; 16 outside printable ASCII became '?'" in out, out
    assert re.search(r"sample:\nGATT[ACGT?\n]{8}", out), out


def test_no_sample_is_drawn_when_none_is_asked_for(tmp_path):
    digits = tmp_path / "digits.txt"
    digits.write_text("0123456789\n" * 100)
    rc, out = train_gpt(digits, "--steps", 2, "--block", 16, "--sample-chars", 0, "--plain")
    assert rc == 0, out
    assert "trained 2 steps" in out and "sample:" not in out, out


def test_a_corpus_too_short_for_the_block_is_refused_before_training(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text(("def f(x): return x\n" * 40)[:640])  # a validation tenth of 64, --block 64
    rc, out = train_gpt(short, "--steps", 2)
    assert rc != 0, out
    assert "--block 64 needs more than 65" in out and "--text" in out, out
    assert "trained" not in out and "train:" not in out, out


DS_CONFIG = os.path.join(EXAMPLES, "ds_config.json")
DS_EXAMPLE = os.path.join(EXAMPLES, "train_deepspeed.py")


def scheduled_steps():
    with open(DS_CONFIG) as f:
        return json.load(f)["scheduler"]["params"]["total_num_steps"]


def saved_checkpoint(output):
    """(the directory, the tag) of the checkpoint the DeepSpeed example says
    it saved, with what its `latest` names checked to be that tag."""
    m = re.search(r"^(?:\[rank 0\] )?saved (.+)/(global_step\d+)$", output, re.M)
    assert m, output
    with open(os.path.join(m.group(1), "latest")) as f:
        assert f.read() == m.group(2)
    return m.group(1), m.group(2)


def test_the_deepspeed_example_stops_where_its_schedule_ends(tmp_path):
    # README.md's single-process command: one rank's epoch is 80 steps, twice
    # the schedule's 40 (it trained all 80, the last 40 at the floor lr).
    total = scheduled_steps()
    p = subprocess.run([sys.executable, DS_EXAMPLE], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=120, env=rank_env(TMPDIR=tmp_path))
    assert p.returncode == 0, p.stdout
    steps = [int(s) for s in re.findall(r"^step (\d+) loss", p.stdout, re.M)]
    assert steps and steps[-1] == total, p.stdout
    assert saved_checkpoint(p.stdout)[1] == f"global_step{total}", p.stdout


def test_deepspeed_example_runs_at_once_save_apart(tmp_path):
    """Three runs of the DeepSpeed example at the same time, one rank each:
    two save into a new directory each under TMPDIR, the third into the one
    given after the config. A fixed /tmp/zerod-ds-example was all runs' at
    once, and where another user had left it, no run of this one's could
    save there."""
    given = tmp_path / "given"
    runs = [[], [], [DS_CONFIG, given]]
    procs = [subprocess.Popen([sys.executable, DS_EXAMPLE, *map(str, args)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=rank_env(TMPDIR=tmp_path)) for args in runs]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    saved = [saved_checkpoint(out)[0] for out in outs]
    assert saved[2] == str(given), outs[2]
    assert saved[0] != saved[1], outs
    for d in saved[:2]:
        assert os.path.dirname(d) == str(tmp_path) and os.path.basename(d).startswith("zerod-ds-example-"), d


def test_the_deepspeed_example_on_two_ranks_saves_one_checkpoint(tmp_path):
    """README.md's `zerod run --nproc 2` command: rank 0 shows the schedule's
    last step, and both ranks save into one directory named for the run,
    each its shard."""
    total = scheduled_steps()
    rc, ranks, out = zerod_run(2, DS_CONFIG, DS_EXAMPLE, DS_CONFIG, env=rank_env(TMPDIR=tmp_path))
    assert rc == 0, out
    steps = [int(s) for s in re.findall(r"^\[rank 0\] step (\d+) loss", out, re.M)]
    assert steps and steps[-1] == total, out
    directory, tag = saved_checkpoint(out)
    assert tag == f"global_step{total}", out
    assert re.fullmatch(re.escape(str(tmp_path)) + r"/zerod-ds-example-[0-9a-f]{16}", directory), out
    shards = sorted(n for n in os.listdir(os.path.join(directory, tag)) if n.endswith(".zdshard"))
    assert shards == ["rank-00000-of-00002.zdshard", "rank-00001-of-00002.zdshard"], shards


def test_the_deepspeed_examples_ranks_name_one_directory_for_their_launch():
    """Without a directory given, several ranks save into one named for
    their launch: an id every rank's environment holds alike. Under real
    DeepSpeed (`deepspeed --num_gpus 2 train_deepspeed.py ds_config.json`)
    there is no ZEROD_RUN_ID, but the MASTER_ADDR and MASTER_PORT its
    launcher (as torchrun) gives every rank; with no id at all the example
    asks for the directory."""
    spec = importlib.util.spec_from_file_location("train_deepspeed", DS_EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    rendezvous = {"MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29500"}
    assert example.shared_run_id({"ZEROD_RUN_ID": "0123456789abcdef", **rendezvous}) == "0123456789abcdef"
    assert example.shared_run_id({"TORCHELASTIC_RUN_ID": "job7", **rendezvous}) == "job7"
    # torchrun's default --rdzv-id, every launch's alike
    assert example.shared_run_id({"TORCHELASTIC_RUN_ID": "none", **rendezvous}) == "10.0.0.7-29500"
    assert example.shared_run_id({"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "3", **rendezvous}) == "42-3"
    assert example.shared_run_id(rendezvous) == "10.0.0.7-29500"
    assert example.shared_run_id({"MASTER_ADDR": "fe80::1", "MASTER_PORT": "29500"}) == "fe80__1-29500"
    assert example.shared_run_id({"MASTER_ADDR": "10.0.0.7"}) is None
    assert example.shared_run_id({}) is None
