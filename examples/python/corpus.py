"""The main job's corpus: a text file, or this Python's own standard library
sources (every machine with Python has them), as printable ASCII. Also
read by bench/gpu/daemon.py, which hands the same characters to the C++
trainer."""
import glob
import os

# Characters outside printable ASCII become this one, keeping the vocabulary small.
UNKNOWN = "?"


def load_corpus(path, max_chars):
    if path:
        with open(path, encoding="utf-8", errors="replace") as f:
            text, source = f.read(max_chars), path
    else:
        stdlib = os.path.dirname(os.__file__)
        parts, size = [], 0
        for name in sorted(glob.glob(os.path.join(stdlib, "*.py"))):
            with open(name, encoding="utf-8", errors="replace") as f:
                parts.append(f.read())
            size += len(parts[-1])
            if size >= max_chars:
                break
        text, source = "".join(parts)[:max_chars], f"{stdlib}/*.py"
    keep = {chr(c) for c in range(32, 127)} | {"\n"}
    text = "".join(c if c in keep else UNKNOWN for c in text.replace("\t", "    "))
    return text, source
