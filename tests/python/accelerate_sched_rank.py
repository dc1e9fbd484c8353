"""One rank of test_accelerate's scheduler test, started by `zerod run
--nproc 2`: the same small loop under plain Accelerate (its multi-CPU mode,
over the gloo group ZerodAccelerator's ranks share) and under
ZerodAccelerator, with the LR scheduler as Accelerate steps it: at every
update once per process (argv[1] "default"; a OneCycleLR that the 2
processes would step past its total_steps), once ("split": split_batches),
or at every scheduler.step() call ("per_call": step_scheduler_with_optimizer
False, called after every micro-batch). Prints "<who> <micro-batch> <loss>
<lr applied at the update, or -> <lr after>" per micro-batch, and for
zerod the lr zerod applied ("applied <micro-batch> <lr>")."""
import sys

import torch
import torch.nn.functional as F

from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import DataLoaderConfiguration

from zerod.accelerate import ZerodAccelerator, _join_zerod_ranks

torch.set_num_threads(1)
_join_zerod_ranks()  # the environment and gloo group of Accelerate's multi-CPU mode, for the plain run too
mode = sys.argv[1]
kwargs = {"default": {"gradient_accumulation_steps": 2},
          "split": {"gradient_accumulation_steps": 2, "dataloader_config": DataLoaderConfiguration(split_batches=True)},
          "per_call": {"gradient_accumulation_steps": 2, "step_scheduler_with_optimizer": False}}[mode]


def objects():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    if mode == "per_call":
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    else:
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=6, cycle_momentum=False)
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g))
    # 8 micro-batches of 4 on each rank: 4 updates
    loader = torch.utils.data.DataLoader(data, batch_size=8 if mode == "split" else 4)
    return model, opt, loader, sched


for who, make in (("plain", lambda: Accelerator(cpu=True, **kwargs)),
                  ("zerod", lambda: ZerodAccelerator(zero_stage=2, lr_steps=20, **kwargs))):
    AcceleratorState._reset_state(True)
    accelerator = make()
    assert accelerator.num_processes == 2
    model, opt, loader, sched = accelerator.prepare(*objects())
    for i, (x, y) in enumerate(loader):
        with accelerator.accumulate(model):
            loss = F.mse_loss(model(x), y)
            accelerator.backward(loss)
            applied = opt.param_groups[0]["lr"] if accelerator.sync_gradients else "-"
            opt.step()
            sched.step()
            opt.zero_grad()
        print(who, i, repr(loss.item()), applied, repr(sched.get_last_lr()[0]), flush=True)
        if who == "zerod" and accelerator.sync_gradients:
            print("applied", i, repr(accelerator.zerod_engine.last_step.lr), flush=True)
