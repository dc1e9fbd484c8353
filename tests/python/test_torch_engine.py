"""zerod.torch.initialize: module selection, residency, gradients, evaluation,
state_dict, embedded at stages 0 and 3 (one rank; the daemon's ranks are in
test_parity.py)."""

import inspect
import warnings
from collections import OrderedDict

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

import zerod
import zerod.torch
from gpt import GPT, Block, GPTConfig
from models import CHARS, WithExtraState, batch, loss_of, make

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


def test_the_models_own_state_dict_and_load_state_dict_go_through_zerod(tmp_path, monkeypatch):
    """nanoGPT and Hugging Face save torch.save(model.state_dict()) and load
    with model.load_state_dict(): on the wrapped model these give and take
    zerod's values, as engine.state_dict() and engine.load_state_dict() do
    (they once gave empty tensors, the parameters' data between forwards)."""
    model, ref = tiny_gpt(), tiny_gpt()
    engine = zerod.torch.initialize(model, job_text=sgd_job("stage3"))
    (x,), y = batch("gpt", 0)
    engine.backward(engine(x, y)[1])
    engine.step()
    trained = engine.state_dict()
    sd = model.state_dict()
    assert list(sd) == list(trained)
    for k in trained:
        torch.testing.assert_close(sd[k], trained[k], rtol=0, atol=0, msg=k)
    nested = nn.ModuleDict({"gpt": model})  # the wrapped model inside another: keys with a prefix
    torch.testing.assert_close(nested.state_dict()["gpt.lm_head.weight"], trained["lm_head.weight"], rtol=0, atol=0)
    torch.save(sd, tmp_path / "model.pt")

    with torch.no_grad():
        for p in ref.parameters():
            p.mul_(0.5)
    assert model.load_state_dict(ref.state_dict()) == torch.nn.modules.module._IncompatibleKeys([], [])
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(engine.state_dict()[k], v, rtol=0, atol=0, msg=k)
    model.load_state_dict(torch.load(tmp_path / "model.pt"))
    for k, v in engine.state_dict().items():
        torch.testing.assert_close(v, trained[k], rtol=0, atol=0, msg=k)
    with pytest.raises(zerod.InvalidArgumentError, match=r"'lm_head.weight' has shape \(3, 4\)"):
        model.load_state_dict({**trained, "lm_head.weight": torch.zeros(3, 4)})
    if "assign" in inspect.signature(nn.Module.load_state_dict).parameters:  # torch >= 2.1
        with pytest.raises(zerod.InvalidArgumentError, match=r"assign=True"):
            model.load_state_dict(trained, assign=True)
    engine.backward(engine(x, y)[1])  # the engine trains on
    assert engine.step().applied

    # On several ranks the reads are collectives rank 0 alone cannot make.
    monkeypatch.setattr(engine, "world_size", 2)
    with pytest.raises(zerod.InvalidStateError, match=r"model.state_dict\(\) of a model zerod.torch.initialize\(\) "
                                                      r"wrapped, on 2 ranks.*call engine.state_dict\(\) on every rank"):
        model.state_dict()


def train_gpt(engine, steps):
    for s in steps:
        (x,), y = batch("gpt", s)
        engine.backward(loss_of("gpt", engine, (x,), y, torch.float32))
        engine.step()


def test_optimizer_state_dict_resumes_training_exactly():
    job = ('return { optimizer = { type = "adamw", lr = 1e-2 }, '
           'zero = { stage = 3, param_persistence_threshold = 0 } }')
    run = train_gpt

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


# 1-bit Adam keeps no per-tensor scalars: the dict carries all it needs,
# and a run resumed from it (on one rank, no error feedback to restart)
# ends as the uninterrupted one.
def test_optimizer_state_dict_resumes_onebit_adam_exactly():
    job = 'return { optimizer = { type = "onebit_adam", lr = 1e-2, freeze_step = 2 } }'
    a = zerod.torch.initialize(tiny_gpt(), job_text=job)
    train_gpt(a, range(4))
    sd, osd = a.state_dict(), a.optimizer_state_dict()
    train_gpt(a, range(4, 7))
    b = zerod.torch.initialize(tiny_gpt(), job_text=job)
    b.load_state_dict(sd)
    b.load_optimizer_state_dict(osd)
    train_gpt(b, range(4, 7))
    want, got = a.state_dict(), b.state_dict()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0, msg=k)


# 1-bit LAMB's frozen trust ratios (per-tensor scalars) are not in the
# dict; restored from it, a fresh engine would apply lr * 0 from then on.
# The load refuses, pointing to the checkpoints that carry them, and
# changes nothing.
def test_optimizer_state_dict_of_onebit_lamb_is_refused_where_it_would_not_resume():
    job = 'return { optimizer = { type = "onebit_lamb", lr = 1e-2, freeze_step = 3 } }'
    a = zerod.torch.initialize(tiny_gpt(), job_text=job)
    train_gpt(a, range(5))
    sd, osd = a.state_dict(), a.optimizer_state_dict()
    assert osd["step"] == 5
    b = zerod.torch.initialize(tiny_gpt(), job_text=job)
    b.load_state_dict(sd)
    with pytest.raises(zerod.ConfigError, match=r"load_optimizer_state_dict: zd_model_set_step: step 5: optimizer "
                                                r"'onebit_lamb' keeps per-tensor scalars.*that update 6 reads.*"
                                                r"save_checkpoint and load_checkpoint"):
        b.load_optimizer_state_dict(osd)
    left = b.optimizer_state_dict()
    assert left["step"] == 0
    assert all(not v.any() for slots in left["state"].values() for v in slots.values())


ADAMW_ONE_WINDOW = ('return { optimizer = { type = "adamw", lr = 1e-2 }, '
                    'zero = { stage = 3, param_persistence_threshold = 0 } }')


