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


def main(config, epochs=1):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = GPT(GPTConfig(vocab_size=len(CHARS), block_size=BLOCK, n_layer=2, n_head=2, n_embd=64))
    engine, optimizer, loader, scheduler = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config, training_data=Windows())
    for epoch in range(epochs):
        for i, (x, y) in enumerate(loader):
            logits, _ = engine(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
            engine.backward(loss)
            engine.step()
            if i % 20 == 19 and engine.global_rank == 0:
                print(f"step {engine.global_steps} loss {loss.item():.4f} lr {engine.get_lr()[0]:.2e}", flush=True)
    engine.save_checkpoint("/tmp/zerod-ds-example")
    if engine.global_rank == 0:
        print(f"saved /tmp/zerod-ds-example/{open('/tmp/zerod-ds-example/latest').read()}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "ds_config.json"))
