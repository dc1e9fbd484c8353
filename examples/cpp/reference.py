"""The PyTorch side of the C++ GPT: examples/python/gpt.py's GPT, from the
initial weights and on the batches `train_gpt --dump DIR` wrote, trained
with torch.optim.AdamW and clip_grad_norm_ as a zerod job with those
settings trains it (fp32, one micro-batch per step, the gradient of the
global batch's mean loss).

    python3 reference.py DIR --lr 0.002 [--lr ...] [--betas 0.9 0.99] [--eps 1e-8]
                             [--weight-decay 0.01] [--clip 1.0] [--device cpu|cuda]

prints one line per step: the global batch's loss, the loss of rank 0's
slice for 2 ranks (what rank 0 of `zerod run --nproc 2` prints) and the
gradient's norm before clipping (zd_step_result.grad_norm). One --lr per
step (zerod's schedule: compare.py passes the rates the trainer printed),
or one for all.
"""
import argparse
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
from gpt import GPT, GPTConfig  # noqa: E402


def read_inputs(path):
    """The sizes, the named initial tensors and the batches of a dump."""
    sizes, params = {}, []
    with open(os.path.join(path, "manifest.txt")) as f:
        for line in f:
            key, *rest = line.split()
            if key == "param":
                params.append((rest[0], [int(d) for d in rest[1:]]))
            else:
                sizes[key] = int(rest[0])
    flat = np.fromfile(os.path.join(path, "params.f32"), dtype="<f4")
    tensors, at = {}, 0
    for name, shape in params:
        n = int(np.prod(shape))
        tensors[name] = torch.from_numpy(flat[at:at + n].copy()).view(*shape)
        at += n
    assert at == flat.size, f"params.f32 has {flat.size} values, the manifest names {at}"
    batches = np.fromfile(os.path.join(path, "batches.i32"), dtype="<i4")
    batches = torch.from_numpy(batches.astype(np.int64)).view(sizes["steps"], sizes["global_rows"], sizes["block"] + 1)
    return sizes, tensors, batches


def train(path, lrs, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01, clip=1.0, device="cpu"):
    """[(global loss, rank 0's slice of 2, gradient norm), ...] per step."""
    sizes, tensors, batches = read_inputs(path)
    model = GPT(GPTConfig(vocab_size=sizes["vocab"], block_size=sizes["block"], n_layer=sizes["layers"],
                          n_head=sizes["heads"], n_embd=sizes["embd"]))
    named = dict(model.named_parameters())  # lm_head.weight is transformer.wte.weight
    assert sorted(named) == sorted(tensors), f"gpt.py has {sorted(named)}, the dump {sorted(tensors)}"
    with torch.no_grad():
        for name, value in tensors.items():
            named[name].copy_(value)
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lrs[0], betas=betas, eps=eps, weight_decay=weight_decay)
    rows, half = sizes["global_rows"], sizes["global_rows"] // 2
    out = []
    for step in range(sizes["steps"]):
        b = batches[step].to(device)
        logits, _ = model(b[:, :-1])
        per_token = F.cross_entropy(logits.reshape(-1, logits.size(-1)), b[:, 1:].reshape(-1), reduction="none")
        per_token = per_token.view(rows, -1)
        loss = per_token.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        for group in opt.param_groups:
            group["lr"] = lrs[min(step, len(lrs) - 1)]
        opt.step()
        out.append((loss.item(), per_token[:half].mean().item(), norm.item()))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dump")
    p.add_argument("--lr", type=float, action="append", required=True)
    p.add_argument("--betas", type=float, nargs=2, default=(0.9, 0.99))
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    for step, (loss, rank0, norm) in enumerate(train(a.dump, a.lr, tuple(a.betas), a.eps, a.weight_decay, a.clip,
                                                     a.device), 1):
        print(f"step {step:4d}  loss {loss:.7f}  rank0_of_2 {rank0:.7f}  grad_norm {norm:.7g}")


if __name__ == "__main__":
    main()
