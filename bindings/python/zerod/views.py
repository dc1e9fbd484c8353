"""Views of zerod's memory as numpy arrays and torch tensors, without copying.

Views of device memory (a job on the cuda device) come as torch tensors on
that GPU, through DLPack (kDLCUDA), still without copying; numpy arrays are
for host views only.

A view is valid from the call that made it until its module's matching
_end; after that the memory may hold another module's parameters (stage 3)
or be unmapped. A View object raises once invalid; the arrays and tensors it
handed out cannot be revoked, so do not keep them past the _end.

Parameter views are read-only: their numpy arrays are flagged so. PyTorch has
no read-only tensors, so writing into a parameter's tensor is undefined
behaviour; change a parameter with Model.param_write instead. 16-bit views
come as bfloat16/float16 tensors; in numpy, bf16 is uint16 bits (numpy has no
bfloat16) and f16 is float16.
"""
import ctypes

import numpy as np

from .constants import DEVICE_CPU, DEVICE_CUDA, VIEW_READ_ONLY, Dtype
from .errors import InvalidStateError, ZerodNotImplementedError

_NUMPY = {1: np.dtype(np.float32), 2: np.dtype(np.uint16), 3: np.dtype(np.float16)}
_TORCH = {}  # filled on first use, so numpy-only users never import torch


def numpy_dtype(dtype):
    return _NUMPY[int(dtype)]


def torch_dtype(dtype):
    if not _TORCH:
        import torch
        _TORCH.update({1: torch.float32, 2: torch.bfloat16, 3: torch.float16})
    return _TORCH[int(dtype)]


def _bytes_at(ptr, nbytes):
    return (ctypes.c_uint8 * nbytes).from_address(ptr)


def numpy_at(ptr, nbytes, dtype, shape, writable):
    """A numpy array over nbytes of host memory at ptr (no copy)."""
    arr = np.frombuffer(_bytes_at(ptr, nbytes), dtype=_NUMPY[int(dtype)]).reshape(shape)
    if not writable:
        arr.setflags(write=False)
    return arr


def torch_at(ptr, nbytes, dtype, shape, device_type=DEVICE_CPU, device_id=0):
    """A torch tensor over nbytes of zerod's memory at ptr (no copy): host
    memory, or a GPU's (through DLPack)."""
    import torch
    if device_type == DEVICE_CPU:
        return torch.frombuffer(_bytes_at(ptr, nbytes), dtype=torch_dtype(dtype)).view(shape)
    from torch.utils.dlpack import from_dlpack
    return from_dlpack(dlpack_capsule(ptr, dtype, shape, device_type, device_id))


# --- DLPack (dlpack.h, the version every framework reads) ---------------------

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DLDeleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                             ("deleter", _DLDeleter)]

# kDLFloat = 2, kDLBfloat = 4; the bits of each zd dtype.
_DL_DTYPE = {1: (2, 32), 2: (4, 16), 3: (2, 16)}

# Each managed tensor and its shape are one block from the C library's
# malloc, and its deleter is the C library's free: no Python runs when a
# consumer lets a tensor go. A consumer may do that during the interpreter's
# last garbage collection, after this module's globals are gone (a
# DeepSpeedEngine cycle holding view tensors, collected at exit, freed them
# through a Python deleter whose code was gone: SIGSEGV on a GPU,
# 2026-11-27). A capsule never consumed leaks its block (about 100 bytes):
# torch_at's go straight to a from_dlpack; a consumer that calls a View's
# __dlpack__ and then fails leaks that much.
_libc = ctypes.CDLL(None)
_malloc = _libc.malloc
_malloc.restype = ctypes.c_void_p
_malloc.argtypes = [ctypes.c_size_t]
_free = _libc.free
_free.restype = None
_free.argtypes = [ctypes.c_void_p]
_FREE = ctypes.cast(_free, ctypes.c_void_p).value

