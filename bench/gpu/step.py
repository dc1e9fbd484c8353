"""One benchmark run in a process of its own (a fresh GPU and allocator):
trains the GPT of model.py for --steps optimizer steps in one mode and prints
one JSON line with what it measured. The modes:
  torch             plain PyTorch: fp32 weights, bf16 autocast, torch.optim.AdamW (fused)
  zerod0            zerod stage 0, everything in HBM (bf16 working copy, fp32 master and AdamW)
  zerod3            zerod stage 3, everything in HBM
  zerod3_host       zerod stage 3, optimizer (master + AdamW) on the host
  zerod3_host_bf16  zerod3_host with the optimizer state in bf16 (state_dtype)
  zerod3_params     zerod stage 3, parameters and optimizer on the host
  zerod3_nvme_opt   zerod stage 3, parameters on the host, optimizer on NVMe (--nvme DIR)
  zerod3_nvme       zerod stage 3, parameters and optimizer on NVMe
  ds3_host          DeepSpeed ZeRO-3, offload_optimizer cpu (pinned)
  ds3_params        DeepSpeed ZeRO-3, offload_optimizer and offload_param cpu
  ds3_nvme_opt      DeepSpeed ZeRO-3, offload_param cpu, offload_optimizer nvme
  ds3_nvme          DeepSpeed ZeRO-3, offload_optimizer and offload_param nvme
Every mode computes in bf16 with fp32 master weights and AdamW(lr 1e-4,
betas 0.9/0.95, weight decay 0.1), gradient clipping 1.0, the same batches.
One step is one optimizer step: --gas micro-batches of --micro sequences of
--seq tokens each.
"""
import argparse
import contextlib
import json
import os
import resource
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))
sys.path.insert(0, HERE)
from model import GPT, Config, batch, n_params  # noqa: E402

LR, BETAS, WD, CLIP = 1e-4, (0.9, 0.95), 0.1, 1.0
# The optimizer steps --trace records (1-based). zerod writes the trace
# inside the last one's step() (the window closes there), so that step is
# left out of a traced row's step time (timed_steps).
TRACE_STEPS = (3, 4)

ZEROD_OFFLOAD = {
    "zerod3_host": {"optimizer": "host"},
    "zerod3_host_bf16": {"optimizer": "host"},
    "zerod3_params": {"params": "host", "optimizer": "host"},
    "zerod3_nvme_opt": {"params": "host", "optimizer": "nvme"},
    "zerod3_nvme": {"params": "nvme", "optimizer": "nvme"},
}
MODES = ["torch", "zerod0", "zerod3", *ZEROD_OFFLOAD, "ds3_host", "ds3_params", "ds3_nvme_opt", "ds3_nvme"]


def lua(v):
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {lua(x)}" for k, x in v.items()) + " }"
    if isinstance(v, (list, tuple)):
        return "{" + ", ".join(map(lua, v)) + "}"
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a Lua string for what these hold
    return repr(v)


def zerod_job(a):
    stage = 0 if a.mode == "zerod0" else 3
    optimizer = {"type": "adamw", "lr": LR, "betas": BETAS, "weight_decay": WD}
    state_dtype = a.state_dtype or ("bf16" if a.mode == "zerod3_host_bf16" else None)
    if state_dtype:
        optimizer["state_dtype"] = state_dtype
    offload = dict(ZEROD_OFFLOAD.get(a.mode, {}))
    if "nvme" in offload.values():
        offload["nvme_path"] = a.nvme
    if a.accumulate:
        offload["accumulate"] = a.accumulate
    if a.ratio is not None:
        offload["ratio"] = a.ratio
    # Not zerod's defaults (1e9 live, buckets of 5e7): at most 3e8 gathered
    # elements live (6 blocks at width 2048, 1.5 at 4096) and gathers and
    # reductions in buckets of 1e8 (2 blocks at 2048, half of one at 4096).
    # The DeepSpeed rows run on DeepSpeed's own defaults (ds_config sets
    # none: stage3_max_live_parameters 1e9, stage3_prefetch_bucket_size 5e7,
    # reduce_bucket_size 5e8): more live and larger reductions than these,
    # half the prefetch.
    zero = f"stage = {stage}" + (", max_live_parameters = 3e8, prefetch_bucket_size = 1e8, "
                                 "reduce_bucket_size = 1e8" if stage == 3 else "")
    lines = [
        'precision = "bf16",',
        f"optimizer = {lua(optimizer)},",
        f"gradient_accumulation_steps = {a.gas},",
        f"gradient_clipping = {CLIP},",
        f"zero = {{ {zero} }},",
    ]
    if offload:
        lines.append(f"offload = {lua(offload)},")
    if a.threads is not None:
        lines.append(f"threads = {a.threads},")
    if a.trace:
        lines.append(f"trace = {{ path = {lua(a.trace)}, steps = {lua(TRACE_STEPS)} }},")
    return "return {\n  " + "\n  ".join(lines) + "\n}"


