#!/usr/bin/env python3
"""Checks that every repository path the Markdown files name exists.

The docs and ARCHITECTURE.md name files so that a reader can check each
statement (`engine/memory/arena.*`, `libzerod/src/remote*`,
`protocol/transport/frame.h`). When files move, those names go stale
silently; this check fails naming file:line and the path.

A path is a word that begins with one of the tree's top-level folders
(ROOTS) and is not itself part of a longer path (so `/usr/include/zerod`
or `kit/include/zerod/kit/` are not read as `include/...`). It matches if
the tree has it as a file or folder, read as a glob (`memory.*`,
`remote*`, `engine/*.h`) and with `{a,b}` expanded. Trailing punctuation
and `#anchors` are dropped. A path that does not exist on purpose (an
example of a user's own file, an old layout named as history) can be
allowed with the comment `<!-- doc-paths: ignore -->` on its line.

Usage: check_doc_paths.py --root <repository> [--self-test]
Exit status 0 when every path exists, 1 otherwise (each one printed).
"""

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile

# The top-level folders whose paths the docs name. `abi/` is gone (it became
# include/ and libzerod/); it is listed so that a leftover mention fails.
ROOTS = ("abi", "base", "bench", "bindings", "cmake", "daemon", "docs", "engine", "examples", "include",
         "kit", "libzerod", "plugins", "protocol", "scripting", "scripts", "tests")

IGNORE_MARK = "doc-paths: ignore"

# A root at the start of a word: not after a letter, digit, `/`, `.`, `-`,
# `_`, `$`, `~`, `@` or `:` (which would make it part of a longer path, a
# variable, a URL or a package name).
PATH_RE = re.compile(r"(?<![\w/.\-$~@:])(?:" + "|".join(ROOTS) + r")/[\w.*{},/\-]*")
TRAILING = ".,:;)"


def expand_braces(path):
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    out = []
    for alt in m.group(1).split(","):
        out.extend(expand_braces(path[:m.start()] + alt + path[m.end():]))
    return out


def exists(root, path):
    for p in expand_braces(path):
        full = os.path.join(root, p)
        if any(c in p for c in "*?["):
            if glob.glob(full):
                continue
            return False
        if not os.path.exists(full):
            return False
    return True


def candidates(line):
    for m in PATH_RE.finditer(line):
        path = m.group(0).split("#", 1)[0]
        while path and path[-1] in TRAILING:
            path = path[:-1]
        # A sentence that ends right after a folder: "... in engine/."
        if path.endswith("/."):
            path = path[:-1]
        # `engine/{memory,optimizer}/` with an unbalanced brace is prose, not a path.
        if path.count("{") != path.count("}"):
            continue
        yield path


def markdown_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "*.md"], check=True, capture_output=True, text=True)
        files = [f for f in out.stdout.splitlines() if f]
    except (OSError, subprocess.CalledProcessError):
        files = []
    if not files:  # a copy without .git (an unpacked tarball)
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "build"]
            files += [os.path.relpath(os.path.join(dirpath, f), root) for f in filenames if f.endswith(".md")]
    # Vendored or generated trees are not ours to check.
    return sorted(f for f in files if "/third_party/" not in f and not f.startswith("build"))


def check(root):
    problems = []
    for rel in markdown_files(root):
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if IGNORE_MARK in line:
                    continue
                for path in candidates(line):
                    if not exists(root, path):
                        problems.append(f"{rel}:{lineno}: names `{path}`, which is not in the tree")
    return problems


def self_test():
    """The check must catch a stale path and pass the forms it accepts."""
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "engine", "memory"))
        for name in ("arena.cpp", "arena.h"):
            open(os.path.join(tmp, "engine", "memory", name), "w").close()
        os.makedirs(os.path.join(tmp, "libzerod", "src"))
        open(os.path.join(tmp, "libzerod", "src", "remote_model.cpp"), "w").close()
        good = ("`engine/memory/arena.*`, engine/memory/, (engine/memory/arena.h).\n"
                "engine/{memory}/ libzerod/src/remote*; /usr/include/zerod/x.h sub/include/zerod/k.h\n"
                "see engine/.\n"
                "abi/old.h <!-- doc-paths: ignore -->\n")
        bad = "the arena is engine/arena.cpp and the library abi/src/, protocol/{proto,transport}/\n"
        with open(os.path.join(tmp, "good.md"), "w") as f:
            f.write(good)
        if check(tmp):
            print("self-test: the accepted forms were reported:", *check(tmp), sep="\n  ")
            return 1
        with open(os.path.join(tmp, "bad.md"), "w") as f:
            f.write(bad)
        found = check(tmp)
        want = ["engine/arena.cpp", "abi/src/", "protocol/{proto,transport}/"]
        missing = [w for w in want if not any(f"`{w}`" in p for p in found)]
        if missing or len(found) != len(want):
            print("self-test: expected reports for", want, "got:", *found, sep="\n  ")
            return 1
    print("self-test: stale paths caught, accepted forms pass")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    problems = check(os.path.abspath(args.root))
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} path(s) named in the Markdown files do not exist "
              "(fix the text, or mark a deliberate one with <!-- doc-paths: ignore -->)")
        return 1
    print("every path named in the Markdown files exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
