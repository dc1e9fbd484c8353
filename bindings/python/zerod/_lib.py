"""Finds and loads libzerod and declares the prototype of every zd_* call.

Lookup order: $ZEROD_LIB (the path of libzerod.so), the build tree of the
checkout this package sits in (build/lib/libzerod.so), then the system's
library path (ctypes.util.find_library). The library's ABI major must be the
one this package was written against.
"""
import ctypes
import ctypes.util
import os
from ctypes import POINTER, c_char_p, c_double, c_int32, c_int64, c_uint32, c_uint64, c_void_p

from . import _structs as S

# The ABI this package mirrors (zerod.h's ZD_ABI_VERSION_MAJOR / _MINOR).
ABI_MAJOR = 1
ABI_MINOR = 7
ABI_VERSION = (ABI_MAJOR << 16) | ABI_MINOR

_HERE = os.path.dirname(os.path.abspath(__file__))
_BUILD_TREE_LIB = os.path.normpath(os.path.join(_HERE, "..", "..", "..", "build", "lib", "libzerod.so"))


class LibraryNotFound(ImportError):
    pass


def _candidates():
    env = os.environ.get("ZEROD_LIB")
    if env:
        # An explicit choice is the only one tried: silently falling back to
        # another build would hide a wrong path.
        return [env], f"ZEROD_LIB={env}"
    found = ctypes.util.find_library("zerod")
    tried = [_BUILD_TREE_LIB] + ([found] if found else [])
    return tried, f"{_BUILD_TREE_LIB} (the build tree) and the system library path"


def _load():
    paths, where = _candidates()
    errors = []
    for path in paths:
        if os.path.sep in path and not os.path.exists(path):
            errors.append(f"{path}: no such file")
            continue
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            errors.append(str(e))
    raise LibraryNotFound(
        "zerod: cannot load libzerod; looked at " + where + ("\n  " + "\n  ".join(errors) if errors else "") +
        "\nBuild it (`cmake --preset default && ninja -C build zerod`), or set ZEROD_LIB to the path of libzerod.so.")


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