def ds_config(a):
    cpu = {"device": "cpu", "pin_memory": True}
    nvme = {"device": "nvme", "nvme_path": a.nvme, "pin_memory": True}
    zero = {"stage": 3, "offload_optimizer": dict(nvme if a.mode in ("ds3_nvme_opt", "ds3_nvme") else cpu)}
    if a.ratio is not None:
        zero["offload_optimizer"]["ratio"] = a.ratio  # ZeRO-3's partial offload (Twin-Flow)
    if a.mode != "ds3_host":
        zero["offload_param"] = nvme if a.mode == "ds3_nvme" else cpu
    return {
        "train_micro_batch_size_per_gpu": a.micro,
        "gradient_accumulation_steps": a.gas,
        "bf16": {"enabled": True},
        "gradient_clipping": CLIP,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "weight_decay": WD}},
        "zero_optimization": zero,
    }


def timed_steps(a, n):
    """The steps (1-based) whose median is step_ms: the third on (the first
    two warm up; all of them in a run of 3 or fewer), less the step that
    writes a zerod trace, where that leaves any."""
    timed = list(range(3, n + 1)) if n > 3 else list(range(1, n + 1))
    if a.trace and a.mode.startswith("zerod") and len(timed) > 1 and TRACE_STEPS[1] in timed:
        timed.remove(TRACE_STEPS[1])
    return timed


def batch_cycle(steps, gas):
    """How many batches a run cycles through: at most 4, and a divisor of
    the micro-batches from step 1's last to the last step's last ((steps -
    1) * gas), so that both are the same batch and "falling" (ok, and the
    losses first and last) compares the same tokens. min(4, that span) is
    one only where the span is 4 or less or a multiple of 4."""
    span = (steps - 1) * gas
    return max(d for d in range(1, 5) if span % d == 0) if span > 0 else 1


def batch_index(step, micro, gas, cycle):
    """The batch of micro-batch `micro` of step `step` (both from 0)."""
    return (step * gas + micro) % cycle


def rss_gib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def parser():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", required=True, choices=MODES)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--embd", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", "--block", type=int, default=1024, help="tokens per sequence (the block size)")
    ap.add_argument("--micro", "--batch", type=int, default=4, help="sequences per micro-batch")
    ap.add_argument("--gas", type=int, default=1, help="micro-batches per optimizer step")
    ap.add_argument("--ckpt", action="store_true", help="activation checkpointing of every transformer block")
    ap.add_argument("--steps", type=int, default=10, help="optimizer steps")
    ap.add_argument("--nvme", default="/tmp/zerod-bench-nvme")
    ap.add_argument("--accumulate", choices=["auto", "device", "host"],
                    help="zerod modes: the job's offload.accumulate (where micro-batch gradients add up)")
    ap.add_argument("--state-dtype", choices=["bf16"], help="zerod modes: the job's optimizer.state_dtype")
    ap.add_argument("--ratio", type=float, help="zerod modes: the job's offload.ratio (the share of the optimizer "
                                                "that leaves the GPU: whole tensors, the last layers first); "
                                                "DeepSpeed modes: offload_optimizer.ratio")
    ap.add_argument("--threads", type=int, help="zerod modes: the job's threads (CPU threads of the host's "
                                                "update; default every core)")
    ap.add_argument("--trace", help="zerod modes: write a timeline of steps 3-4 here (trace_summary.py reads it); "
                                    "step 4, which writes it, is then left out of step_ms")
    # Only for exercising this script's logic on a machine without a GPU.
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    return ap


