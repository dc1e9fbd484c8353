#!/usr/bin/env python3
"""Holds bindings/julia/src/generated.jl to zerod.h, without Julia.

No Julia runtime could be installed where zerod is developed, so the Julia
binding has never run. What can be checked without it is checked here, each
against its own source of truth:

 1. regenerated: bindings/julia/gen/generate.py run on the header now writes
    exactly the committed file (a header change without regeneration fails);
 2. names, both ways: the structs, fields (in order), constants, typedefs,
    handles and calls of the header (read here with simple patterns,
    independently of the generator) are those of generated.jl;
 3. layouts: every struct's size and each field's offset and size, computed
    from the Julia declarations by Julia's isbits layout rules (those of the C
    ABI), and the table the generator recorded (`_LAYOUT`), are what the C
    compiler says (sizeof, _Alignof, offsetof); Julia inserts no padding of
    its own (C's padding is explicit `_padN` fields);
 4. types: the C type quoted beside each field, typedef and call is the
    header's (checked by the compiler with _Generic, so `char*` for `const
    char*` fails), and each Julia type is that C type's Julia counterpart by
    the rules written out in JULIA_TYPES below;
 5. values: each constant is a C `int` (the Julia side's Int32) with the
    compiler's value; each keyword constructor's defaults are the bytes of
    the struct's ZD_*_INIT macro;
 6. symbols: every zd_* symbol the built libzerod exports (libzerod/libzerod.map
    exports zd_* and nothing else) has a wrapper, each wrapper a symbol, and
    bind!() binds each.

    check_generated.py --root SRC --lib path/to/libzerod.so [--cc cc] [--nm nm]
                       [--header H] [--generated F]

Exits 0 when everything holds; otherwise prints every difference and exits 1.
Standard library only.
"""
import argparse
import difflib
import os
import re
import shutil
import struct as pystruct
import subprocess
import sys
import tempfile

failures = []


def fail(msg):
    failures.append(msg)


# ---------------------------------------------------------------------------
# The header, read with simple patterns (independently of the generator)
# ---------------------------------------------------------------------------

def strip_c_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def read_header(path):
    text = strip_c_comments(open(path).read())
    flat = " ".join(text.split())
    h = {"structs": {}, "constants": set(), "functions": set(), "typedefs": {}, "handles": set()}
    for m in re.finditer(r"typedef struct (\w+) \{(.*?)\} \1;", flat):
        fields = []
        for decl in m.group(2).split(";"):
            decl = re.sub(r"\[[^\]]*\]", "", decl).strip()
            if decl:
                fields.append(re.search(r"(\w+)$", decl).group(1))
        h["structs"][m.group(1)] = fields
    for m in re.finditer(r"typedef struct (\w+) \1;", flat):
        h["handles"].add(m.group(1))
    for m in re.finditer(r"typedef (\w+) (zd_\w+);", flat):
        h["typedefs"][m.group(2)] = m.group(1)
    for m in re.finditer(r"^\s*#\s*define\s+(ZD_\w+)\s+\S", text, flags=re.M):
        if not m.group(1).endswith("_INIT") and m.group(1) != "ZD_API":
            h["constants"].add(m.group(1))
    for block in re.findall(r"\benum\s*\{(.*?)\}", text, flags=re.S):
        h["constants"].update(re.findall(r"\b(ZD_\w+)\s*=", block))
    for m in re.finditer(r"ZD_API [^;(]*?\b(zd_\w+)\s*\(", flat):
        h["functions"].add(m.group(1))
    return h


# ---------------------------------------------------------------------------
# generated.jl, read as text
# ---------------------------------------------------------------------------

def split_commas(s):
    """Splits at commas outside braces and parentheses."""
    out, depth, cur = [], 0, ""
    for c in s:
        if c in "{(":
            depth += 1
        elif c in "})":
            depth -= 1
        if c == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += c
    if cur.strip():
        out.append(cur.strip())
    return out