_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def dlpack_capsule(ptr, dtype, shape, device_type, device_id):
    """A DLPack capsule ("dltensor") over zerod's memory at ptr: contiguous,
    row-major, on the device given (DLPack's device numbers are zd_view's)."""
    code, bits = _DL_DTYPE[int(dtype)]
    shape = tuple(int(e) for e in shape)
    rank = max(len(shape), 1)
    block = _malloc(ctypes.sizeof(_DLManagedTensor) + ctypes.sizeof(ctypes.c_int64) * rank)
    if not block:
        raise MemoryError("no memory for a DLPack tensor's header")
    try:
        managed = _DLManagedTensor.from_address(block)
        dims = (ctypes.c_int64 * rank).from_address(block + ctypes.sizeof(_DLManagedTensor))
        dims[:len(shape)] = shape
        managed.dl_tensor.data = ptr
        managed.dl_tensor.device = _DLDevice(int(device_type), int(device_id))
        managed.dl_tensor.ndim = len(shape)
        managed.dl_tensor.dtype = _DLDataType(code, bits, 1)
        managed.dl_tensor.shape = dims
        managed.dl_tensor.strides = None  # compact row-major
        managed.dl_tensor.byte_offset = 0
        managed.manager_ctx = None
        ctypes.c_void_p.from_address(block + _DLManagedTensor.deleter.offset).value = _FREE
        return _PyCapsule_New(block, b"dltensor", None)
    except BaseException:
        _free(block)
        raise


class View:
    """A contiguous row-major tensor in zerod's memory (a zd_view)."""

    __slots__ = ("data_ptr", "nbytes", "dtype", "shape", "read_only", "device_type", "device_id",
                 "arena", "offset", "_valid")

    def __init__(self, raw):
        self.data_ptr = raw.data or 0
        self.nbytes = raw.nbytes
        self.dtype = Dtype(raw.dtype)
        self.shape = tuple(raw.shape[:raw.ndim])
        self.read_only = bool(raw.flags & VIEW_READ_ONLY)
        self.device_type = raw.device_type
        self.device_id = raw.device_id
        self.arena = raw.arena
        self.offset = raw.offset
        self._valid = True

    @property
    def valid(self):
        return self._valid

    def _invalidate(self):
        self._valid = False

    def _require_valid(self):
        if not self._valid:
            raise InvalidStateError("this view ended with its module's _end call (or its model or client "
                                    "was closed); take a new one after the next _begin")

    def numpy(self):
        """The view as a numpy array (read-only for parameters); host views only."""
        self._require_valid()
        if self.device_type != DEVICE_CPU:
            raise ZerodNotImplementedError(f"a view on device type {self.device_type} (GPU memory) has no numpy "
                                           "array: use view.torch(), or copy it to the host first")
        return numpy_at(self.data_ptr, self.nbytes, self.dtype, self.shape, not self.read_only)

    def torch(self):
        """The view as a torch tensor, on the view's device. Do not write a
        parameter's (see above)."""
        self._require_valid()
        if self.device_type not in (DEVICE_CPU, DEVICE_CUDA):
            raise ZerodNotImplementedError(f"a view on device type {self.device_type}")
        return torch_at(self.data_ptr, self.nbytes, self.dtype, self.shape, self.device_type, self.device_id)

    # DLPack, so torch.from_dlpack(view), np.from_dlpack(view) and other
    # frameworks take the view without a copy (DLPack has no read-only flag).
    def __dlpack__(self, stream=None):
        self._require_valid()
        return dlpack_capsule(self.data_ptr, self.dtype, self.shape, self.device_type, self.device_id)

    def __dlpack_device__(self):
        return (self.device_type, self.device_id)

    def __repr__(self):
        state = "" if self._valid else ", ended"
        return (f"zerod.View(shape={self.shape}, dtype={self.dtype.name}, "
                f"{'read-only' if self.read_only else 'writable'}{state})")
