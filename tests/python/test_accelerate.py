"""zerod.accelerate against the real Hugging Face Accelerate (from PyPI), on
the CPU: the Accelerate user's loop, written once, runs under Accelerator()
and under ZerodAccelerator(...) -- the import and the constructor the only
lines changed -- with the same losses (fp32: 1e-4 relative, every batch;
bf16 and fp16 autocast: 1e-3), and save_state/load_state resumes bit for bit.
"""
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import GradScalerKwargs, set_seed

from zerod.accelerate import ZerodAccelerator
from zerod.errors import InvalidArgumentError, InvalidStateError
from gpt import GPT, GPTConfig
from models import BLOCK, CHARS, TOKENS

N_SAMPLES = 64


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """Accelerate's state is a process-wide singleton: each test (and each
    Accelerator in it, see run) starts from none."""
    AcceleratorState._reset_state(True)
    yield
    AcceleratorState._reset_state(True)


class Windows(torch.utils.data.Dataset):
    def __len__(self):
        return N_SAMPLES

    def __getitem__(self, i):
        start = (i * 13) % (len(TOKENS) - BLOCK - 1)
        chunk = TOKENS[start:start + BLOCK + 1]
        return chunk[:-1], chunk[1:]


def objects(batch_size=8, one_cycle=True):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=len(CHARS), block_size=BLOCK, n_layer=2, n_head=2, n_embd=32))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.05)
    sched = (torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=40, cycle_momentum=False)
             if one_cycle else None)
    loader = torch.utils.data.DataLoader(Windows(), batch_size=batch_size, shuffle=False)
    return model, opt, loader, sched


def user_loop(accelerator, model, optimizer, loader, scheduler, epochs=2, save_after=None, resume_from=None,
              blow_up_at=None, scales=None):
    """The Accelerate user's loop (as in Accelerate's examples). For the
    fp16 tests: the loss of micro-batch `blow_up_at` is multiplied by 1e6 (its
    scaled gradients overflow fp16), and `scales` gets the loss scale after
    every micro-batch."""
    losses, lrs = [], []
    if resume_from is not None:
        accelerator.load_state(resume_from)
    for epoch in range(epochs):
        if resume_from is not None and epoch == 0:
            continue  # the state saved after epoch 0 was loaded
        for x, y in loader:
            with accelerator.accumulate(model):
                logits, _ = model(x)
                loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
                if len(losses) == blow_up_at:
                    loss = loss * 1e6
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 0.5)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            losses.append(float(loss))
            lrs.append(scheduler.get_last_lr()[0])
            if scales is not None:
                engine = getattr(accelerator, "zerod_engine", None)
                scales.append(engine.zerod_model.loss_scale() if engine else accelerator.scaler.get_scale())
        if save_after is not None and epoch == 0:
            accelerator.save_state(save_after)
    return losses, lrs


def run(make_accelerator, batch_size=8, **kw):
    set_seed(0)
    AcceleratorState._reset_state(True)
    accelerator = make_accelerator()
    prepared = accelerator.prepare(*objects(batch_size))
    out = user_loop(accelerator, *prepared, **kw)
    return out, accelerator, prepared


def _same(name, ours, theirs, tol, n=16):
    assert len(ours) == len(theirs) == n
    rel = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
    print(f"\n{name}: max relative loss difference {rel:.2e} over {len(ours)} batches (tolerance {tol:g})")
    assert sum(theirs[-3:]) < sum(theirs[:3])
    for s, (a, b) in enumerate(zip(ours, theirs)):
        assert abs(a - b) <= tol * abs(b), f"{name} batch {s}: zerod {a}, Accelerate {b}\n{ours}\n{theirs}"


def _order_warnings(caught):
    return [str(w.message) for w in caught if "lr_scheduler.step()" in str(w.message)]


def plain_accelerator(**kwargs):
    """Accelerator(...) as the user makes it. With mixed_precision="fp16"
    Accelerate has no CPU path (it trains in fp32 there); the reference is
    its GPU path, run on the CPU: fp16 autocast (native_amp) and a torch
    GradScaler with GradScalerKwargs' settings, which Accelerate's backward,
    clip_grad_norm_, optimizer and scheduler wrappers then use as on a GPU."""
    accelerator = Accelerator(**kwargs)
    if accelerator.mixed_precision == "fp16":
        handler = accelerator.scaler_handler.to_kwargs() if accelerator.scaler_handler is not None else {}
        accelerator.native_amp = True
        accelerator.scaler = torch.amp.GradScaler("cpu", **handler)
    return accelerator


