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

The same goes for the GoogleTest names the docs cite as evidence
(`checkpoint.CheckpointSave.ASaveOverAWholeCheckpointKeepsItUntilTheNewOneIsWhole`,
`compressing_engine.CompressingResume.*`): a word that begins with a ctest
prefix some `gtest_discover_tests(... TEST_PREFIX "p.")` registers, followed
by `Suite.Name` (the suite begins with a capital letter) must name a
`TEST`/`TEST_F`/`TEST_P` under tests/, read as a glob. A parameterized test
(`TEST_P`) runs only as `Instance/Suite.Name/param`, the instance being an
`INSTANTIATE_TEST_SUITE_P(Instance, Suite, ...)`'s first argument, so it must
be cited with that instance (`device_engine.Placements/OnDevice.*ratio*`):
without it (`device_engine.OnDevice.*ratio*`) the name selects nothing in
ctest or --gtest_filter, and a plain test is never cited with one. It is
checked against the sources, not a build
tree, so a test a configuration leaves out (CUDA, MPI) still counts. Names
that only continue an earlier one (`.ASnapshotResumesTheErrorFeedbackToo`)
and tests registered with add_test (`python.checkpoints`, `kernels.cuda`)
are not checked: they read like job-script keys (`daemon.keep_state` is one,
beside the `daemon.*` tests) and file names (`daemon.md`), and many are
named from CMake variables (`python.${name}`) that only a configure resolves.

Usage: check_doc_paths.py --root <repository> [--self-test]
Exit status 0 when every path and test exists, 1 otherwise (each one printed).
"""

import argparse
import fnmatch
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


GTEST_MACRO_RE = re.compile(r"\b(TEST|TEST_F|TEST_P|TYPED_TEST|TYPED_TEST_P)\(\s*(\w+)\s*,\s*(\w+)\s*\)")
# The instance may be empty (`INSTANTIATE_TEST_SUITE_P(, Suite, ...)`): then
# the names have no instance part.
INSTANTIATE_RE = re.compile(r"\bINSTANTIATE_TEST_SUITE_P\(\s*(\w*)\s*,\s*(\w+)\s*,")
TEST_PREFIX_RE = re.compile(r'TEST_PREFIX\s+"(\w+)\."')


def source_files(root, names):
    """Files under root whose name matches one of names (globs), outside build trees and hidden folders."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and not d.startswith("build")
                       and d != "third_party"]
        for f in filenames:
            if any(fnmatch.fnmatchcase(f, n) for n in names):
                yield os.path.join(dirpath, f)


def gtest_prefixes(root):
    prefixes = set()
    for path in source_files(root, ("CMakeLists.txt", "*.cmake")):
        with open(path, encoding="utf-8", errors="replace") as f:
            prefixes.update(TEST_PREFIX_RE.findall(f.read()))
    return prefixes


def gtest_tests(root):
    """(instance, suite, name) of every test the sources define, as ctest names it.

    A plain test's instance is None; a TEST_P test is one entry per
    instantiation of its suite (none if it has none: then it never runs).
    """
    defined = set()
    instances = {}
    for path in source_files(os.path.join(root, "tests"), ("*.cpp", "*.cc", "*.h")):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        defined.update(GTEST_MACRO_RE.findall(text))
        for instance, suite in INSTANTIATE_RE.findall(text):
            instances.setdefault(suite, set()).add(instance or None)
    tests = set()
    for macro, suite, name in defined:
        for instance in instances.get(suite, ()) if macro == "TEST_P" else (None,):
            tests.add((instance, suite, name))
    return tests


def test_name_re(prefixes):
    if not prefixes:
        return None
    alts = "|".join(sorted((re.escape(p) for p in prefixes), key=len, reverse=True))
    # prefix . [Instance/] Suite . Name [/param]; not part of a longer word.
    return re.compile(r"(?<![\w.])(?:" + alts + r")\.(?:([\w*]+)/)?([A-Z][\w*]*)\.([\w*]+)(?:/[\w*]+)?(?![\w(])")


def test_exists(tests, instance, suite, name):
    # A glob in the name may reach into a parameter the sources do not spell
    # (`Placements/OnDevice.*opaque_*`): then only the part before it counts.
    if "*" in name:
        name = name.split("*", 1)[0] + "*"
    return any(fnmatch.fnmatchcase(s, suite) and fnmatch.fnmatchcase(n, name) and
               (i is None if instance is None else i is not None and fnmatch.fnmatchcase(i, instance))
               for i, s, n in tests)


