"""A torch LR scheduler as a zerod schedule. zerod runs the schedule itself
(the job's `lr(step)`, in the daemon when there is one), so a scheduler is
turned into its values ahead of time: a copy of it steps over a stand-in
optimizer of one parameter, and the lr of every update goes into the job as
zerod.table{ values = ... } (the last value holds after the table ends).
That is exact for any scheduler whose lr follows from the step count alone;
ReduceLROnPlateau, which follows a metric, is refused.
"""
import copy
import functools
import types
import warnings

import torch

from .errors import InvalidArgumentError

__all__ = ["trace", "lua_table", "Stepped", "DEFAULT_HORIZON", "ESTIMATE_LIMIT", "one_lr", "CYCLED_MOMENTUM_FIX"]

# Updates traced when nothing says how long training runs. The job's text
# holds one number per update (about 22 bytes each; runs of one value are
# written once), under the daemon's 4 MiB message limit.
DEFAULT_HORIZON = 50_000
# The most updates traced from an estimate of the run's length (Lightning's
# max_epochs times its batches: 1000 epochs by default where the user set
# neither max_epochs nor max_steps): about 3.3 MiB of job text, and a few
# seconds of tracing. A length the user gave (max_steps, lr_steps) is traced
# whole.
ESTIMATE_LIMIT = 150_000
# What every refusal of a momentum-cycling OneCycleLR/CyclicLR says to do:
# the trace here, and zerod.deepspeed's at initialize() (which Accelerate's
# prepare() and Lightning's fit() use too) and at a changed betas/momentum.
CYCLED_MOMENTUM_FIX = "zerod's schedule sets the lr only: pass cycle_momentum=False"


def _horizon_of(scheduler):
    """The scheduler's own length, where it has one: the step after which
    its lr stays as it is. Not CosineAnnealingLR's T_max: that is half a
    period, after which torch's cosine rises again, and DeepSpeed steps it on."""
    for attr in ("total_steps", "total_iters"):
        v = getattr(scheduler, attr, None)
        if isinstance(v, int) and v > 0:
            return v + 1
    milestones = getattr(scheduler, "milestones", None)
    if milestones:
        return max(milestones) + 1
    return None


def _untold_horizon(scheduler, every):
    """Updates traced for a scheduler without a length of its own:
    DEFAULT_HORIZON, or for CosineAnnealingLR at least its first half period
    (T_max: a run of that length is the usual intent, and a table cut short
    would freeze its lr mid-descent), up to ESTIMATE_LIMIT (the job text's
    room); the caller warns of what lies past it."""
    t_max = getattr(scheduler, "T_max", None) if isinstance(
        scheduler, torch.optim.lr_scheduler.CosineAnnealingLR) else None
    if not isinstance(t_max, int) or t_max <= 0:
        return DEFAULT_HORIZON
    return min(max(DEFAULT_HORIZON, (t_max + 1) * every), ESTIMATE_LIMIT)


class Stepped:
    """A torch scheduler that a trainer steps every `every` updates (e.g.
    Lightning's interval "epoch"), to be traced over `steps` updates (None:
    the scheduler's own length): what zerod.deepspeed.initialize takes as
    lr_scheduler where one scheduler step is not one update. `when`, where
    given, says it instead: when(t) is true where the trainer steps it after
    update t (from 0; Lightning's frequency counts batches within an epoch).
    Accelerate's AcceleratedScheduler steps it `per` times at each update
    (once per process); stepped after every micro-batch it has stepped
    `offset` times more when an update reads its lr (the window's earlier
    micro-batches')."""

    def __init__(self, scheduler, every=1, steps=None, per=1, offset=0, when=None):
        self.scheduler, self.every, self.steps = scheduler, int(every), steps
        self.per, self.offset = int(per), int(offset)
        self.when = when


