//! Rust bindings to libzerod: zerod owns a job's model state (parameters,
//! gradients, optimizer state) and runs the optimizer; the trainer does the
//! math and drives each step through module guards.
//!
//! ```no_run
//! use zerod::{Client, Model, ParamDesc};
//!
//! fn main() -> zerod::Result<()> {
//!     // ZEROD_ENDPOINT (zerod run); one of several ranks of torchrun, mpirun
//!     // or srun: the node's daemon (Client::connect); else embedded
//!     let client = Client::connect(None)?;
//!     let mut model = Model::from_script_path(&client, "job.lua")?;
//!     let w = model.register_param(&ParamDesc::new("fc.weight", "fc", &[3, 2]).init(&[0.5f32; 6]))?;
//!     model.finalize()?;
//!     let fc = model.find_module("fc")?;
//!     for _ in 0..100 {
//!         {
//!             let fwd = model.forward(fc)?; // forward_begin; dropping it is forward_end
//!             let weights: &[f32] = fwd.param(w)?.as_slice().unwrap();
//!             // ... the forward pass and the loss, with `weights` ...
//!         }
//!         let mut bwd = model.backward(fc)?; // gradient views are zero now
//!         bwd.grad_mut(w)?.copy_from_f32(&[0.1; 6]); // dL/dw of this micro-batch
//!         bwd.end()?; // backward_end, with its result
//!         let r = model.step()?; // applies the optimizer at each window's end
//!         if r.applied { /* r.step, r.lr, r.grad_norm ... */ }
//!     }
//!     Ok(())
//! }
//! ```
//!
//! The guards make the ABI's rules hold at compile time. A view does not
//! outlive its module's `_end`:
//!
//! ```compile_fail
//! # fn f(model: &mut zerod::Model, m: zerod::ModuleId, p: zerod::ParamId) -> zerod::Result<()> {
//! let fwd = model.forward(m)?;
//! let w = fwd.param(p)?;
//! fwd.end()?;
//! let _ = w.len();
//! # Ok(()) }
//! ```
//!
//! Nothing else runs on the model while a module is begun:
//!
//! ```compile_fail
//! # fn f(model: &mut zerod::Model, m: zerod::ModuleId) -> zerod::Result<()> {
//! let fwd = model.forward(m)?;
//! model.step()?;
//! drop(fwd);
//! # Ok(()) }
//! ```
//!
//! A gradient is borrowed mutably once, and a model stays on its thread:
//!
//! ```compile_fail
//! # fn f(model: &mut zerod::Model, m: zerod::ModuleId, p: zerod::ParamId) -> zerod::Result<()> {
//! let mut bwd = model.backward(m)?;
//! let a = bwd.grad_mut(p)?;
//! let b = bwd.grad_mut(p)?;
//! drop((a, b));
//! # Ok(()) }
//! ```
//!
//! ```compile_fail
//! fn send<T: Send>(_: T) {}
//! fn f(model: zerod::Model<'static>) { send(model) }
//! ```
//!
//! See `docs/rust.md` in the zerod repository for the whole story, and
//! `ffi` for the raw declarations.

mod client;
mod dtype;
mod error;
pub mod ffi;
mod guard;
mod memory;
mod model;
mod param;
mod view;

pub use client::{Client, ClientInfo, ConnectOptions};
pub use dtype::{Bf16, Dtype, Element, F16};
pub use error::{Error, Result, Status};
pub use guard::{BackwardGuard, ForwardGuard};
pub use memory::{MemKind, MemoryFigures, Tier};
pub use model::{CommFigures, Model, ModelOptions, OptimizerInfo, StepResult};
pub use param::{ModuleId, ModuleInfo, ParamDesc, ParamId, ParamInfo};
pub use view::{Elements, ElementsMut, GradView, ParamView};

/// The ABI this crate was written against, `(major << 16) | minor`.
pub const ABI_VERSION: u32 = ffi::ZD_ABI_VERSION;

/// The loaded library's ABI version, `(major << 16) | minor`.
pub fn abi_version() -> u32 {
    // SAFETY: no arguments; thread-safe.
    unsafe { ffi::zd_abi_version() }
}

/// The loaded library's release version, e.g. "0.1.0".
pub fn version() -> String {
    // SAFETY: a static string; thread-safe.
    unsafe { error::string_from(ffi::zd_version()) }
}
