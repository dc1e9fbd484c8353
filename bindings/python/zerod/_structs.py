"""ctypes mirrors of the structs in zerod.h, field for field.

tests/python/test_abi_layout.py compiles a C program against the header and
checks every size and offset here, so these cannot drift from the ABI.
"""
import ctypes
from ctypes import c_char_p, c_double, c_int32, c_int64, c_uint32, c_uint64, c_void_p

MAX_DIMS = 8
MAX_STATE_SLOTS = 4


class _Sized(ctypes.Structure):
    """A struct that begins with its own size, filled in on construction."""

    def __init__(self, **fields):
        super().__init__(**fields)
        self.struct_size = ctypes.sizeof(self)


class ConnectOptions(_Sized):
    _fields_ = [
        ("struct_size", c_uint32),
        ("abi_version", c_uint32),
        ("timeout_ms", c_uint32),
        ("reserved", c_uint32),
    ]


class ClientInfo(_Sized):
    _fields_ = [
        ("struct_size", c_uint32),
        ("rank", c_int32),
        ("world_size", c_int32),
        ("local_rank", c_int32),
        ("embedded", c_int32),
    ]


class ModelOptions(_Sized):
    _fields_ = [
        ("struct_size", c_uint32),
        ("flags", c_uint32),
        ("script_path", c_char_p),
        ("script_text", c_char_p),
        ("script_name", c_char_p),
        ("device", c_char_p),  # ABI 1.1
    ]


class ParamDesc(_Sized):
    _fields_ = [
        ("struct_size", c_uint32),
        ("dtype", c_int32),
        ("name", c_char_p),
        ("module", c_char_p),
        ("ndim", c_int32),
        ("shape", ctypes.POINTER(c_int64)),
        ("init", c_void_p),
        ("init_dtype", c_int32),
    ]


class ParamInfo(_Sized):
    _fields_ = [
        ("struct_size", c_uint32),
        ("dtype", c_int32),
        ("name", c_char_p),
        ("module", c_int32),
        ("ndim", c_int32),
        ("shape", c_int64 * MAX_DIMS),
        ("numel", c_int64),
    ]


class View(_Sized):
    _fields_ = [
        ("struct_size", c_uint32),
        ("flags", c_uint32),
        ("data", c_void_p),
        ("nbytes", c_uint64),
        ("dtype", c_int32),
        ("ndim", c_int32),
        ("shape", c_int64 * MAX_DIMS),
        ("device_type", c_int32),
        ("device_id", c_int32),
        ("arena", c_int32),
        ("reserved", c_int32),
        ("offset", c_uint64),
    ]


class StepResult(_Sized):
    _fields_ = [
        ("struct_size", c_uint32),
        ("flags", c_uint32),
        ("step", c_int64),
        ("micro_step", c_int64),
        ("lr", c_double),
        ("loss_scale", c_double),
        ("grad_norm", c_double),
    ]


class MemoryFigures(_Sized):
    _fields_ = [
        ("struct_size", c_uint32),
        ("reserved", c_uint32),
        ("current", c_uint64),
        ("peak", c_uint64),
        ("budget", c_uint64),
    ]


class OptimizerInfo(_Sized):
    _fields_ = [
        ("struct_size", c_uint32),
        ("state_slots", c_int32),
        ("step", c_int64),
        ("name", c_char_p),
        ("slot_names", c_char_p * MAX_STATE_SLOTS),
    ]


class CommFigures(_Sized):
    _fields_ = [
        ("struct_size", c_uint32),
        ("reserved", c_uint32),
        ("bytes_sent", c_uint64),
        ("network_bytes_sent", c_uint64),
        ("collectives", c_uint64),
    ]


class Progress(_Sized):
    _fields_ = [
        ("struct_size", c_uint32),
        ("flags", c_uint32),
        ("tokens", c_uint64),
        ("samples", c_uint64),
        ("loss", c_double),
        ("reserved", c_uint64),
    ]


# The C name of each mirror, for the layout test.
C_NAMES = {
    ConnectOptions: "zd_connect_options",
    ClientInfo: "zd_client_info",
    ModelOptions: "zd_model_options",
    ParamDesc: "zd_param_desc",
    ParamInfo: "zd_param_info",
    View: "zd_view",
    StepResult: "zd_step_result",
    MemoryFigures: "zd_memory_figures",
    OptimizerInfo: "zd_optimizer_info",
    CommFigures: "zd_comm_figures",
    Progress: "zd_progress",
}
