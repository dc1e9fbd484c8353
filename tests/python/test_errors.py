"""The mistakes a Python user makes get an exception that says what to do."""
import pytest
import torch
import torch.nn as nn

import zerod
import zerod.torch

ADAMW = 'return { optimizer = { type = "adamw", lr = 1e-3 } }'


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


@pytest.fixture
def engine():
    e = zerod.torch.initialize(net(), job_text=ADAMW)
    yield e
    e.close()


def micro_batch(engine, backward=True):
    loss = engine(torch.randn(3, 4)).square().mean()
    if backward:
        engine.backward(loss)
    return loss


def test_backward_twice(engine):
    loss = micro_batch(engine, backward=False)
    engine.backward(loss)
    with pytest.raises(zerod.InvalidStateError, match=r"backward\(\) was already called for this micro-batch: "
                                                      r"call engine.step\(\) after each backward"):
        engine.backward(loss)
    engine.step()  # and the engine carries on
    micro_batch(engine)
    engine.step()


def test_step_without_backward(engine):
    with pytest.raises(zerod.InvalidStateError, match=r"step\(\) without backward\(\): each micro-batch is loss = "
                                                      r"engine\(batch\); engine.backward\(loss\); engine.step\(\)"):
        engine.step()
    micro_batch(engine, backward=False)
    with pytest.raises(zerod.InvalidStateError, match="its backward did not"):
        engine.step()


def test_forward_after_backward_without_step(engine):
    micro_batch(engine)
    with pytest.raises(zerod.InvalidStateError, match=r"call engine.step\(\) after every micro-batch's backward"):
        micro_batch(engine, backward=False)


def test_parameter_created_after_initialize(engine):
    engine.module.add_module("extra", nn.Linear(2, 2))
    with pytest.raises(zerod.InvalidStateError, match=r"parameter 'extra.weight' was created \(or unfrozen\) after "
                                                      r"zerod.torch.initialize\(\).*Build the whole model, then call"):
        micro_batch(engine)


def test_tensor_on_the_wrong_device(engine):
    with pytest.raises(zerod.InvalidArgumentError, match=r"input tensor 0 is on meta, but the model's parameters "
                                                         r"live on cpu.*batch.to\('cpu'\)"):
        engine(torch.empty(3, 4, device="meta"))
    micro_batch(engine)  # nothing was begun: the engine is fine


def test_integer_inputs_on_another_device_are_left_to_torch():
    # torch wants some integer tensors on the CPU whatever the model's device
    # (pack_padded_sequence's lengths): only floating-point inputs are checked.
    class WithLengths(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x, lengths):
            return self.fc(x[:, :lengths.shape[0]])
    engine = zerod.torch.initialize(WithLengths(), job_text=ADAMW)
    loss = engine(torch.randn(3, 4), torch.empty(4, dtype=torch.long, device="meta")).square().mean()
    engine.backward(loss)
    assert engine.step().applied


def test_no_sync_is_refused_saying_how_zerod_accumulates(engine):
    with pytest.raises(zerod.InvalidArgumentError, match=r"engine.no_sync\(\) is not supported by zerod.*"
                                                         r"gradient_accumulation_steps in the job script"):
        with engine.no_sync():
            pass


def test_model_on_the_wrong_device():
    with pytest.raises(zerod.InvalidArgumentError, match="the model is on meta; zerod trains models on the CPU or "
                                                         "on a CUDA GPU"):
        zerod.torch.initialize(net().to("meta"), job_text=ADAMW)
    split = net()
    split[0].to("meta")
    with pytest.raises(zerod.InvalidArgumentError, match=r"the model's parameters are on several devices "
                                                         r"\('0.weight' on meta, '.*' on cpu\); move the whole"):
        zerod.torch.initialize(split, job_text=ADAMW)


def test_a_gpu_that_is_not_there_is_named():
    # create_model(device="cuda") is what initialize() asks for a model on a
    # GPU: without one (or under a daemon) the reason is in the error.
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with zerod.connect("embedded:") as c:
        with pytest.raises(zerod.ConfigError, match=r'device = "cuda", but .*set device = "cpu"'):
            c.create_model(script_text=ADAMW, device="cuda")
        with pytest.raises(zerod.InvalidArgumentError, match=r'options.device is "tpu"'):
            c.create_model(script_text=ADAMW, device="tpu")