def _same_optimizer_state(a, b):
    assert a["step"] == b["step"] and list(a["state"]) == list(b["state"])
    for key, slots in a["state"].items():
        for name, value in slots.items():
            torch.testing.assert_close(b["state"][key][name], value, rtol=0, atol=0, msg=f"{key} {name}")


# A refused dict must leave the engine as it was. The load used to set the
# step (0 -> 3) and write every slot but the faulty last one before refusing
# it, and to take a dict of 2 of the parameters, leaving the others' moments
# at zero under step 3 (Adam's next updates several times too large there).
def test_a_refused_optimizer_state_dict_changes_nothing():
    a = zerod.torch.initialize(tiny_gpt(), job_text=ADAMW_ONE_WINDOW)
    train_gpt(a, range(3))
    osd = a.optimizer_state_dict()
    b = zerod.torch.initialize(tiny_gpt(), job_text=ADAMW_ONE_WINDOW)
    train_gpt(b, range(5, 6))
    before = b.optimizer_state_dict()

    state = OrderedDict(osd["state"])
    last = list(state)[-1]
    state[last] = {name: torch.zeros(99) for name in state[last]}
    with pytest.raises(zerod.InvalidArgumentError, match=rf"slot 'exp_avg': '{last}' has shape \(99,\)"):
        b.load_optimizer_state_dict(dict(osd, state=state))
    _same_optimizer_state(before, b.optimizer_state_dict())

    part = OrderedDict(list(osd["state"].items())[:2])
    with pytest.raises(zerod.InvalidArgumentError, match=r"the state of 2 of the \d+ parameters zerod holds; "
                                                         r"missing 'transformer.h.0.ln_1.weight'"):
        b.load_optimizer_state_dict(dict(osd, state=part))
    _same_optimizer_state(before, b.optimizer_state_dict())

    twice = OrderedDict(osd["state"], **{"lm_head.weight": osd["state"]["transformer.wte.weight"]})
    with pytest.raises(zerod.InvalidArgumentError, match=r"'transformer.wte.weight' and 'lm_head.weight' are one "
                                                         r"parameter \(tied\)"):
        b.load_optimizer_state_dict(dict(osd, state=twice))
    _same_optimizer_state(before, b.optimizer_state_dict())

    b.load_optimizer_state_dict(osd)  # the whole dict loads
    _same_optimizer_state(osd, b.optimizer_state_dict())


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


ADAMW = 'return {{ optimizer = {{ type = "adamw", lr = 1e-2 }}, zero = {{ {zero} }} }}'


def _train_beside_torch(engine, ref, steps=3):
    """AdamW steps of the engine and of `ref` under torch.optim.AdamW (the
    job's defaults: betas, eps, weight_decay 0.01) on the same batches;
    asserts the weights agree after them."""
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(2)
    for _ in range(steps):
        x, y = torch.randn(8, 4, generator=g), torch.randn(8, 4, generator=g)
        engine.backward(F.mse_loss(engine(x), y))
        engine.step()
        opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        opt.step()
    got = engine.state_dict()
    assert list(got) == list(ref.state_dict())
    for name, p in ref.named_parameters():
        assert got[name].shape == p.shape, name
        torch.testing.assert_close(got[name], p.detach(), rtol=1e-5, atol=1e-6, msg=name)


class ScaledByContainers(nn.Module):
    """Parameters in an nn.ParameterList, an nn.ParameterDict and a
    ParameterList inside an nn.ModuleDict: containers without a forward of
    their own, which the parent's forward reads."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 4)
        self.scales = nn.ParameterList([nn.Parameter(torch.rand(4) + 0.5) for _ in range(2)])
        self.shifts = nn.ParameterDict({"a": nn.Parameter(torch.randn(4))})
        self.extra = nn.ModuleDict({"gates": nn.ParameterList([nn.Parameter(torch.randn(4))])})

    def forward(self, x):
        h = self.lin(x)
        for s in self.scales:
            h = torch.tanh(h * s)
        return h * torch.sigmoid(self.extra["gates"][0]) + self.shifts["a"]


# They were zerod modules of their own, whose hooks never ran: the
# parameters stayed empty, an evaluation returned zeros and training failed
# on torch's "invalid gradient".
@pytest.mark.parametrize("stage", STAGES)
def test_parameters_of_containers_go_to_the_module_whose_forward_uses_them(stage):
    model, ref = ScaledByContainers(), ScaledByContainers()
    engine = zerod.torch.initialize(model, job_text=ADAMW.format(zero=STAGES[stage]))
    assert engine.zerod_modules == {"<root>": [model], "lin": [model.lin]}
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(engine(x), ref(x))
    _train_beside_torch(engine, ref)


def test_a_modules_match_without_a_forward_is_refused():
    with pytest.raises(zerod.InvalidArgumentError, match=r"modules=\['scales'\] matched no submodule of "
                                                         r"ScaledByContainers \(only 'scales', which has no "
                                                         r"forward of its own"):
        zerod.torch.initialize(ScaledByContainers(), job_text=sgd_job(), modules=["scales"])


class LowRank(nn.Module):
    """A LoRA-like adapter of rank 0: down.weight (0, 4) and up.weight
    (4, 0) have no elements; up.bias has."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.base = nn.Linear(4, 4)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch: "Initializing zero-element tensors is a no-op"
            self.down = nn.Linear(4, 0, bias=False)
            self.up = nn.Linear(0, 4)

    def forward(self, x):
        return self.base(x) + self.up(self.down(x))