@pytest.mark.parametrize("precision,tol", [("no", 1e-4), ("bf16", 1e-3), ("fp16", 1e-3)])
@pytest.mark.parametrize("stage,offload", [(3, True), (1, False)])
def test_same_losses_as_plain_accelerate(precision, tol, stage, offload):
    with warnings.catch_warnings(record=True) as their_warnings:
        warnings.simplefilter("always")
        (theirs, their_lrs), _, _ = run(lambda: plain_accelerator(gradient_accumulation_steps=2,
                                                                  mixed_precision=precision))
    with warnings.catch_warnings(record=True) as our_warnings:
        warnings.simplefilter("always")
        (ours, our_lrs), acc, (model, *_rest) = run(lambda: ZerodAccelerator(
            gradient_accumulation_steps=2, mixed_precision=precision, gradient_clipping=0.5, zero_stage=stage,
            offload=offload))
    # torch's LR scheduler warns that the schedule skips its first value when
    # it sees no optimizer.step() before its own: not so under zerod (the
    # lrs below are Accelerate's), and plain Accelerate does not warn.
    assert _order_warnings(their_warnings) == []
    assert _order_warnings(our_warnings) == []
    _same(f"{precision} stage {stage}{' offload' if offload else ''}", ours, theirs, tol)
    assert our_lrs == their_lrs
    # The lr zerod applied at its last update is the scheduler's, and the
    # weights come out whole.
    assert acc.zerod_engine.last_step.applied
    sd = acc.get_state_dict(model)
    assert set(sd) == set(acc.unwrap_model(model).state_dict())
    assert all(v.numel() > 0 for v in sd.values())


def test_fp16_overflow_and_grad_scaler_kwargs_as_accelerate():
    """zerod's loss scaler follows the GradScaler Accelerate would make from
    GradScalerKwargs (init 2^10, doubling every 2 clean steps): the same
    scale after every micro-batch, the window holding the overflowing
    micro-batch skipped on both sides (the scheduler not stepped), the same
    losses and learning rates before and after."""
    kwargs = dict(gradient_accumulation_steps=2, mixed_precision="fp16",
                  kwargs_handlers=[GradScalerKwargs(init_scale=1024.0, growth_interval=2)])
    theirs_scales, our_scales = [], []
    (theirs, their_lrs), _, _ = run(lambda: plain_accelerator(**kwargs), blow_up_at=9, scales=theirs_scales)
    (ours, our_lrs), acc, (_, opt, *_rest) = run(lambda: ZerodAccelerator(gradient_clipping=0.5, zero_stage=2,
                                                                          **kwargs),
                                                 blow_up_at=9, scales=our_scales)
    assert acc.zerod_engine.config["fp16"] == {"enabled": True, "initial_scale_power": 10, "loss_scale_window": 2,
                                               "hysteresis": 1, "zerod_window_rule": "torch"}
    assert our_scales == theirs_scales
    assert our_scales[7] == 2 * our_scales[9] and max(our_scales) > 1024  # halved by the overflow, grown before
    assert our_lrs == their_lrs and our_lrs[7] == our_lrs[9]  # the skipped window did not step the schedule
    assert acc.zerod_engine.skipped_steps == 1
    _same("fp16 with an overflow", ours, theirs, 1e-3)


def test_save_state_load_state_resumes_exactly(tmp_path):
    make = lambda: ZerodAccelerator(gradient_accumulation_steps=2, gradient_clipping=0.5, zero_stage=3,  # noqa
                                    offload=True)
    (unbroken, lrs), _, _ = run(make, save_after=str(tmp_path / "state"))
    assert (tmp_path / "state" / "zerod" / "latest").exists()

    set_seed(123)  # the RNG state comes back from save_state
    AcceleratorState._reset_state(True)
    accelerator = make()
    model, opt, loader, sched = objects()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)  # not the saved values: load_state must bring them
    prepared = accelerator.prepare(model, opt, loader, sched)
    (resumed, resumed_lrs) = user_loop(accelerator, *prepared, resume_from=str(tmp_path / "state"))
    assert resumed == unbroken[8:]  # bit for bit
    assert resumed_lrs == lrs[8:]


def test_clip_value_must_match():
    accelerator = ZerodAccelerator(gradient_clipping=1.0)
    model, opt, loader, sched = accelerator.prepare(*objects())
    x, y = next(iter(loader))
    logits, _ = model(x)
    accelerator.backward(F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1)))
    assert float(accelerator.clip_grad_norm_(model.parameters(), 1.0)) > 0
    with pytest.raises(InvalidArgumentError, match="gradient_clipping=1.0"):
        accelerator.clip_grad_norm_(model.parameters(), 0.5)


