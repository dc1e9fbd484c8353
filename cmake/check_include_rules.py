#!/usr/bin/env python3
"""Checks every #include in the source tree against cmake/include_rules.txt.

Usage: check_include_rules.py [--rules FILE] [--root DIR] [--graph]

Each source file belongs to the area of the longest `area` prefix that
matches its path. Each #include is resolved the way the compiler would
(quoted: the including file's folder first; then the `search` folders that
apply to the including file, in the order the rules file gives them) and the
included file's area must be one that the includer's area may `allow`, or
the pair must match a `bend` line. An include that names a file of the tree
yet resolves to nothing, or a source file that is in no area, is an error
too, so a new folder cannot slip past the rules unseen.

Exit status 0 when every include keeps the rules; 1 with one line per broken
include ("file:line: includes X (area a -> area b): rule"); 2 when the rules
file itself is wrong. --graph prints the area-to-area edges with counts
(a reading aid, not a check).
"""

import argparse
import fnmatch
import os
import re
import sys

SOURCE_SUFFIXES = (".h", ".hpp", ".c", ".cc", ".cpp", ".cu", ".cuh", ".inc")
# Build trees, caches and fetched dependencies are not the project's source.
SKIPPED_DIRS = {".git", "__pycache__", "target", "node_modules", "venv", ".venv"}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


class RulesError(Exception):
    pass


class Rules:
    def __init__(self):
        self.areas = []        # (prefix or glob, name), longest first after load
        self.area_names = set()
        self.search = []       # (folder, [includer prefixes] or None for all)
        self.generated = {}    # include name -> folder it is generated for
        self.allow = {}        # area -> set of areas it may include
        self.bends = []        # [from glob, to glob, issue, reason, times used, rules line]

    def area_of(self, path):
        for spec, name in self.areas:
            if "*" in spec or "?" in spec:
                if fnmatch.fnmatchcase(path, spec):
                    return name
            elif path == spec.rstrip("/") or path.startswith(spec):
                return name
        return None


def load_rules(path, name=None):
    rules = Rules()
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            words = line.split()
            kind, args = words[0], words[1:]
            where = f"{name or path}:{number}"
            if kind == "area":
                if len(args) < 2:
                    raise RulesError(f"{where}: `area <name> <prefix>...` needs a name and a prefix")
                rules.area_names.add(args[0])
                for spec in args[1:]:
                    if "*" not in spec and "?" not in spec and not spec.endswith("/"):
                        spec += "/"
                    rules.areas.append((spec, args[0]))
            elif kind == "search":
                if not args:
                    raise RulesError(f"{where}: `search <folder> [<includer prefix>...]` needs a folder")
                rules.search.append((args[0].rstrip("/"), args[1:] or None))
            elif kind == "generated":
                if len(args) != 2:
                    raise RulesError(f"{where}: `generated <include name> <folder>` takes two words")
                rules.generated[args[0]] = args[1].rstrip("/")
            elif kind == "allow":
                if len(args) < 1:
                    raise RulesError(f"{where}: `allow <area> <area>...` needs an area")
                rules.allow.setdefault(args[0], set()).update(args[1:])
            elif kind == "bend":
                # bend <from glob> <to glob> <issue> <reason...>
                if len(args) < 4 or not re.fullmatch(r"issue-(\d+|none)", args[2]):
                    raise RulesError(f"{where}: `bend <from glob> <to glob> issue-<n> <reason>` "
                                     "needs both globs, the issue that will remove it and a reason")
                rules.bends.append([args[0], args[1], args[2], " ".join(args[3:]), 0, where])
            else:
                raise RulesError(f"{where}: unknown rule kind `{kind}`")
    for area in list(rules.allow):
        if "*" in rules.allow[area]:
            rules.allow[area] = set(rules.area_names)
        for named in [area, *rules.allow[area]]:
            if named not in rules.area_names:
                raise RulesError(f"{name or path}: `allow` names area `{named}`, which no `area` line defines")
    rules.areas.sort(key=lambda item: len(item[0]), reverse=True)
    return rules


def source_files(root):
    files = []
    for folder, dirs, names in os.walk(root):
        rel_folder = os.path.relpath(folder, root)
        if rel_folder == ".":
            # Build trees (build/, build-asan/, ...) and other top-level outputs.
            dirs[:] = [d for d in dirs if not d.startswith("build") and d not in ("out",)]
        # A build tree of any name (its generated sources are not the tree's).
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS
                         and not os.path.isfile(os.path.join(folder, d, "CMakeCache.txt")))
        for name in sorted(names):
            if name.endswith(SOURCE_SUFFIXES):
                files.append(os.path.normpath(os.path.join(rel_folder, name)))
    return files


