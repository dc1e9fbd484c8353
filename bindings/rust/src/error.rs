//! `Status` (a `zd_status` that is not `ZD_OK`) and `Error` (a status and
//! zerod's message, which names the culprit).

use std::borrow::Cow;
use std::ffi::CStr;
use std::fmt;
use std::os::raw::c_char;

use crate::ffi;

/// Why a call failed. The header promises that status values only grow, so
/// a value this crate does not know comes back as `Unknown` rather than
/// being guessed at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    InvalidArgument,
    InvalidState,
    NotFound,
    ShapeMismatch,
    Config,
    Plugin,
    OutOfMemory,
    Budget,
    Io,
    NotImplemented,
    Version,
    PeerLost,
    Timeout,
    BufferTooSmall,
    Internal,
    Unknown(i32),
}

impl Status {
    /// The status of a failed call; None for `ZD_OK`, which is no failure.
    pub fn from_raw(raw: ffi::zd_status) -> Option<Status> {
        Some(match raw {
            ffi::ZD_OK => return None,
            ffi::ZD_ERR_INVALID_ARGUMENT => Status::InvalidArgument,
            ffi::ZD_ERR_INVALID_STATE => Status::InvalidState,
            ffi::ZD_ERR_NOT_FOUND => Status::NotFound,
            ffi::ZD_ERR_SHAPE_MISMATCH => Status::ShapeMismatch,
            ffi::ZD_ERR_CONFIG => Status::Config,
            ffi::ZD_ERR_PLUGIN => Status::Plugin,
            ffi::ZD_ERR_OUT_OF_MEMORY => Status::OutOfMemory,
            ffi::ZD_ERR_BUDGET => Status::Budget,
            ffi::ZD_ERR_IO => Status::Io,
            ffi::ZD_ERR_NOT_IMPLEMENTED => Status::NotImplemented,
            ffi::ZD_ERR_VERSION => Status::Version,
            ffi::ZD_ERR_PEER_LOST => Status::PeerLost,
            ffi::ZD_ERR_TIMEOUT => Status::Timeout,
            ffi::ZD_ERR_BUFFER_TOO_SMALL => Status::BufferTooSmall,
            ffi::ZD_ERR_INTERNAL => Status::Internal,
            other => Status::Unknown(other),
        })
    }

    /// The `zd_status` value.
    pub fn raw(self) -> ffi::zd_status {
        match self {
            Status::InvalidArgument => ffi::ZD_ERR_INVALID_ARGUMENT,
            Status::InvalidState => ffi::ZD_ERR_INVALID_STATE,
            Status::NotFound => ffi::ZD_ERR_NOT_FOUND,
            Status::ShapeMismatch => ffi::ZD_ERR_SHAPE_MISMATCH,
            Status::Config => ffi::ZD_ERR_CONFIG,
            Status::Plugin => ffi::ZD_ERR_PLUGIN,
            Status::OutOfMemory => ffi::ZD_ERR_OUT_OF_MEMORY,
            Status::Budget => ffi::ZD_ERR_BUDGET,
            Status::Io => ffi::ZD_ERR_IO,
            Status::NotImplemented => ffi::ZD_ERR_NOT_IMPLEMENTED,
            Status::Version => ffi::ZD_ERR_VERSION,
            Status::PeerLost => ffi::ZD_ERR_PEER_LOST,
            Status::Timeout => ffi::ZD_ERR_TIMEOUT,
            Status::BufferTooSmall => ffi::ZD_ERR_BUFFER_TOO_SMALL,
            Status::Internal => ffi::ZD_ERR_INTERNAL,
            Status::Unknown(raw) => raw,
        }
    }

    /// The C name, e.g. "ZD_ERR_CONFIG". For an unknown value the library
    /// is asked (`zd_status_str`): it may be newer than this crate.
    pub fn name(self) -> Cow<'static, str> {
        Cow::Borrowed(match self {
            Status::InvalidArgument => "ZD_ERR_INVALID_ARGUMENT",
            Status::InvalidState => "ZD_ERR_INVALID_STATE",
            Status::NotFound => "ZD_ERR_NOT_FOUND",
            Status::ShapeMismatch => "ZD_ERR_SHAPE_MISMATCH",
            Status::Config => "ZD_ERR_CONFIG",
            Status::Plugin => "ZD_ERR_PLUGIN",
            Status::OutOfMemory => "ZD_ERR_OUT_OF_MEMORY",
            Status::Budget => "ZD_ERR_BUDGET",
            Status::Io => "ZD_ERR_IO",
            Status::NotImplemented => "ZD_ERR_NOT_IMPLEMENTED",
            Status::Version => "ZD_ERR_VERSION",
            Status::PeerLost => "ZD_ERR_PEER_LOST",
            Status::Timeout => "ZD_ERR_TIMEOUT",
            Status::BufferTooSmall => "ZD_ERR_BUFFER_TOO_SMALL",
            Status::Internal => "ZD_ERR_INTERNAL",
            Status::Unknown(raw) => {
                // SAFETY: zd_status_str takes any value and never returns NULL.
                return Cow::Owned(unsafe { string_from(ffi::zd_status_str(raw)) });
            }
        })
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Status::Unknown(raw) => write!(f, "{} ({})", self.name(), raw),
            _ => f.write_str(&self.name()),
        }
    }
}

/// A failed call: its status and zerod's message, e.g.
/// `ZD_ERR_CONFIG: zd_model_create: job.lua:3: unknown key 'optimzer' ...`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    status: Status,
    message: String,
}

impl Error {
    pub fn new(status: Status, message: impl Into<String>) -> Error {
        Error {
            status,
            message: message.into(),
        }
    }

    pub fn status(&self) -> Status {
        self.status
    }

    /// zerod's message: it names the call and the parameter, module or
    /// file:line at fault.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status, self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// Ok for `ZD_OK`, else the status with the message `message` reads (only
/// read on failure: it is valid until the next zerod call).
pub(crate) fn check(status: ffi::zd_status, message: impl FnOnce() -> String) -> Result<()> {
    match Status::from_raw(status) {
        None => Ok(()),
        Some(s) => Err(Error::new(s, message())),
    }
}

/// The message of this thread's last failed call (`zd_last_error`), for
/// calls that have no model to ask.
pub(crate) fn thread_error() -> String {
    // SAFETY: zd_last_error never returns NULL; the text is copied before
    // any other zerod call.
    unsafe { string_from(ffi::zd_last_error()) }
}

/// Copies a C string the library owns; NULL gives "".
///
/// # Safety
/// `p` is NULL or a NUL-terminated string valid for the duration of the call.
pub(crate) unsafe fn string_from(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}
