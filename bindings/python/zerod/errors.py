"""zerod's statuses as Python exceptions.

Every call that returns a non-OK zd_status raises the subclass of ZerodError
for that status, carrying zerod's own message (which names the parameter,
module or job-script line at fault). Where a status has a natural Python
counterpart the class derives from it too, so `except ValueError` or
`except TimeoutError` also catch them.
"""
from . import _lib

OK = 0
ERR_INVALID_ARGUMENT = 1
ERR_INVALID_STATE = 2
ERR_NOT_FOUND = 3
ERR_SHAPE_MISMATCH = 4
ERR_CONFIG = 5
ERR_PLUGIN = 6
ERR_OUT_OF_MEMORY = 7
ERR_BUDGET = 8
ERR_IO = 9
ERR_NOT_IMPLEMENTED = 10
ERR_VERSION = 11
ERR_PEER_LOST = 12
ERR_TIMEOUT = 13
ERR_BUFFER_TOO_SMALL = 14
ERR_INTERNAL = 15


class ZerodError(Exception):
    """A zerod call failed. `status` is the zd_status, `message` zerod's text."""

    status = ERR_INTERNAL

    def __init__(self, message, status=None):
        if status is not None:
            self.status = status
        self.message = message
        super().__init__(f"{self.status_name}: {message}")

    @property
    def status_name(self):
        return status_name(self.status)


class InvalidArgumentError(ZerodError, ValueError):
    status = ERR_INVALID_ARGUMENT


class InvalidStateError(ZerodError):
    status = ERR_INVALID_STATE


class NotFoundError(ZerodError, LookupError):
    status = ERR_NOT_FOUND


class ShapeMismatchError(ZerodError, ValueError):
    status = ERR_SHAPE_MISMATCH


class ConfigError(ZerodError):
    status = ERR_CONFIG


class PluginError(ZerodError):
    status = ERR_PLUGIN


class OutOfMemoryError(ZerodError, MemoryError):
    status = ERR_OUT_OF_MEMORY


class BudgetError(ZerodError, MemoryError):
    status = ERR_BUDGET


class ZerodIOError(ZerodError, OSError):
    status = ERR_IO


class ZerodNotImplementedError(ZerodError, NotImplementedError):
    status = ERR_NOT_IMPLEMENTED


class VersionError(ZerodError):
    status = ERR_VERSION


class PeerLostError(ZerodError, ConnectionError):
    status = ERR_PEER_LOST


class ZerodTimeoutError(ZerodError, TimeoutError):
    status = ERR_TIMEOUT


class BufferTooSmallError(ZerodError):
    status = ERR_BUFFER_TOO_SMALL


class InternalError(ZerodError):
    status = ERR_INTERNAL


BY_STATUS = {cls.status: cls for cls in (
    InvalidArgumentError, InvalidStateError, NotFoundError, ShapeMismatchError, ConfigError,
    PluginError, OutOfMemoryError, BudgetError, ZerodIOError, ZerodNotImplementedError, VersionError,
    PeerLostError, ZerodTimeoutError, BufferTooSmallError, InternalError)}


def status_name(status):
    return _lib.zd_status_str(status).decode()


def error_for(status):
    """The exception for a failed call, with this thread's zd_last_error()."""
    message = _lib.zd_last_error().decode(errors="replace")
    return BY_STATUS.get(status, ZerodError)(message, status)


def check(status):
    if status:
        raise error_for(status)


# Tracebacks name them as users import them: zerod.PeerLostError.
for _cls in (ZerodError, *BY_STATUS.values()):
    _cls.__module__ = "zerod"