# zerod's registry takes positive extents only: initialize() refused them.
# They stay in torch (nothing to partition or update) with no optimizer
# state, and the model trains as under torch.
@pytest.mark.parametrize("stage", STAGES)
def test_parameters_without_elements_stay_in_torch(stage, tmp_path):
    model, ref = LowRank(), LowRank()
    job = ADAMW.format(zero=STAGES[stage])
    engine = zerod.torch.initialize(model, job_text=job)
    assert engine.zerod_modules == {"base": [model.base], "up": [model.up]}
    assert engine.num_parameters == 4 * 4 + 4 + 4
    _train_beside_torch(engine, ref)
    osd = engine.optimizer_state_dict()
    assert list(osd["state"]) == ["base.weight", "base.bias", "up.bias"]
    engine.save_checkpoint(tmp_path)

    again = zerod.torch.initialize(LowRank(), job_text=job)
    again.load_state_dict(engine.state_dict())
    again.load_optimizer_state_dict(osd)
    _same_optimizer_state(osd, again.optimizer_state_dict())
    from_checkpoint = zerod.torch.initialize(LowRank(), job_text=job)
    from_checkpoint.load_checkpoint(tmp_path)
    for other in (again, from_checkpoint):
        got = other.state_dict()
        for k, v in engine.state_dict().items():
            assert got[k].shape == v.shape, k
            torch.testing.assert_close(got[k], v, rtol=0, atol=0, msg=k)


# Of tied keys with different values, zerod kept the first; torch copies
# every key in the model's order, so the last one wins there, whatever the
# dict's order.
def test_tied_keys_with_different_values_load_as_in_torch():
    sd = make("tied").state_dict()
    sd = OrderedDict([("head.weight", torch.ones_like(sd["head.weight"]))] +
                     [(k, torch.zeros_like(v) if k == "embed.weight" else v) for k, v in sd.items()
                      if k != "head.weight"])
    ref = make("tied")
    ref.load_state_dict(sd)
    assert ref.embed.weight.detach().eq(1).all()  # head comes after embed in the model
    model = make("tied")
    engine = zerod.torch.initialize(model, job_text=sgd_job())
    engine.load_state_dict(sd)
    torch.testing.assert_close(engine.state_dict()["embed.weight"], ref.embed.weight.detach(), rtol=0, atol=0)
    engine.load_state_dict(make("tied").state_dict())
    model.load_state_dict(sd)  # the model's own load, through zerod's hook
    torch.testing.assert_close(engine.state_dict()["embed.weight"], ref.embed.weight.detach(), rtol=0, atol=0)


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


def _save_matmuls(ctx, op, *args, **kwargs):
    """Selective checkpointing's policy: keep the matmuls' outputs, recompute
    the rest (what torch's docs show)."""
    keep = op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default)
    policy = torch.utils.checkpoint.CheckpointPolicy
    return policy.MUST_SAVE if keep else policy.PREFER_RECOMPUTE


def _save_everything(ctx, op, *args, **kwargs):
    """Keeps every op's output, views of the parameters (a Linear's
    weight.t()) among them."""
    return torch.utils.checkpoint.CheckpointPolicy.MUST_SAVE


@pytest.mark.parametrize("respect_hooks", [None, True])
@pytest.mark.parametrize("policy", [_save_matmuls, _save_everything])
@pytest.mark.parametrize("modules", [None, [Block]])
@pytest.mark.parametrize("stage", STAGES)
def test_selective_activation_checkpointing(stage, modules, policy, respect_hooks):
    # checkpoint(context_fn=...) counts every op its dispatch modes see, in
    # the forward and again in the recomputation, and wants the same counts:
    # zerod's own views of its memory (new in the forward, cached in the
    # recomputation) once made them differ ("aten.view.default invocation
    # index 21 ... not found in storage" at stage 3). With
    # respect_saved_tensors_hooks=True (a later torch's default) what it
    # caches goes through zerod's hooks, which once sent it on to the
    # checkpoint's own hook ("aten.layer_norm.default ... not found").
    checkpoint = torch.utils.checkpoint
    if not hasattr(checkpoint, "create_selective_checkpoint_contexts"):
        pytest.skip(f"torch {torch.__version__} has no selective activation checkpointing (torch >= 2.4)")
    how = {"context_fn": lambda: checkpoint.create_selective_checkpoint_contexts(policy)}
    if respect_hooks is not None:
        if "respect_saved_tensors_hooks" not in inspect.signature(checkpoint.checkpoint).parameters:
            pytest.skip(f"torch {torch.__version__}'s checkpoint has no respect_saved_tensors_hooks")
        how["respect_saved_tensors_hooks"] = respect_hooks

    def make_model():
        torch.manual_seed(0)
        return CheckpointedGPT(GPTConfig(vocab_size=len(CHARS), block_size=16, n_layer=2, n_head=2, n_embd=16),
                               reentrant=False)
    model, ref = make_model(), make_model()
    model.how.update(how)
    engine = zerod.torch.initialize(model, job_text=sgd_job(stage), modules=modules)
    for step in range(2):
        (x,), y = batch("gpt", step)
        ref.zero_grad()
        ref(x, y)[1].backward()
        with torch.no_grad():
            for p in ref.parameters():
                p -= p.grad
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch: zerod's hooks stand around the region
            engine.backward(engine(x, y)[1])
        engine.step()
    after = engine.state_dict()
    for name, p in ref.named_parameters():
        torch.testing.assert_close(after[name], p.detach(), rtol=1e-5, atol=1e-6, msg=name)


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


def _peak_modules_in_backward(monkeypatch):
    """Records zd_backward_begin/_end until monkeypatch.undo(); returns a
    list whose one element is the most zerod modules in backward at once."""
    now, peak = set(), [0]

    def begin(h, m, real=zerod._lib.lib.zd_backward_begin):
        now.add(m)
        peak[0] = max(peak[0], len(now))
        return real(h, m)

    def end(h, m, real=zerod._lib.lib.zd_backward_end):
        now.discard(m)
        return real(h, m)
    monkeypatch.setattr(zerod._lib, "zd_backward_begin", begin)
    monkeypatch.setattr(zerod._lib, "zd_backward_end", end)
    return peak


