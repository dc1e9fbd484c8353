"""The main job: a character-level GPT trained through zerod.

    zerod run --nproc 2 --job examples/python/gpt_job.lua -- python3 examples/python/train_gpt.py
    python3 examples/python/train_gpt.py            # one rank, embedded engine
    ... train_gpt.py --device cuda                   # on the GPU (scripts/run-main.sh gpu)
    ... train_gpt.py --device cuda --plain           # plain PyTorch there, the yardstick

The model (gpt.py) is plain PyTorch; zerod.torch.initialize hands its
parameters to zerod, which keeps them (ZeRO stage 3: each rank holds half),
their gradients and the AdamW state, and applies the optimizer. The corpus is
this Python's own standard library sources (every machine with Python has
them), or any text file given with --text. Every rank draws the same global
batch of batch * world_size sequences and trains on its own slice; rank 0
shows progress and, at the end, samples text from the trained model.
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--text", help="train on this text file instead of the Python standard library")
    p.add_argument("--max-chars", type=int, default=2_000_000, help="corpus size cap")
    p.add_argument("--steps", type=int, default=800, help="optimizer steps (the job's schedule assumes 800)")
    p.add_argument("--batch", type=int, default=16, help="sequences per rank per step")
    p.add_argument("--block", type=int, default=64, help="context length")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--embd", type=int, default=128)
    p.add_argument("--sample-chars", type=int, default=400, help="characters sampled after training (0: none)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--job", default=os.path.join(HERE, "gpt_job.lua"),
                   help="job script when not under `zerod run --job` (which sets ZEROD_JOB)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"],
                   help="where torch computes (auto: the GPU where torch sees one); zerod follows the model")
    p.add_argument("--bf16", action="store_true", help="bf16 weights (zerod keeps fp32 masters; --plain: autocast)")
    p.add_argument("--plain", action="store_true",
                   help="plain PyTorch, no zerod: torch.optim.AdamW with gpt_job.lua's hyperparameters and "
                        "schedule, to measure zerod against")
    return p.parse_args()


def threads_per_rank():
    cores = len(os.sched_getaffinity(0))
    return max(1, cores // int(os.environ.get("ZEROD_LOCAL_WORLD_SIZE", "1")))


# Ranks share the machine's cores: size the BLAS and OpenMP pools before
# torch loads them (they read these once).
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, str(threads_per_rank()))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

try:
    import zerod  # noqa: E402
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, os.path.join(HERE, "..", "..", "bindings", "python"))
    import zerod  # noqa: E402
import zerod.torch  # noqa: E402

sys.path.insert(0, HERE)
from corpus import UNKNOWN, printable, read_corpus  # noqa: E402
from gpt import GPT, Block, GPTConfig, generate  # noqa: E402


def check_corpus(text, source, block):
    """Exits, naming --text and --block, when the corpus's last tenth (the
    validation text) cannot hold one sequence of block + 1 characters: the
    evaluation after training would fail (it did, after the whole run)."""
    n_val = len(text) // 10
    if n_val <= block + 1:
        sys.exit(f"{source}: {len(text):,} characters; its last tenth, the validation text, is {n_val}, and "
                 f"--block {block} needs more than {block + 1} there: give --text a longer file (at least "
                 f"{10 * (block + 2):,} characters) or a smaller --block")


def sample_prompt(text, stoi):
    """The sample's prompt: "def " where the corpus has those characters
    (Python sources), else its own first 4, since a prompt must be in the
    vocabulary (a DNA or digits file has no "d")."""
    return "def " if all(c in stoi for c in "def ") else text[:4]


def human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024


class LinesWhenPiped:
    """tqdm's output when it is not a terminal (`zerod run` pipes it to
    prefix each line with the rank): one line per refresh, not \\r-redraws."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, s):
        s = s.replace("\r", "").strip()
        if s:
            self.stream.write(s + "\n")

    def flush(self):
        self.stream.flush()


# gpt_job.lua's optimizer and schedule, for --plain.
LR, MIN_LR, WARMUP, BETAS, WEIGHT_DECAY, CLIP = 2e-3, 2e-4, 40, (0.9, 0.99), 0.01, 1.0


def cosine(step, total):
    """zerod.cosine{ warmup_steps = WARMUP, total_steps = total, max_lr = LR, min_lr = MIN_LR }."""
    import math
    if step < WARMUP:
        return MIN_LR + (LR - MIN_LR) * step / WARMUP
    t = min(1.0, (step - WARMUP) / max(1, total - WARMUP))
    return MIN_LR + 0.5 * (LR - MIN_LR) * (1 + math.cos(math.pi * t))


class Plain:
    """The engine's interface over plain PyTorch (for --plain): the whole
    model in the GPU's memory, torch.optim.AdamW, autocast for bf16."""

    def __init__(self, model, args):
        self.model, self.args, self.rank, self.world_size = model, args, 0, 1
        self.num_parameters = sum(p.numel() for p in model.parameters())
        self.zerod_modules = []
        fused = {"fused": True} if next(model.parameters()).is_cuda else {}
        self.opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY, **fused)
        self.applied = 0

    def __call__(self, *a):
        dev = next(self.model.parameters()).device
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=self.args.bf16):
            return self.model(*a)

    def backward(self, loss):
        loss.backward()

    def step(self):
        for g in self.opt.param_groups:
            g["lr"] = cosine(self.applied, self.args.steps)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), CLIP)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.applied += 1

        class Result:
            lr = self.opt.param_groups[0]["lr"]
        return Result

    def report(self, **_):
        pass

    def memory(self):
        return {}

    def eval(self):
        self.model.eval()