def read_julia(path):
    lines = open(path).read().split("\n")
    j = {"constants": {}, "aliases": {}, "handles": set(), "structs": {}, "inits": {}, "layout": {},
         "functions": {}, "bound": {}, "listed": [], "exports": set()}
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.fullmatch(r"const (ZD_\w+)\s*= Int32\((-?\d+)\)", line)
        if m:
            j["constants"][m.group(1)] = int(m.group(2))
        m = re.fullmatch(r"const (zd_\w+) = (\S+)  # typedef (.+) (zd_\w+)", line)
        if m:
            if m.group(1) != m.group(4):
                fail(f"generated.jl: the alias {m.group(1)} quotes the typedef of {m.group(4)}")
            j["aliases"][m.group(1)] = (m.group(2), m.group(3))
        m = re.fullmatch(r"mutable struct (\w+) end  # typedef struct (\w+) (\w+)", line)
        if m:
            j["handles"].add(m.group(1))
        m = re.fullmatch(r"struct (\w+)", line)
        if m:
            fields = []
            i += 1
            while lines[i] != "end":
                fm = re.fullmatch(r"    (\w+)::(.+?)\s+# (.+)", lines[i])
                if not fm:
                    fail(f"generated.jl:{i + 1}: cannot read the field `{lines[i]}`")
                else:
                    fields.append((fm.group(1), fm.group(2), fm.group(3)))
                i += 1
            j["structs"][m.group(1)] = fields
        m = re.fullmatch(r"# (ZD_\w+_INIT)", line)
        if m and i + 1 < len(lines):
            cm = re.fullmatch(r"(\w+)\(;", lines[i + 1])
            if cm:
                defaults = {}
                i += 2
                while not lines[i].startswith(")"):
                    dm = re.fullmatch(r"    (\w+) = (.+),", lines[i])
                    if not dm:
                        fail(f"generated.jl:{i + 1}: cannot read the default `{lines[i]}`")
                    else:
                        defaults[dm.group(1)] = dm.group(2)
                    i += 1
                am = re.fullmatch(r"\) = (\w+)\((.*)\)", lines[i])
                args = split_commas(am.group(2)) if am else None
                j["inits"][cm.group(1)] = (m.group(1), defaults, args)
        m = re.fullmatch(r"    \((zd_\w+), (\d+), (\d+), \((.*)\)\),", line)
        if m:
            fields = [(f, int(o), int(n)) for f, o, n in re.findall(r"\(:(\w+), (\d+), (\d+)\)", m.group(4))]
            j["layout"][m.group(1)] = (int(m.group(2)), int(m.group(3)), fields)
        m = re.fullmatch(r"# C: (.+)", line)
        if m:
            fm = re.fullmatch(r"function (\w+)\((.*)\)", lines[i + 1])
            cm = re.fullmatch(r"    ccall\(fp, (.+?), \((.*)\)((?:, \w+)*)\)", lines[i + 4]) if fm else None
            pm = re.fullmatch(r"    fp = _fp_(\w+)\[\]", lines[i + 2]) if fm else None
            if not (fm and cm and pm):
                fail(f"generated.jl:{i + 1}: the wrapper after `{line}` is not in the expected shape")
            else:
                params = [p for p in fm.group(2).split(", ") if p]
                types = split_commas(cm.group(2))
                passed = [a for a in cm.group(3).split(", ") if a]
                if pm.group(1) != fm.group(1):
                    fail(f"generated.jl: {fm.group(1)} calls through _fp_{pm.group(1)}")
                if passed != params:
                    fail(f"generated.jl: {fm.group(1)} passes ({', '.join(passed)}) for ({', '.join(params)})")
                j["functions"][fm.group(1)] = (m.group(1), params, cm.group(1), types)
        m = re.fullmatch(r"    _fp_(\w+)\[\] = _lookup\(lib, :(\w+)\)", line)
        if m:
            j["bound"][m.group(1)] = m.group(2)
        m = re.fullmatch(r"    :(zd_\w+),", line)
        if m:
            j["listed"].append(m.group(1))
        if line.startswith("export "):
            block = line[len("export "):]
            while block.rstrip().endswith(","):
                i += 1
                block += lines[i]
            j["exports"] = {n.strip() for n in block.split(",")}
        i += 1
    return j


# ---------------------------------------------------------------------------
# Julia's layout of the declared structs
# ---------------------------------------------------------------------------

