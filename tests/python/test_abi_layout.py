"""The ctypes mirrors cannot drift from zerod.h: a C program compiled
against the header prints every struct's size and field offsets, every
enumerator's value, and the test compares them with the Python side. Every
exported call has a prototype."""
import ctypes
import os
import re
import shutil
import subprocess

import pytest

import zerod
from zerod import _lib, _structs, constants, errors

from conftest import ROOT

HEADER = os.path.join(ROOT, "include", "zerod", "zerod.h")


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory):
    cc = os.environ.get("CC") or shutil.which("cc")
    if not cc:
        pytest.skip("no C compiler (cc) to compile the layout probe")
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include <zerod/zerod.h>', "int main(void) {"]
    for cls, cname in _structs.C_NAMES.items():
        lines.append(f'  printf("{cname} sizeof %zu\\n", sizeof({cname}));')
        for field, _ in cls._fields_:
            lines.append(f'  printf("{cname} {field} %zu\\n", offsetof({cname}, {field}));')
    for name in enumerators():
        lines.append(f'  printf("enum {name} %lld\\n", (long long)({name}));')
    lines += ["  return 0;", "}"]
    tmp = tmp_path_factory.mktemp("layout")
    src, exe = tmp / "layout.c", tmp / "layout"
    src.write_text("\n".join(lines) + "\n")
    subprocess.run([cc, "-std=c11", "-I", os.path.dirname(os.path.dirname(HEADER)), str(src), "-o", str(exe)],
                   check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    layout = {}
    for line in out.splitlines():
        a, b, value = line.split()
        layout[(a, b)] = int(value)
    return layout


def enumerators():
    """Every ZD_* enumerator the header defines in an enum block."""
    text = open(HEADER).read()
    names = []
    for block in re.findall(r"enum\s*\{(.*?)\}", text, re.S):
        block = re.sub(r"/\*.*?\*/", "", block, flags=re.S)
        names += re.findall(r"\b(ZD_[A-Z0-9_]+)\s*=", block)
    return names


def test_every_struct_matches_the_header(c_layout):
    for cls, cname in _structs.C_NAMES.items():
        assert ctypes.sizeof(cls) == c_layout[(cname, "sizeof")], cname
        for field, _ in cls._fields_:
            assert getattr(cls, field).offset == c_layout[(cname, field)], f"{cname}.{field}"


def test_every_header_struct_is_mirrored():
    text = open(HEADER).read()
    declared = set(re.findall(r"typedef struct (zd_\w+) \{", text))
    assert declared == set(_structs.C_NAMES.values())


def test_struct_size_is_filled_in():
    for cls in _structs.C_NAMES:
        assert cls().struct_size == ctypes.sizeof(cls)


def test_every_exported_call_has_a_prototype():
    text = open(HEADER).read()
    calls = set(re.findall(r"ZD_API\s+[\w\s\*]+?\b(zd_\w+)\s*\(", text))
    assert calls and calls == set(_lib.PROTOTYPES)


def test_constants_match_the_header(c_layout):
    python = {
        "ZD_ABI_VERSION_MAJOR": _lib.ABI_MAJOR, "ZD_ABI_VERSION_MINOR": _lib.ABI_MINOR,
        "ZD_MAX_DIMS": _structs.MAX_DIMS, "ZD_MAX_STATE_SLOTS": _structs.MAX_STATE_SLOTS,
        "ZD_MODEL_ALLOW_SCRIPT_IO": constants.MODEL_ALLOW_SCRIPT_IO, "ZD_VIEW_READ_ONLY": constants.VIEW_READ_ONLY,
        "ZD_DEVICE_CPU": constants.DEVICE_CPU, "ZD_DEVICE_CUDA": constants.DEVICE_CUDA,
        "ZD_STEP_BOUNDARY": constants.STEP_BOUNDARY, "ZD_STEP_APPLIED": constants.STEP_APPLIED,
        "ZD_STEP_SKIPPED": constants.STEP_SKIPPED, "ZD_TIER_COUNT": len(constants.Tier),
        "ZD_MEM_KIND_COUNT": len(constants.MemKind) - 1,
        "ZD_PROGRESS_HAS_LOSS": constants.PROGRESS_HAS_LOSS,
    }
    for d in constants.Dtype:
        python[f"ZD_DTYPE_{d.name}"] = d
    for t in constants.Tier:
        python[f"ZD_TIER_{t.name}"] = t
    for k in constants.MemKind:
        python[f"ZD_MEM_{k.name}"] = k
    for name in dir(errors):
        if name == "OK" or name.startswith("ERR_"):
            python[f"ZD_{name}"] = getattr(errors, name)
    header = {name: c_layout[("enum", name)] for name in enumerators()}
    for name, value in re.findall(r"#define (ZD_[A-Z_]+) (\d+)\n", open(HEADER).read()):
        header[name] = int(value)
    assert set(python) == set(header), set(python) ^ set(header)
    for name, value in header.items():
        assert int(python[name]) == value, name
    for name in dir(errors):
        if name.startswith("ERR_"):
            status = getattr(errors, name)
            assert zerod.status_name(status) == f"ZD_{name}"
            assert errors.BY_STATUS[status].status == status
