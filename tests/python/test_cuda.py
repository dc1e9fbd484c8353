"""zerod.torch on a GPU: parameters are views of zerod's HBM (DLPack,
kDLCUDA), gradients land in zerod's device buffers on torch's current
stream, and the optimizer runs where the job puts its state.

The reference is torch.optim.AdamW on the same GPU, on the same model, data
and initial values, as a GPU user of torch gets it (the multi-tensor
implementation, and the norm likewise). Two checks, after 20 steps:
  - the loss curve: every step's loss within 1e-5 relative in fp32, 2e-3
    in bf16 (bf16 compute, fp32 master and AdamW, as zerod does); an H100
    measured 7.8e-8 and 9.1e-5 (torch's two implementations: 7.8e-8 and
    6.3e-5);
  - the parameters, in the worst tensor's norm (||a-b|| / ||b||): zerod no
    farther from torch's default than twice the distance of torch's own
    single-tensor AdamW (foreach=False) from it, in the same run.
Why not element by element: Adam is ill-conditioned there. Where a
gradient is near zero the sign of m/sqrt(v) follows rounding, and a GPU's
backward is not bit-reproducible, so torch's two implementations end
9.8e-3 apart element-wise in fp32 (0.16 in norm in bf16), and zerod's
distance to torch moved from 1.5e-5 to 4.5e-3 between two H100 runs of
the same code. The same figures in all four modes (zerod's tiers agree with
each other bit for bit) are printed for the record.
Modes: stage 0 with everything in HBM; stage 3 in HBM; stage 3 with the
optimizer on the host; stage 3 with parameters and optimizer on NVMe.

ctest runs this through gpu_or_skip.py, which reports the suite SKIPPED,
with the reason, where torch sees no GPU or libzerod has no cuda device; a
plain pytest run skips it with the same reason.
"""
import pytest
import torch

import zerod.torch
from gpu_or_skip import skip_module_without_gpu
from models import BETAS, CLIP, EPS, LR, WEIGHT_DECAY, batch, loss_of, make, torch_reference

skip_module_without_gpu()

STEPS = 20
MODES = ["stage0", "stage3", "stage3+host", "stage3+nvme"]


def job(precision, mode, nvme_dir):
    stage = 0 if mode == "stage0" else 3
    zero = f"stage = {stage}" + (", param_persistence_threshold = 0" if stage == 3 else "")
    offload = ""
    if mode.endswith("+host"):
        offload = 'offload = { optimizer = "host" },'
    elif mode.endswith("+nvme"):
        offload = f'offload = {{ params = "nvme", optimizer = "nvme", nvme_path = "{nvme_dir}" }},'
    return f"""return {{
  precision = "{precision}",
  optimizer = {{ type = "adamw", lr = {LR}, betas = {{{BETAS[0]}, {BETAS[1]}}}, eps = {EPS},
                weight_decay = {WEIGHT_DECAY} }},
  gradient_clipping = {CLIP},
  zero = {{ {zero} }},
  {offload}
}}
"""


_refs = {}


def reference(dtype, foreach):
    """Plain AdamW on the GPU: the losses and the fp32 master weights, the
    model in dtype."""
    if (dtype, foreach) not in _refs:
        losses, master = torch_reference("gpt", dtype, STEPS, device="cuda", with_master=True, foreach=foreach)
        _refs[dtype, foreach] = losses, {k: v.detach().float().cpu() for k, v in master.state_dict().items()}
    return _refs[dtype, foreach]


def distances(got, want):
    """Per tensor: (worst element-wise relative, norm-relative)."""
    out = {}
    for name, w in want.items():
        g = got[name].float().cpu()
        out[name] = (((g - w).abs() / (w.abs() + 1e-3)).max().item(), ((g - w).norm() / w.norm()).item())
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_parameters_match_plain_pytorch_on_the_gpu(precision, mode, tmp_path):
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    engine = zerod.torch.initialize(make("gpt").cuda(), job_text=job(precision, mode, tmp_path), dtype=dtype)
    assert engine.device.type == "cuda"
    losses = []
    for step in range(STEPS):
        inputs, y = batch("gpt", step)
        loss = loss_of("gpt", engine, tuple(t.cuda() for t in inputs), y.cuda(), dtype)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    want_losses, want = reference(dtype, foreach=None)
    alt_losses, alt = reference(dtype, foreach=False)
    ours, torchs = distances(engine.state_dict(), want), distances(alt, want)
    worst_ours = max(v[1] for v in ours.values())
    worst_torch = max(v[1] for v in torchs.values())
    loss_gap = max(abs(a - b) / abs(b) for a, b in zip(losses, want_losses))
    torch_loss_gap = max(abs(a - b) / abs(b) for a, b in zip(alt_losses, want_losses))
    print(f"\n{precision} {mode}: zerod vs torch's AdamW: losses {loss_gap:.2e}, worst element "
          f"{max(v[0] for v in ours.values()):.2e}, worst tensor norm {worst_ours:.2e}; torch single-tensor vs "
          f"multi-tensor: {torch_loss_gap:.2e}, {max(v[0] for v in torchs.values()):.2e}, {worst_torch:.2e}")
    assert loss_gap <= (1e-5 if precision == "fp32" else 2e-3), \
        f"losses {loss_gap:.2e} from torch's ({precision}, {mode}): {losses} vs {want_losses}"
    assert worst_ours <= 2 * worst_torch, (f"zerod is {worst_ours:.2e} from torch's AdamW in norm, over twice "
                                           f"torch's own two implementations' {worst_torch:.2e} ({precision}, {mode})")
    engine.close()


def test_views_are_zerods_device_memory():
    engine = zerod.torch.initialize(make("gpt").cuda(), job_text=job("fp32", "stage3", "/tmp"))
    zm = engine.zerod_model
    mid = zm.find_module(engine._groups[0].name)
    zm.forward_begin(mid)
    v = zm.param_view(engine._groups[0].slots[0].pid)
    t = v.torch()
    assert t.is_cuda and t.data_ptr() == v.data_ptr, "a view, not a copy"
    assert torch.from_dlpack(v).data_ptr() == v.data_ptr
    zm.forward_end(mid)
    engine.close()
