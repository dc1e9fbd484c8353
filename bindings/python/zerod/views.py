"""Views of zerod's memory as numpy arrays and torch tensors, without copying.

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

from .constants import DEVICE_CPU, VIEW_READ_ONLY, Dtype
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


def torch_at(ptr, nbytes, dtype, shape):
    """A torch tensor over nbytes of host memory at ptr (no copy)."""
    import torch
    return torch.frombuffer(_bytes_at(ptr, nbytes), dtype=torch_dtype(dtype)).view(shape)


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

    def _require_host(self):
        if not self._valid:
            raise InvalidStateError("this view ended with its module's _end call; take a new one "
                                    "after the next _begin")
        if self.device_type != DEVICE_CPU:
            raise ZerodNotImplementedError(f"view on device type {self.device_type}: the Python binding "
                                           "wraps host (CPU) views only")

    def numpy(self):
        """The view as a numpy array (read-only for parameters)."""
        self._require_host()
        return numpy_at(self.data_ptr, self.nbytes, self.dtype, self.shape, not self.read_only)

    def torch(self):
        """The view as a torch tensor. Do not write a parameter's (see above)."""
        self._require_host()
        return torch_at(self.data_ptr, self.nbytes, self.dtype, self.shape)

    # DLPack, so torch.from_dlpack(view), np.from_dlpack(view) and other
    # frameworks take the view without a copy (DLPack has no read-only flag).
    def __dlpack__(self, stream=None):
        return self.torch().__dlpack__()

    def __dlpack_device__(self):
        return (self.device_type, self.device_id)

    def __repr__(self):
        state = "" if self._valid else ", ended"
        return (f"zerod.View(shape={self.shape}, dtype={self.dtype.name}, "
                f"{'read-only' if self.read_only else 'writable'}{state})")