def main():
    args = parse_args()
    torch.set_num_threads(threads_per_rank())
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("--device cuda: torch sees no GPU here (torch " + torch.__version__ + ")")
        device = torch.device("cuda", int(os.environ.get("ZEROD_LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    raw, source = read_corpus(args.text, args.max_chars)
    text, replaced = printable(raw)
    check_corpus(text, source, args.block)
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    n_val = len(data) // 10
    train, val = data[:-n_val], data[-n_val:]

    torch.manual_seed(args.seed)  # the same initial model on every rank (rank 0's is used)
    cfg = GPTConfig(vocab_size=len(chars), block_size=args.block, n_layer=args.layers, n_head=args.heads,
                    n_embd=args.embd)
    model = GPT(cfg).to(device)
    if args.plain:
        engine = Plain(model, args)
    else:
        job = None if os.environ.get("ZEROD_JOB") else args.job
        # Blocks, not single layers, are the unit of residency: under the daemon
        # every begin and end is a round trip to it.
        engine = zerod.torch.initialize(model, job=job, modules=[Block],
                                        dtype=torch.bfloat16 if args.bf16 else None)
    rank, world = engine.rank, engine.world_size
    if rank == 0:
        print(f"corpus: {len(text):,} characters of {source}, vocabulary {len(chars)}"
              + (f"; {replaced:,} outside printable ASCII became '{UNKNOWN}'" if replaced else ""))
        print(f"model: {engine.num_parameters / 1e6:.2f}M parameters in {len(engine.zerod_modules)} zerod modules; "
              f"{world} rank(s) x {args.batch} sequences of {args.block} characters per step")

    # The same global batch on every rank (same seed); each takes its slice.
    batches = torch.Generator().manual_seed(args.seed + 1)

    def global_batch(source_data, generator):
        starts = torch.randint(len(source_data) - args.block - 1, (args.batch * world,), generator=generator)
        mine = starts[rank * args.batch:(rank + 1) * args.batch]
        x = torch.stack([source_data[s:s + args.block] for s in mine])
        y = torch.stack([source_data[s + 1:s + 1 + args.block] for s in mine])
        return x.to(device), y.to(device)

    interactive = sys.stderr.isatty()
    if not interactive:
        tqdm.monitor_interval = 0  # its extra refreshes would print extra lines
    bar = tqdm(total=args.steps, desc="train", disable=rank != 0, dynamic_ncols=interactive,
               file=sys.stderr if interactive else LinesWhenPiped(sys.stderr),
               mininterval=0.5 if interactive else 15, bar_format="{l_bar}{bar:20}{r_bar}")
    losses, tokens_per_step = [], args.batch * args.block * world
    memory = {}
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    try:
        for step in range(1, args.steps + 1):
            x, y = global_batch(train, batches)
            _, loss = engine(x, y)
            engine.backward(loss)
            result = engine.step()
            losses.append(loss.item())
            # This rank's tokens and loss: zerod's metrics, `zerod top` and the trace's loss plot.
            engine.report(tokens=args.batch * args.block, samples=args.batch, loss=losses[-1])
            if step % 20 == 1 or step == args.steps:
                memory = engine.memory()
            elapsed = time.perf_counter() - start
            bar.set_postfix_str(
                f"loss {losses[-1]:.3f} lr {result.lr:.1e} {tokens_per_step * step / elapsed / 1e3:.1f}k tok/s | "
                + " ".join(f"{tier} {human_bytes(m.current)}" for tier, m in memory.items()), refresh=False)
            bar.update()
    except KeyboardInterrupt:
        bar.close()
        print(f"rank {rank}: interrupted at step {len(losses)}; leaving the job", file=sys.stderr)
        sys.exit(130)
    bar.close()
    if device.type == "cuda":
        torch.cuda.synchronize()
    train_time = time.perf_counter() - start

    # Evaluation and sampling run on every rank: at stage 3 each forward
    # gathers parameters from all of them.
    engine.eval()
    evals = torch.Generator().manual_seed(args.seed + 2)
    with torch.no_grad():
        val_loss = sum(engine(*global_batch(val, evals))[1].item() for _ in range(8)) / 8
    if rank == 0:
        k = max(1, min(10, len(losses)))  # runs shorter than 10 steps average what they have
        head, tail = sum(losses[:k]) / k, sum(losses[-k:]) / k
        print(f"trained {args.steps} steps in {train_time:.1f} s: {tokens_per_step * args.steps / train_time:,.0f} "
              f"tokens/s; loss {head:.3f} -> {tail:.3f} (mean of the first and last 10 steps), "
              f"validation loss {val_loss:.3f}" + (" [plain PyTorch]" if args.plain else ""))
        if not args.plain:
            print("per-tier peak bytes on rank 0: " +
                  ", ".join(f"{tier} {human_bytes(m.peak)}" for tier, m in engine.memory().items()))
        if world > 1:
            comm = engine.zerod_model.comm_figures()
            print(f"collectives: rank 0 sent {human_bytes(comm.bytes_sent)} in {comm.collectives:,} collectives "
                  f"({comm.bytes_sent // max(1, args.steps):,} bytes per step, evaluation included)")
    if args.sample_chars > 0:  # on every rank, or on none: at stage 3 each forward gathers from all
        prompt = torch.tensor([[stoi[c] for c in sample_prompt(text, stoi)]], dtype=torch.long, device=device)
        out = generate(engine, prompt, args.sample_chars, args.block, temperature=0.8, top_k=20,
                       generator=torch.Generator(device=device).manual_seed(args.seed + 3))
        if rank == 0:
            print("sample:\n" + "".join(chars[i] for i in out[0].tolist()))


if __name__ == "__main__":
    main()