def test_reentrant_checkpointing_ends_each_module_as_without(monkeypatch):
    # torch's reentrant checkpoint (Hugging Face's gradient_checkpointing_enable)
    # runs the first forward under no_grad, so nothing counted the modules'
    # parameters, and each recomputed module stayed in backward until
    # engine.backward() ended (at stage 3, resident: 8 of 9 modules here).
    def run(model_class, **kwargs):
        torch.manual_seed(0)
        model = model_class(GPTConfig(vocab_size=len(CHARS), block_size=16, n_layer=6, n_head=2, n_embd=16), **kwargs)
        engine = zerod.torch.initialize(model, job_text=sgd_job("stage3"), modules=[Block])
        peaks, losses = [], []
        for step in range(3):
            (x,), y = batch("gpt", step)
            peak = _peak_modules_in_backward(monkeypatch)
            loss = engine(x, y)[1]
            engine.backward(loss)
            monkeypatch.undo()
            engine.step()
            peaks.append(peak[0])
            losses.append(loss.item())
        return peaks, losses
    plain_peaks, plain_losses = run(GPT)
    peaks, losses = run(CheckpointedGPT, reentrant=True)
    assert peaks == plain_peaks
    assert losses == pytest.approx(plain_losses, rel=1e-6)


# Recomputation as forward pairs (zerod.torch's Engine._begin_recomputed)
# needs a torch that shows zerod the saved-tensor hooks on top (torch 2.15
# does); on torch 1.13 each recomputed module stays resident until its
# backward.
needs_recompute_in_pairs = pytest.mark.skipif(
    not zerod.torch._RECOMPUTE_IN_PAIRS,
    reason=f"torch {torch.__version__} has no torch._C._autograd._top_saved_tensors_default_hooks or no "
           "always_call forward hooks: zerod.torch recomputes as on torch 1.13 (a recomputed module begins its "
           "backward and stays resident until then; a checkpoint inside a zerod module's forward fails)")
# Stage 3 with nothing gathered ahead: the device tier's peak of parameter
# bytes is what the begin calls kept resident at once.
ADAMW_STAGE3 = ('return { optimizer = { type = "adamw", lr = 3e-3 }, gradient_clipping = 1.0, '
                'gradient_accumulation_steps = 2, zero = { stage = 3, param_persistence_threshold = 0, '
                'prefetch_bucket_size = 0 } }')


class CheckpointInsideBlock(Block):
    """A block that checkpoints its attention and its MLP inside its own
    forward: with modules=[Block], inside a zerod module."""

    reentrant = False

    def forward(self, x):
        how = {"use_reentrant": self.reentrant}
        x = x + torch.utils.checkpoint.checkpoint(lambda a: self.attn(self.ln_1(a)), x, **how)
        return x + torch.utils.checkpoint.checkpoint(lambda a: self.mlp(self.ln_2(a)), x, **how)


def _gpt(model_class=GPT, inside=None, **kwargs):
    """The same small GPT every time; inside=True/False makes its blocks
    checkpoint inside their forward (reentrant or not)."""
    torch.manual_seed(0)
    model = model_class(GPTConfig(vocab_size=len(CHARS), block_size=16, n_layer=2, n_head=2, n_embd=32), **kwargs)
    if inside is not None:
        for block in model.transformer.h:
            block.__class__ = CheckpointInsideBlock
            block.reentrant = inside
    return model


def _train_stage3(model, modules, steps=4, begins=None):
    """Trains `model` at stage 3 (ADAMW_STAGE3); returns its final weights
    and the device tier's peak of parameter bytes. With `begins` (a list
    _record_begins fills), one (forward's, backward's) pair of lists of
    begin calls per micro-batch."""
    engine = zerod.torch.initialize(model, job_text=ADAMW_STAGE3, modules=modules)
    runs = []
    for step in range(steps):
        (x,), y = batch("gpt", step)
        at = len(begins) if begins is not None else 0
        loss = engine(x, y)[1]
        mid = len(begins) if begins is not None else 0
        engine.backward(loss)
        if begins is not None:
            runs.append((begins[at:mid], begins[mid:]))
        engine.step()
    return engine.state_dict(), engine.memory(zerod.MemKind.PARAMS)["device"].peak, runs


def _record_begins(monkeypatch):
    """Records zd_forward_begin and zd_backward_begin as ("forward" or
    "backward", module) until monkeypatch.undo()."""
    calls = []
    for kind in ("forward", "backward"):
        def record(h, m, real=getattr(zerod._lib.lib, f"zd_{kind}_begin"), kind=kind):
            calls.append((kind, m))
            return real(h, m)
        monkeypatch.setattr(zerod._lib, f"zd_{kind}_begin", record)
    return calls


