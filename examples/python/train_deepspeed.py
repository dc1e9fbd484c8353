"""A DeepSpeed training script whose only change is its import: the GPT of
gpt.py on the Zen of Python, configured by a DeepSpeed JSON config.

    PYTHONPATH=bindings/python python3 examples/python/train_deepspeed.py examples/python/ds_config.json
    build/bin/zerod run --nproc 2 --job examples/python/ds_config.json -- \
        python3 examples/python/train_deepspeed.py examples/python/ds_config.json

The checkpoint at the end goes into the directory given after the config,
else into a new one of the run's own in the temporary directory (TMPDIR,
else /tmp), which it prints.

With `import deepspeed` instead (and `deepspeed examples/python/train_deepspeed.py ...`)
it is the same script under DeepSpeed.
"""
import contextlib
import io
import json
import os
import re
import sys
import tempfile

import torch
import torch.nn.functional as F

import zerod.deepspeed as deepspeed  # was: import deepspeed

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt import GPT, GPTConfig  # noqa: E402

with contextlib.redirect_stdout(io.StringIO()):
    import this
TEXT = "".join(this.d.get(c, c) for c in this.s)
CHARS = sorted(set(TEXT))
TOKENS = torch.tensor([CHARS.index(c) for c in TEXT], dtype=torch.long)
BLOCK = 32


class Windows(torch.utils.data.Dataset):
    def __len__(self):
        return 640

    def __getitem__(self, i):
        start = (i * 7) % (len(TOKENS) - BLOCK - 1)
        chunk = TOKENS[start:start + BLOCK + 1]
        return chunk[:-1], chunk[1:]


def scheduled_steps(config):
    """The scheduler's total_num_steps, where training stops: an epoch is 80
    steps on one rank and 40 on two (the ranks share the 640 windows), and
    the schedule is 40 long whichever it is (one rank trained 40 steps past
    its end)."""
    if not isinstance(config, dict):
        with open(config) as f:
            config = json.load(f)
    return config["scheduler"]["params"]["total_num_steps"]


def shared_run_id(environ=os.environ):
    """An id every rank of this launch holds alike, and no other launch at
    the same time, from what the launcher put in the environment: `zerod
    run`'s ZEROD_RUN_ID (random); torchrun's TORCHELASTIC_RUN_ID (its
    --rdzv-id; "none" is its default, every launch's); srun's job and step;
    else the rendezvous address and port torchrun and DeepSpeed's
    `deepspeed` hand their ranks, which no two launches use at once. None
    where there is none of them."""
    candidates = [environ.get("ZEROD_RUN_ID"),
                  environ.get("TORCHELASTIC_RUN_ID") if environ.get("TORCHELASTIC_RUN_ID") != "none" else None,
                  _joined(environ, "SLURM_JOB_ID", "SLURM_STEP_ID"),
                  _joined(environ, "MASTER_ADDR", "MASTER_PORT")]
    run = next((c for c in candidates if c), None)
    # Part of a file name: an IPv6 address's colons and the like become "_".
    return re.sub(r"[^A-Za-z0-9._-]", "_", run) if run else None


def _joined(environ, *names):
    values = [environ.get(n) for n in names]
    return "-".join(values) if all(values) else None


def checkpoint_dir(engine, given=None):
    """Where the checkpoint goes, the same directory on every rank: `given`,
    else one of this run's own. A fixed path (it was /tmp/zerod-ds-example)
    is another run's at the same time, or one left there by another user
    that this one cannot write. One rank makes a new one; several name
    theirs for the launch (shared_run_id), so that no rank has to tell the
    others the name."""
    if given:
        return given
    if engine.dp_world_size == 1:
        return tempfile.mkdtemp(prefix="zerod-ds-example-")
    run = shared_run_id()
    if not run:
        sys.exit(f"{engine.dp_world_size} ranks, and no id of their launch in the environment (ZEROD_RUN_ID, "
                 "TORCHELASTIC_RUN_ID, SLURM_JOB_ID, MASTER_ADDR and MASTER_PORT): give the checkpoint's "
                 "directory, the same for every rank, after the config")
    path = os.path.join(tempfile.gettempdir(), f"zerod-ds-example-{run}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    if not os.access(path, os.W_OK | os.X_OK):  # an earlier launch's, another user's
        sys.exit(f"{path} is not this user's to write: give the checkpoint's directory after the config")
    return path


def main(config, save_dir=None):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = GPT(GPTConfig(vocab_size=len(CHARS), block_size=BLOCK, n_layer=2, n_head=2, n_embd=64))
    engine, optimizer, loader, scheduler = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config, training_data=Windows())
    save_dir = checkpoint_dir(engine, save_dir)  # before training: it may refuse
    steps = scheduled_steps(config)
    while engine.global_steps < steps:  # epochs, as many as the schedule takes
        for i, (x, y) in enumerate(loader):
            logits, _ = engine(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
            engine.backward(loss)
            engine.step()
            done = engine.global_steps == steps
            if (i % 20 == 19 or done) and engine.global_rank == 0:
                print(f"step {engine.global_steps} loss {loss.item():.4f} lr {engine.get_lr()[0]:.2e}", flush=True)
            if done:
                break
    engine.save_checkpoint(save_dir)
    if engine.global_rank == 0:
        with open(os.path.join(save_dir, "latest")) as f:
            print(f"saved {os.path.join(save_dir, f.read())}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "ds_config.json"),
         sys.argv[2] if len(sys.argv) > 2 else None)
