#!/usr/bin/env python3
"""Writes bindings/julia/src/generated.jl, the raw `ccall` layer of the Julia
binding, from include/zerod/zerod.h.

    python3 bindings/julia/gen/generate.py            # rewrites src/generated.jl
    python3 bindings/julia/gen/generate.py --stdout   # prints it instead
    python3 bindings/julia/gen/generate.py --header H --out F

Run it after any change to zerod.h; ctest's julia.generated_matches_header
fails until the committed file is what this script writes.

No libclang: the header keeps a regular style (see its rules at the top), and
this script reads exactly that style -- `#define ZD_*` constants and
`ZD_*_INIT` macros, anonymous `enum { ... };` blocks, `typedef <scalar>
zd_x;`, `typedef struct zd_x zd_x;` (opaque handles), `typedef struct zd_x {
fields } zd_x;` and `ZD_API <type> zd_name(params);`. Anything else in the
header stops it with the line it could not read, rather than being skipped.

Struct layouts are computed with the LP64 C rules (x86-64 and aarch64 Linux,
macOS): every field at the next multiple of its alignment, the struct
rounded up to its largest alignment. Julia lays out an isbits struct by the
same rules; the generator still writes every byte of C padding as an explicit
`_padN` field, so the Julia struct needs no padding of its own, and records
the layout it assumed in `_LAYOUT`, which the test compares with the C
compiler's and the module compares with Julia's when it loads.

Standard library only.
"""
import argparse
import ast
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
DEFAULT_HEADER = os.path.join(ROOT, "include", "zerod", "zerod.h")
DEFAULT_OUT = os.path.normpath(os.path.join(HERE, "..", "src", "generated.jl"))

# C scalar -> (Julia type, size, alignment), LP64.
SCALARS = {
    "int8_t": ("Int8", 1, 1),
    "uint8_t": ("UInt8", 1, 1),
    "int16_t": ("Int16", 2, 2),
    "uint16_t": ("UInt16", 2, 2),
    "int32_t": ("Int32", 4, 4),
    "uint32_t": ("UInt32", 4, 4),
    "int64_t": ("Int64", 8, 8),
    "uint64_t": ("UInt64", 8, 8),
    "size_t": ("Csize_t", 8, 8),
    "float": ("Float32", 4, 4),
    "double": ("Float64", 8, 8),
}
POINTER = (8, 8)

# Julia's reserved words: a C name that is one gets a trailing underscore.
JULIA_KEYWORDS = {
    "baremodule", "begin", "break", "catch", "const", "continue", "do", "else", "elseif", "end",
    "export", "false", "finally", "for", "function", "global", "if", "import", "let", "local",
    "macro", "module", "public", "quote", "return", "struct", "true", "try", "using", "while",
}


class HeaderError(Exception):
    pass


def julia_name(name):
    return name + "_" if name in JULIA_KEYWORDS else name


# ---------------------------------------------------------------------------
# Reading the header
# ---------------------------------------------------------------------------

class CType:
    """A declarator's type: base name, whether the base is const, one entry
    per pointer level (whether that level is itself const), array length."""

    def __init__(self, base, base_const, pointers, array=None):
        self.base, self.base_const, self.pointers, self.array = base, base_const, pointers, array

    def spelling(self):
        """The type as C spells it, without the name: `const char*`."""
        s = ("const " if self.base_const else "") + self.base
        for c in self.pointers:
            s += "*" + (" const" if c else "")
        return s

    def declaration(self, name, array_text=None):
        s = self.spelling() + " " + name
        if self.array is not None:
            s += "[" + (array_text or str(self.array)) + "]"
        return s


class Struct:
    def __init__(self, name, fields):
        self.name = name
        self.fields = fields  # [(name, CType, array text)]


class Function:
    def __init__(self, name, ret, params, text):
        self.name, self.ret, self.params, self.text = name, ret, params, text


class Header:
    def __init__(self):
        self.constants = []   # [(name, value)] in header order
        self.values = {}      # name -> value
        self.inits = {}       # struct name -> [initialiser text]
        self.typedefs = []    # [(name, CType)]
        self.handles = []     # [name]
        self.structs = []     # [Struct]
        self.functions = []   # [Function]

    def typedef(self, name):
        for n, t in self.typedefs:
            if n == name:
                return t
        return None

    def struct(self, name):
        for s in self.structs:
            if s.name == name:
                return s
        return None