JULIA_SCALARS = {"Int8": 1, "UInt8": 1, "Int16": 2, "UInt16": 2, "Int32": 4, "UInt32": 4, "Float32": 4,
                 "Int64": 8, "UInt64": 8, "Float64": 8, "Csize_t": 8, "Cstring": 8}


def julia_size_align(t, j):
    """Size and alignment of a Julia isbits type on a 64-bit machine: a
    primitive type is aligned to its size, a tuple or struct to its
    largest field (Julia's rules, which are the C ABI's)."""
    if t in JULIA_SCALARS:
        return JULIA_SCALARS[t], JULIA_SCALARS[t]
    if re.fullmatch(r"Ptr\{.+\}", t):
        return 8, 8
    m = re.fullmatch(r"NTuple\{(\d+), (.+)\}", t)
    if m:
        size, align = julia_size_align(m.group(2), j)
        return int(m.group(1)) * size, align
    if t in j["aliases"]:
        return julia_size_align(j["aliases"][t][0], j)
    if t in j["structs"]:
        size, align, _ = julia_layout(t, j)
        return size, align
    raise ValueError(f"no Julia layout rule for `{t}`")


def julia_layout(name, j):
    """(size, alignment, {field: (offset, size)}, implicit padding found)."""
    offset, max_align, fields, implicit = 0, 1, {}, []
    for fname, t, _ in j["structs"][name]:
        size, align = julia_size_align(t, j)
        aligned = (offset + align - 1) // align * align
        if aligned != offset:
            implicit.append(f"{aligned - offset} bytes before {fname}")
        fields[fname] = (aligned, size)
        offset = aligned + size
        max_align = max(max_align, align)
    size = (offset + max_align - 1) // max_align * max_align
    if size != offset:
        implicit.append(f"{size - offset} bytes at the end")
    for p in implicit:
        fail(f"generated.jl: Julia would pad {name} by itself ({p}); the generator writes C's padding as _padN fields")
    return size, max_align, fields


# ---------------------------------------------------------------------------
# C types and their Julia counterparts
# ---------------------------------------------------------------------------

# The counterpart of each C scalar (Julia's own C type aliases agree:
# Cint == Int32, Clonglong == Int64, Cdouble == Float64, Csize_t == UInt).
JULIA_TYPES = {"int8_t": "Int8", "uint8_t": "UInt8", "int16_t": "Int16", "uint16_t": "UInt16",
               "int32_t": "Int32", "uint32_t": "UInt32", "int64_t": "Int64", "uint64_t": "UInt64",
               "size_t": "Csize_t", "float": "Float32", "double": "Float64", "void": "Cvoid",
               "char": "UInt8"}


def parse_c_decl(decl):
    """`const char* name[N]` -> (base, base_const, pointer levels, name, array text)."""
    decl = " ".join(decl.split())
    array = None
    m = re.fullmatch(r"(.*?)\s*\[(.+)\]", decl)
    if m:
        decl, array = m.group(1), m.group(2)
    m = re.fullmatch(r"(const )?(\w+)\s*(\**)\s*(\w+)", decl)
    if not m:
        raise ValueError(f"cannot read the C declaration `{decl}`")
    return m.group(2), bool(m.group(1)), len(m.group(3)), m.group(4), array


def c_to_julia(base, pointers, array_len, j, as_argument):
    """The Julia type of a C type: `const char*` arguments and results are
    Cstring (ccall converts a String, checking for NULs); everywhere else a
    pointer is Ptr{pointee}, char is UInt8, void is Cvoid, an array is
    NTuple{N, element}, a typedef or struct keeps its name."""
    t = JULIA_TYPES.get(base) or base
    if base not in JULIA_TYPES and base not in j["aliases"] and base not in j["structs"] and base not in j["handles"]:
        raise ValueError(f"no Julia counterpart for the C type `{base}`")
    for _ in range(pointers):
        t = f"Ptr{{{t}}}"
    if array_len is not None:
        t = f"NTuple{{{array_len}, {t}}}"
    return t


def pointer_to(decl_type, array):
    """The C type of &x for `decl_type x` or `decl_type x[array]`."""
    return f"{decl_type} (*)[{array}]" if array else f"{decl_type}*"


# ---------------------------------------------------------------------------
# The C compiler's side
# ---------------------------------------------------------------------------

