"""One benchmark run in a process of its own (a fresh GPU and allocator):
trains the GPT of model.py for --steps steps in one mode and prints one JSON
line with what it measured. The modes:
  torch            plain PyTorch: fp32 weights, bf16 autocast, torch.optim.AdamW (fused)
  zerod0           zerod stage 0, everything in HBM (bf16 working copy, fp32 master and AdamW)
  zerod3           zerod stage 3, everything in HBM
  zerod3_host      zerod stage 3, optimizer (master + AdamW) on the host
  zerod3_params    zerod stage 3, parameters and optimizer on the host
  zerod3_nvme      zerod stage 3, parameters and optimizer on NVMe (--nvme DIR)
  ds3_host         DeepSpeed ZeRO-3, offload_optimizer cpu (pinned)
  ds3_params       DeepSpeed ZeRO-3, offload_optimizer and offload_param cpu
  ds3_nvme         DeepSpeed ZeRO-3, offload_optimizer and offload_param nvme
Every mode computes in bf16 with fp32 master weights and AdamW(lr 1e-4,
betas 0.9/0.95, weight decay 0.1), gradient clipping 1.0, the same batches.
"""
import argparse
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


def zerod_job(mode, nvme, trace=None):
    stage = 0 if mode == "zerod0" else 3
    offload = {
        "zerod3_host": 'offload = { optimizer = "host" },',
        "zerod3_params": 'offload = { params = "host", optimizer = "host" },',
        "zerod3_nvme": f'offload = {{ params = "nvme", optimizer = "nvme", nvme_path = "{nvme}" }},',
    }.get(mode, "")
    # A live window of a few blocks and a bucket of about one block, as
    # DeepSpeed's defaults give for this width.
    zero = f"stage = {stage}" + (", max_live_parameters = 3e8, prefetch_bucket_size = 1e8, "
                                 "reduce_bucket_size = 1e8" if stage == 3 else "")
    return f"""return {{
  precision = "bf16",
  optimizer = {{ type = "adamw", lr = {LR}, betas = {{{BETAS[0]}, {BETAS[1]}}}, weight_decay = {WD} }},
  gradient_clipping = {CLIP},
  zero = {{ {zero} }},
  {offload}
  {f'trace = {{ path = "{trace}", steps = {{3, 4}} }},' if trace else ""}
}}"""


def ds_config(mode, nvme, micro_batch):
    zero = {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True}}
    if mode in ("ds3_params", "ds3_nvme"):
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if mode == "ds3_nvme":
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": nvme, "pin_memory": True}
        zero["offload_param"] = {"device": "nvme", "nvme_path": nvme, "pin_memory": True}
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "gradient_clipping": CLIP,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "weight_decay": WD}},
        "zero_optimization": zero,
    }


def rss_gib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", required=True)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--embd", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--block", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--nvme", default="/tmp/zerod-bench-nvme")
    ap.add_argument("--trace", help="zerod modes: write a timeline of steps 3-4 here (trace_summary.py reads it)")
    a = ap.parse_args()
    c = Config(n_layer=a.layers, n_embd=a.embd, n_head=a.heads, block_size=a.block)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    torch.manual_seed(0)
    out = {"mode": a.mode, "layers": a.layers, "embd": a.embd, "params": n_params(c)}
    t0 = time.time()
    try:
        rss0 = rss_gib()
        if a.mode == "torch":
            with torch.device(dev):
                model = GPT(c)
            opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=WD, fused=True)

            def step(x, y):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(x, y)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
                opt.step()
                opt.zero_grad(set_to_none=True)
                return loss
        elif a.mode.startswith("zerod"):
            import zerod.torch
            os.makedirs(a.nvme, exist_ok=True)
            # Built on the GPU in bf16: zerod copies it into its own tiers at
            # initialize and frees the torch copy.
            with torch.device(dev):
                model = GPT(c).to(torch.bfloat16)
            engine = zerod.torch.initialize(model, job_text=zerod_job(a.mode, a.nvme, a.trace), modules=["h.*"])
            del model
            torch.cuda.empty_cache()

            def step(x, y):
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
            with deepspeed.zero.Init(config_dict_or_path=ds_config(a.mode, a.nvme, a.batch)):
                model = GPT(c)
            engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                   config=ds_config(a.mode, a.nvme, a.batch))

            def step(x, y):
                loss = engine(x, y)
                engine.backward(loss)
                engine.step()
                return loss
        out["setup_s"] = round(time.time() - t0, 1)
        times, losses = [], []
        for s in range(a.steps):
            x, y = batch(c, a.batch, s, dev)
            torch.cuda.synchronize()
            t = time.perf_counter()
            loss = step(x, y)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
            losses.append(float(loss))
        warm = times[2:] if len(times) > 3 else times
        out.update(ok=all(map(lambda v: v == v and abs(v) != float("inf"), losses)) and losses[-1] < losses[0],
                   step_ms=round(1000 * statistics.median(warm), 1), loss_first=losses[0], loss_last=losses[-1],
                   device_peak_gib=round(torch.cuda.max_memory_allocated(dev) / 2**30, 2),
                   host_peak_gib=round(rss_gib(), 2), host_gib_over_start=round(rss_gib() - rss0, 2),
                   tokens_per_s=round(a.batch * a.block / statistics.median(warm)))
        if a.mode.startswith("zerod"):
            m = engine.memory()
            out["zerod_device_peak_gib"] = round(m["device"].peak / 2**30, 2)
            out["zerod_host_gib"] = round(m["host"].current / 2**30, 2)
            out["zerod_host_bytes_per_param"] = round(m["host"].current / out["params"], 2)
    except torch.cuda.OutOfMemoryError as e:
        out.update(ok=False, error="cuda out of memory: " + str(e).splitlines()[0])
    except Exception as e:  # a failed size is a result for the search, not a crash
        out.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