def _assert_same_weights(got, want):
    assert list(got) == list(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k


@needs_recompute_in_pairs
@pytest.mark.parametrize("modules", [None, [Block]], ids=["leaf_modules", "block_modules"])
@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_checkpointing_keeps_no_more_parameters_resident_than_without(reentrant, modules):
    # torch's checkpoint kept what the recomputation saved, raw views of
    # zerod's parameters among it, so each recomputed module stayed begun
    # until its backward: with the default leaf modules the whole block
    # being recomputed was resident at once (a peak of 166272 bytes of
    # parameters in the device tier here, 132352 without checkpointing).
    # Now the recomputation is a forward pair whose saved views are where
    # they sit.
    plain_weights, plain_peak, _ = _train_stage3(_gpt(), modules)
    weights, peak, _ = _train_stage3(_gpt(CheckpointedGPT, reentrant=reentrant), modules)
    assert peak == plain_peak
    _assert_same_weights(weights, plain_weights)


@pytest.mark.parametrize("modules", [None, [Block]], ids=["leaf_modules", "block_modules"])
@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_checkpointing_begins_the_same_modules_in_every_micro_batch(reentrant, modules, monkeypatch):
    # Stage 3 gathers ahead along the first micro-batch's begin calls and
    # stops for the rest of a micro-batch that leaves them: a recomputation
    # must begin modules alike from the first micro-batch on. A block
    # checkpointed whole (modules=[Block]) begins its backward at its
    # recomputation, as it always has: one gather, no forward pair in the
    # backward.
    begins = _record_begins(monkeypatch)
    _, _, runs = _train_stage3(_gpt(CheckpointedGPT, reentrant=reentrant), modules, begins=begins)
    monkeypatch.undo()
    assert all(run == runs[0] for run in runs[1:])
    recomputed_pairs = [c for c in runs[0][1] if c[0] == "forward"]
    if modules is not None:
        assert recomputed_pairs == []
    elif zerod.torch._RECOMPUTE_IN_PAIRS:
        assert len(recomputed_pairs) == 2 * 5  # each block's modules but the last, which begins its backward


@needs_recompute_in_pairs
@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_a_checkpoint_inside_a_zerod_modules_forward_trains_as_without(reentrant):
    # modules=[Block] with Block.forward calling checkpoint(self.mlp, ...):
    # the recomputation runs inside the block, where no hook of zerod's
    # begins anything, and failed on the block's empty parameters
    # ("Expected weight to be of same shape ..., but got weight of shape
    # [0]"). The block now begins its backward when the checkpoint unpacks
    # the inputs it saved inside the block.
    plain_weights, _, _ = _train_stage3(_gpt(), [Block])
    weights, _, _ = _train_stage3(_gpt(inside=reentrant), [Block])
    _assert_same_weights(weights, plain_weights)


@needs_recompute_in_pairs
@pytest.mark.parametrize("modules", [None, [Block]], ids=["leaf_modules", "block_modules"])
@pytest.mark.parametrize("case", ["nested_non_reentrant", "non_reentrant_in_reentrant", "early_stop_off"])
def test_nested_checkpoints_and_a_full_recomputation_train_as_without(case, modules):
    # Nested: blocks checkpointed whole whose forward checkpoints again
    # (torch recomputes the outer region, then the inner one). Early stop
    # off: the recomputation runs every module to its end instead of
    # stopping inside the last one that saves. Under a reentrant outer
    # checkpoint the MLP's last module begins its backward at the outer
    # recomputation and stays resident while the inner checkpoint
    # recomputes the MLP before its backward: one module more than without
    # checkpointing (a whole block more on torch 1.13).
    plain_weights, plain_peak, _ = _train_stage3(_gpt(), modules)
    if case == "early_stop_off":
        with torch.utils.checkpoint.set_checkpoint_early_stop(False):
            weights, peak, _ = _train_stage3(_gpt(CheckpointedGPT, reentrant=False), modules)
    else:
        weights, peak, _ = _train_stage3(_gpt(CheckpointedGPT, reentrant=case != "nested_non_reentrant",
                                              inside=False), modules)
    _assert_same_weights(weights, plain_weights)
    if case != "non_reentrant_in_reentrant":
        assert peak == plain_peak


@needs_recompute_in_pairs
@pytest.mark.parametrize("where", ["forward", "recomputation"])
def test_an_interrupt_inside_a_checkpoint_leaves_no_saved_tensor_hooks_behind(where):
    # Inside a checkpointed region zerod puts a pair of saved-tensor hooks
    # over the checkpoint's, popped by the module's forward hook. torch does
    # not run that hook for a KeyboardInterrupt: forward() and backward()
    # pop what it leaves, else zerod's own pair stayed on the stack for
    # whatever torch ran next in the process.
    def top():
        return torch._C._autograd._top_saved_tensors_default_hooks(False)
    model = _gpt(CheckpointedGPT, reentrant=False)
    engine = zerod.torch.initialize(model, job_text=ADAMW_STAGE3)
    (x,), y = batch("gpt", 0)
    engine.backward(engine(x, y)[1])
    engine.step()
    assert top() is None
    fire = []

    def interrupt(module, inputs):
        if fire:
            fire.pop()
            raise KeyboardInterrupt
    model.transformer.h[0].mlp.c_fc.register_forward_pre_hook(interrupt)  # after zerod's
    if where == "forward":
        fire.append(True)
        with pytest.raises(KeyboardInterrupt):
            engine(x, y)
        assert top() is None
        engine.backward(engine(x, y)[1])  # still usable
        engine.step()
    else:
        loss = engine(x, y)[1]
        fire.append(True)
        with pytest.raises(KeyboardInterrupt):
            engine.backward(loss)
    assert top() is None


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


def test_deepspeed_parameter_groups_set_the_optimizers_hyperparameters():
    """DeepSpeed hands model_parameters' groups to the optimizer the config's
    section makes: what they set overrides the section's. Every group at
    weight_decay 0.0 under a config's 0.01 trains as a config of 0.0 does,
    bit for bit; one group's lr is the lr of every update (and the
    schedule's base). A key the optimizer type does not take is refused."""
    import zerod.deepspeed as zds

    def run(cfg, groups=None):
        model = _mlp()
        engine, opt, _, _ = zds.initialize(model=model, config=cfg, model_parameters=groups(model) if groups else
                                           model.parameters())
        try:
            return opt.param_groups[0]["weight_decay"], _mlp_losses(engine, _mlp_batches()), engine.state_dict()
        finally:
            engine.close()

    def adamw(**params):
        return {"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": dict(lr=1e-2, **params)}}

    def no_decay(model):
        named = list(model.named_parameters())
        return [{"params": [p for n, p in named if not n.endswith("bias")], "weight_decay": 0.0},
                {"params": [p for n, p in named if n.endswith("bias")], "weight_decay": 0.0}]
    decay, losses, weights = run(adamw(weight_decay=0.01), no_decay)
    want_decay, want_losses, want_weights = run(adamw(weight_decay=0.0))
    assert decay == want_decay == 0.0
    assert losses == want_losses
    for k in want_weights:
        assert torch.equal(weights[k], want_weights[k]), k

    cfg = dict(adamw(), scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 2, "warmup_type": "linear"}})
    model = _mlp()
    engine = zds.initialize(model=model, model_parameters=[{"params": list(model.parameters()), "lr": 1e-5}],
                            config=cfg)[0]
    try:
        applied = []
        for x, y in _mlp_batches():
            engine.backward(F.mse_loss(engine(x), y))
            applied.append(engine.step().lr)
        assert applied == pytest.approx([0.0, 0.0, 5e-6, 1e-5], rel=1e-12, abs=0)  # WarmupLR up to the group's
        assert engine.get_lr() == pytest.approx([1e-5], rel=1e-12)
    finally:
        engine.close()

    model = _mlp()
    with pytest.raises(zerod.InvalidArgumentError, match=r"model_parameters: the parameter groups set momentum=0\.9, "
                                                         r"which the AdamW optimizer does not take"):
        zds.initialize(model=model, model_parameters=[{"params": list(model.parameters()), "momentum": 0.9}],
                       config=adamw())
    model(torch.ones(1, 4))  # refused before the engine took the parameters


