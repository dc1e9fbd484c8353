"""Moving checkpoints into zerod from elsewhere (docs/checkpoints.md).

    python3 -m zerod.ckpt extract-deepspeed DS_DIR --to RAW_DIR [--tag TAG]

reads a DeepSpeed ZeRO checkpoint (stages 1-3; DS_DIR is what
engine.save_checkpoint was given, or one of its tag directories) through
DeepSpeed's own universal-checkpoint converter and writes each parameter's
fp32 master and AdamW moments as raw float32 files, with a description,
into RAW_DIR. `zerod ckpt import DS_DIR --to OUT` runs this and writes the
zerod checkpoint from it (checksums and all); use that.

It needs torch and deepspeed (the versions that wrote the checkpoint).
Tensor- and pipeline-parallel checkpoints are refused: zerod has neither.
"""
import argparse
import glob
import os
import shutil
import sys
import tempfile


def _escape(s):
    out = []
    for ch in s.encode():
        out.append(f"%{ch:02X}" if ch <= 0x20 or ch == 0x25 or ch >= 0x7F else chr(ch))
    return "".join(out) or "%00"


def _tag_dir(ds_dir, tag):
    if glob.glob(os.path.join(ds_dir, "*_model_states.pt")):
        return ds_dir
    if tag is None:
        latest = os.path.join(ds_dir, "latest")
        if not os.path.exists(latest):
            raise SystemExit(f"zerod.ckpt: {ds_dir} holds no DeepSpeed checkpoint (no *_model_states.pt and no "
                             "'latest' file); name the tag directory, or --tag")
        with open(latest) as f:
            tag = f.read().strip()
    path = os.path.join(ds_dir, tag)
    if not glob.glob(os.path.join(path, "*_model_states.pt")):
        raise SystemExit(f"zerod.ckpt: {path} holds no DeepSpeed checkpoint (no *_model_states.pt)")
    return path


def _tensor(obj):
    return obj["param"] if isinstance(obj, dict) else obj


def extract_deepspeed(ds_dir, out, tag=None):
    import torch
    from deepspeed.checkpoint import ds_to_universal

    src = _tag_dir(ds_dir, tag)
    model_files = sorted(glob.glob(os.path.join(src, "*model_states.pt")))
    states = [torch.load(f, map_location="cpu", weights_only=False) for f in model_files]
    if any(s.get("mp_world_size", 1) > 1 for s in states) or glob.glob(os.path.join(src, "layer_*")):
        raise SystemExit("zerod.ckpt: a tensor- or pipeline-parallel DeepSpeed checkpoint: zerod has neither")
    ms = states[0]
    cfg = ms.get("ds_config") or {}
    opt = (cfg.get("optimizer") or {})
    kind = str(opt.get("type", "adamw")).lower()
    params = opt.get("params") or {}
    if kind not in ("adam", "adamw"):
        raise SystemExit(f"zerod.ckpt: the checkpoint's optimizer is {opt.get('type')}; zerod imports Adam and AdamW "
                         "state (exp_avg, exp_avg_sq)")
    # DeepSpeed's "Adam" decouples weight decay unless adam_w_mode is false.
    optimizer = "adamw" if kind == "adamw" or params.get("adam_w_mode", True) else "adam"
    stage = int((cfg.get("zero_optimization") or {}).get("stage", 0))
    precision = "bf16" if (cfg.get("bf16") or {}).get("enabled") else "fp16" if (cfg.get("fp16") or {}).get("enabled") \
        else "fp32"
    step = int(ms.get("global_steps") or 0)

    universal = tempfile.mkdtemp(prefix="zerod-universal-")
    try:
        ds_to_universal.main(argparse.Namespace(input_folder=src, output_folder=universal, num_extract_workers=1,
                                                num_merge_workers=1, keep_temp_folder=False, strict=True,
                                                inject_missing_state=True))
        zero = os.path.join(universal, "zero")
        # Parameters in the model's order: its state_dict's, those DeepSpeed trained.
        shapes = {}
        for group in ms.get("param_shapes") or []:
            shapes.update(group)
        module = ms.get("module") or {}
        order = [k for k in module if k in shapes] + [k for k in shapes if k not in module]
        if not order:  # stage 3 keeps no module state: the universal folder names them
            order = sorted(os.listdir(zero))
        os.makedirs(out, exist_ok=True)
        lines = ["zerod-import 1", f"step {step}", f"zero_stage {stage}", f"precision {precision}",
                 f"optimizer {optimizer} 2 exp_avg exp_avg_sq"]
        for i, name in enumerate(order):
            d = os.path.join(zero, name)
            if not os.path.isdir(d):
                raise SystemExit(f"zerod.ckpt: DeepSpeed's converter wrote nothing for parameter '{name}'")
            master = _tensor(torch.load(os.path.join(d, "fp32.pt"), map_location="cpu", weights_only=False)).detach().float()
            for b, fname in enumerate(("fp32.pt", "exp_avg.pt", "exp_avg_sq.pt")):
                p = os.path.join(d, fname)
                t = _tensor(torch.load(p, map_location="cpu", weights_only=False)).float() if os.path.exists(p) \
                    else torch.zeros_like(master)  # never stepped: zero moments, as AdamW starts
                t.detach().contiguous().numpy().tofile(os.path.join(out, f"{i}.b{b}"))
            # The model's shape (stage 3's converter hands parameters back flat).
            shape = [int(x) for x in shapes.get(name, master.shape)] or [1]
            lines.append(f"param {master.numel()} {len(shape)} {' '.join(map(str, shape))} {_escape(name)}")
        lines.append("end")
        with open(os.path.join(out, "params.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")
        # What torch holds outside the optimizer (buffers, frozen parameters),
        # for zerod.torch's load_checkpoint.
        rest = {k: v for k, v in module.items() if k not in shapes}
        torch.save({"module_rest": rest, "client_state": {}}, os.path.join(out, "torch_state.pt"))
    finally:
        shutil.rmtree(universal, ignore_errors=True)
    return len(order), step


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m zerod.ckpt")
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("extract-deepspeed")
    ex.add_argument("ds_dir")
    ex.add_argument("--to", required=True)
    ex.add_argument("--tag")
    a = ap.parse_args(argv)
    n, step = extract_deepspeed(a.ds_dir, a.to, a.tag)
    print(f"zerod.ckpt: {n} parameters of step {step} extracted into {a.to}", file=sys.stderr)


if __name__ == "__main__":
    main()