def c_program(j):
    c = ["#include <stddef.h>", "#include <stdio.h>", "#include <zerod/zerod.h>", "",
         "static void bytes(const char* s, const char* f, const void* p, size_t n) {",
         '  printf("init %s %s ", s, f);',
         '  for (size_t i = 0; i < n; ++i) printf("%02x", ((const unsigned char*)p)[i]);',
         '  printf("\\n");', "}", ""]
    # Types, checked by the compiler: a _Generic that selects 1 only for the
    # quoted type (pointer types are compatible only with the same pointee,
    # qualifiers included).
    for name, (_, ctext) in sorted(j["aliases"].items()):
        c.append(f'_Static_assert(_Generic(({name}*)0, {ctext}*: 1, default: 0), '
                 f'"typedef {name} is not {ctext} (generated.jl quotes it so)");')
    for sname, fields in sorted(j["structs"].items()):
        for _, _, comment in fields:
            if comment.startswith("padding"):
                continue
            base, const, ptrs, fname, array = parse_c_decl(comment)
            decl_type = ("const " if const else "") + base + "*" * ptrs
            c.append(f"_Static_assert(_Generic(&(({sname}*)0)->{fname}, {pointer_to(decl_type, array)}: 1, "
                     f'default: 0), "{sname}.{fname} is not `{comment}` (generated.jl quotes it so)");')
    for fname, (proto, _, _, _) in sorted(j["functions"].items()):
        m = re.fullmatch(r"(.+?)\b(zd_\w+)\((.*)\)", proto)
        ret, name, params = m.group(1).strip(), m.group(2), m.group(3)
        if name != fname:
            fail(f"generated.jl: the wrapper {fname} quotes the prototype of {name}")
            continue
        c.append(f"_Static_assert(_Generic(&{name}, {ret} (*)({params}): 1, default: 0), "
                 f'"{name} is not `{proto}` (generated.jl quotes it so)");')
    c += ["", "int main(void) {"]
    for sname, fields in sorted(j["structs"].items()):
        macro = j["inits"].get(sname, (None,))[0]
        c.append("  {")
        if macro:
            c.append(f"    static const {sname} init = {macro};")
        c.append(f'    printf("struct {sname} %zu %zu\\n", sizeof({sname}), _Alignof({sname}));')
        for _, _, comment in fields:
            if comment.startswith("padding"):
                continue
            f = parse_c_decl(comment)[3]
            c.append(f'    printf("field {sname} {f} %zu %zu\\n", offsetof({sname}, {f}), sizeof((({sname}*)0)->{f}));')
            if macro:
                c.append(f'    bytes("{sname}", "{f}", &init.{f}, sizeof(init.{f}));')
        c.append("  }")
    for k in sorted(j["constants"]):
        c.append(f'  _Static_assert(_Generic(({k}), int: 1, default: 0), "{k} is not an int");')
        c.append(f'  printf("const {k} %lld\\n", (long long)({k}));')
    c += ["  return 0;", "}", ""]
    return "\n".join(c)


def run_c(source, cc, include_dir, workdir):
    src, exe = os.path.join(workdir, "layout.c"), os.path.join(workdir, "layout")
    with open(src, "w") as f:
        f.write(source)
    r = subprocess.run([cc, "-std=c11", "-Wall", "-Werror", "-I", include_dir, src, "-o", exe],
                       capture_output=True, text=True)
    if r.returncode != 0:
        # Each failed _Static_assert names what differs.
        msgs = re.findall(r"error: (.*)", r.stderr) or [r.stderr.strip()]
        for msg in msgs:
            fail(f"the C compiler, on the layout program ({src}): {msg}")
        return None
    out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
    layout = {"structs": {}, "fields": {}, "init": {}, "constants": {}}
    for line in out.splitlines():
        w = line.split(" ")
        if w[0] == "struct":
            layout["structs"][w[1]] = (int(w[2]), int(w[3]))
        elif w[0] == "field":
            layout["fields"][(w[1], w[2])] = (int(w[3]), int(w[4]))
        elif w[0] == "init":
            layout["init"][(w[1], w[2])] = bytes.fromhex(w[3] if len(w) > 3 else "")
        elif w[0] == "const":
            layout["constants"][w[1]] = int(w[2])
    return layout


