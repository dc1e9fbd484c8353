"""The main job's corpus: a text file, or this Python's own standard library
sources (every machine with Python has them), as printable ASCII. Also
read by bench/gpu/daemon.py, which hands the same characters to the C++
trainer."""
import glob
import os

# Characters outside printable ASCII become this one, keeping the vocabulary small.
UNKNOWN = "?"
PRINTABLE = frozenset(chr(c) for c in range(32, 127)) | {"\n"}


def load_corpus(path, max_chars):
    """(text, source): the corpus as printable ASCII, and where it came from."""
    raw, source = read_corpus(path, max_chars)
    return printable(raw)[0], source


def read_corpus(path, max_chars):
    """(text, source) as read, before printable()."""
    if path:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(max_chars), path
    stdlib = os.path.dirname(os.__file__)
    parts, size = [], 0
    for name in sorted(glob.glob(os.path.join(stdlib, "*.py"))):
        with open(name, encoding="utf-8", errors="replace") as f:
            parts.append(f.read())
        size += len(parts[-1])
        if size >= max_chars:
            break
    return "".join(parts)[:max_chars], f"{stdlib}/*.py"


def printable(text):
    """(text, replaced): tabs as 4 spaces, every other character outside
    printable ASCII as UNKNOWN, and how many were replaced (a non-English
    text can become mostly UNKNOWN: the trainer says so)."""
    text = text.replace("\t", "    ")
    out = "".join(c if c in PRINTABLE else UNKNOWN for c in text)
    return out, sum(1 for c in text if c not in PRINTABLE)