def resolve(rules, root, includer, quote, name, known):
    """The tree path an include names, or None for a header from outside the tree."""
    candidates = []
    if quote == '"':
        candidates.append(os.path.join(os.path.dirname(includer), name))
    for folder, prefixes in rules.search:
        if prefixes is None or any(includer.startswith(p) for p in prefixes):
            candidates.append(os.path.join(folder, name))
    for candidate in candidates:
        candidate = os.path.normpath(candidate)
        if candidate in known or os.path.isfile(os.path.join(root, candidate)):
            return candidate
    if name in rules.generated:
        return os.path.join(rules.generated[name], name)
    return None


def check(rules_path, root):
    """(problems, edges, summary) for the tree at root under the rules file."""
    rules_name = os.path.relpath(rules_path, root) if rules_path.startswith(root + os.sep) else rules_path
    rules = load_rules(rules_path, rules_name)
    files = source_files(root)
    known = set(files)
    basenames = {os.path.basename(f) for f in files}
    problems = []
    # A search folder that is gone (moved, say) would quietly resolve less.
    for folder, _prefixes in rules.search:
        if not os.path.isdir(os.path.join(root, folder)):
            problems.append(f"{rules_name}: `search {folder}`: no such folder; update the line")
    edges = {}
    checked = 0
    for path in files:
        source_area = rules.area_of(path)
        if source_area is None:
            problems.append(f"{path}: in no area of {rules_name}; add an `area` line for its folder")
            continue
        allowed = rules.allow.get(source_area, set()) | {source_area}
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                match = INCLUDE.match(line)
                if not match:
                    continue
                quote, name = match.groups()
                target = resolve(rules, root, path, quote, name, known)
                if target is None:
                    # <vector>, <cuda_runtime.h>: outside the tree. A quoted
                    # name that a tree file carries but no search folder
                    # reaches means this checker resolves less than the build.
                    if quote == '"' and os.path.basename(name) in basenames:
                        problems.append(f"{path}:{number}: includes \"{name}\", which no `search` "
                                        f"folder of {rules_name} reaches for this file")
                    continue
                checked += 1
                target_area = rules.area_of(target)
                edges[(source_area, target_area)] = edges.get((source_area, target_area), 0) + 1
                if target_area in allowed:
                    continue
                bend = next((b for b in rules.bends
                             if fnmatch.fnmatchcase(path, b[0]) and fnmatch.fnmatchcase(target, b[1])), None)
                if bend is not None:
                    bend[4] += 1
                    continue
                may = ", ".join(sorted(allowed))
                problems.append(f"{path}:{number}: includes {target} ({source_area} -> {target_area}): "
                                f"{source_area} may include only {may}")

    # A bend nothing uses any more is a rule that allows more than the code needs.
    for from_glob, to_glob, issue, _reason, used, where in rules.bends:
        if used == 0:
            problems.append(f"{where}: bend `{from_glob} -> {to_glob}` ({issue}) matches no include "
                            "any more; delete its line")
    bends = sum(b[4] for b in rules.bends)
    summary = (f"{checked} includes of {len(files)} files keep {rules_name} "
               f"({bends} through {len(rules.bends)} known bends)")
    return problems, edges, summary


# Each mutation adds one thing to a scratch copy of the tree that the rules
# must catch, and the text its one problem line must contain. Files are added
# rather than edited, so the mutations hold whatever the tree's files become.
MUTATIONS = [
    ("engine/zz_mutation.cpp", '#include "error.h"\n#include "transport/frame.h"\n',
     "engine/zz_mutation.cpp:2: includes protocol/transport/frame.h (engine -> transport)"),
    ("engine/observe/zz_mutation.h", '#include "server.h"\n',
     "engine/observe/zz_mutation.h:1: includes daemon/server/server.h (engine -> server)"),
    ("engine/zz_mutation.cpp", '#include "job_script.h"\n',
     "engine/zz_mutation.cpp:1: includes scripting/job_script.h (engine -> scripting)"),
    ("protocol/transport/zz_mutation.cpp", '#include "error.h"\n\n#include "model/model.h"\n',
     "protocol/transport/zz_mutation.cpp:3: includes engine/model/model.h (transport -> engine)"),
    ("daemon/launcher/zz_mutation.cpp", '#include "log.h"\n#include "model/registry.h"\n',
     "daemon/launcher/zz_mutation.cpp:2: includes engine/model/registry.h (launcher -> engine)"),
    ("protocol/proto/zz_mutation.cpp", '#include "model/registry.h"\n',
     "protocol/proto/zz_mutation.cpp:1: includes engine/model/registry.h (proto -> engine)"),
    ("plugins/optimizers/zz/zz_mutation.cpp", '#include <zerod/zerod_plugin.h>\n#include "error.h"\n',
     "plugins/optimizers/zz/zz_mutation.cpp:2: includes base/error.h (plugins -> base)"),
    ("plugins/comm/common/zz_mutation.h", '#include "model/model.h"\n',
     "plugins/comm/common/zz_mutation.h:1: includes engine/model/model.h (plugin_kit -> engine)"),
    ("kit/zz_mutation.h", '#include <zerod/zerod.h>\n',
     "kit/zz_mutation.h:1: includes include/zerod/zerod.h (kit -> abi)"),
    ("examples/zz_mutation.c", '#include "model/model.h"\n',
     "examples/zz_mutation.c:1: includes engine/model/model.h (examples -> engine)"),
    ("base/zz_mutation.cpp", '#include "memory/arena.h"\n',
     "base/zz_mutation.cpp:1: includes engine/memory/arena.h (base -> engine)"),
    ("engine/zz_mutation.cpp", '#include "onebit_reference.h"\n',
     "engine/zz_mutation.cpp:1: includes \"onebit_reference.h\", which no `search` folder"),
    ("zz_new_folder/zz_mutation.cpp", "int x;\n", "zz_new_folder/zz_mutation.cpp: in no area"),
    # A bend nobody needs any more.
    ("RULES", "bend engine/* daemon/server/* issue-34 a bend that nothing uses\n",
     "bend `engine/* -> daemon/server/*` (issue-34) matches no include any more"),
]


