"""Finds and loads libzerod and declares the prototype of every zd_* call.

Lookup order (the first that loads wins; docs/python.md says why):
  1. $ZEROD_LIB, the path of libzerod.so; nothing else is tried when it is set.
  2. When this package sits in a source checkout: that checkout's build tree
     (build/lib/libzerod.so), the library this very source was built into.
  3. Beside the `zerod` executable on PATH: <bin>/../lib/libzerod.so.1, and
     lib64 and lib/<multiarch>, where an install with another
     CMAKE_INSTALL_LIBDIR puts it. `cmake --install` (default /usr/local)
     puts bin/zerod on PATH but, until ldconfig runs, its lib/ is not on the
     dynamic linker's search path.
  4. This Python's prefix (sys.prefix/lib...), for a zerod installed beside
     the Python (a venv's or a conda prefix).
  5. The dynamic linker's own search: LD_LIBRARY_PATH and ldconfig's cache.
The library's ABI major must be the one this package was written against.
"""
import ctypes
import os
import platform
import shutil
import sys
import sysconfig
from ctypes import POINTER, c_char_p, c_double, c_int32, c_int64, c_uint32, c_uint64, c_void_p

from . import _structs as S

# The ABI this package mirrors (zerod.h's ZD_ABI_VERSION_MAJOR / _MINOR).
ABI_MAJOR = 1
ABI_MINOR = 7
ABI_VERSION = (ABI_MAJOR << 16) | ABI_MINOR

_HERE = os.path.dirname(os.path.abspath(__file__))
# The soname of the major this package speaks first; the unversioned name is
# a development symlink that a runtime-only install may lack.
_LIB_NAMES = (f"libzerod.so.{ABI_MAJOR}", "libzerod.so")


class LibraryNotFound(ImportError):
    pass