def test_job_script_with_a_typo(tmp_job):
    path = tmp_job("return {\n  optimizer = { type = 'adamw', lr = 1e-3 },\n  gradient_clipp1ng = 1.0,\n}\n")
    with pytest.raises(zerod.ConfigError, match=r"job.lua:3: unknown key 'gradient_clipp1ng' "
                                                r"\(did you mean 'gradient_clipping'\?\)"):
        zerod.torch.initialize(net(), job=path)


def test_a_bf16_model_in_an_fp32_job():
    with pytest.raises(zerod.InvalidArgumentError, match="parameter '0.weight' is bf16 but the job's precision is "
                                                         "\"fp32\": register it as f32 or set precision = \"bf16\""):
        zerod.torch.initialize(net(), job_text=ADAMW, dtype=torch.bfloat16)


def test_loss_backward_instead_of_engine_backward(engine):
    loss = micro_batch(engine, backward=False)
    # Raised inside autograd: torch 1.13 re-raises it as a RuntimeError with
    # the text, torch 2 as itself.
    with pytest.raises((RuntimeError, zerod.InvalidStateError),
                       match=r"call engine.backward\(loss\), not loss.backward\(\).*run the forward again"):
        loss.backward()
    # That backward freed part of the graph: engine.backward(loss) now fails
    # in torch before any gradient reaches zerod, so the engine stays usable.
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        engine.backward(loss)
    engine.state_dict()
    micro_batch(engine)
    assert engine.step().applied


def test_a_loss_of_several_elements_is_refused_and_the_engine_carries_on(engine):
    out = engine(torch.randn(3, 4))
    with pytest.raises(zerod.InvalidArgumentError, match=r"backward\(loss\): loss has 6 elements; it must be one "
                                                         r"\(this rank's mean loss, e.g. loss.mean\(\)\)"):
        engine.backward(out)
    engine.backward(out.square().mean())  # the forward is still there
    assert engine.step().applied


def test_a_model_moved_or_cast_after_initialize_is_refused(engine):
    before = engine.state_dict()
    engine.module.to(torch.float64)  # as model.cuda() or .half() would: torch drops zerod's gradient hooks
    with pytest.raises(zerod.InvalidStateError, match=r"parameter '0.weight' was moved or cast \(now torch.float64 "
                                                      r"on cpu\) after zerod.torch.initialize\(\).*registered it "
                                                      r"as torch.float32 on cpu.*before initialize\(\), e.g. "
                                                      r"zerod.torch.initialize\(model.cuda\(\)"):
        micro_batch(engine)
    # Casting back does not bring the hooks back: still refused, nothing trained.
    engine.module.float()
    with pytest.raises(zerod.InvalidStateError, match="was moved or cast"):
        micro_batch(engine)
    after = engine.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_freezing_a_parameter_after_initialize_is_refused(engine):
    engine.module[0].requires_grad_(False)
    with pytest.raises(zerod.InvalidStateError, match=r"parameter '0.weight' was frozen \(requires_grad=False\) "
                                                      r"after zerod.torch.initialize\(\).*freeze it before "
                                                      r"initialize\(\)"):
        micro_batch(engine)


def test_model_called_directly_with_gradients(engine):
    with pytest.raises(zerod.InvalidStateError, match=r"ran outside the engine with gradients enabled: call "
                                                      r"engine\(batch\), not the model"):
        engine.module(torch.randn(3, 4))
    with torch.no_grad():
        engine.module(torch.randn(3, 4))  # evaluation is fine


def test_an_exception_in_a_forward_leaves_the_engine_usable(engine):
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        engine(torch.randn(3, 5))
    micro_batch(engine)
    assert engine.step().applied


def test_state_dict_mid_micro_batch(engine):
    micro_batch(engine)
    with pytest.raises(zerod.InvalidStateError, match=r"state_dict\(\) in the middle of a micro-batch: call it after "
                                                      r"engine.step\(\)"):
        engine.state_dict()