def test_deepspeed_groups_under_torch_adam_leave_weight_decay_to_torchs_default():
    """With "torch_adam" DeepSpeed builds torch.optim.AdamW, whose weight decay
    defaults to 0.01 (torch.optim.Adam's, for Adam with adam_w_mode false,
    to 0): a group that leaves weight_decay out has that, so groups that
    say 0.01 agree with it, and groups of 0 do not."""
    import zerod.deepspeed as zds
    from zerod import _dsconfig

    def cfg(kind="AdamW", **params):
        return {"train_batch_size": 8, "optimizer": {"type": kind, "params": {"lr": 1e-3, "torch_adam": True,
                                                                              **params}}}

    def groups(model, decay):
        named = list(model.named_parameters())
        return [{"params": [p for n, p in named if not n.endswith("bias")]},
                {"params": [p for n, p in named if n.endswith("bias")], "weight_decay": decay}]
    assert _dsconfig.optimizer_defaults(cfg())["weight_decay"] == 0.01
    assert _dsconfig.optimizer_defaults(cfg("Adam"))["weight_decay"] == 0.01  # adam_w_mode defaults to true
    assert _dsconfig.optimizer_defaults(cfg("Adam", adam_w_mode=False))["weight_decay"] == 0.0
    assert _dsconfig.optimizer_defaults(cfg(torch_adam=False))["weight_decay"] == 0.0  # DeepSpeed's own kernels
    model = _mlp()
    engine, opt, _, _ = zds.initialize(model=model, model_parameters=groups(model, 0.01), config=cfg())
    assert opt.param_groups[0]["weight_decay"] == 0.01
    engine.close()
    with pytest.raises(zerod.InvalidArgumentError, match=r"group 1 has weight_decay=0\.0, group 0 leaves it to the "
                                                         r"optimizer's weight_decay=0\.01"):
        zds.initialize(model=model, model_parameters=groups(model, 0.0), config=cfg())


@pytest.mark.parametrize("key,sched", [
    ("warmup_type", {"type": "WarmupLR", "params": {"warmup_num_steps": 10, "warmup_type": "auto"}}),
    ("cos_min_ratio", {"type": "WarmupCosineLR", "params": {"total_num_steps": 100, "warmup_num_steps": 10,
                                                            "cos_min_ratio": "auto"}}),
    ("cycle_max_lr", {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": "auto",
                                                     "cycle_momentum": False}}),
])
def test_deepspeed_an_auto_nothing_answers_is_refused_naming_it(key, sched):
    """An "auto" no trainer value fills (zerod.deepspeed has none for a
    scheduler's shape) is refused naming the key, before the engine takes
    the model's parameters: the model still runs and initializes again."""
    import zerod.deepspeed as zds

    cfg = {"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "scheduler": sched}
    model = _mlp()
    x = torch.ones(2, 4)
    want = model(x)
    with pytest.raises(zerod.InvalidArgumentError, match=r'"auto" cannot be resolved for scheduler\.params\.' + key):
        zds.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    assert torch.equal(model(x), want)
    del cfg["scheduler"]
    zds.initialize(model=model, model_parameters=model.parameters(), config=cfg)[0].close()


def test_deepspeed_initialize_failing_after_the_engine_gives_the_model_back():
    """A failure once the engine holds the parameters (here the training_data
    DeepSpeed's DataLoader cannot take: an IterableDataset without a length)
    closes the engine and gives the parameters their tensors back: the model
    runs as before, and initializes again."""
    import zerod.deepspeed as zds

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(torch.zeros(4, 4))

    cfg = {"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    model = _mlp()
    x = torch.ones(2, 4)
    want = model(x)
    with pytest.raises(TypeError):
        zds.initialize(model=model, model_parameters=model.parameters(), config=cfg, training_data=Stream())
    assert torch.equal(model(x), want)
    engine = zds.initialize(model=model, model_parameters=model.parameters(), config=cfg)[0]
    try:
        assert torch.equal(engine(x), want)
    finally:
        engine.close()



def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def _mlp_batches(n=4):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)) for _ in range(n)]