def _lib_subdirs():
    """Where an install puts libzerod below its prefix: CMAKE_INSTALL_LIBDIR
    is lib by default, lib64 on some distributions, lib/<multiarch> on Debian
    when the prefix is /usr."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or f"{platform.machine()}-linux-gnu"
    return ("lib", "lib64", os.path.join("lib", multiarch))


def _checkout_root():
    """The source checkout this package sits in (bindings/python/zerod of it),
    or None for an installed package."""
    root = os.path.normpath(os.path.join(_HERE, "..", "..", ".."))
    marker = os.path.join(root, "include", "zerod", "zerod.h")
    return root if os.path.isfile(marker) else None


def _locations():
    """(what, [file to try]) in lookup order, or (what, reason) where a
    location has nothing to try; what says where and why it was looked at."""
    def under(prefix):
        return [os.path.join(prefix, d, n) for d in _lib_subdirs() for n in _LIB_NAMES]

    root = _checkout_root()
    if root:
        yield "the build tree of the checkout this package sits in", under(os.path.join(root, "build"))
    exe = shutil.which("zerod")
    if exe:
        exe = os.path.realpath(exe)
        yield f"beside the zerod on PATH ({exe})", under(os.path.dirname(os.path.dirname(exe)))
    else:
        yield "beside the zerod on PATH", "no zerod on PATH"
    yield f"this Python's prefix (sys.prefix={sys.prefix})", under(sys.prefix)
    # A bare soname: dlopen searches LD_LIBRARY_PATH and ldconfig's cache.
    yield "the dynamic linker's search path (LD_LIBRARY_PATH, ldconfig's cache)", [_LIB_NAMES[0]]


def _try(path):
    """The loaded library, or why not: the loader's own text (wrong
    architecture, a missing dependency, ...)."""
    try:
        return ctypes.CDLL(path), None
    except OSError as e:
        return None, str(e)


def _load_chosen(path):
    """ZEROD_LIB: an explicit choice is the only one tried; silently falling
    back to another build would hide a wrong path."""
    lib, why = _try(path) if os.path.exists(path) else (None, "no such file")
    if lib:
        return lib
    raise LibraryNotFound(f"zerod: cannot load libzerod from ZEROD_LIB={path}: {why}\n"
                          "Set ZEROD_LIB to the path of a libzerod.so (<prefix>/lib/libzerod.so), or unset it "
                          "to let the package look for one.")


def _load():
    if os.environ.get("ZEROD_LIB"):
        return _load_chosen(os.environ["ZEROD_LIB"])
    tried = ["ZEROD_LIB: not set"]
    for what, files in _locations():
        if isinstance(files, str):
            tried.append(f"{what}: {files}")
            continue
        present = [f for f in files if os.path.sep not in f or os.path.exists(f)]
        if not present:
            dirs = dict.fromkeys(os.path.dirname(f) for f in files)  # in order, once each
            tried.append(f"{what}: no {' or '.join(_LIB_NAMES)} in {', '.join(dirs)}")
            continue
        lib, why = _try(present[0])
        if lib:
            return lib
        # glibc's dlerror() text names the file already.
        tried.append(f"{what}: {why}" if present[0] in why else f"{what}: {present[0]}: {why}")
    build_hint = ("; or, from this checkout, build it (`cmake --preset default && ninja -C build zerod`)"
                  if _checkout_root() else "")
    raise LibraryNotFound(
        "zerod: cannot load libzerod. Tried, in order:\n  " + "\n  ".join(tried) +
        "\nAfter `cmake --install`, run `sudo ldconfig` (so that the dynamic linker finds <prefix>/lib), or set "
        "ZEROD_LIB=<prefix>/lib/libzerod.so" + build_hint + ".")


lib = _load()


def _check_abi():
    lib.zd_abi_version.restype = c_uint32
    have = lib.zd_abi_version()
    major, minor = have >> 16, have & 0xFFFF
    if major != ABI_MAJOR:
        raise ImportError(
            f"zerod: {getattr(lib, '_name', 'libzerod')} provides ABI {major}.{minor}, but this Python "
            f"package speaks ABI {ABI_MAJOR}.x; use the bindings/python that came with that libzerod "
            f"(or point ZEROD_LIB at a libzerod of ABI {ABI_MAJOR})")


# Before any prototype: a library of another major may lack these calls.
_check_abi()

_Model = c_void_p   # zd_model*, opaque
_Client = c_void_p  # zd_client*, opaque

# name: (restype, argtypes). zd_status is int32_t; enums are int32_t.
_PROTOTYPES = {
    "zd_abi_version": (c_uint32, []),
    "zd_version": (c_char_p, []),
    "zd_status_str": (c_char_p, [c_int32]),
    "zd_last_error": (c_char_p, []),
    "zd_connect": (c_int32, [c_char_p, POINTER(S.ConnectOptions), POINTER(_Client)]),
    "zd_disconnect": (None, [_Client]),
    "zd_client_get_info": (c_int32, [_Client, POINTER(S.ClientInfo)]),
    "zd_model_create": (c_int32, [_Client, POINTER(S.ModelOptions), POINTER(_Model)]),
    "zd_model_destroy": (None, [_Model]),
    "zd_model_last_error": (c_char_p, [_Model]),
    "zd_model_register_param": (c_int32, [_Model, POINTER(S.ParamDesc), POINTER(c_int32)]),
    "zd_model_finalize": (c_int32, [_Model]),
    "zd_model_find_module": (c_int32, [_Model, c_char_p, POINTER(c_int32)]),
    "zd_model_find_param": (c_int32, [_Model, c_char_p, POINTER(c_int32)]),
    "zd_model_param_count": (c_int32, [_Model, POINTER(c_int32)]),
    "zd_model_module_count": (c_int32, [_Model, POINTER(c_int32)]),
    "zd_model_param_info": (c_int32, [_Model, c_int32, POINTER(S.ParamInfo)]),
    "zd_model_module_info": (c_int32, [_Model, c_int32, POINTER(c_char_p), POINTER(c_int32), POINTER(c_int32)]),
    "zd_forward_begin": (c_int32, [_Model, c_int32]),
    "zd_forward_end": (c_int32, [_Model, c_int32]),
    "zd_backward_begin": (c_int32, [_Model, c_int32]),
    "zd_backward_end": (c_int32, [_Model, c_int32]),
    "zd_param_view": (c_int32, [_Model, c_int32, POINTER(S.View)]),
    "zd_grad_view": (c_int32, [_Model, c_int32, POINTER(S.View)]),
    "zd_step": (c_int32, [_Model, POINTER(S.StepResult)]),
    "zd_model_set_lr": (c_int32, [_Model, c_double]),
    "zd_model_loss_scale": (c_int32, [_Model, POINTER(c_double)]),
    "zd_model_set_stream": (c_int32, [_Model, c_void_p]),
    "zd_model_save": (c_int32, [_Model, c_char_p]),
    "zd_model_load": (c_int32, [_Model, c_char_p]),
    "zd_param_read": (c_int32, [_Model, c_int32, c_int32, c_void_p, c_uint64]),
    "zd_param_write": (c_int32, [_Model, c_int32, c_int32, c_void_p, c_uint64]),
    "zd_model_optimizer_info": (c_int32, [_Model, POINTER(S.OptimizerInfo)]),
    "zd_optimizer_state_read": (c_int32, [_Model, c_int32, c_int32, c_int32, c_void_p, c_uint64]),
    "zd_optimizer_state_write": (c_int32, [_Model, c_int32, c_int32, c_int32, c_void_p, c_uint64]),
    "zd_model_set_step": (c_int32, [_Model, c_int64]),
    "zd_model_memory": (c_int32, [_Model, c_int32, c_int32, c_int32, POINTER(S.MemoryFigures)]),
    "zd_model_comm_figures": (c_int32, [_Model, c_int32, POINTER(S.CommFigures)]),
    "zd_model_report": (c_int32, [_Model, POINTER(S.Progress)]),
}


def _missing(name):
    """Stands in for a call the loaded library lacks (an older minor)."""
    def call(*args):
        from .errors import ZerodNotImplementedError
        have = lib.zd_abi_version()
        raise ZerodNotImplementedError(f"{name}: the loaded libzerod (ABI {have >> 16}.{have & 0xFFFF}) does not "
                                       "have this call; use a newer libzerod")
    return call


for _name, (_res, _args) in _PROTOTYPES.items():
    _fn = getattr(lib, _name, None)
    if _fn is None:
        globals()[_name] = _missing(_name)
        continue
    _fn.restype = _res
    _fn.argtypes = _args
    globals()[_name] = _fn

PROTOTYPES = frozenset(_PROTOTYPES)


