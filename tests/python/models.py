"""Models, data and plain-PyTorch reference training for the parity tests.

Imported both by the tests (for the reference run) and by train_rank.py
(the trainer the tests run through zerod), so both see the same models,
initial values and batches.
"""
import contextlib
import copy
import io

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt import GPT, GPTConfig

# AdamW as the job scripts below configure it, and the same for torch.
LR, BETAS, EPS, WEIGHT_DECAY, CLIP = 3e-3, (0.9, 0.99), 1e-8, 0.05, 1.0
GLOBAL_BATCH = 8

# The Zen of Python: a small corpus every Python has (importing `this`
# prints it; the tests' output does not need it).
with contextlib.redirect_stdout(io.StringIO()):
    import this
TEXT = "".join(this.d.get(c, c) for c in this.s)
CHARS = sorted(set(TEXT))
TOKENS = torch.tensor([CHARS.index(c) for c in TEXT], dtype=torch.long)
BLOCK = 16


class SkipNet(nn.Module):
    """`extra` runs only when the batch says so: skipped on some steps."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 32)
        self.extra = nn.Linear(32, 32)
        self.out = nn.Linear(32, 4)

    def forward(self, x, use_extra):
        h = torch.tanh(self.inp(x))
        if use_extra:
            h = torch.tanh(self.extra(h))
        return self.out(h)


class TiedNet(nn.Module):
    """`mix` runs twice per forward; `head` shares `embed`'s weight."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(len(CHARS), 24)
        self.mix = nn.Linear(24, 24)
        self.head = nn.Linear(24, len(CHARS), bias=False)
        self.head.weight = self.embed.weight

    def forward(self, idx):
        h = torch.tanh(self.mix(self.embed(idx)))
        return self.head(torch.tanh(self.mix(h)))


def make(kind):
    torch.manual_seed(0)
    if kind == "gpt":
        return GPT(GPTConfig(vocab_size=len(CHARS), block_size=BLOCK, n_layer=2, n_head=2, n_embd=32))
    return {"skip": SkipNet, "tied": TiedNet}[kind]()


def batch(kind, step, rank=0, world=1):
    """This rank's slice of global batch `step` (the same on every rank)."""
    g = torch.Generator().manual_seed(1000 + step)
    n = GLOBAL_BATCH // world
    rows = slice(rank * n, (rank + 1) * n)
    if kind == "skip":
        x = torch.randn(GLOBAL_BATCH, 8, generator=g)
        y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
        return (x[rows], step % 3 != 0), y[rows]
    starts = torch.randint(len(TOKENS) - BLOCK - 1, (GLOBAL_BATCH,), generator=g)[rows]
    x = torch.stack([TOKENS[s:s + BLOCK] for s in starts])
    y = torch.stack([TOKENS[s + 1:s + 1 + BLOCK] for s in starts])
    return (x,), y


def loss_of(kind, forward, inputs, y, dtype):
    """The mean loss of a micro-batch, computed in fp32 from the logits."""
    if kind == "skip":
        inputs = (inputs[0].to(dtype), inputs[1])
    out = forward(*inputs)
    logits = out[0] if kind == "gpt" else out
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))


def job(precision="fp32", stage=0, offload=False):
    """The job script the tests train with: AdamW and clipping as above."""
    # Stage 3 partitions every parameter (the default threshold would keep
    # these small ones whole, and their residency untested).
    zero = f"stage = {stage}" + (", param_persistence_threshold = 0" if stage == 3 else "")
    host = '\n  offload = { optimizer = "host" },' if offload else ""
    return f"""return {{
  precision = "{precision}",
  optimizer = {{ type = "adamw", lr = {LR}, betas = {{{BETAS[0]}, {BETAS[1]}}}, eps = {EPS},
                weight_decay = {WEIGHT_DECAY} }},
  gradient_clipping = {CLIP},
  zero = {{ {zero} }},{host}
}}
"""


def torch_reference(kind, dtype, steps, device="cpu", with_master=False, foreach=None):
    """Losses of plain torch.optim.AdamW on the global batch (and, with
    with_master, the fp32 model it ends with). For bf16 the model computes in
    bf16 and AdamW updates fp32 master weights, as zerod does. Gradients of
    parameters a step did not use are zero (not None), so AdamW updates them
    as zerod does. foreach picks torch's implementation of AdamW and of the
    norm (None: torch's default, the multi-tensor one on a GPU)."""
    # The master starts from the values zerod is given: the model converted
    # to `dtype` (zerod.torch.initialize(..., dtype=) converts first).
    master = make(kind).to(dtype).float().to(device)
    work = copy.deepcopy(master).to(dtype) if dtype != torch.float32 else master
    for p in master.parameters():
        p.grad = torch.zeros_like(p)
    opt = torch.optim.AdamW(master.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY,
                            foreach=foreach)
    losses = []
    for step in range(steps):
        if work is not master:
            with torch.no_grad():
                for w, m in zip(work.parameters(), master.parameters()):
                    w.copy_(m)
            work.zero_grad(set_to_none=True)
        opt.zero_grad(set_to_none=False)
        inputs, y = batch(kind, step)
        inputs = tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in inputs)
        loss = loss_of(kind, work, inputs, y.to(device), dtype)
        loss.backward()
        if work is not master:
            for w, m in zip(work.parameters(), master.parameters()):
                if w.grad is not None:
                    m.grad.copy_(w.grad)
        nn.utils.clip_grad_norm_(master.parameters(), CLIP, **({} if foreach is None else {"foreach": foreach}))
        opt.step()
        losses.append(loss.item())
    return (losses, master) if with_master else losses


class WithExtraState(nn.Linear):
    """A module with torch's get_extra_state/set_extra_state (a dict, not a
    tensor, in its state_dict)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.version = 1

    def get_extra_state(self):
        return {"version": self.version}

    def set_extra_state(self, state):
        self.version = state["version"]
