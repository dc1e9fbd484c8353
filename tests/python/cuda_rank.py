"""train_rank.py on the GPU: the model on this rank's GPU before zerod
takes it, batches there too. Embedded, or one of the ranks of `zerod run`,
whose daemon then owns the rank's GPU memory (its pool exported to this
process, docs/daemon.md "On a GPU").

    cuda_rank.py <gpt|skip|tied> <fp32|bf16> <steps> [job.lua]
"""
import torch

from train_rank import main

device = torch.device("cuda", 0)
torch.cuda.set_device(device)
main(device)