def strip_comments(text):
    """Removes /* */ and // comments, keeping line breaks (so that line
    numbers and preprocessor lines survive)."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                raise HeaderError("an unterminated /* comment")
            out.append("\n" * text.count("\n", i, j))
            i = j + 2
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = len(text) if j < 0 else j
        elif text[i] == '"':
            j = i + 1
            while text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


_INT = re.compile(r"\b(0[xX][0-9a-fA-F]+|\d+)[uUlL]*\b")


def evaluate(expr, known):
    """The value of an integer constant expression of the header: literals
    (with u/l suffixes), names already defined, + - * << >> | & ~ and
    parentheses."""
    text = _INT.sub(lambda m: str(int(m.group(1), 0)), expr.strip())
    tree = ast.parse(text, mode="eval")

    def ev(n):
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        if isinstance(n, ast.Name):
            if n.id not in known:
                raise HeaderError(f"`{n.id}` is used before it is defined in `{expr}`")
            return known[n.id]
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.USub, ast.UAdd, ast.Invert)):
            v = ev(n.operand)
            return -v if isinstance(n.op, ast.USub) else v if isinstance(n.op, ast.UAdd) else ~v
        if isinstance(n, ast.BinOp):
            ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
                   ast.LShift: lambda a, b: a << b, ast.RShift: lambda a, b: a >> b,
                   ast.BitOr: lambda a, b: a | b, ast.BitAnd: lambda a, b: a & b}
            for op, f in ops.items():
                if isinstance(n.op, op):
                    return f(ev(n.left), ev(n.right))
        raise HeaderError(f"cannot evaluate `{expr}`")

    return ev(tree)


def parse_type(decl, where, known=None, allow_array=False):
    """`const char* name`, `int64_t shape[ZD_MAX_DIMS]` -> (CType, name, array text)."""
    decl = " ".join(decl.split())
    array = array_text = None
    m = re.fullmatch(r"(.*?)\s*\[([^\]]+)\]", decl)
    if m:
        if not allow_array:
            raise HeaderError(f"{where}: an array where none is expected: `{decl}`")
        decl, array_text = m.group(1), m.group(2).strip()
        array = evaluate(array_text, known or {})
    m = re.fullmatch(r"(.*?)([A-Za-z_][A-Za-z0-9_]*)", decl)
    if not m:
        raise HeaderError(f"{where}: cannot read the declaration `{decl}`")
    type_text, name = m.group(1), m.group(2)
    tokens = type_text.replace("*", " * ").split()
    base, base_const, pointers = None, False, []
    for t in tokens:
        if t == "const":
            if pointers:
                pointers[-1] = True
            else:
                base_const = True
        elif t == "*":
            pointers.append(False)
        elif t in ("struct", "enum", "unsigned", "signed", "long", "short", "volatile"):
            raise HeaderError(f"{where}: `{t}` in `{decl}`: the header uses fixed-width types and typedef names")
        elif base is None:
            base = t
        else:
            raise HeaderError(f"{where}: two base types in `{decl}`")
    if base is None:
        # `void` alone, or a type without a name (`int32_t`).
        raise HeaderError(f"{where}: no type in `{decl}`")
    if any(pointers):
        raise HeaderError(f"{where}: a const pointer (`* const`) in `{decl}`; not supported")
    return CType(base, base_const, pointers, array), name, array_text


def split_top_level(code, sep=";"):
    """Splits at `sep` outside braces and parentheses: [(text, line)]."""
    out, depth, start, line, start_line = [], 0, 0, 1, 1
    for i, c in enumerate(code):
        if c == "\n":
            line += 1
        elif c in "{(":
            depth += 1
        elif c in "})":
            depth -= 1
        elif c == sep and depth == 0:
            out.append((code[start:i], start_line))
            start, start_line = i + 1, line
    rest = code[start:]
    if rest.strip():
        out.append((rest, start_line))
    return out


def parse_header(text, path="zerod.h"):
    h = Header()
    code_lines = []
    skipping = []  # one entry per #if: whether its lines are dropped
    for number, raw in enumerate(strip_comments(text).split("\n"), 1):
        line = raw.strip()
        where = f"{path}:{number}"
        if line.startswith("#"):
            directive = line[1:].strip()
            word = directive.split()[0] if directive else ""
            if word in ("if", "ifdef", "ifndef"):
                # C++'s `extern "C" {` and its brace are not C.
                skipping.append(directive == "ifdef __cplusplus" or bool(skipping and skipping[-1]))
            elif word == "else":
                pass
            elif word == "endif":
                skipping.pop()
            elif word == "include":
                pass
            elif word == "define":
                if skipping and skipping[-1]:
                    continue
                m = re.fullmatch(r"define\s+([A-Za-z_][A-Za-z0-9_]*)(?:\s+(.*))?", directive)
                name, value = m.group(1), (m.group(2) or "").strip()
                if name == "ZD_API" or (not value and name.endswith("_H")):
                    continue
                if not name.startswith("ZD_"):
                    raise HeaderError(f"{where}: a #define outside the ZD_ prefix: {name}")
                if name.endswith("_INIT"):
                    if not (value.startswith("{") and value.endswith("}")):
                        raise HeaderError(f"{where}: {name} is not a braced initialiser")
                    h.inits[name] = value
                else:
                    v = evaluate(value, h.values)
                    h.constants.append((name, v))
                    h.values[name] = v
            else:
                raise HeaderError(f"{where}: a preprocessor line this generator does not read: {line}")
            code_lines.append("")
            continue
        code_lines.append("" if (skipping and skipping[-1]) else raw)
    if skipping:
        raise HeaderError(f"{path}: an #if without its #endif")

    for stmt, line in split_top_level("\n".join(code_lines)):
        s = " ".join(stmt.split())
        where = f"{path}:{line}"
        if not s:
            continue
        m = re.fullmatch(r"enum \{(.*)\}", s)
        if m:
            for entry in m.group(1).split(","):
                entry = entry.strip()
                if not entry:
                    continue
                em = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.+)", entry)
                if not em:
                    raise HeaderError(f"{where}: an enumerator without an explicit value: `{entry}`")
                v = evaluate(em.group(2), h.values)
                h.constants.append((em.group(1), v))
                h.values[em.group(1)] = v
            continue
        m = re.fullmatch(r"typedef struct ([A-Za-z_]\w*) \{(.*)\} ([A-Za-z_]\w*)", s)
        if m:
            if m.group(1) != m.group(3):
                raise HeaderError(f"{where}: typedef struct {m.group(1)} {{...}} {m.group(3)}: the names differ")
            fields = []
            for f, _ in split_top_level(m.group(2)):
                if f.strip():
                    ctype, fname, array_text = parse_type(f, where, h.values, allow_array=True)
                    fields.append((fname, ctype, array_text))
            h.structs.append(Struct(m.group(1), fields))
            continue
        m = re.fullmatch(r"typedef struct ([A-Za-z_]\w*) ([A-Za-z_]\w*)", s)
        if m:
            if m.group(1) != m.group(2):
                raise HeaderError(f"{where}: typedef struct {m.group(1)} {m.group(2)}: the names differ")
            h.handles.append(m.group(1))
            continue
        m = re.fullmatch(r"typedef (.+)", s)
        if m:
            ctype, name, _ = parse_type(m.group(1), where)
            if ctype.pointers or ctype.base not in SCALARS:
                raise HeaderError(f"{where}: a typedef of something other than a fixed-width scalar: `{s}`")
            h.typedefs.append((name, ctype))
            continue
        m = re.fullmatch(r"ZD_API (.+?)\((.*)\)", s)
        if m:
            ret, name, _ = parse_type(m.group(1), where)
            if ret.base == "void" and not ret.pointers:
                ret = None  # returns nothing
            params = []
            if m.group(2).strip() != "void":
                for p in m.group(2).split(","):
                    ptype, pname, _ = parse_type(p, where)
                    params.append((pname, ptype))
            text = s[len("ZD_API "):]
            h.functions.append(Function(name, ret, params, text))
            continue
        raise HeaderError(f"{where}: a declaration this generator does not read: `{s[:120]}`")
    return h


# ---------------------------------------------------------------------------
# C types as Julia types, and layouts
# ---------------------------------------------------------------------------

def julia_base(h, base):
    if base in SCALARS:
        return SCALARS[base][0]
    if base == "void":
        return "Cvoid"
    if base == "char":
        return "UInt8"
    if h.typedef(base) or h.struct(base) or base in h.handles:
        return base
    raise HeaderError(f"unknown type `{base}`")


def julia_field_type(h, t):
    """A struct field: pointers are Ptr{...} (char* is Ptr{UInt8}, what
    pointer(::String) gives), arrays NTuple{N, ...}."""
    j = julia_base(h, t.base)
    for _ in t.pointers:
        j = f"Ptr{{{j}}}"
    if t.array is not None:
        j = f"NTuple{{{t.array}, {j}}}"
    return j


def julia_arg_type(h, t):
    """A parameter or return value: as a field, except that `const char*`
    is Cstring (a String converts to it, checked for NULs; so does C_NULL)."""
    if t is None:
        return "Cvoid"
    if t.base == "char" and t.base_const and len(t.pointers) == 1:
        return "Cstring"
    return julia_field_type(h, t)


def size_align(h, t):
    if t.pointers:
        size, align = POINTER
    elif t.base in SCALARS:
        size, align = SCALARS[t.base][1:]
    elif h.typedef(t.base):
        size, align = size_align(h, h.typedef(t.base))
    elif h.struct(t.base):
        size, align, _ = layout(h, h.struct(t.base))
    else:
        raise HeaderError(f"no size for `{t.spelling()}`")
    if t.array is not None:
        size *= t.array
    return size, align


def layout(h, s):
    """(size, alignment, [(field, offset, size)]) by the LP64 C rules."""
    offset, max_align, fields = 0, 1, []
    for name, t, _ in s.fields:
        size, align = size_align(h, t)
        offset = (offset + align - 1) // align * align
        fields.append((name, offset, size))
        offset += size
        max_align = max(max_align, align)
    return (offset + max_align - 1) // max_align * max_align, max_align, fields


def padding_type(n):
    for t, size in (("UInt64", 8), ("UInt32", 4), ("UInt16", 2), ("UInt8", 1)):
        if n == size:
            return t
    return f"NTuple{{{n}, UInt8}}"


# ---------------------------------------------------------------------------
# ZD_*_INIT macros as keyword defaults
# ---------------------------------------------------------------------------

def split_initialiser(text):
    inner = text.strip()[1:-1]
    return [item.strip() for item, _ in split_top_level(inner, ",")]


def julia_default(h, t, item, struct_name):
    """An initialiser item of the header as a Julia expression."""
    if t.array is not None:
        if not (item.startswith("{") and item.endswith("}")):
            raise HeaderError(f"{struct_name}'s INIT gives `{item}` for an array")
        items = split_initialiser(item)
        # C: elements not listed are zero.
        items += ["0"] * (t.array - len(items))
        elem = CType(t.base, t.base_const, t.pointers)
        return "(" + ", ".join(julia_default(h, elem, i, struct_name) for i in items) + ")"
    if item in ("NULL", "0") and t.pointers:
        return "C_NULL"
    m = re.fullmatch(r"sizeof\((\w+)\)", item)
    if m:
        if m.group(1) != struct_name:
            raise HeaderError(f"{struct_name}'s INIT takes sizeof({m.group(1)})")
        return f"sizeof({struct_name})"
    if re.fullmatch(r"-?\d+\.\d*", item):
        return item
    if re.fullmatch(r"[A-Za-z_]\w*", item) and item in h.values:
        return item
    try:
        return str(evaluate(item, h.values))
    except HeaderError:
        raise HeaderError(f"{struct_name}'s INIT: cannot translate `{item}`")


# ---------------------------------------------------------------------------
# Writing generated.jl
# ---------------------------------------------------------------------------

def generate(h, header_rel):
    every = [n for n, _ in h.constants] + [n for n, _ in h.typedefs] + h.handles + \
        [s.name for s in h.structs] + [f.name for f in h.functions]
    clashes = sorted({n for n in every if every.count(n) > 1} | {n for n in every if n in JULIA_KEYWORDS})
    if clashes:
        raise HeaderError(f"names that would clash in Julia: {', '.join(clashes)}")
    out = []
    w = out.append
    w("# GENERATED FILE -- DO NOT EDIT.")
    w(f"# Written by bindings/julia/gen/generate.py from {header_rel}; rerun it after")
    w("# changing the header (ctest's julia.generated_matches_header fails until then).")
    w("#")
    w("# NEVER EXECUTED: no Julia runtime could be installed where zerod is developed.")
    w("# What is checked instead, without Julia: that this file is what the generator")
    w("# writes from the header; that the struct layouts below (computed from Julia's")
    w("# isbits layout rules) and _LAYOUT are the C compiler's sizeof/offsetof; that")
    w("# each field's and typedef's C type, each constant's value and each ZD_*_INIT")
    w("# default are the compiler's; that each C prototype quoted here is the")
    w("# header's (compiled against it) and maps to its ccall's types; and that every")
    w("# zd_* symbol libzerod exports has a wrapper (tests/julia/check_generated.py).")
    w("#")
    w("# The raw C API, one to one: the header's names, constants as C's `int`")
    w("# (Int32), structs as isbits mirrors with explicit padding, one thin wrapper")
    w("# per call. `Zerod` (Zerod.jl) is the layer to use; this is what it stands on.")
    w("# Layouts assume LP64 (64-bit Linux and macOS); the module checks on load.")
    w("module LibZerod")
    w("")
    w("using Libdl")
    w("")

    w("# ---- Constants (each is an `int` in C) ----")
    w("")
    width = max(len(n) for n, _ in h.constants)
    for name, value in h.constants:
        w(f"const {name.ljust(width)} = Int32({value})")
    w("")

    w("# ---- Scalar typedefs ----")
    w("")
    for name, t in h.typedefs:
        w(f"const {name} = {julia_field_type(h, t)}  # typedef {t.spelling()} {name}")
    w("")

    w("# ---- Opaque handles (only ever behind a Ptr) ----")
    w("")
    for name in h.handles:
        w(f"mutable struct {name} end  # typedef struct {name} {name}")
    w("")

    w("# ---- Structs ----")
    w("#")
    w("# Fields in the header's order and types; `_padN` fields are the bytes C")
    w("# leaves between fields or at the end, so that Julia's layout needs none of")
    w("# its own. Each struct has a keyword constructor whose defaults are its")
    w("# ZD_*_INIT macro: `zd_view()` is ZD_VIEW_INIT, `zd_view(; dtype = 2)` too")
    w("# with one field changed.")
    w("")
    layouts = []
    for s in h.structs:
        size, align, fields = layout(h, s)
        layouts.append((s.name, size, align, fields))
        members = []  # (julia name, julia type, comment, is padding, CType, index into fields)
        end, pad = 0, 0
        for i, ((fname, t, array_text), (_, offset, fsize)) in enumerate(zip(s.fields, fields)):
            if offset > end:
                members.append((f"_pad{pad}", padding_type(offset - end), f"padding: {offset - end} bytes", True, None))
                pad += 1
            members.append((julia_name(fname), julia_field_type(h, t), t.declaration(fname, array_text), False, t))
            end = offset + fsize
        if size > end:
            members.append((f"_pad{pad}", padding_type(size - end), f"padding: {size - end} bytes", True, None))
        w(f"struct {s.name}")
        col = max(len(f"    {n}::{jt}") for n, jt, _, _, _ in members) + 2
        for n, jt, comment, _, _ in members:
            w(f"    {n}::{jt}".ljust(col) + f"# {comment}")
        w("end")
        # The INIT macro as keyword defaults.
        macro = "ZD_" + s.name[len("zd_"):].upper() + "_INIT"
        if macro not in h.inits:
            raise HeaderError(f"{s.name} has no {macro}")
        items = split_initialiser(h.inits[macro])
        if len(items) > len(s.fields):
            raise HeaderError(f"{macro} has more items than {s.name} has fields")
        items += ["0"] * (len(s.fields) - len(items))  # C: the rest are zero
        w(f"# {macro}")
        w(f"{s.name}(;")
        field_index = 0
        args = []
        for n, jt, _, is_pad, t in members:
            if is_pad:
                args.append(f"ntuple(_ -> 0x00, {jt[7:jt.index(',')]})" if jt.startswith("NTuple") else "0")
                continue
            default = julia_default(h, t, items[field_index], s.name)
            w(f"    {n} = {default},")
            args.append(n)
            field_index += 1
        w(f") = {s.name}({', '.join(args)})")
        w("")

    w("# The layouts the generator computed (LP64 C rules): (struct, sizeof, alignment,")
    w("# ((field, offset, size), ...)). The test holds them to the C compiler's;")
    w("# check_layout() holds them to Julia's.")
    w("const _LAYOUT = (")
    for name, size, align, fields in layouts:
        fs = ", ".join(f"(:{julia_name(f)}, {o}, {n})" for f, o, n in fields)
        w(f"    ({name}, {size}, {align}, ({fs},)),")
    w(")")
    w("")
    w('"""')
    w("    check_layout()")
    w("")
    w("Throws unless every struct here has, in this Julia, the size and field")
    w("offsets C gives it (as recorded in `_LAYOUT`). `Zerod` calls it on load.")
    w('"""')
    w("function check_layout()")
    w("    for (T, size, _, fields) in _LAYOUT")
    w("        sizeof(T) == size || error(\"LibZerod: sizeof($T) is $(sizeof(T)) in this Julia, $size in C\")")
    w("        for (name, offset, _) in fields")
    w("            i = findfirst(==(name), fieldnames(T))")
    w("            got = fieldoffset(T, i)")
    w("            got == offset || error(\"LibZerod: $T.$name is at byte $got in this Julia, $offset in C\")")
    w("        end")
    w("    end")
    w("    return nothing")
    w("end")
    w("")

    w("# ---- Calls ----")
    w("#")
    w("# One wrapper per exported call, through a function pointer that bind!() looks")
    w("# up once the library is open (a library path chosen at run time, not when")
    w("# the package was precompiled). Arguments are converted as ccall converts")
    w("# them: a Ref or an Array passes as a Ptr, a String as a Cstring.")
    w("")
    names = [f.name for f in h.functions]
    for f in h.functions:
        w(f"const _fp_{f.name} = Ref{{Ptr{{Cvoid}}}}(C_NULL)")
    w("")
    w("# Every call of the header, in its order.")
    w("const FUNCTIONS = (")
    for n in names:
        w(f"    :{n},")
    w(")")
    w("")
    w('"""')
    w("    bind!(lib::Ptr{Cvoid})")
    w("")
    w("Looks every call up in `lib` (a handle from `Libdl.dlopen`). A call the")
    w("library lacks (one of an older minor ABI) stays unbound and throws when")
    w("called; nothing else is affected.")
    w('"""')
    w("function bind!(lib::Ptr{Cvoid})")
    for n in names:
        w(f"    _fp_{n}[] = _lookup(lib, :{n})")
    w("    return nothing")
    w("end")
    w("")
    w("_lookup(lib, name) = something(Libdl.dlsym(lib, name; throw_error = false), C_NULL)")
    w("")
    w("@noinline _unbound(name) = error(\"libzerod: $name is not bound: the loaded library lacks it \" *")
    w("                                 \"(an older minor ABI), or bind!() has not run\")")
    w("")
    for f in h.functions:
        params = [julia_name(n) for n, _ in f.params]
        types = [julia_arg_type(h, t) for _, t in f.params]
        ret = julia_arg_type(h, f.ret)
        type_tuple = "(" + ", ".join(types) + ("," if len(types) == 1 else "") + ")"
        w(f"# C: {f.text}")
        w(f"function {f.name}({', '.join(params)})")
        w(f"    fp = _fp_{f.name}[]")
        w(f"    fp == C_NULL && _unbound(:{f.name})")
        w(f"    ccall(fp, {ret}, {type_tuple}{''.join(', ' + p for p in params)})")
        w("end")
        w("")

    exports = [n for n, _ in h.constants] + [n for n, _ in h.typedefs] + h.handles + \
        [s.name for s in h.structs] + names
    w("export " + ",\n    ".join(exports))
    w("")
    w("end # module LibZerod")
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--header", default=DEFAULT_HEADER)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--stdout", action="store_true", help="print instead of writing --out")
    args = ap.parse_args(argv)
    with open(args.header) as f:
        text = f.read()
    try:
        h = parse_header(text, os.path.basename(args.header))
        # The same text whichever copy of the header was read (the test
        # reads mutated copies), so only the header's content shows.
        jl = generate(h, "include/zerod/zerod.h")
    except HeaderError as e:
        print(f"generate.py: {e}", file=sys.stderr)
        return 1
    if args.stdout:
        sys.stdout.write(jl)
    else:
        with open(args.out, "w") as f:
            f.write(jl)
    return 0


if __name__ == "__main__":
    sys.exit(main())