def test_problem(tests, instance, suite, name):
    """Why a cited test selects nothing, or None when it names one."""
    if test_exists(tests, instance, suite, name):
        return None
    if instance is None:
        named = sorted({i for i, s, _ in tests if i is not None and fnmatch.fnmatchcase(s, suite)})
        if named:
            # The sources do not say which binary a prefix runs, so every instance of the suite is offered.
            return ("a parameterized (TEST_P) test, which runs only as Instance/Suite.Name: cite it with its "
                    "instance (" + " or ".join(f"{i}/{suite}" for i in named) + ")")
    return "which no TEST/TEST_F/TEST_P (and INSTANTIATE_TEST_SUITE_P) under tests/ defines"


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
    name_re = test_name_re(gtest_prefixes(root))
    tests = gtest_tests(root) if name_re else set()
    for rel in markdown_files(root):
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if IGNORE_MARK in line:
                    continue
                for path in candidates(line):
                    if not exists(root, path):
                        problems.append(f"{rel}:{lineno}: names `{path}`, which is not in the tree")
                if name_re:
                    for m in name_re.finditer(line):
                        why = test_problem(tests, *m.groups())
                        if why:
                            problems.append(f"{rel}:{lineno}: names the test `{m.group(0)}`, {why}")
    return problems


def self_test():
    """The check must catch a stale path and pass the forms it accepts."""
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "engine", "memory"))
        for name in ("arena.cpp", "arena.h"):
            open(os.path.join(tmp, "engine", "memory", name), "w").close()
        os.makedirs(os.path.join(tmp, "libzerod", "src"))
        open(os.path.join(tmp, "libzerod", "src", "remote_model.cpp"), "w").close()
        os.makedirs(os.path.join(tmp, "tests"))
        with open(os.path.join(tmp, "tests", "CMakeLists.txt"), "w") as f:
            f.write('gtest_discover_tests(checkpoint_test TEST_PREFIX "checkpoint." DISCOVERY_TIMEOUT 60)\n')
        with open(os.path.join(tmp, "tests", "checkpoint_test.cpp"), "w") as f:
            f.write("TEST(CheckpointSave, KeepsTheOld) {}\nTEST_P(OnDevice, Works) {}\n"
                    "INSTANTIATE_TEST_SUITE_P(\n    Placements, OnDevice, ::testing::Values(1));\n"
                    "TEST_P(Unplaced, NeverRuns) {}\n")
        good = ("`engine/memory/arena.*`, engine/memory/, (engine/memory/arena.h).\n"
                "engine/{memory}/ libzerod/src/remote*; /usr/include/zerod/x.h sub/include/zerod/k.h\n"
                "see engine/.\n"
                "abi/old.h <!-- doc-paths: ignore -->\n"
                "(`checkpoint.CheckpointSave.KeepsTheOld`, `.KeepsTheOld`), checkpoint.CheckpointSave.*;\n"
                "`checkpoint.Placements/OnDevice.Works/fp32`, `checkpoint.Placements/OnDevice.*fp32*`,\n"
                "`checkpoint.save_state`, `zero.Stage.Key`, `python.checkpoints`, `checkpoint.Module(x)`.\n"
                "`checkpoint.Old.Name` <!-- doc-paths: ignore -->\n")
        # A TEST_P test without its instance selects nothing; a plain test
        # with one, or a suite never instantiated, neither.
        bad = ("the arena is engine/arena.cpp and the library abi/src/, protocol/{proto,transport}/\n"
               "`checkpoint.CheckpointSave.Gone`, checkpoint.Renamed.*, `checkpoint.Inst/OnDevice.Fails/x`\n"
               "`checkpoint.OnDevice.*fp32*`, `checkpoint.OnDevice.Works`, `checkpoint.Other/OnDevice.Works`,\n"
               "`checkpoint.Placements/CheckpointSave.KeepsTheOld`, `checkpoint.Unplaced.NeverRuns`\n")
        with open(os.path.join(tmp, "good.md"), "w") as f:
            f.write(good)
        if check(tmp):
            print("self-test: the accepted forms were reported:", *check(tmp), sep="\n  ")
            return 1
        with open(os.path.join(tmp, "bad.md"), "w") as f:
            f.write(bad)
        found = check(tmp)
        want = ["engine/arena.cpp", "abi/src/", "protocol/{proto,transport}/", "checkpoint.CheckpointSave.Gone",
                "checkpoint.Renamed.*", "checkpoint.Inst/OnDevice.Fails/x", "checkpoint.OnDevice.*fp32*",
                "checkpoint.OnDevice.Works", "checkpoint.Other/OnDevice.Works",
                "checkpoint.Placements/CheckpointSave.KeepsTheOld", "checkpoint.Unplaced.NeverRuns"]
        missing = [w for w in want if not any(f"`{w}`" in p for p in found)]
        if missing or len(found) != len(want):
            print("self-test: expected reports for", want, "got:", *found, sep="\n  ")
            return 1
        if not any("`checkpoint.OnDevice.Works`" in p and "Placements/OnDevice" in p for p in found):
            print("self-test: a TEST_P test cited without its instance is not told which to use:", *found,
                  sep="\n  ")
            return 1
    print("self-test: stale paths caught, accepted forms pass (test names too, TEST_P with their instance)")
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
        print(f"{len(problems)} path(s) or test(s) named in the Markdown files do not exist "
              "(fix the text, or mark a deliberate one with <!-- doc-paths: ignore -->)")
        return 1
    print("every path named in the Markdown files exists, and every GoogleTest name they cite")
    return 0


if __name__ == "__main__":
    sys.exit(main())
