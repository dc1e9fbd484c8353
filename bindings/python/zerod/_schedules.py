"""A torch LR scheduler as a zerod schedule. zerod runs the schedule itself
(the job's `lr(step)`, in the daemon when there is one), so a scheduler is
turned into its values ahead of time: a copy of it steps over a stand-in
optimizer of one parameter, and the lr of every update goes into the job as
zerod.table{ values = ... } (the last value holds after the table ends).
That is exact for any scheduler whose lr follows from the step count alone;
ReduceLROnPlateau, which follows a metric, is refused.
"""
import copy
import warnings

import torch

from .errors import InvalidArgumentError

__all__ = ["trace", "lua_table", "Stepped", "DEFAULT_HORIZON"]

# Updates traced when nothing says how long training runs. The job's text
# holds one number per update (about 22 bytes each; runs of one value are
# written once), under the daemon's 4 MiB message limit.
DEFAULT_HORIZON = 50_000


def _horizon_of(scheduler):
    """The scheduler's own length, where it has one."""
    for attr in ("total_steps", "T_max", "total_iters"):
        v = getattr(scheduler, attr, None)
        if isinstance(v, int) and v > 0:
            return v + 1
    milestones = getattr(scheduler, "milestones", None)
    if milestones:
        return max(milestones) + 1
    return None


class Stepped:
    """A torch scheduler that a trainer steps every `every` updates (e.g.
    Lightning's interval "epoch"), to be traced over `steps` updates (None:
    the scheduler's own length): what zerod.deepspeed.initialize takes as
    lr_scheduler where one scheduler step is not one update. Accelerate's
    AcceleratedScheduler steps it `per` times at each update (once per
    process); stepped after every micro-batch it has stepped `offset` times
    more when an update reads its lr (the window's earlier micro-batches')."""

    def __init__(self, scheduler, every=1, steps=None, per=1, offset=0):
        self.scheduler, self.every, self.steps = scheduler, int(every), steps
        self.per, self.offset = int(per), int(offset)


def trace(scheduler, steps=None, every=1):
    """The lr of updates 0..steps-1 under `scheduler` (a torch LRScheduler
    attached to the user's optimizer), which steps once every `every`
    updates (Lightning's interval "epoch": the updates of one epoch), or a
    Stepped that says both. `steps` None is the scheduler's own length,
    where it has one, else DEFAULT_HORIZON with a warning. The user's
    scheduler and optimizer are not touched."""
    per, offset = 1, 0
    if isinstance(scheduler, Stepped):
        steps = scheduler.steps if scheduler.steps is not None else steps
        every, per, offset = scheduler.every, scheduler.per, scheduler.offset
        scheduler = scheduler.scheduler
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise InvalidArgumentError(
            "ReduceLROnPlateau follows a metric, which zerod's schedule (a function of the step, run where the "
            "optimizer runs) cannot see; use a step-based scheduler or a zerod schedule in the job script")
    if not isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler):
        raise InvalidArgumentError(f"{type(scheduler).__name__} is not a torch LR scheduler")
    opt = scheduler.optimizer
    if steps is None:
        own = _horizon_of(scheduler)
        if own and (per != 1 or offset):
            # The update at which its last step has been taken, and that one.
            steps = max(1, -(-(own - 1 - offset) * every // per) + 1)
        else:
            steps = own * every if own else DEFAULT_HORIZON
        if not own:
            # LambdaLR, ExponentialLR, CosineAnnealingWarmRestarts, ...: the
            # lr would stop following the scheduler where the table ends.
            warnings.warn(
                f"{type(scheduler).__name__} has no length zerod can read (total_steps, T_max, total_iters, "
                f"milestones): zerod traces its lr for the first {DEFAULT_HORIZON} updates and keeps the last "
                f"value after that. Say how many updates the run has: zerod.deepspeed.initialize(..., "
                f"lr_steps=N) or ZerodAccelerator(..., lr_steps=N) (Lightning and Hugging Face's Trainer pass "
                "their max_steps)", stacklevel=3)
    # A deep copy of optimizer and scheduler together, with the optimizer's
    # parameters swapped for one scalar while copying: the model is not
    # copied, and the copy's scheduler steps the copy's optimizer.
    saved = [g["params"] for g in opt.param_groups]
    saved_state = opt.state
    try:
        for g in opt.param_groups:
            g["params"] = [torch.zeros(1)]
        opt.state = type(saved_state)()
        opt2, sched2 = copy.deepcopy((opt, scheduler))
    finally:
        for g, p in zip(opt.param_groups, saved):
            g["params"] = p
        opt.state = saved_state
    values = []

    def momentum(o):
        return [(g.get("betas"), g.get("momentum")) for g in o.param_groups]
    start = momentum(opt2)
    total = getattr(sched2, "total_steps", None)

    def step():
        # A OneCycleLR not past its total_steps (torch would raise there, and
        # Accelerate's AcceleratedScheduler stops stepping it): the last
        # value holds after, as after the table's end.
        if not isinstance(total, int) or sched2._step_count <= total:
            sched2.step()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()"
        for _ in range(offset):
            step()
        for t in range(steps):
            lrs = {float(g["lr"]) for g in opt2.param_groups}
            if len(lrs) > 1:
                raise InvalidArgumentError(
                    f"{type(scheduler).__name__} gives the parameter groups different learning rates at update "
                    f"{t} ({sorted(lrs)}); zerod applies one lr to every parameter")
            values.append(lrs.pop())
            if momentum(opt2) != start:
                raise InvalidArgumentError(
                    f"{type(scheduler).__name__} changes the optimizer's momentum/betas at update {t} (e.g. "
                    "OneCycleLR's cycle_momentum=True); zerod's schedule sets the lr only: pass "
                    "cycle_momentum=False")
            if (t + 1) % every == 0 and t + 1 < steps:
                for _ in range(per):
                    step()
    return values


def lua_table(values):
    """A Lua expression for zerod.table{ values = ... }, runs of one value
    written once."""
    runs = []
    for v in values:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    if len(runs) * 4 < len(values):
        body = " ".join(f"r({v!r}, {n})" for v, n in runs)
        return ("zerod.table{ values = (function() local v = {} local function r(x, n) for _ = 1, n do "
                f"v[#v + 1] = x end end {body} return v end)() }}")
    return "zerod.table{ values = { " + ", ".join(repr(v) for v in values) + " } }"
