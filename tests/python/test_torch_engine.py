"""zerod.torch.initialize: module selection, residency, gradients, evaluation,
state_dict, embedded at stages 0 and 3 (one rank; the daemon's ranks are in
test_parity.py)."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

import zerod
import zerod.torch
from gpt import GPT, Block, GPTConfig
from models import CHARS, batch, loss_of, make

SGD1 = 'return {{ optimizer = {{ type = "sgd", lr = 1.0 }}, gradient_accumulation_steps = {gas}, zero = {{ {zero} }} }}'
STAGES = {"stage0": "stage = 0", "stage3": "stage = 3, param_persistence_threshold = 0"}


def tiny_gpt():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=len(CHARS), block_size=16, n_layer=2, n_head=2, n_embd=16))


def sgd_job(stage="stage0", gas=1):
    return SGD1.format(gas=gas, zero=STAGES[stage])


def test_default_rule_takes_modules_owning_parameters_and_groups_tied_ones():
    engine = zerod.torch.initialize(tiny_gpt(), job_text=sgd_job())
    names = list(engine.zerod_modules)
    assert names[0] == "transformer.wte+lm_head"  # weight tying: one zerod module
    assert "transformer.h.0.attn.c_attn" in names and "transformer.h.1.ln_2" in names
    assert len(names) == 2 + 2 * 6 + 1
    assert engine.num_parameters == sum(p.numel() for p in tiny_gpt().parameters())


@pytest.mark.parametrize("spec", [[Block], ["transformer.h.*"], Block])
def test_named_modules_own_their_subtree(spec):
    engine = zerod.torch.initialize(tiny_gpt(), job_text=sgd_job(), modules=spec)
    assert list(engine.zerod_modules) == ["transformer.wte+lm_head", "transformer.wpe", "transformer.h.0",
                                          "transformer.h.1", "transformer.ln_f"]


def test_a_pattern_that_matches_nothing_is_refused():
    with pytest.raises(zerod.InvalidArgumentError, match=r"modules=\['blocks.\*'\] matched no submodule of GPT"):
        zerod.torch.initialize(tiny_gpt(), job_text=sgd_job(), modules=["blocks.*"])


def test_parameters_point_into_zerod_only_while_their_module_runs():
    model = tiny_gpt()
    engine = zerod.torch.initialize(model, job_text=sgd_job())
    fc = model.transformer.h[0].mlp.c_fc
    seen = {}

    def look(module, inputs):
        seen["ptr"], seen["shape"] = module.weight.data_ptr(), tuple(module.weight.shape)
    fc.register_forward_pre_hook(look)  # runs after zerod's own pre-hook
    assert fc.weight.numel() == 0
    (x,), y = batch("gpt", 0)
    with torch.no_grad():
        engine(x)
    zm = engine.zerod_model
    mid, pid = zm.find_module("transformer.h.0.mlp.c_fc"), zm.find_param("transformer.h.0.mlp.c_fc.weight")
    zm.forward_begin(mid)
    assert seen["ptr"] == zm.param_view(pid).data_ptr  # zero copy: the same memory (stage 0 keeps it)
    zm.forward_end(mid)
    assert seen["shape"] == (64, 16) and fc.weight.numel() == 0


@pytest.mark.parametrize("stage", STAGES)
def test_gradients_are_torchs_and_never_sit_in_param_grad(stage):
    model, ref = tiny_gpt(), tiny_gpt()
    engine = zerod.torch.initialize(model, job_text=sgd_job(stage))
    (x,), y = batch("gpt", 0)
    ref(x, y)[1].backward()
    _, loss = engine(x, y)
    engine.backward(loss)
    assert all(p.grad is None for p in model.parameters())  # no full-model gradient in torch
    engine.step()
    after = engine.state_dict()
    for name, p in ref.named_parameters():  # SGD with lr 1: the update is the gradient
        torch.testing.assert_close(p.detach() - after[name], p.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_gradient_accumulation_averages_micro_batches():
    model, ref = tiny_gpt(), tiny_gpt()
    engine = zerod.torch.initialize(model, job_text=sgd_job(gas=2))
    for step in range(2):
        (x,), y = batch("gpt", step)
        (ref(x, y)[1] / 2).backward()
        _, loss = engine(x, y)
        engine.backward(loss)
        r = engine.step()
        assert r.boundary == (step == 1)
    after = engine.state_dict()
    for name, p in ref.named_parameters():
        torch.testing.assert_close(p.detach() - after[name], p.grad, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("stage", STAGES)
def test_evaluation_without_gradients(stage):
    model, ref = tiny_gpt(), tiny_gpt()
    engine = zerod.torch.initialize(model, job_text=sgd_job(stage)).eval()
    (x,), _ = batch("gpt", 3)
    with torch.no_grad():
        got, want = engine(x)[0], ref(x)[0]
        model(x)  # the model itself may run too, without gradients
    torch.testing.assert_close(got, want)
    assert not model.training
    with pytest.raises(zerod.InvalidStateError, match="step\\(\\) without backward"):
        engine.step()


def test_state_dict_is_torchs_with_full_fp32_values_and_loads_back():
    model, ref = tiny_gpt(), tiny_gpt()
    engine = zerod.torch.initialize(model, job_text=sgd_job("stage3"))
    sd, want = engine.state_dict(), ref.state_dict()
    assert list(sd) == list(want)
    assert sd["lm_head.weight"] is sd["transformer.wte.weight"]  # tied, as in torch
    for k in want:
        torch.testing.assert_close(sd[k], want[k], rtol=0, atol=0)
    with torch.no_grad():
        for p in ref.parameters():
            p.mul_(0.5)
    engine.load_state_dict(ref.state_dict())
    (x,), _ = batch("gpt", 1)
    with torch.no_grad():
        torch.testing.assert_close(engine(x)[0], ref(x)[0])
    assert set(engine.memory()) == {"device", "host", "nvme"}


def test_optimizer_state_dict_resumes_training_exactly():
    job = ('return { optimizer = { type = "adamw", lr = 1e-2 }, '
           'zero = { stage = 3, param_persistence_threshold = 0 } }')

    def run(engine, steps):
        for s in steps:
            (x,), y = batch("gpt", s)
            engine.backward(loss_of("gpt", engine, (x,), y, torch.float32))
            engine.step()

    a = zerod.torch.initialize(tiny_gpt(), job_text=job)
    run(a, range(3))
    sd, osd = a.state_dict(), a.optimizer_state_dict()
    assert osd["optimizer"] == "adamw" and osd["step"] == 3
    assert set(osd["state"]["transformer.wte.weight"]) == {"exp_avg", "exp_avg_sq"}
    assert "lm_head.weight" not in osd["state"]  # tied: saved once, under its first key
    run(a, range(3, 5))
    want = a.state_dict()

    b = zerod.torch.initialize(tiny_gpt(), job_text=job)
    b.load_state_dict(sd)
    b.load_optimizer_state_dict(osd)
    run(b, range(3, 5))
    got = b.state_dict()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0)
    assert b.optimizer_state_dict()["step"] == 5
    with pytest.raises(zerod.InvalidArgumentError, match="optimizer 'sgd'"):
        b.load_optimizer_state_dict(dict(osd, optimizer="sgd"))


def test_bf16_model():
    model = tiny_gpt()
    engine = zerod.torch.initialize(model, job_text='return { precision = "bf16" }', dtype=torch.bfloat16)
    (x,), y = batch("gpt", 0)
    logits, _ = engine(x)
    assert logits.dtype == torch.bfloat16
    engine.backward(F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1)))
    assert engine.step().applied
    assert engine.state_dict()["transformer.wte.weight"].dtype == torch.float32


class Odd(nn.Module):
    """A parameter of a non-leaf module, and a frozen parameter."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.scale = nn.Parameter(torch.ones(4))
        self.inner = nn.Linear(4, 4)
        self.frozen = nn.Parameter(torch.full((4,), 2.0), requires_grad=False)

    def forward(self, x):
        return (self.inner(x) * self.scale + self.frozen).sum()


class RowOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.arange(8.0).view(2, 4))

    def forward(self, i):
        return self.w[i]  # a view of the parameter


def test_outputs_that_view_a_parameter_are_copied():
    model = nn.Sequential(RowOut())
    engine = zerod.torch.initialize(model, job_text=sgd_job("stage3"))
    out = engine(1)
    torch.testing.assert_close(out, torch.arange(4.0, 8.0))  # still valid after forward_end
    engine.backward(out.sum())
    engine.step()
    torch.testing.assert_close(engine.state_dict()["0.w"], torch.tensor([[0.0, 1, 2, 3], [3, 4, 5, 6]]))


def test_frozen_parameters_stay_in_torch_and_root_parameters_are_a_module():
    model = Odd()
    engine = zerod.torch.initialize(model, job_text=sgd_job())
    assert list(engine.zerod_modules) == ["<root>", "inner"]
    loss = engine(torch.ones(2, 4))
    engine.backward(loss)
    engine.step()
    sd = engine.state_dict()
    torch.testing.assert_close(sd["frozen"], torch.full((4,), 2.0))
    assert not torch.equal(sd["scale"], torch.ones(4))


def test_a_module_called_twice_and_tied_weights_get_one_residency_each_call(monkeypatch):
    model, ref = make("tied"), make("tied")
    engine = zerod.torch.initialize(model, job_text=sgd_job("stage3"))
    assert list(engine.zerod_modules) == ["embed+head", "mix"]
    calls = []
    for name in ("forward_begin", "backward_begin"):  # record the begin calls
        def record(h, m, real=getattr(zerod._lib.lib, f"zd_{name}"), name=name):
            calls.append((name, m))
            return real(h, m)
        monkeypatch.setattr(zerod._lib, f"zd_{name}", record)
    (x,), y = batch("tied", 0)
    loss = F.cross_entropy(engine(x).view(-1, len(CHARS)), y.view(-1))
    engine.backward(loss)
    monkeypatch.undo()
    zm = engine.zerod_model
    tied, mix = zm.find_module("embed+head"), zm.find_module("mix")
    assert [c for c in calls if c[0] == "forward_begin"] == [("forward_begin", m) for m in (tied, mix, mix, tied)]
    assert [c for c in calls if c[0] == "backward_begin"] == [("backward_begin", m) for m in (tied, mix)]
    engine.step()
    ref_loss = F.cross_entropy(ref(x).view(-1, len(CHARS)), y.view(-1))
    ref_loss.backward()
    for name, p in ref.named_parameters():
        torch.testing.assert_close(p.detach() - engine.state_dict()[name], p.grad, rtol=1e-5, atol=1e-6, msg=name)