def test_refusals():
    with pytest.raises(InvalidArgumentError, match="growth_factor=3"):
        ZerodAccelerator(mixed_precision="fp16", cpu=True, kwargs_handlers=[GradScalerKwargs(growth_factor=3.0)])
    AcceleratorState._reset_state(True)
    accelerator = ZerodAccelerator()
    model = torch.nn.Linear(4, 4)
    with pytest.raises(InvalidArgumentError, match="Adagrad has no zerod equivalent"):
        accelerator.prepare(model, torch.optim.Adagrad(model.parameters()))
    # An optimizer of part of the model (the head), the rest not frozen:
    # Accelerate would leave the rest as it is, zerod would train it.
    AcceleratorState._reset_state(True)
    accelerator = ZerodAccelerator()
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
    with pytest.raises(InvalidArgumentError, match=r"the optimizer leaves out 2 parameter\(s\) that require grad "
                                                   r"\('0.weight', '0.bias'\)"):
        accelerator.prepare(model, torch.optim.SGD(model[1].parameters(), lr=0.1))


def _one_micro_batch(accelerator, model, loader):
    x, y = next(iter(loader))
    logits, _ = model(x)
    accelerator.backward(F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1)))


def test_a_window_without_optimizer_step_is_refused(tmp_path):
    """zerod applies the update inside accelerator.backward(), where
    Accelerate applies it at optimizer.step(): a loop that does not step
    after a window (its own accumulation, `if (i + 1) % 4 == 0:
    optimizer.step()`, or a skipped step) is refused at the next backward
    or save_state, naming the way to accumulate."""
    accelerator = ZerodAccelerator(zero_stage=1)
    model, opt, loader, sched = accelerator.prepare(*objects())
    _one_micro_batch(accelerator, model, loader)
    opt.step()
    _one_micro_batch(accelerator, model, loader)  # stepped before: fine
    with pytest.raises(InvalidStateError, match=r"save_state\(\) after a backward that ended an accumulation "
                                                r"window without optimizer.step\(\)"):
        accelerator.save_state(str(tmp_path / "state"))
    with pytest.raises(InvalidStateError, match=r"gradient_accumulation_steps=N\) \(it is 1\) and `with "
                                                r"accelerator.accumulate\(model\):`"):
        _one_micro_batch(accelerator, model, loader)
    opt.step()
    _one_micro_batch(accelerator, model, loader)


def _nanogpt_lr(window, warmup=2, decay=6, max_lr=3e-3, min_lr=3e-4):
    """nanoGPT's get_lr(it): a linear warm-up, a cosine down to min_lr."""
    if window < warmup:
        return max_lr * (window + 1) / (warmup + 1)
    if window > decay:
        return min_lr
    ratio = (window - warmup) / (decay - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (max_lr - min_lr)


# What ReduceLROnPlateau is fed after each window: a validation metric
# that stalls, so that it lowers the lr (the same on both sides whatever the
# losses' last bits).
_METRIC = [3.0, 2.5, 2.5, 2.5, 2.0, 2.0, 2.0, 2.0, 2.0]


def hand_objects(how):
    """objects() with the schedule of `how`: "hand" none (the loop writes
    the lr), "unprepared" a LambdaLR the loop steps itself, "plateau" a
    ReduceLROnPlateau (given to prepare()), "over_a_scheduler" the prepared
    OneCycleLR."""
    model, opt, loader, sched = objects(one_cycle=how == "over_a_scheduler")
    if how in ("hand", "unprepared"):
        # A warm-up from 0: zerod's job takes the optimizer's lr (3e-3, kept
        # as initial_lr), param_groups hold 0, which zerod must apply.
        warm = (lambda t: min(1.0, t / 3) * 0.8 ** t)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, warm) if how == "unprepared" else None
        return (model, opt, loader), sched
    if how == "plateau":
        sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=1)
    return (model, opt, loader, sched), None


