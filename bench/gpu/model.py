"""The GPT the GPU benchmarks train: minGPT's shape (pre-norm blocks,
GELU MLP, tied embedding and head) with torch's fused attention
(scaled_dot_product_attention), so activation memory and time are what a
user's model would have. Sized by layers and width:
    params ~= 12 * n_layer * n_embd^2 + vocab * n_embd
"""
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint


@dataclass
class Config:
    n_layer: int = 24
    n_embd: int = 2048
    n_head: int = 16
    vocab_size: int = 50304
    block_size: int = 1024


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_head = c.n_head
        self.ln_1 = nn.LayerNorm(c.n_embd)
        self.c_attn = nn.Linear(c.n_embd, 3 * c.n_embd)
        self.c_proj = nn.Linear(c.n_embd, c.n_embd)
        self.ln_2 = nn.LayerNorm(c.n_embd)
        self.c_fc = nn.Linear(c.n_embd, 4 * c.n_embd)
        self.c_out = nn.Linear(4 * c.n_embd, c.n_embd)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.c_out(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, c, checkpoint_blocks=False):
        super().__init__()
        self.checkpoint_blocks = checkpoint_blocks
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.wpe = nn.Embedding(c.block_size, c.n_embd)
        self.h = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.n_embd)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            # Non-reentrant, the variant torch recommends and Hugging Face
            # models use by default: what a user's training runs.
            x = checkpoint(b, x, use_reentrant=False) if self.checkpoint_blocks else b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def n_params(c):
    return 12 * c.n_layer * c.n_embd ** 2 + 13 * c.n_layer * c.n_embd + (c.vocab_size + c.block_size + 2) * c.n_embd


def batch(c, batch_size, step, device, rank=0):
    """Synthetic tokens (the same on every run): a benchmark of steps, not of
    learning, though the loss must still be finite and fall. Each data
    parallel rank has batches of its own."""
    g = torch.Generator().manual_seed(4 * rank + step % 4)  # a few batches, seen again: the loss falls
    idx = torch.randint(c.vocab_size, (batch_size, c.block_size + 1), generator=g)
    return idx[:, :-1].to(device), idx[:, 1:].to(device)