def trace(scheduler, steps=None, every=1):
    """The lr of updates 0..steps-1 under `scheduler` (a torch LRScheduler
    attached to the user's optimizer), which steps once every `every`
    updates (Lightning's interval "epoch": the updates of one epoch), or a
    Stepped that says both. `steps` None is the scheduler's own length,
    where it has one, else DEFAULT_HORIZON with a warning. The user's
    scheduler and optimizer are not touched."""
    per, offset, when = 1, 0, None
    if isinstance(scheduler, Stepped):
        steps = scheduler.steps if scheduler.steps is not None else steps
        every, per, offset, when = scheduler.every, scheduler.per, scheduler.offset, scheduler.when
        scheduler = scheduler.scheduler
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise InvalidArgumentError(
            "ReduceLROnPlateau follows a metric, which zerod's schedule (a function of the step, run where the "
            "optimizer runs) cannot see; use a step-based scheduler or a zerod schedule in the job script")
    if not isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler):
        raise InvalidArgumentError(f"{type(scheduler).__name__} is not a torch LR scheduler")
    opt = scheduler.optimizer
    if when is None:
        def when(t):
            return (t + 1) % every == 0
        custom = False
    else:
        custom = True
    if steps is None:
        own = _horizon_of(scheduler)
        if own and custom:
            steps = _updates_to_reach(when, own - 1, per, offset)
        elif own and (per != 1 or offset):
            # The update at which its last step has been taken, and that one.
            steps = max(1, -(-(own - 1 - offset) * every // per) + 1)
        else:
            steps = own * every if own else _untold_horizon(scheduler, every)
        if not own:
            # LambdaLR, ExponentialLR, CosineAnnealingLR,
            # CosineAnnealingWarmRestarts, ...: the lr would stop following
            # the scheduler where the table ends.
            warnings.warn(
                f"{type(scheduler).__name__} has no length zerod can read (total_steps, total_iters, "
                f"milestones): zerod traces its lr for the first {steps} updates and keeps the last "
                f"value after that. Say how many updates the run has: zerod.deepspeed.initialize(..., "
                f"lr_steps=N) or ZerodAccelerator(..., lr_steps=N) (Lightning passes its max_steps, else the "
                "updates of max_epochs over a sized dataloader; Hugging Face's Trainer its max_steps)", stacklevel=3)
    # A deep copy of optimizer and scheduler together, with the optimizer's
    # parameters swapped for one scalar while copying: the model is not
    # copied, and the copy's scheduler steps the copy's optimizer. The
    # objects a bound lr_lambda belongs to (LambdaLR(opt, self.warmup) in a
    # LightningModule: the whole model) are shared, not copied.
    saved = [g["params"] for g in opt.param_groups]
    saved_state = opt.state
    try:
        for g in opt.param_groups:
            g["params"] = [torch.zeros(1)]
        opt.state = type(saved_state)()
        memo = {id(o): o for o in _method_owners(scheduler, {id(opt), id(scheduler)})}
        opt2, sched2 = copy.deepcopy((opt, scheduler), memo)
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
                    f"OneCycleLR's cycle_momentum=True); {CYCLED_MOMENTUM_FIX}")
            if when(t) and t + 1 < steps:
                for _ in range(per):
                    step()
    return values


def _updates_to_reach(when, count, per, offset):
    """The updates to trace for a scheduler that has its last value after
    `count` steps, stepped per `when` (Stepped): up to the first update
    that reads it (at most DEFAULT_HORIZON: a `when` that seldom holds)."""
    taken, t = offset, 0
    while taken < count and t < DEFAULT_HORIZON - 1:
        if when(t):
            taken += per
        t += 1
    return t + 1


def _method_owners(obj, skip, seen=None):
    """The objects the bound methods held in `obj`'s attributes (lists,
    tuples, dicts, functools.partial and nested schedulers followed) belong
    to, leaving out those in `skip` (ids: the optimizer and scheduler,
    which are copied)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, types.MethodType):
        owner = obj.__self__
        return [] if id(owner) in skip or isinstance(owner, type) else [owner]
    if isinstance(obj, (list, tuple)):
        items = obj
    elif isinstance(obj, dict):
        items = obj.values()
    elif isinstance(obj, functools.partial):
        items = [obj.func, *obj.args, *obj.keywords.values()]
    elif isinstance(obj, torch.optim.lr_scheduler.LRScheduler):
        items = vars(obj).values()
    else:
        return []
    return [o for item in items for o in _method_owners(item, skip, seen)]


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


def one_lr(optimizer, who):
    """The lr every parameter group of a torch optimizer holds, as a float:
    zerod's optimizer has one set of hyperparameters, so groups whose lrs
    differ are refused, naming them (`who`: the integration)."""
    lrs = [g["lr"] for g in optimizer.param_groups]
    values = [float(lr) for lr in lrs]
    if any(v != values[0] for v in values[1:]):
        raise InvalidArgumentError(
            f"{who}: the optimizer's parameter groups hold different learning rates ({values}); zerod applies one lr "
            "to every parameter (one set of optimizer hyperparameters), so set the same lr in every group")
    return values[0]


def mark_stepped(optimizer):
    """Records on the user's torch optimizer that it stepped, as its own
    step() would have: zerod applied the update it stands for (in
    Accelerate's backward(), in Lightning's closure), so its real step()
    never runs. The torch
    LR scheduler attached to it checks this record at its first step() and
    would otherwise warn that lr_scheduler.step() came before
    optimizer.step() and that the schedule skips its first value, which is
    not so (zerod runs the schedule traced from this scheduler). torch >= 2.2
    keeps the record in `_opt_called`; earlier 2.x counts the calls of its
    wrapped step() (marked `_with_counter`) in `_step_count`."""
    optimizer._opt_called = True
    if getattr(optimizer.step, "_with_counter", False):
        optimizer._step_count = getattr(optimizer, "_step_count", 0) + 1
