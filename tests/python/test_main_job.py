"""The main job (examples/python/train_gpt.py) end to end, shortened: 2
ranks under `zerod run` with its own job script (ZeRO stage 3), a smaller
model and corpus; the loss falls, rank 0 shows progress and memory, and
prints a sample."""
import os
import re

from conftest import EXAMPLES, zerod_run


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