def hand_loop(accelerator, model, optimizer, loader, scheduler=None, how="hand", by_hand=None, epochs=2):
    """The loop of a schedule zerod does not trace: the lr each window's
    update reads is written into param_groups before the window (nanoGPT's
    `for g in optimizer.param_groups: g["lr"] = get_lr(it)`), set by a
    scheduler prepare() was not given (`by_hand`, stepped here after each
    window) or by ReduceLROnPlateau, or halved by hand for one window under
    the prepared scheduler. Returns the losses, the lr param_groups held at
    each window's update and (under zerod) the lr each update applied."""
    losses, lrs, applied, window = [], [], [], 0
    for _ in range(epochs):
        for x, y in loader:
            with accelerator.accumulate(model):
                if how == "hand":
                    for g in optimizer.param_groups:
                        g["lr"] = _nanogpt_lr(window)
                logits, _ = model(x)
                loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 0.5)
                    lrs.append(optimizer.param_groups[0]["lr"])
                    last = getattr(accelerator, "_zerod_last", None)
                    if last is not None:
                        applied.append(last.lr)
                optimizer.step()
                if how == "over_a_scheduler":
                    scheduler.step()
                if accelerator.sync_gradients:
                    window += 1
                    if how == "unprepared":
                        by_hand.step()
                    elif how == "plateau":
                        scheduler.step(_METRIC[window])
                    elif how == "over_a_scheduler" and window == 3:
                        for g in optimizer.param_groups:
                            g["lr"] *= 0.5  # for one window: the scheduler's next step writes its own
                optimizer.zero_grad()
            losses.append(float(loss.detach()))
    return losses, lrs, applied


@pytest.mark.parametrize("how", ["hand", "unprepared", "plateau", "over_a_scheduler"])
def test_a_hand_written_schedule_trains_as_under_plain_accelerate(how):
    """An lr the loop writes into the optimizer's param_groups (a
    hand-written schedule, a scheduler not given to prepare(),
    ReduceLROnPlateau, a one-window change under the prepared scheduler)
    is applied by zerod as by Accelerate: zerod reads param_groups at each
    window's last backward and takes a value that differs from its schedule
    (engine.set_lr). The same losses as plain Accelerate, and every update
    applied the lr param_groups held."""
    def one(make):
        set_seed(0)
        AcceleratorState._reset_state(True)
        accelerator = make()
        objs, by_hand = hand_objects(how)
        prepared = accelerator.prepare(*objs)
        return hand_loop(accelerator, *prepared[:3], scheduler=prepared[3] if len(prepared) > 3 else None, how=how,
                         by_hand=by_hand)
    theirs, their_lrs, _ = one(lambda: plain_accelerator(gradient_accumulation_steps=2))
    ours, our_lrs, applied = one(lambda: ZerodAccelerator(gradient_accumulation_steps=2, gradient_clipping=0.5,
                                                          zero_stage=1))
    assert our_lrs == their_lrs and len(set(their_lrs)) > 2, their_lrs  # the schedule moved
    assert applied == our_lrs
    _same(f"hand-written lr ({how})", ours, theirs, 1e-4)


def test_parameter_groups_with_different_lrs_are_refused():
    """zerod's optimizer has one lr: groups the loop gives different lrs are
    refused at the window's backward, naming them, before anything is
    applied."""
    accelerator = ZerodAccelerator(zero_stage=1)
    model, _, loader, _ = objects()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay}, {"params": rest}], lr=3e-3)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    _one_micro_batch(accelerator, model, loader)
    opt.step()
    before = accelerator.get_state_dict(model)
    opt.param_groups[1]["lr"] = 1e-3
    with pytest.raises(InvalidArgumentError, match=r"ZerodAccelerator: the optimizer's parameter groups hold "
                                                   r"different learning rates \(\[0.003, 0.001\]\); zerod "
                                                   r"applies one lr"):
        _one_micro_batch(accelerator, model, loader)
    after = accelerator.get_state_dict(model)
    assert all(torch.equal(v, before[k]) for k, v in after.items())


def test_other_hyperparameters_written_into_param_groups_are_refused():
    """zerod takes the optimizer's hyperparameters other than the lr once,
    at prepare(), and has no call that changes them: a loop writing one into
    param_groups (DINO's weight-decay schedule, betas changed mid-run),
    which Accelerate would apply, is refused at the next backward, naming
    the key, before anything is applied; the value taken, written back, goes
    on."""
    accelerator = ZerodAccelerator(zero_stage=1)
    model, opt, loader, _ = accelerator.prepare(*objects(one_cycle=False))
    _one_micro_batch(accelerator, model, loader)
    opt.step()
    before = accelerator.get_state_dict(model)
    for key, value, said in (("weight_decay", 0.0, r"\['weight_decay'\] was changed from 0.05 to 0.0"),
                             ("betas", (0.9, 0.999), r"\['betas'\] was changed from \(0.9, 0.95\) to \(0.9, 0.999\)")):
        taken = opt.param_groups[0][key]
        for g in opt.param_groups:
            g[key] = value
        with pytest.raises(InvalidArgumentError, match=r"ZerodAccelerator: optimizer.param_groups\[0\]" + said +
                           r", but zerod takes the optimizer's hyperparameters other than the lr once, at prepare\(\)"):
            _one_micro_batch(accelerator, model, loader)
        after = accelerator.get_state_dict(model)
        assert all(torch.equal(v, before[k]) for k, v in after.items())
        for g in opt.param_groups:
            g[key] = taken
    _one_micro_batch(accelerator, model, loader)
    opt.step()


