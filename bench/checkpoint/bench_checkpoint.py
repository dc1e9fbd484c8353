"""Checkpoint speed against the disk's own: a model of --params fp32
parameters with AdamW state (12 bytes a parameter on disk) is saved
(zd_model_save), checked (zerod ckpt info --verify), loaded into a fresh
model (zd_model_load) and exported to safetensors (zerod ckpt export), in
one run; beside them fio writing and reading the same number of bytes,
sequentially, in the same directory (the disk's limit). Prints GB/s and the
ratio to fio's; asserts nothing.

    PYTHONPATH=bindings/python /usr/bin/python3 bench/checkpoint/bench_checkpoint.py [--params 1e8] [--dir /var/tmp]
"""
import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time

import numpy as np

import zerod

ZEROD = shutil.which("zerod") or os.path.join(os.path.dirname(__file__), "..", "..", "build", "bin", "zerod")
JOB = 'return { optimizer = { type = "adamw", lr = 1e-3 } }'


def model(client, n, tensors):
    m = client.create_model(script_text=JOB)
    per = int(n // tensors)
    ids = [m.register_param(f"w{i}", f"m{i}", (per,), init=np.full(per, 0.01 * i, dtype=np.float32))
           for i in range(tensors)]
    m.finalize()
    return m, ids, per


def fio(directory, size, rw):
    if not shutil.which("fio"):
        return None
    r = subprocess.run(["fio", "--name=ckpt", f"--directory={directory}", f"--size={size}", f"--rw={rw}", "--bs=1M",
                        "--ioengine=psync", "--end_fsync=1", "--output-format=json", "--invalidate=1"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return None
    job = json.loads(r.stdout)["jobs"][0]
    side = job["write" if "write" in rw else "read"]
    return side["bw_bytes"] / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=float, default=1e8)
    ap.add_argument("--tensors", type=int, default=16)
    ap.add_argument("--dir", default="/var/tmp")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="zerod-bench-ckpt-", dir=a.dir)
    try:
        with zerod.connect("embedded:") as client:
            m, ids, per = model(client, a.params, a.tensors)
            # One step, so the moments hold values.
            for i, pid in enumerate(ids):
                m.backward_begin(i)
                m.grad_view(pid).numpy()[:] = 0.5
                m.backward_end(i)
            m.step()
            n = per * a.tensors
            nbytes = n * 12
            ckpt = os.path.join(work, "ckpt")
            t = time.perf_counter()
            m.save(ckpt)
            save_s = time.perf_counter() - t
            t = time.perf_counter()
            subprocess.run([ZEROD, "ckpt", "info", ckpt, "--verify"], check=True, capture_output=True)
            verify_s = time.perf_counter() - t
            m2, _, _ = model(client, a.params, a.tensors)
            t = time.perf_counter()
            m2.load(ckpt)
            load_s = time.perf_counter() - t
            t = time.perf_counter()
            subprocess.run([ZEROD, "ckpt", "export", ckpt, "--to", os.path.join(work, "m.safetensors")], check=True,
                           capture_output=True)
            export_s = time.perf_counter() - t
            t = time.perf_counter()
            subprocess.run([ZEROD, "ckpt", "export", ckpt, "--to", os.path.join(work, "b.safetensors"), "--dtype",
                            "bf16"], check=True, capture_output=True)
            export_bf16_s = time.perf_counter() - t
        fdir = os.path.join(work, "fio")
        os.makedirs(fdir)
        fio_w = fio(fdir, nbytes, "write")
        fio_r = fio(fdir, nbytes, "read")
        print(f"{n / 1e6:.0f}M fp32 parameters with AdamW state: {nbytes / 1e9:.2f} GB of checkpoint, in {a.dir}\n")
        print(f"{'':34} {'seconds':>8} {'GB/s':>7} {'x fio':>7}")

        def row(name, secs, gb, ref):
            ratio = f"{gb / secs / ref:7.2f}" if ref else "      -"
            print(f"{name:34} {secs:8.2f} {gb / secs:7.2f} {ratio}")

        row("zd_model_save (write, fsync)", save_s, nbytes / 1e9, fio_w)
        row("zerod ckpt info --verify (read)", verify_s, nbytes / 1e9, fio_r)
        row("zd_model_load (read, check, place)", load_s, nbytes / 1e9, fio_r)
        row("zerod ckpt export, fp32 (4 B/param)", export_s, n * 4 / 1e9, fio_w)
        row("zerod ckpt export, bf16 (2 B/param)", export_bf16_s, n * 2 / 1e9, fio_w)
        if fio_w:
            print(f"\nfio, sequential 1 MiB blocks, same bytes, same directory: write {fio_w:.2f} GB/s, read "
                  f"{fio_r:.2f} GB/s (reads may come from the page cache, as zerod's do)")
        else:
            print("\nfio: not available (apt-get install fio): no disk limit to compare with")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