class CheckpointedGPT(GPT):
    """Recomputes every block's forward inside the backward, by torch's
    default checkpoint or (reentrant=False) its non-reentrant one."""

    def __init__(self, cfg, reentrant=None):
        super().__init__(cfg)
        self.how = {} if reentrant is None else {"use_reentrant": reentrant}

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1)).unsqueeze(0)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = torch.utils.checkpoint.checkpoint(block, x, **self.how)
        logits = self.lm_head(self.transformer.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


@pytest.mark.parametrize("modules", [None, [Block]])
@pytest.mark.parametrize("stage", STAGES)
def test_activation_checkpointing(stage, modules):
    def make_model():
        torch.manual_seed(0)
        return CheckpointedGPT(GPTConfig(vocab_size=len(CHARS), block_size=16, n_layer=2, n_head=2, n_embd=16))
    model, ref = make_model(), make_model()
    engine = zerod.torch.initialize(model, job_text=sgd_job(stage), modules=modules)
    (x,), y = batch("gpt", 0)
    ref(x, y)[1].backward()
    engine.backward(engine(x, y)[1])
    engine.step()
    after = engine.state_dict()
    for name, p in ref.named_parameters():
        torch.testing.assert_close(p.detach() - after[name], p.grad, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("modules", [None, [Block]])
@pytest.mark.parametrize("stage", STAGES)
def test_non_reentrant_checkpointing_trains_as_without(stage, modules):
    # The non-reentrant checkpoint (bench/gpu's) keeps what the recomputation
    # saves, views of zerod's parameters among them, in its own hooks, and
    # torch 2 stops the recomputation inside the last module that saves
    # anything. Both once broke training: at stage 3 the views outlived the
    # module's residency (losses off by 1e-3), and a stopped module stayed in
    # forward (zd_backward_begin refused it).
    job = ('return {{ optimizer = {{ type = "adamw", lr = 3e-3 }}, gradient_clipping = 1.0, '
           'gradient_accumulation_steps = 2, zero = {{ {zero} }} }}').format(zero=STAGES[stage])

    def losses(model_class, **kwargs):
        torch.manual_seed(0)
        model = model_class(GPTConfig(vocab_size=len(CHARS), block_size=16, n_layer=2, n_head=2, n_embd=64), **kwargs)
        engine = zerod.torch.initialize(model, job_text=job, modules=modules)
        out = []
        for step in range(8):
            (x,), y = batch("gpt", step)
            loss = engine(x, y)[1]
            engine.backward(loss)
            engine.step()
            out.append(loss.item())
        return out
    plain = losses(GPT)
    assert plain[-1] < plain[0]
    assert losses(CheckpointedGPT, reentrant=False) == pytest.approx(plain, rel=1e-6)


def test_deepspeed_initialize_places_the_model_as_deepspeed_does(monkeypatch):
    """zerod.deepspeed.initialize moves a model that is all on the CPU to
    its rank's GPU (local_rank modulo the GPUs, made current) where torch
    sees one, as DeepSpeed's engine does; DS_ACCELERATOR=cpu keeps it, and
    an integration that placed it itself passes _placement=None. The GPUs
    are played by the test: the move is recorded, not made."""
    import zerod.deepspeed as zds

    moved, current = [], []

    class Model(torch.nn.Linear):
        def to(self, *args, **kwargs):
            moved.append(args[0])
            return self

    class Client:
        class info:
            local_rank = 3

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    zds._place_as_deepspeed(Model(2, 2), Client())
    assert moved == [torch.device("cuda", 1)] and current == moved
    moved.clear()
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    zds._place_as_deepspeed(Model(2, 2), Client())
    assert moved == []
    zds._place_on(Model(2, 2), torch.device("cpu"))
    assert moved == [], "an integration's CPU device keeps it there"


def test_deepspeed_parameter_groups_agree_on_every_key():
    """model_parameters' groups go to the optimizer the config's section
    makes (DeepSpeed hands them to it), where a key a group leaves out is the
    section's value, or its type's default: the union of the keys is
    compared. Megatron's usual groups (no weight decay on biases) are one set
    of hyperparameters only where the optimizer's weight_decay is 0."""
    import zerod.deepspeed as zds
    from zerod import _dsconfig

    def megatron_groups(model):
        named = list(model.named_parameters())
        return [{"params": [p for n, p in named if not n.endswith("bias")]},
                {"params": [p for n, p in named if n.endswith("bias")], "weight_decay": 0.0}]

    cfg = {"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}}}
    with pytest.raises(zerod.InvalidArgumentError, match=r"model_parameters: parameter group 1 has "
                       r"weight_decay=0\.0, group 0 leaves it to the optimizer's weight_decay=0\.01; zerod applies "
                       r"one set"):
        model = make("skip")
        zds.initialize(model=model, model_parameters=megatron_groups(model), config=cfg)
    del cfg["optimizer"]["params"]["weight_decay"]  # DeepSpeed's AdamW then decays by 0: the groups agree
    model = make("skip")
    zds.initialize(model=model, model_parameters=megatron_groups(model), config=cfg)[0].close()
    # Where the optimizer's value is not known, a key one group sets and
    # another leaves out is a difference, whichever group sets it.
    with pytest.raises(zerod.InvalidArgumentError, match="group 1 has weight_decay=0.0, group 0 leaves it to the "
                                                         "optimizer's default"):
        _dsconfig.check_param_groups([{"params": [1]}, {"params": [2], "weight_decay": 0.0}], "groups")
    with pytest.raises(zerod.InvalidArgumentError, match="group 2 leaves it to the optimizer's default, group 0 "
                                                         "has lr=0.1"):
        _dsconfig.check_param_groups([{"params": [1], "lr": 0.1}, {"params": [2], "lr": 0.1}, {"params": [3]}],
                                     "groups")
    # Values alike in another form (torch's betas tuple, the config's list) agree.
    assert _dsconfig.check_param_groups([{"params": [1], "betas": (0.9, 0.95)}, {"params": [2]}], "groups",
                                        {"betas": [0.9, 0.95]}) == {"betas": (0.9, 0.95)}