def test_a_momentum_cycling_scheduler_not_prepared_is_refused_at_prepare():
    """A OneCycleLR made on the optimizer with cycle_momentum=True (its
    default) but not given to prepare() cycles the betas at every step, which
    zerod takes once: refused at prepare(), saying cycle_momentum=False,
    not at the second backward as a changed betas; with
    cycle_momentum=False it trains."""
    model, opt, loader, _ = objects(one_cycle=False)
    torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=40)
    with pytest.raises(InvalidArgumentError, match=r"ZerodAccelerator: optimizer.param_groups\[0\] holds "
                                                   r"max_momentum/base_momentum: a OneCycleLR or CyclicLR .* at "
                                                   r"prepare\(\); .*pass cycle_momentum=False"):
        ZerodAccelerator(zero_stage=1).prepare(model, opt, loader)

    AcceleratorState._reset_state(True)
    model, opt, loader, _ = objects(one_cycle=False)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=40, cycle_momentum=False)
    accelerator = ZerodAccelerator(zero_stage=1)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    for _ in range(3):
        _one_micro_batch(accelerator, model, loader)
        opt.step()
        sched.step()
        opt.zero_grad()


def test_free_memory_destroys_the_engine_and_prepare_runs_again():
    """free_memory(), which Accelerate says to call between two trainings,
    destroys DeepSpeed's engine; zerod's is destroyed alike: the model keeps
    the trained weights, the engine is no longer live (it stayed so for the
    process's life, holding zerod's model and the model's parameters as
    empty placeholders), and the same accelerator prepares the model again."""
    import zerod.torch as zt

    accelerator = ZerodAccelerator(zero_stage=1)
    model, opt, loader, _ = objects(one_cycle=False)
    prepared_model, prepared_opt, prepared_loader = accelerator.prepare(model, opt, loader)
    _one_micro_batch(accelerator, prepared_model, prepared_loader)
    prepared_opt.step()
    trained, engine = accelerator.get_state_dict(prepared_model), accelerator.zerod_engine
    accelerator.free_memory()
    assert accelerator.zerod_engine is None and engine not in zt._LIVE_ENGINES
    after = model.state_dict()
    assert trained and all(torch.equal(after[k], v) for k, v in trained.items())

    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    prepared_model, prepared_opt, prepared_loader = accelerator.prepare(model, opt, loader)
    try:
        _one_micro_batch(accelerator, prepared_model, prepared_loader)
        prepared_opt.step()
        assert accelerator.zerod_engine.global_steps == 1
    finally:
        accelerator.free_memory()


def test_an_optimizer_of_named_parameters_trains_as_one_of_parameters():
    """torch >= 2.6's optimizer made from model.named_parameters() keeps the
    names in its groups (param_names): the same optimizer to zerod, and to
    Accelerate; the same losses as the optimizer made from parameters()."""
    def losses(named):
        set_seed(0)
        AcceleratorState._reset_state(True)
        accelerator = ZerodAccelerator(zero_stage=1)
        model, _, loader, _ = objects(one_cycle=False)
        params = model.named_parameters() if named else model.parameters()
        opt = torch.optim.AdamW(params, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.05)
        if named and "param_names" not in opt.param_groups[0]:
            pytest.skip(f"torch {torch.__version__} keeps no param_names in its groups")
        model, opt, loader = accelerator.prepare(model, opt, loader)
        out = []
        for x, y in list(loader)[:4]:
            logits, _ = model(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
            accelerator.backward(loss)
            opt.step()
            out.append(float(loss.detach()))
        return out
    assert losses(named=True) == losses(named=False)


def test_optimizer_state_dict_round_trip_resumes_exactly(tmp_path):
    """A checkpoint the loop writes itself, torch.save({"model":
    model.state_dict(), "optimizer": optimizer.state_dict()}), holds zerod's
    optimizer state (Adam's moments, the update count): a fresh run that
    loads both goes on bit for bit with the unbroken one. A torch
    optimizer's state_dict is refused naming both formats."""
    def prepared():
        set_seed(0)
        AcceleratorState._reset_state(True)
        accelerator = ZerodAccelerator(gradient_accumulation_steps=2, zero_stage=3)
        return (accelerator, *accelerator.prepare(*objects(one_cycle=False)[:3]))

    def train(accelerator, model, opt, batches):
        for x, y in batches:
            with accelerator.accumulate(model):
                logits, _ = model(x)
                accelerator.backward(F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1)))
                opt.step()
                opt.zero_grad()
        return accelerator.get_state_dict(model)

    accelerator, model, opt, loader = prepared()
    batches = list(loader)
    train(accelerator, model, opt, batches[:4])
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "ckpt.pt")
    unbroken = train(accelerator, model, opt, batches[4:])

    accelerator, model, opt, _ = prepared()
    with pytest.raises(InvalidArgumentError, match=r"this is a torch optimizer's state_dict"):
        opt.load_state_dict(torch.optim.AdamW([torch.zeros(1)]).state_dict())
    saved = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert saved["optimizer"]["step"] == 2 and saved["optimizer"]["state"]
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optimizer"])
    resumed = train(accelerator, model, opt, batches[4:])
    assert all(torch.equal(resumed[k], v) for k, v in unbroken.items())