def mutation_test(rules_path, root):
    """Runs MUTATIONS over scratch copies of the tree; 0 when each is caught."""
    import shutil
    import tempfile

    failures = []
    with tempfile.TemporaryDirectory(prefix="zerod-include-rules-") as scratch:
        for path in source_files(root):
            os.makedirs(os.path.join(scratch, os.path.dirname(path)), exist_ok=True)
            shutil.copyfile(os.path.join(root, path), os.path.join(scratch, path))
        with open(rules_path, encoding="utf-8") as f:
            rules_text = f.read()
        scratch_rules = os.path.join(scratch, "include_rules.txt")

        def run(extra_rules=""):
            with open(scratch_rules, "w", encoding="utf-8") as f:
                f.write(rules_text + extra_rules)
            return check(scratch_rules, scratch)[0]

        baseline = run()
        if baseline:
            failures.append("the unchanged copy already breaks the rules:\n  " + "\n  ".join(baseline))
        for path, text, expected in MUTATIONS:
            if path == "RULES":
                problems = run(text)
            else:
                full = os.path.join(scratch, path)
                os.makedirs(os.path.dirname(full), exist_ok=True)
                with open(full, "w", encoding="utf-8") as f:
                    f.write(text)
                try:
                    problems = run()
                finally:
                    os.remove(full)
            new = [p for p in problems if p not in baseline]
            if len(new) == 1 and expected in new[0]:
                print(f"caught: {new[0]}")
            else:
                failures.append(f"adding {path} ({text.strip()!r}) should report exactly one problem "
                                f"containing {expected!r}; reported: {new}")
        # The bends are needed: without the one for the client's mirror
        # registry, its include fails.
        without = "\n".join(l for l in rules_text.splitlines()
                            if not l.startswith("bend libzerod/src/remote* engine/model/registry.h"))
        with open(scratch_rules, "w", encoding="utf-8") as f:
            f.write(without + "\n")
        problems = check(scratch_rules, scratch)[0]
        if without == rules_text.rstrip("\n") or not any(
                p.startswith("libzerod/src/remote") and "engine/model/registry.h (libzerod_client -> engine)" in p
                for p in problems):
            failures.append(f"deleting the remote* -> registry.h bend should fail libzerod/src/remote*; reported: {problems}")
        else:
            print("caught: deleting the remote* -> registry.h bend fails libzerod/src/remote*")
    for failure in failures:
        print(f"MISSED: {failure}")
    if failures:
        print(f"include rules: {len(failures)} mutation(s) not caught", file=sys.stderr)
        return 1
    print(f"include rules: all {len(MUTATIONS) + 1} mutations caught")
    return 0


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rules", default=os.path.join(here, "include_rules.txt"))
    parser.add_argument("--root", default=os.path.dirname(here))
    parser.add_argument("--graph", action="store_true", help="print the area-to-area edges too")
    parser.add_argument("--mutation-test", action="store_true",
                        help="check that forbidden includes added to a scratch copy are caught")
    options = parser.parse_args()
    rules_path = os.path.abspath(options.rules)
    root = os.path.abspath(options.root)

    try:
        if options.mutation_test:
            return mutation_test(rules_path, root)
        problems, edges, summary = check(rules_path, root)
    except (OSError, RulesError) as e:
        print(f"include rules: {e}", file=sys.stderr)
        return 2

    if options.graph:
        for (a, b), count in sorted(edges.items()):
            print(f"{a:>15} -> {b:<15} {count}")
    for problem in problems:
        print(problem)
    if problems:
        print(f"include rules: {len(problems)} problem(s); the rules are in {rules_path} "
              "(what may include what: ARCHITECTURE.md §13)", file=sys.stderr)
        return 1
    print(f"include rules: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
