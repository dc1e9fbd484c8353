"""A rank as any launcher starts it (torchrun, mpirun, srun, `zerod run`):
trains models.py's GPT on its slice of each global batch through
zerod.torch.initialize(model, job=JOB) and writes, into OUT/rank<r>.txt, its
rank and world size as zerod sees them, one "loss <step> <value>" line per
step and "state <checksum>" of the full fp32 weights. With DIE_AT (rank 1
only, or the rank DIE_RANK names, and under torchrun only in its first
attempt) it exits abruptly after that many steps (DIE_AT: the 4th argument or the variable); with HANG_AT, that rank
(HANG_RANK, default 1) stops answering at that step. A job that takes snapshots resumes where the engine says
(engine.global_steps after initialize): the file then begins with
"resumed at <step>" after the rank line and has the steps from there.

    launcher_rank.py JOB OUT STEPS [DIE_AT]
"""
import os
import sys

import torch

import zerod.torch
from models import batch, loss_of, make

job, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
die_at = int(sys.argv[4]) if len(sys.argv) > 4 else int(os.environ.get("DIE_AT", "-1"))
torch.set_num_threads(1)
torch.manual_seed(0)
engine = zerod.torch.initialize(make("gpt"), job=job)
lines = [f"rank {engine.rank} of {engine.world_size}"]
start = engine.global_steps
if start:
    lines.append(f"resumed at {start}")
path = os.path.join(out, f"rank{engine.rank}.txt")
first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
die_rank = int(os.environ.get("DIE_RANK", "1"))
hang_rank = int(os.environ.get("HANG_RANK", "1"))
for step in range(start, steps):
    if step == int(os.environ.get("HANG_AT", "-1")) and engine.rank == hang_rank:
        import time
        time.sleep(600)  # a rank that hangs: the other's collective times out, naming it
    if step == die_at and engine.rank == die_rank and first_attempt:
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        os._exit(3)
    inputs, y = batch("gpt", step, engine.rank, engine.world_size)
    loss = loss_of("gpt", engine, inputs, y, torch.float32)
    engine.backward(loss)
    engine.step()
    lines.append(f"loss {step} {loss.item():.9g}")
state = engine.state_dict()
lines.append(f"state {sum(float(v.double().abs().sum()) for v in state.values()):.9g}")
with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