def test_clip_grad_value_is_refused_by_name():
    """As Accelerate refuses it under DeepSpeed: zerod clips by the norm."""
    accelerator = ZerodAccelerator(zero_stage=0)
    model, opt, loader, sched = accelerator.prepare(*objects())
    _one_micro_batch(accelerator, model, loader)
    with pytest.raises(InvalidArgumentError, match="does not support clip_grad_value_"):
        accelerator.clip_grad_value_(model.parameters(), 0.01)


@pytest.mark.parametrize("mode", ["default", "split", "per_call"])
def test_the_scheduler_steps_as_accelerate_steps_it_on_two_processes(mode, tmp_path):
    """Accelerate steps the LR scheduler num_processes times at each update
    (a process's batch counts as one of the one-process run's; not past a
    OneCycleLR's total_steps), once with split_batches, and at every call
    with step_scheduler_with_optimizer=False: the 2 ranks of `zerod run`
    run the same loop under plain Accelerate (multi-CPU) and
    ZerodAccelerator, with the same losses and learning rates, and zerod
    applies the lr Accelerate's optimizer steps with."""
    import os
    import subprocess
    import sys

    from conftest import ZEROD, rank_env, split_ranks

    job = tmp_path / "job.lua"
    job.write_text("return { zero = { stage = 2 } }\n")
    here = os.path.dirname(os.path.abspath(__file__))
    p = subprocess.run([ZEROD, "run", "--nproc", "2", "--job", str(job), "--", sys.executable,
                        os.path.join(here, "accelerate_sched_rank.py"), mode],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300, env=rank_env())
    assert p.returncode == 0, p.stdout[-4000:]
    for r, lines in split_ranks(p.stdout).items():
        rows = {who: [line.split()[2:] for line in lines if line.startswith(who + " ")] for who in ("plain", "zerod")}
        assert len(rows["plain"]) == len(rows["zerod"]) == 8, lines
        for (loss, applied, after), (ploss, papplied, pafter) in zip(rows["zerod"], rows["plain"]):
            assert abs(float(loss) - float(ploss)) <= 1e-5 * abs(float(ploss)), (r, rows)
            assert (applied, after) == (papplied, pafter), (r, rows)
        zerod_applied = [line.split()[2] for line in lines if line.startswith("applied ")]
        assert zerod_applied == [row[1] for row in rows["plain"] if row[1] != "-"], (r, zerod_applied, rows)
    lrs = [float(row[2]) for row in rows["plain"]]
    if mode == "default":  # stepped twice an update, to OneCycleLR's end at step 6 and no further
        assert lrs[1] != lrs[3] and lrs[5] == lrs[7], lrs