# ---------------------------------------------------------------------------
# Keyword defaults as bytes
# ---------------------------------------------------------------------------

def default_bytes(expr, t, j, c):
    """The bytes a Julia default converts to in a field of type t."""
    m = re.fullmatch(r"NTuple\{(\d+), (.+)\}", t)
    if m:
        items = split_commas(expr[1:-1]) if expr.startswith("(") and expr.endswith(")") else None
        if items is None or len(items) != int(m.group(1)):
            raise ValueError(f"`{expr}` is not a tuple of {m.group(1)}")
        return b"".join(default_bytes(x, m.group(2), j, c) for x in items)
    if t in j["aliases"]:
        t = j["aliases"][t][0]
    size = julia_size_align(t, j)[0]
    if expr == "C_NULL":
        if not t.startswith("Ptr{"):
            raise ValueError(f"C_NULL for a {t}")
        value = 0
    elif re.fullmatch(r"sizeof\((\w+)\)", expr):
        value = c["structs"][re.fullmatch(r"sizeof\((\w+)\)", expr).group(1)][0]
    elif re.fullmatch(r"-?\d+\.\d*", expr):
        if t not in ("Float64", "Float32"):
            raise ValueError(f"{expr} for a {t}")
        return pystruct.pack("<d" if t == "Float64" else "<f", float(expr))
    elif re.fullmatch(r"-?\d+", expr):
        value = int(expr)
    elif expr in j["constants"]:
        value = j["constants"][expr]
    else:
        raise ValueError(f"cannot evaluate `{expr}`")
    if t in ("Float64", "Float32"):
        return pystruct.pack("<d" if t == "Float64" else "<f", float(value))
    return (value % (1 << (8 * size))).to_bytes(size, "little")


