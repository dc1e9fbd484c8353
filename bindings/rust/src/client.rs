//! `Client`: a connection to an engine, embedded or a node daemon.

use std::ffi::CString;
use std::fmt;
use std::ptr::{self, NonNull};

use crate::error::{check, thread_error, Error, Result, Status};
use crate::ffi;

/// A connection to an engine (`zd_client`). Models borrow it, so it outlives
/// them: `zd_disconnect` would free them too.
///
/// `Send` but not `Sync`: the header lets a client and its models be used
/// by one thread at a time, so a client may move to another thread only when
/// no model borrows it, and is never shared.
pub struct Client {
    raw: NonNull<ffi::zd_client>,
}

// SAFETY: zerod.h: "a zd_client and the zd_models created on it must be used
// from one thread at a time (the caller serialises)". Moving a Client moves
// all use of it; models borrow it and so cannot be alive across the move.
// The per-thread zd_last_error is read right after each failing call, on
// the thread that made it.
unsafe impl Send for Client {}

/// Options of `Client::connect_with`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnectOptions {
    /// Milliseconds a wait on another rank or the daemon may take before it
    /// fails with `Status::Timeout`; 0 = the job script's value.
    pub timeout_ms: u32,
}

/// Where this trainer sits in the job (`zd_client_info`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientInfo {
    /// This trainer's rank, 0-based.
    pub rank: i32,
    /// Ranks in the job.
    pub world_size: i32,
    /// Rank on this node.
    pub local_rank: i32,
    /// True in embedded mode, false when connected to a daemon.
    pub embedded: bool,
}

impl Client {
    /// Connects (`zd_connect`): `Some("embedded:")` runs the engine in this
    /// process; `Some("unix:/path.sock")` talks to a daemon; `None` uses
    /// `ZEROD_ENDPOINT` (set by `zerod run`). Without it, a process another
    /// launcher started as one of several ranks (torchrun, mpirun, srun,
    /// PMI) starts or joins its node's daemon rather than training alone:
    /// that needs `ZEROD_JOB` (the job script) and the count of ranks on the
    /// node (the launcher's, or `ZEROD_LOCAL_WORLD_SIZE` beside zerod's other
    /// rank variables), and fails with `Status::Config` naming what is
    /// missing (docs/daemon.md, "Ranks that another launcher started").
    /// Any other process runs embedded.
    pub fn connect(uri: Option<&str>) -> Result<Client> {
        Client::connect_with(uri, &ConnectOptions::default())
    }

    pub fn connect_with(uri: Option<&str>, options: &ConnectOptions) -> Result<Client> {
        let uri = uri.map(|u| c_string("uri", u)).transpose()?;
        let opts = ffi::zd_connect_options {
            timeout_ms: options.timeout_ms,
            ..Default::default()
        };
        let mut out: *mut ffi::zd_client = ptr::null_mut();
        // SAFETY: uri is NULL or a C string, opts is a complete struct, out
        // is a valid out-pointer; all outlive the call.
        let st = unsafe {
            ffi::zd_connect(
                uri.as_ref().map_or(ptr::null(), |u| u.as_ptr()),
                &opts,
                &mut out,
            )
        };
        check(st, thread_error)?;
        NonNull::new(out)
            .map(|raw| Client { raw })
            .ok_or_else(|| Error::new(Status::Internal, "zd_connect returned ZD_OK and no client"))
    }

    /// Rank, world size, local rank and mode (`zd_client_get_info`).
    pub fn info(&self) -> Result<ClientInfo> {
        let mut info = ffi::zd_client_info::default();
        // SAFETY: a live client and a complete out struct.
        let st = unsafe { ffi::zd_client_get_info(self.raw.as_ptr(), &mut info) };
        check(st, thread_error)?;
        Ok(ClientInfo {
            rank: info.rank,
            world_size: info.world_size,
            local_rank: info.local_rank,
            embedded: info.embedded != 0,
        })
    }

    /// The raw handle, for calls this crate does not wrap. It stays owned by
    /// the Client.
    pub fn as_ptr(&self) -> *mut ffi::zd_client {
        self.raw.as_ptr()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // SAFETY: the handle is live and, as models borrow the client, none
        // of them is left to use it.
        unsafe { ffi::zd_disconnect(self.raw.as_ptr()) }
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client").field("raw", &self.raw).finish()
    }
}

/// A C string for an argument, or `Status::InvalidArgument` naming it when
/// the text holds a NUL.
pub(crate) fn c_string(what: &str, text: &str) -> Result<CString> {
    CString::new(text).map_err(|_| {
        Error::new(
            Status::InvalidArgument,
            format!("{} contains a NUL byte: {:?}", what, text),
        )
    })
}