def test_two_processes_under_zerod_run(tmp_path):
    """The same loop as the 2 ranks of `zerod run`, Accelerate splitting each
    batch of 16 between them (split_batches, so that the LR scheduler steps
    once an update, as in one process): the mean of the ranks' losses is
    plain Accelerate's in one process with batches of 16;
    save_state writes both ranks' zerod shards and load_state resumes both
    bit for bit."""
    import os
    import subprocess
    import sys

    from conftest import ZEROD, rank_env, split_ranks

    job = tmp_path / "job.lua"
    job.write_text("return { zero = { stage = 3 } }\n")  # checked by zerod run; the accelerator brings its own
    here = os.path.dirname(os.path.abspath(__file__))
    cmd = [ZEROD, "run", "--nproc", "2", "--job", str(job), "--", sys.executable,
           os.path.join(here, "accelerate_rank.py"), str(tmp_path / "state")]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
                       env=rank_env())
    assert p.returncode == 0, p.stdout[-4000:]
    assert "lr_scheduler.step()" not in p.stdout  # torch's order warning (see test_same_losses_as_plain_accelerate)
    ranks = split_ranks(p.stdout)
    for r in (0, 1):  # micro-batch 8 a rank; 8 x 2 accumulation steps x 2 ranks a step
        assert [l for l in ranks[r] if l.startswith("batch ")] == ["batch 8 32"], ranks[r][:5]
    per_rank = [[l.split()[2:] for l in ranks[r] if l.startswith("loss ")] for r in (0, 1)]
    ours = [(float(a[0]) + float(b[0])) / 2 for a, b in zip(*per_rank)]
    our_lrs = [float(a[1]) for a in per_rank[0]]
    (theirs, their_lrs), _, _ = run(lambda: Accelerator(gradient_accumulation_steps=2), batch_size=16)
    _same("2 processes under zerod run", ours, theirs, 1e-4, n=8)
    assert our_lrs == their_lrs
    assert (tmp_path / "state" / "zerod" / "latest").exists()

    # Both ranks load_state and run the second epoch again: bit for bit.
    p = subprocess.run(cmd + ["resume"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=300, env=rank_env())
    assert p.returncode == 0, p.stdout[-4000:]
    again = split_ranks(p.stdout)
    for r in (0, 1):
        resumed = [l.split()[2:] for l in again[r] if l.startswith("loss ")]
        assert resumed == per_rank[r][len(per_rank[r]) // 2:], (r, resumed, per_rank[r])


def test_save_model_writes_zerods_weights(tmp_path):
    """accelerator.save_model writes the full weights zerod holds (through
    get_state_dict), as safetensors."""
    from safetensors.torch import load_file

    accelerator = ZerodAccelerator(zero_stage=3, offload=True)
    model, opt, loader, sched = accelerator.prepare(*objects())
    x, y = next(iter(loader))
    logits, _ = model(x)
    accelerator.backward(F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1)))
    opt.step()
    accelerator.save_model(model, str(tmp_path))
    saved = load_file(str(tmp_path / "model.safetensors"))
    full = accelerator.get_state_dict(model)
    assert set(full) - set(saved) == {"lm_head.weight"}  # tied to the embedding: written once, as for any model
    assert all(torch.equal(saved[k], full[k]) and saved[k].numel() > 0 for k in saved)
    initial = objects()[0].state_dict()
    assert not torch.equal(saved["transformer.wte.weight"], initial["transformer.wte.weight"])  # trained


def test_two_jobs_sharing_a_daemon_directory_meet_apart(tmp_path):
    """The gloo group beside zerod (zerod/_gloo.py) of four 2-rank jobs whose
    ranks share one daemon's socket directory (`zerod serve --jobs`, jobs
    told apart by ZEROD_JOB_KEY or by their launcher's ids, here Slurm
    steps): each job's ranks meet their own, not another job's (the store
    file had one name for every job)."""
    import os
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import os, sys, torch
        from zerod._gloo import init_gloo
        init_gloo(int(sys.argv[1]), 2, "accelerate")
        t = torch.tensor([float(sys.argv[2])])
        torch.distributed.all_reduce(t)
        print(int(t.item()))
    """)
    env = dict(os.environ, ZEROD_ENDPOINT=f"unix:{tmp_path}/zerod.sock", PYTHONPATH=os.pathsep.join(sys.path))
    for k in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "ZEROD_JOB_KEY", "SLURM_JOB_ID", "SLURM_STEP_ID"):
        env.pop(k, None)
    procs = []
    # Told apart by ZEROD_JOB_KEY, and (as two torchrun-less launches with
    # their own MASTER_PORT would be, ranks started by hand) by the launcher
    # ids libzerod reads, with ZEROD_ENDPOINT set so the file is used.
    for job, value, ids in (("a", 1, {"ZEROD_JOB_KEY": "a"}), ("b", 10, {"ZEROD_JOB_KEY": "b"}),
                            ("c", 100, {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"}),
                            ("d", 1000, {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "1"})):
        for rank in (0, 1):
            procs.append((job, subprocess.Popen([sys.executable, "-c", code, str(rank), str(value)],
                                                env=dict(env, **ids), stdout=subprocess.PIPE,
                                                stderr=subprocess.STDOUT, text=True)))
    sums = {}
    try:
        for job, p in procs:
            out, _ = p.communicate(timeout=120)
            assert p.returncode == 0, out[-2000:]
            sums.setdefault(job, []).append(int(out.split()[-1]))
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert sums == {"a": [2, 2], "b": [20, 20], "c": [200, 200], "d": [2000, 2000]}


def test_the_gloo_group_zerod_starts_is_ended_before_the_interpreter_exits(tmp_path):
    """The gloo group init_gloo starts is destroyed at exit while Python is
    whole: left to the interpreter's teardown, gloo's threads could abort a
    rank that had finished ("terminate called without an active exception",
    which failed this file's four-job test once in CI). A handler registered
    before init_gloo runs after zerod's (atexit is last in, first out) and
    sees the group gone and the store file removed."""
    import os
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import atexit, glob, os, torch
        from zerod._gloo import init_gloo
        def after():
            print("initialized", torch.distributed.is_initialized())
            print("stores", len(glob.glob(os.path.join(os.environ["DIR"], "accelerate-store*"))))
        atexit.register(after)
        init_gloo(0, 1, "accelerate")
        t = torch.tensor([3.0])
        torch.distributed.all_reduce(t)
        print("sum", int(t.item()))
    """)
    env = dict(os.environ, ZEROD_ENDPOINT=f"unix:{tmp_path}/zerod.sock", ZEROD_JOB_KEY="exit", DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join(sys.path))
    for k in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "ZEROD_RUN_ID"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.split("\n")[:3] == ["sum 3", "initialized False", "stores 0"], p.stdout + p.stderr