# ---------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", required=True, help="the zerod checkout")
    ap.add_argument("--lib", required=True, help="the built libzerod.so")
    ap.add_argument("--cc", default=os.environ.get("CC") or "cc")
    ap.add_argument("--nm", default="nm")
    ap.add_argument("--header", help="default: ROOT/include/zerod/zerod.h")
    ap.add_argument("--generated", help="default: ROOT/bindings/julia/src/generated.jl")
    args = ap.parse_args()
    header = args.header or os.path.join(args.root, "include", "zerod", "zerod.h")
    generated = args.generated or os.path.join(args.root, "bindings", "julia", "src", "generated.jl")
    generator = os.path.join(args.root, "bindings", "julia", "gen", "generate.py")
    include_dir = os.path.dirname(os.path.dirname(header))

    # 1. Regenerated from the header now, the file is the committed one.
    r = subprocess.run([sys.executable, generator, "--header", header, "--stdout"], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"generate.py failed on {header}:\n{r.stderr}")
    else:
        committed = open(generated).read()
        if r.stdout != committed:
            diff = list(difflib.unified_diff(committed.splitlines(), r.stdout.splitlines(),
                                             "generated.jl (committed)", "generated.jl (from the header now)",
                                             lineterm="", n=1))
            fail("generated.jl is not what generate.py writes from the header now; run "
                 "`python3 bindings/julia/gen/generate.py` and commit the result. The difference:\n  " +
                 "\n  ".join(diff[:60]) + ("\n  ..." if len(diff) > 60 else ""))

    h = read_header(header)
    j = read_julia(generated)

    # 2. The same names on both sides.
    def same(kind, header_names, julia_names):
        for n in sorted(set(header_names) - set(julia_names)):
            fail(f"{kind} {n} is in zerod.h but not in generated.jl")
        for n in sorted(set(julia_names) - set(header_names)):
            fail(f"{kind} {n} is in generated.jl but not in zerod.h")

    same("the constant", h["constants"], j["constants"])
    same("the struct", h["structs"], j["structs"])
    same("the typedef", h["typedefs"], j["aliases"])
    same("the handle", h["handles"], j["handles"])
    same("the call", h["functions"], j["functions"])
    for sname in sorted(set(h["structs"]) & set(j["structs"])):
        c_fields = [parse_c_decl(cm)[3] for _, _, cm in j["structs"][sname] if not cm.startswith("padding")]
        if c_fields != h["structs"][sname]:
            fail(f"{sname}: zerod.h has the fields {h['structs'][sname]}, generated.jl {c_fields}")
        for jname, _, cm in j["structs"][sname]:
            if cm.startswith("padding"):
                if not re.fullmatch(r"_pad\d+", jname):
                    fail(f"{sname}.{jname}: padding under another name")
            elif jname not in (parse_c_decl(cm)[3], parse_c_decl(cm)[3] + "_"):
                fail(f"{sname}.{jname} stands for the C field {parse_c_decl(cm)[3]}")
    for sname in j["structs"]:
        if sname not in j["inits"]:
            fail(f"generated.jl: {sname} has no keyword constructor (its ZD_*_INIT)")
        if sname not in j["layout"]:
            fail(f"generated.jl: {sname} is not in _LAYOUT")

    # 3-5. The compiler's view.
    workdir = tempfile.mkdtemp(prefix="julia_layout.")
    try:
        c = run_c(c_program(j), args.cc, include_dir, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if c is not None:
        for k, v in sorted(j["constants"].items()):
            if c["constants"].get(k) != v:
                fail(f"{k} is {c['constants'].get(k)} in C, {v} in generated.jl")
        for sname in sorted(j["structs"]):
            csize, calign = c["structs"][sname]
            jsize, jalign, jfields = julia_layout(sname, j)
            if (jsize, jalign) != (csize, calign):
                fail(f"{sname}: sizeof/alignment {csize}/{calign} in C, {jsize}/{jalign} by Julia's rules")
            recorded = j["layout"].get(sname)
            if recorded and recorded[:2] != (csize, calign):
                fail(f"{sname}: _LAYOUT records sizeof/alignment {recorded[0]}/{recorded[1]}, C has {csize}/{calign}")
            recorded_fields = {f: (o, n) for f, o, n in (recorded[2] if recorded else [])}
            for jname, jtype, cm in j["structs"][sname]:
                if cm.startswith("padding"):
                    continue
                base, _, ptrs, cname, array = parse_c_decl(cm)
                coff, csz = c["fields"][(sname, cname)]
                if jfields[jname] != (coff, csz):
                    fail(f"{sname}.{cname}: offset/size {coff}/{csz} in C, {jfields[jname][0]}/{jfields[jname][1]} "
                         f"by Julia's rules")
                if recorded_fields.get(jname) != (coff, csz):
                    fail(f"{sname}.{cname}: _LAYOUT records {recorded_fields.get(jname)}, C has {(coff, csz)}")
                try:
                    array_len = None if array is None else (int(array) if array.isdigit() else c["constants"][array])
                    want = c_to_julia(base, ptrs, array_len, j, as_argument=False)
                    if want != jtype:
                        fail(f"{sname}.{cname}: `{cm}` is {want} in Julia, generated.jl has {jtype}")
                except (ValueError, KeyError) as e:
                    fail(f"{sname}.{cname}: {e}")
            # ZD_*_INIT as keyword defaults.
            macro, defaults, args_ = j["inits"].get(sname, (None, {}, None))
            expected_args = [("0" if not jt.startswith("NTuple") else f"ntuple(_ -> 0x00, {jt[7:jt.index(',')]})")
                             if cm.startswith("padding") else jn for jn, jt, cm in j["structs"][sname]]
            if args_ is not None and args_ != expected_args:
                fail(f"{sname}(; ...) builds {sname}({', '.join(args_)}), not ({', '.join(expected_args)})")
            for jname, jtype, cm in j["structs"][sname]:
                if cm.startswith("padding") or macro is None:
                    continue
                cname = parse_c_decl(cm)[3]
                if jname not in defaults:
                    fail(f"{sname}(; ...) has no default for {jname}")
                    continue
                try:
                    got = default_bytes(defaults[jname], jtype, j, c)
                except (ValueError, KeyError) as e:
                    fail(f"{sname}(; {jname} = {defaults[jname]}): {e}")
                    continue
                want = c["init"][(sname, cname)]
                if got != want:
                    fail(f"{sname}(; {jname} = {defaults[jname]}) gives the bytes {got.hex()}, "
                         f"{macro} {want.hex()}")
        for alias, (jt, ct) in sorted(j["aliases"].items()):
            want = JULIA_TYPES.get(ct)
            if want != jt:
                fail(f"typedef {ct} {alias} is {want} in Julia, generated.jl has {jt}")
        for fname, (proto, params, jret, jtypes) in sorted(j["functions"].items()):
            m = re.fullmatch(r"(.+?)\b(zd_\w+)\((.*)\)", proto)
            try:
                rbase, rconst, rptrs, _, _ = parse_c_decl(m.group(1).strip() + " result")
                want_ret = "Cstring" if (rbase, rconst, rptrs) == ("char", True, 1) else \
                    c_to_julia(rbase, rptrs, None, j, as_argument=True)
                if want_ret != jret:
                    fail(f"{fname} returns `{m.group(1).strip()}`: {want_ret} in Julia, generated.jl has {jret}")
                cparams = [] if m.group(3).strip() == "void" else [parse_c_decl(p) for p in m.group(3).split(",")]
                if len(cparams) != len(jtypes) or len(cparams) != len(params):
                    fail(f"{fname}: {len(cparams)} parameters in C, {len(jtypes)} types and {len(params)} "
                         f"names in generated.jl")
                    continue
                for (base, const, ptrs, cname, _), jt, jn in zip(cparams, jtypes, params):
                    want = "Cstring" if (base, const, ptrs) == ("char", True, 1) else \
                        c_to_julia(base, ptrs, None, j, as_argument=True)
                    if want != jt:
                        fail(f"{fname}({cname}): {want} in Julia, generated.jl has {jt}")
                    if jn not in (cname, cname + "_"):
                        fail(f"{fname}: the parameter {cname} is called {jn}")
            except ValueError as e:
                fail(f"{fname}: {e}")

    # 6. Every exported symbol has a wrapper, and each wrapper is bound.
    mapfile = os.path.join(args.root, "libzerod", "libzerod.map")
    if os.path.exists(mapfile) and not re.search(r"global:\s*zd_\*;", open(mapfile).read()):
        fail(f"{mapfile} no longer exports exactly zd_*: this test's reading of exports needs a look")
    r = subprocess.run([args.nm, "-D", "--defined-only", args.lib], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"{args.nm} -D {args.lib}: {r.stderr.strip()}")
    else:
        exported = {w[-1] for w in (l.split() for l in r.stdout.splitlines())
                    if len(w) >= 3 and w[1] in "TtWi" and w[-1].startswith("zd_")}
        others = {w[-1] for w in (l.split() for l in r.stdout.splitlines())
                  if len(w) >= 3 and w[1] in "TW" and not w[-1].startswith("zd_")}
        if not exported:
            fail(f"{args.lib} exports no zd_* function")
        for n in sorted(exported - set(j["functions"])):
            fail(f"libzerod exports {n}, and generated.jl has no wrapper for it")
        for n in sorted(set(j["functions"]) - exported):
            fail(f"generated.jl wraps {n}, which libzerod does not export")
        for n in sorted(others):
            fail(f"libzerod exports {n}, outside zd_* (libzerod/libzerod.map should keep it local)")
    for n in sorted(j["functions"]):
        if j["bound"].get(n) != n:
            fail(f"bind!() does not look {n} up")
    if sorted(j["listed"]) != sorted(j["functions"]) or len(j["listed"]) != len(set(j["listed"])):
        fail("FUNCTIONS does not list each wrapper once")
    every = set(j["constants"]) | set(j["aliases"]) | j["handles"] | set(j["structs"]) | set(j["functions"])
    for n in sorted(every - j["exports"]):
        fail(f"LibZerod does not export {n}")

    if failures:
        print(f"FAILED: generated.jl does not match zerod.h ({len(failures)} differences):")
        for f in failures:
            print("  - " + f)
        return 1
    print(f"generated.jl matches zerod.h: {len(j['constants'])} constants, {len(j['aliases'])} typedefs, "
          f"{len(j['handles'])} handles, {len(j['structs'])} structs ({sum(len(v) for v in j['structs'].values())} "
          f"fields with padding, layouts and ZD_*_INIT defaults as the C compiler has them), "
          f"{len(j['functions'])} calls (prototypes compiled against the header; every zd_* export of "
          f"{os.path.basename(args.lib)} wrapped and bound)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