def _mlp_losses(engine, batches, between=None):
    out = []
    for x, y in batches:
        loss = F.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        out.append(loss.item())
        if between is not None:
            between(x, y)
    return out


def test_set_lr_replaces_the_jobs_lr_and_checkpoints_keep_it(tmp_path):
    """engine.set_lr (zd_model_set_lr): the loop's own lr in place of the
    job's from the next update on, as the step result says; save_checkpoint
    keeps it, and load_checkpoint into a fresh engine restores it, so the
    resumed run ends as the unbroken one."""
    job = 'return { optimizer = { type = "sgd", lr = 0.1 }, zero = { stage = 3, param_persistence_threshold = 0 } }'
    batches = _mlp_batches(6)
    engine = zerod.torch.initialize(_mlp(), job_text=job)
    _mlp_losses(engine, batches[:2])
    assert engine.last_step.lr == 0.1
    engine.set_lr(0.05)
    _mlp_losses(engine, batches[2:3])
    assert engine.last_step.lr == 0.05
    engine.save_checkpoint(str(tmp_path))
    unbroken = _mlp_losses(engine, batches[3:])
    engine.close()
    engine = zerod.torch.initialize(_mlp(), job_text=job)
    engine.load_checkpoint(str(tmp_path))
    assert engine._trainer_lr == 0.05
    assert _mlp_losses(engine, batches[3:]) == unbroken and engine.last_step.lr == 0.05
    with pytest.raises(zerod.InvalidArgumentError, match="the learning rate is -1; it must be finite and >= 0"):
        engine.set_lr(-1)
    engine.close()


@pytest.mark.parametrize("stage", STAGES)
def test_an_evaluation_under_inference_mode_leaves_training_as_it_was(stage):
    """zerod caches a tensor over each parameter's view by address: one
    made under torch.inference_mode() would be an inference tensor, which
    autograd refuses to save, and every later training step would fail.
    They are made outside it: training after such an evaluation is
    training without it."""
    batches = _mlp_batches()
    plain = _mlp_losses(zerod.torch.initialize(_mlp(), job_text=sgd_job(stage)), batches)
    engine = zerod.torch.initialize(_mlp(), job_text=sgd_job(stage))
    with torch.inference_mode():
        first = engine(batches[0][0])  # before any training: the views are made here
    assert first.is_inference()

    def evaluate(x, y):
        with torch.inference_mode():
            engine(x)
    assert _mlp_losses(engine, batches, evaluate) == plain


@pytest.mark.parametrize("stage", STAGES)
def test_state_dict_and_checkpoints_between_steps_after_an_evaluation_with_gradients(stage, tmp_path):
    """An evaluation forward with gradients enabled (no torch.no_grad())
    between steps leaves a forward without its backward: state_dict(),
    save_checkpoint() and the rest drop it (nothing of it is in zerod), and
    training goes on as without it; a backward of the dropped forward's
    graph is refused, naming what dropped it."""
    batches = _mlp_batches()
    plain = _mlp_losses(zerod.torch.initialize(_mlp(), job_text=sgd_job(stage)), batches)
    engine = zerod.torch.initialize(_mlp(), job_text=sgd_job(stage))

    def evaluate(x, y):
        engine.eval()
        F.mse_loss(engine(x), y)  # gradients enabled
        engine.train()
        engine.state_dict()
        engine.save_checkpoint(str(tmp_path / "ck"))
    assert _mlp_losses(engine, batches, evaluate) == plain
    x, y = batches[0]
    loss = F.mse_loss(engine(x), y)
    engine.state_dict()
    with pytest.raises(zerod.InvalidStateError, match=r"the forward that ran before state_dict\(\) was dropped"):
        engine.backward(loss)


def test_state_dict_keeps_extra_state_and_load_state_dict_answers_as_torch(tmp_path):
    """A module's extra state (get_extra_state(), any object) goes through
    state_dict(), save_checkpoint() and load_checkpoint() as in torch, and
    load_state_dict(strict=False) returns torch's missing and unexpected
    keys."""
    model = nn.Sequential(nn.Linear(4, 8), WithExtraState(8, 1))
    engine = zerod.torch.initialize(model, job_text=sgd_job("stage3"))
    sd = engine.state_dict()
    assert sd["1._extra_state"] == {"version": 1}
    assert list(sd) == list(nn.Sequential(nn.Linear(4, 8), WithExtraState(8, 1)).state_dict())
    engine.save_checkpoint(str(tmp_path / "ck"))
    model[1].version = 5
    engine.load_checkpoint(str(tmp_path / "ck"))
    assert model[1].version == 1
    got = engine.load_state_dict({**{k: v for k, v in sd.items() if k != "1.bias"}, "1._extra_state": {"version": 3},
                                  "extra.weight": torch.zeros(1)}, strict=False)
    assert got == torch.nn.modules.module._IncompatibleKeys(["1.bias"], ["extra.weight"])
    assert got.missing_keys == ["1.bias"] and model[1].version == 3
    assert engine.load_state_dict(sd) == torch.nn.modules.module._IncompatibleKeys([], [])
    with pytest.raises(zerod.InvalidArgumentError, match="missing keys"):
        engine.load_state_dict({k: v for k, v in sd.items() if k != "1.bias"})


