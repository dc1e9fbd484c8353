"""The enumerations and flags of zerod.h."""
import enum


class Dtype(enum.IntEnum):
    F32 = 1
    BF16 = 2
    F16 = 3


class Tier(enum.IntEnum):
    """Memory tiers, fastest first."""
    DEVICE = 0
    HOST = 1
    NVME = 2


class MemKind(enum.IntEnum):
    """What the bytes of a tier hold."""
    ALL = -1
    PARAMS = 0
    GRADS = 1
    MASTER = 2
    OPTIMIZER = 3
    BUFFERS = 4


MODEL_ALLOW_SCRIPT_IO = 1 << 0
VIEW_READ_ONLY = 1 << 0
DEVICE_CPU = 1
DEVICE_CUDA = 2
STEP_BOUNDARY = 1 << 0
STEP_APPLIED = 1 << 1
STEP_SKIPPED = 1 << 2
PROGRESS_HAS_LOSS = 1 << 0