def _node_env(tmp_path, node, **extra):
    """Rank `node` of 2, alone on its node, as `mpirun -np 2 ... zerod run
    --nproc 1` starts it: its own daemon directory and run id, as every
    node's `zerod run` has."""
    import os
    import sys

    directory = tmp_path / f"node{node}"
    directory.mkdir(exist_ok=True)
    env = dict(os.environ, ZEROD_ENDPOINT=f"unix:{directory}/zerod.sock", ZEROD_RUN_ID=f"run{node}",
               ZEROD_RANK=str(node), ZEROD_LOCAL_RANK="0", ZEROD_WORLD_SIZE="2", ZEROD_LOCAL_WORLD_SIZE="1",
               PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1")
    for k in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "ZEROD_JOB_KEY", "LOCAL_WORLD_SIZE"):
        env.pop(k, None)
    env.update(extra)
    return env


def test_ranks_on_two_nodes_meet_at_master_addr_and_port(tmp_path):
    """Two nodes of one rank each (zerod/_gloo.py): ZerodAccelerator's gloo
    group meets at MASTER_ADDR:MASTER_PORT, not in a store file beside each
    node's daemon (each node's ranks waited in their own until torch's 30
    minute timeout), and LOCAL_WORLD_SIZE is the node's 1 rank, not the
    world's 2. Both nodes are processes on this machine."""
    import os
    import subprocess
    import sys
    import textwrap

    from conftest import reserved_port

    code = textwrap.dedent("""
        import os, torch
        from zerod.accelerate import _join_zerod_ranks
        _join_zerod_ranks()
        t = torch.tensor([float(os.environ["ZEROD_RANK"]) + 1])
        torch.distributed.all_reduce(t)
        print("local_world_size", os.environ["LOCAL_WORLD_SIZE"], "sum", int(t.item()))
    """)
    lines = []
    with reserved_port() as port:
        master = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs = [subprocess.Popen([sys.executable, "-c", code], env=_node_env(tmp_path, node, **master),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for node in (0, 1)]
        try:
            for p in procs:
                out, _ = p.communicate(timeout=120)  # the bug waited 30 minutes here
                assert p.returncode == 0, out[-2000:]
                lines.append(out.strip().split("\n")[-1])
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    assert lines == ["local_world_size 1 sum 3"] * 2
    for node in (0, 1):
        assert not [n for n in os.listdir(tmp_path / f"node{node}") if "store" in n]


@pytest.mark.parametrize("entry, extra, missing", [
    ("from zerod.accelerate import _join_zerod_ranks; _join_zerod_ranks()", {}, "MASTER_ADDR and MASTER_PORT are"),
    # The Lightning strategy's path under zerod run (ZerodStrategy.setup_environment).
    ("from zerod._gloo import init_gloo; init_gloo(1, 2, 'lightning')", {"MASTER_ADDR": "nodeA"}, "MASTER_PORT is"),
], ids=["accelerate", "lightning"])
def test_ranks_on_two_nodes_without_master_addr_fail_at_once(tmp_path, entry, extra, missing):
    """Two nodes and no MASTER_ADDR/MASTER_PORT: the rank fails at once
    saying what to set (it used to wait in its node's store file for 30
    minutes, for a rank of another node that never comes there)."""
    import os
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", entry], env=_node_env(tmp_path, 1, **extra), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode != 0
    err = p.stderr
    assert "ConfigError" in err and "rank 1 of 2 runs on several nodes" in err, err[-2000:]
    assert f"{missing} not set" in err and "mpirun -x MASTER_ADDR=" in err, err[-2000:]
    assert not [n for n in os.listdir(tmp_path / "node1") if "store" in n]