def test_dtype_converts_parameters_and_keeps_buffers():
    """initialize(dtype=...) and a bf16 DeepSpeed config cast the floating
    parameters only, as DeepSpeed 0.19 does: an fp32 buffer (a rotary
    embedding's inv_freq) stays fp32, an integer one stays integer."""
    import zerod.deepspeed as zds

    class WithBuffers(nn.Linear):
        def __init__(self):
            super().__init__(4, 4)
            self.register_buffer("inv_freq", torch.arange(4.0) / 3)
            self.register_buffer("count", torch.tensor(7))

        def forward(self, x):
            return super().forward(x * self.inv_freq.to(x.dtype))

    for make_engine in (lambda m: zerod.torch.initialize(m, job_text='return { precision = "bf16" }',
                                                         dtype=torch.bfloat16),
                        lambda m: zds.initialize(model=m, config={"train_batch_size": 2, "bf16": {"enabled": True},
                                                                  "optimizer": {"type": "SGD",
                                                                                "params": {"lr": 0.1}}})[0]):
        model = WithBuffers()
        engine = make_engine(model)
        assert model.weight.dtype == model.bias.dtype == torch.bfloat16
        assert model.inv_freq.dtype == torch.float32 and model.count.dtype == torch.int64
        torch.testing.assert_close(model.inv_freq, torch.arange(4.0) / 3, rtol=0, atol=0)
        loss = engine(torch.ones(2, 4, dtype=torch.bfloat16)).float().sum()
        engine.backward(loss)
        engine.step()
        engine.close()


def test_deepspeed_initialize_trains_the_parameters_the_optimizer_holds():
    """A torch optimizer given without model_parameters (Accelerate's and
    Lightning's way) that leaves out parameters requiring grad is refused,
    naming them: torch and DeepSpeed would leave them as they are, and zerod
    trains every parameter with requires_grad. Frozen, they stay as they
    are; and model_parameters=model.parameters() with part of the model
    frozen is accepted, as DeepSpeed accepts it."""
    import zerod.deepspeed as zds

    cfg = {"train_batch_size": 8}
    model = _mlp()
    with pytest.raises(zerod.InvalidArgumentError, match=r"the optimizer leaves out 2 parameter\(s\) that require "
                                                         r"grad \('0.weight', '0.bias'\).*requires_grad_\(False\)"):
        zds.initialize(model=model, optimizer=torch.optim.SGD(model[2].parameters(), lr=0.1), config=cfg)
    model = _mlp()
    model[0].requires_grad_(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    engine = zds.initialize(model=model, optimizer=torch.optim.SGD(model[2].parameters(), lr=0.1), config=cfg)[0]
    _mlp_losses(engine, _mlp_batches(2))
    after = engine.state_dict()
    assert torch.equal(after["0.weight"], before["0.weight"]) and not torch.equal(after["2.weight"],
                                                                                   before["2.weight"])
    engine.close()
    # DeepSpeed's usual call with a frozen backbone: its optimizer leaves the
    # frozen parameters out, so does zerod.
    cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-3}}
    model = _mlp()
    model[0].requires_grad_(False)
    engine = zds.initialize(model=model, model_parameters=model.parameters(), config=cfg)[0]
    assert [s.name for s in engine._slots] == ["2.weight", "2.bias"]
    engine.close()
    model = _mlp()
    model[0].requires_grad_(False)
    zds.initialize(model=model, model_parameters=[{"params": list(model.parameters())}], config=cfg)[0].close()
    with pytest.raises(zerod.InvalidArgumentError, match="model_parameters leaves out '2.weight'"):
        zds.initialize(model=model, model_parameters=list(model[0].parameters()), config=cfg)


BROADCAST_RANK = r'''
import sys
import torch
import torch.nn as nn
import zerod, zerod.torch

zerod.torch._BROADCAST_CHUNK = int(sys.argv[1])  # small: tensors split over several chunks
r = zerod.rank()
torch.manual_seed(100 + r)  # the ranks built the model without a common seed
model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
model[0].requires_grad_(False)
model[1].num_batches_tracked.fill_(5 + r)
model.register_buffer("mask", torch.rand(7) > 0.5)
model.register_buffer("odd", torch.randn(3, 5).to(torch.bfloat16))
model.register_buffer("bits", torch.tensor([1, 2, 0x7f800001, -0x7fffffff], dtype=torch.int32))  # a NaN's bits


def bytes_of(t):
    t = t.detach().to(torch.uint8) if t.dtype == torch.bool else t.detach()
    return f"{t.dtype} {t.contiguous().view(-1).view(torch.uint8).tolist()}"


own = {k: bytes_of(v) for k, v in model.state_dict().items()}
engine = zerod.torch.initialize(model, job_text='return { optimizer = { type = "sgd", lr = 0.1 }, zero = { stage = 0 } }')
for k, v in engine.state_dict().items():
    print("tensor", k, bytes_of(v), flush=True)
    print("own", k, own[k], flush=True)
x = torch.randn(4, 4)
loss = engine(x).pow(2).mean()
engine.backward(loss)
engine.step()
'''


@pytest.mark.parametrize("chunk", [1 << 28, 6])
def test_frozen_parameters_and_buffers_are_rank_0s(chunk, tmp_path, tmp_job):
    """Frozen parameters and buffers stay in torch: rank 0's values go to
    every rank at initialize (as DDP sends them), bit for bit whatever their
    type, as zerod's own parameters do; ranks that built the model without a
    common seed then train one model."""
    from conftest import zerod_run

    script = tmp_path / "rank.py"
    script.write_text(BROADCAST_RANK)
    rc, ranks, out = zerod_run(2, tmp_job("return { zero = { stage = 0 } }"), str(script), chunk)
    assert rc == 0, out[-4000:]
    got = [[line for line in ranks[r] if line.startswith("tensor ")] for r in (0, 1)]
    own = [[line for line in ranks[r] if line.startswith("own ")] for r in (0, 1)]
    assert len(got[0]) == 12 and got[0] == got[1]
    assert [line[len("tensor "):] for line in got[0]] == [line[len("own "):] for line in own[0]]
    assert own[0] != own[1], "the ranks' models differ before initialize"
