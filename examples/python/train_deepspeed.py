"""A DeepSpeed training script whose only change is its import: the GPT of
gpt.py on the Zen of Python, configured by a DeepSpeed JSON config.

    PYTHONPATH=bindings/python python3 examples/python/train_deepspeed.py examples/python/ds_config.json
    build/bin/zerod run --nproc 2 --job examples/python/ds_config.json -- \
        python3 examples/python/train_deepspeed.py examples/python/ds_config.json

With `import deepspeed` instead (and `deepspeed examples/python/train_deepspeed.py ...`)
it is the same script under DeepSpeed.
"""
import contextlib
import io
import json
import os
import sys

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


def main(config):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = GPT(GPTConfig(vocab_size=len(CHARS), block_size=BLOCK, n_layer=2, n_head=2, n_embd=64))
    engine, optimizer, loader, scheduler = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config, training_data=Windows())
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
    engine.save_checkpoint("/tmp/zerod-ds-example")
    if engine.global_rank == 0:
        print(f"saved /tmp/zerod-ds-example/{open('/tmp/zerod-ds-example/latest').read()}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "ds_config.json"))
