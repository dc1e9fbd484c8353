"""Checkpoint speed against the disk's own: a model of --params fp32
parameters with AdamW state (12 bytes a parameter on disk) is saved
(zd_model_save), checked (zerod ckpt info --verify), loaded into a fresh
model (zd_model_load) and exported to safetensors (zerod ckpt export), in
one run; beside them fio writing and reading the same number of bytes,
sequentially, in 1 MiB blocks, in the same directory, two ways:
  - direct: O_DIRECT through libaio, 8 requests in flight (as bench/nvme
    runs it): what the disk itself does, the limit;
  - buffered: one thread of plain write()/read() through the page cache,
    fsync at the end: the path zerod's checkpoint files take (the same path,
    not the disk's limit).
Every read is cold on both sides: fio invalidates its file's cached pages
before it reads, and before each zerod command that reads the checkpoint
(verify, load, both exports) its files' pages are dropped with
posix_fadvise(DONTNEED) (they are clean: the save fsyncs). Prints GB/s and
the ratio to each fio figure; asserts nothing.

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


FIO_WAYS = {  # name: fio options
    "direct": ["--ioengine=libaio", "--direct=1", "--iodepth=8"],
    "buffered": ["--ioengine=psync"],
}


def fio(directory, size, rw, way):
    """fio's GB/s for `rw` ("write" or "read") done `way` (FIO_WAYS), or None
    when fio is missing or fails. Reads invalidate the file's cached pages
    first (--invalidate=1), so they come from the disk."""
    if not shutil.which("fio"):
        return None
    r = subprocess.run(["fio", "--name=ckpt", f"--directory={directory}", f"--size={size}", f"--rw={rw}", "--bs=1M",
                        "--end_fsync=1", "--output-format=json", "--invalidate=1"] + FIO_WAYS[way],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return None
    try:
        job = json.loads(r.stdout)["jobs"][0]
    except (ValueError, KeyError, IndexError):
        return None
    bw = job["write" if "write" in rw else "read"]["bw_bytes"]
    return bw / 1e9 if bw else None


def drop_cached(path):
    """Drop the page cache's copy of every file under `path`, so the next
    read of them comes from the disk as fio's does."""
    for d, _, files in os.walk(path):
        for f in files:
            fd = os.open(os.path.join(d, f), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


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
            drop_cached(ckpt)
            t = time.perf_counter()
            subprocess.run([ZEROD, "ckpt", "info", ckpt, "--verify"], check=True, capture_output=True)
            verify_s = time.perf_counter() - t
            m2, _, _ = model(client, a.params, a.tensors)
            drop_cached(ckpt)
            t = time.perf_counter()
            m2.load(ckpt)
            load_s = time.perf_counter() - t
            drop_cached(ckpt)
            t = time.perf_counter()
            subprocess.run([ZEROD, "ckpt", "export", ckpt, "--to", os.path.join(work, "m.safetensors")], check=True,
                           capture_output=True)
            export_s = time.perf_counter() - t
            drop_cached(ckpt)
            t = time.perf_counter()
            subprocess.run([ZEROD, "ckpt", "export", ckpt, "--to", os.path.join(work, "b.safetensors"), "--dtype",
                            "bf16"], check=True, capture_output=True)
            export_bf16_s = time.perf_counter() - t
        lim = {}
        for way in FIO_WAYS:
            fdir = os.path.join(work, "fio-" + way)
            os.makedirs(fdir)
            lim[way] = (fio(fdir, nbytes, "write", way), fio(fdir, nbytes, "read", way))
            shutil.rmtree(fdir, ignore_errors=True)
        print(f"{n / 1e6:.0f}M fp32 parameters with AdamW state: {nbytes / 1e9:.2f} GB of checkpoint, in {a.dir}; "
              f"every read cold (zerod's files dropped from the page cache first, fio's invalidated)\n")
        print(f"{'':36} {'seconds':>8} {'GB/s':>7} {'x fio direct':>13} {'x fio buffered':>15}")
        W, R = 0, 1

        def row(name, secs, gb, side):
            cells = [f"{gb / secs / lim[w][side]:.2f}" if lim[w][side] else "-" for w in FIO_WAYS]
            print(f"{name:36} {secs:8.2f} {gb / secs:7.2f} {cells[0]:>13} {cells[1]:>15}")

        row("zd_model_save (write, fsync)", save_s, nbytes / 1e9, W)
        row("zerod ckpt info --verify (read)", verify_s, nbytes / 1e9, R)
        row("zd_model_load (read, check, place)", load_s, nbytes / 1e9, R)
        row("zerod ckpt export, fp32 (4 B/param)", export_s, n * 4 / 1e9, W)
        row("zerod ckpt export, bf16 (2 B/param)", export_bf16_s, n * 2 / 1e9, W)

        def gbs(x):
            return f"{x:.2f} GB/s" if x else "failed"
        if shutil.which("fio"):
            print(f"\nfio, sequential 1 MiB blocks, the same bytes, the same directory, reads cold:\n"
                  f"  direct (libaio, O_DIRECT, iodepth 8; the disk's limit): write {gbs(lim['direct'][W])}, "
                  f"read {gbs(lim['direct'][R])}\n"
                  f"  buffered (one thread, psync, fsync at the end; zerod's path, not the limit): "
                  f"write {gbs(lim['buffered'][W])}, read {gbs(lim['buffered'][R])}")
        else:
            print("\nfio: not available (apt-get install fio): no disk limit to compare with")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