def main():
    a = parser().parse_args()
    c = Config(n_layer=a.layers, n_embd=a.embd, n_head=a.heads, block_size=a.seq)
    cuda = a.device == "cuda"
    dev = torch.device("cuda", 0) if cuda else torch.device(a.device)
    if cuda:
        torch.cuda.set_device(dev)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    # Built where it trains: a 1-10B GPT initialised on the CPU first would
    # take minutes, and its copy would count in the host's memory.
    on_device = dev if cuda else contextlib.nullcontext()
    torch.manual_seed(0)
    # Under `zerod run` (bench/gpu/daemon.py) every rank is a process of
    # its own on the same GPU, training on batches of its own.
    rank, world = int(os.environ.get("ZEROD_RANK", 0)), int(os.environ.get("ZEROD_WORLD_SIZE", 1))
    tokens_per_step = a.micro * a.seq * a.gas
    out = {"mode": a.mode, "rank": rank, "world": world, "layers": a.layers, "embd": a.embd, "params": n_params(c),
           "seq": a.seq, "micro": a.micro, "gas": a.gas, "tokens_per_step": tokens_per_step, "ckpt": a.ckpt}
    out.update({k: v for k, v in (("accumulate", a.accumulate), ("state_dtype", a.state_dtype),
                                  ("ratio", a.ratio)) if v is not None})
    t0 = time.time()
    try:
        rss0 = rss_gib()
        if a.mode == "torch":
            with on_device:
                model = GPT(c, checkpoint_blocks=a.ckpt)
            opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=WD, fused=True)

            def step(micro_batches):
                for x, y in micro_batches:
                    with torch.autocast(dev.type, dtype=torch.bfloat16):
                        loss = model(x, y)
                    (loss / a.gas).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
                opt.step()
                opt.zero_grad(set_to_none=True)
                return loss
        elif a.mode.startswith("zerod"):
            import zerod.torch
            os.makedirs(a.nvme, exist_ok=True)
            # Built on the device (zerod copies it into its own tiers at
            # initialize and frees the torch copy) with torch's fp32 initial
            # values, then made bf16 one tensor at a time: model.to() would
            # hold both whole copies, 6 bytes per parameter of GPU memory,
            # more than initialize needs, and decide largest.py's result.
            with on_device:
                model = GPT(c, checkpoint_blocks=a.ckpt)
            for p in model.parameters():
                p.data = p.data.to(torch.bfloat16)
            engine = zerod.torch.initialize(model, job_text=zerod_job(a), modules=["h.*"])
            del model
            if cuda:
                torch.cuda.empty_cache()

            def step(micro_batches):
                # zerod counts the micro-batches (gradient_accumulation_steps)
                # and applies the optimizer at the last one's step().
                for x, y in micro_batches:
                    loss = engine(x, y)
                    engine.backward(loss)
                    engine.step()
                return loss
        else:
            import deepspeed
            os.makedirs(a.nvme, exist_ok=True)
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29511")
            os.environ.setdefault("RANK", "0")
            os.environ.setdefault("WORLD_SIZE", "1")
            os.environ.setdefault("LOCAL_RANK", "0")
            deepspeed.init_distributed()
            with deepspeed.zero.Init(config_dict_or_path=ds_config(a)):
                model = GPT(c, checkpoint_blocks=a.ckpt)
            engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                   config=ds_config(a))

            def step(micro_batches):
                # DeepSpeed's loop: it divides each loss by the accumulation
                # steps and steps the optimizer at the boundary.
                for x, y in micro_batches:
                    loss = engine(x, y)
                    engine.backward(loss)
                    engine.step()
                return loss
        out["setup_s"] = round(time.time() - t0, 1)
        times, losses = [], []
        cycle = batch_cycle(a.steps, a.gas)
        for s in range(a.steps):
            micro_batches = [batch(c, a.micro, batch_index(s, k, a.gas, cycle), dev, rank) for k in range(a.gas)]
            sync()
            t = time.perf_counter()
            loss = step(micro_batches)
            sync()
            times.append(time.perf_counter() - t)
            losses.append(float(loss.detach()))  # the last micro-batch's
        timed = timed_steps(a, len(times))
        warm = [times[i - 1] for i in timed]
        out.update(ok=all(map(lambda v: v == v and abs(v) != float("inf"), losses)) and losses[-1] < losses[0],
                   step_ms=round(1000 * statistics.median(warm), 1), timed_steps=timed, loss_first=losses[0],
                   loss_last=losses[-1], host_peak_gib=round(rss_gib(), 2),
                   host_gib_over_start=round(rss_gib() - rss0, 2),
                   tokens_per_s=round(tokens_per_step / statistics.median(warm)))
        if cuda:
            out["device_peak_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)
            out["device_total_gib"] = round(torch.cuda.mem_get_info(dev)[1] / 2**30, 2)
        if a.mode.startswith("zerod"):
            m = engine.memory()
            out["zerod_device_peak_gib"] = round(m["device"].peak / 2**30, 2)
            # The model state this rank keeps on the device between steps
            # (DESIGN.md section 4's per-rank bytes; the peak adds the
            # gathered parameters and gradient buckets of a step).
            out["zerod_device_bytes"] = m["device"].current
            out["zerod_host_gib"] = round(m["host"].current / 2**30, 2)
            out["zerod_host_bytes_per_param"] = round(m["host"].current / out["params"], 2)
            # The host tier at its highest (finalize's, or a step's staging):
            # what largest.py sizes its next try by.
            out["zerod_host_peak_bytes_per_param"] = round(m["host"].peak / out["params"], 2)
            if m["nvme"].current:
                out["zerod_nvme_gib"] = round(m["nvme"].current / 2**30, 2)
                out["zerod_nvme_bytes_per_param"] = round(m["nvme"].current / out["params"], 2)
    except torch.cuda.OutOfMemoryError as e:
        out.update(ok=False, error="cuda out of memory: " + str(e).splitlines()[0])
    except Exception as e:  # a failed size is a result for the search, not a crash
        out.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
