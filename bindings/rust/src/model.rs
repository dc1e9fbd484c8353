//! `Model`: the state of one job, created from a Lua job script.

use std::ffi::CString;
use std::fmt;
use std::marker::PhantomData;
use std::os::raw::c_void;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr::{self, NonNull};

use crate::client::{c_string, Client};
use crate::dtype::{Dtype, Element};
use crate::error::{check, string_from, thread_error, Error, Result, Status};
use crate::ffi;
use crate::guard::{BackwardGuard, ForwardGuard};
use crate::memory::{MemKind, MemoryFigures, Tier};
use crate::param::{ModuleId, ModuleInfo, ParamDesc, ParamId, ParamInfo};

/// Where a model's job script comes from (`Model::create`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelOptions {
    script: Script,
    name: Option<String>,
    allow_script_io: bool,
    device: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Script {
    Path(PathBuf),
    Text(String),
    Env,
}

impl ModelOptions {
    /// A job script file.
    pub fn script_path(path: impl AsRef<Path>) -> ModelOptions {
        ModelOptions {
            script: Script::Path(path.as_ref().to_path_buf()),
            name: None,
            allow_script_io: false,
            device: None,
        }
    }

    /// A job script's text; errors name it "job.lua" unless `script_name`
    /// says otherwise.
    pub fn script_text(text: impl Into<String>) -> ModelOptions {
        ModelOptions {
            script: Script::Text(text.into()),
            name: None,
            allow_script_io: false,
            device: None,
        }
    }

    /// The script `ZEROD_JOB` names, as `zerod run --job` sets it.
    pub fn from_env() -> ModelOptions {
        ModelOptions {
            script: Script::Env,
            name: None,
            allow_script_io: false,
            device: None,
        }
    }

    /// The name errors use for a script given as text.
    pub fn script_name(mut self, name: impl Into<String>) -> ModelOptions {
        self.name = Some(name.into());
        self
    }

    /// Lets the script use Lua's io library (`ZD_MODEL_ALLOW_SCRIPT_IO`).
    pub fn allow_script_io(mut self, allow: bool) -> ModelOptions {
        self.allow_script_io = allow;
        self
    }

    /// The device the trainer computes on ("cpu", "cuda" or "auto"),
    /// overriding the job script's `device`: views point into its memory.
    pub fn device(mut self, device: impl Into<String>) -> ModelOptions {
        self.device = Some(device.into());
        self
    }
}

/// What one `Model::step` did (`zd_step_result`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepResult {
    /// This call ended a gradient-accumulation window.
    pub boundary: bool,
    /// The optimizer updated the parameters.
    pub applied: bool,
    /// inf/NaN gradients: no update, the loss scale was lowered.
    pub skipped: bool,
    /// All of `zd_step_result.flags`, including any this crate does not name.
    pub flags: u32,
    /// Optimizer steps applied so far (skipped ones excluded).
    pub step: i64,
    /// Micro-batches seen so far.
    pub micro_step: i64,
    /// The learning rate used (or that would have been used).
    pub lr: f64,
    /// The loss scale to use for the next micro-batch.
    pub loss_scale: f64,
    /// Global L2 norm of the averaged, unscaled gradient, before clipping.
    pub grad_norm: f64,
}

/// A job's model state (`zd_model`): parameters, gradients and optimizer
/// state that zerod owns. It borrows its `Client`.
///
/// Neither `Send` nor `Sync`: a model calls into its client, which the
/// header lets only one thread at a time use.
pub struct Model<'c> {
    raw: NonNull<ffi::zd_model>,
    _client: PhantomData<&'c Client>,
}

impl<'c> Model<'c> {
    /// Creates a model from a job script (`zd_model_create`): the script is
    /// run and checked (every error, each with file:line, as
    /// `Status::Config`) and the optimizer plugin is loaded.
    pub fn create(client: &'c Client, options: &ModelOptions) -> Result<Model<'c>> {
        let path = match &options.script {
            Script::Path(p) => Some(path_c_string(p)?),
            _ => None,
        };
        let text = match &options.script {
            Script::Text(t) => Some(c_string("script text", t)?),
            _ => None,
        };
        let name = options
            .name
            .as_deref()
            .map(|n| c_string("script name", n))
            .transpose()?;
        let device = options
            .device
            .as_deref()
            .map(|d| c_string("device", d))
            .transpose()?;
        let opts = ffi::zd_model_options {
            flags: if options.allow_script_io {
                ffi::ZD_MODEL_ALLOW_SCRIPT_IO
            } else {
                0
            },
            script_path: path.as_ref().map_or(ptr::null(), |p| p.as_ptr()),
            script_text: text.as_ref().map_or(ptr::null(), |t| t.as_ptr()),
            script_name: name.as_ref().map_or(ptr::null(), |n| n.as_ptr()),
            device: device.as_ref().map_or(ptr::null(), |d| d.as_ptr()),
            ..Default::default()
        };
        let mut out: *mut ffi::zd_model = ptr::null_mut();
        // SAFETY: a live client, a complete options struct whose strings
        // outlive the call, a valid out-pointer.
        let st = unsafe { ffi::zd_model_create(client.as_ptr(), &opts, &mut out) };
        check(st, thread_error)?;
        NonNull::new(out)
            .map(|raw| Model {
                raw,
                _client: PhantomData,
            })
            .ok_or_else(|| {
                Error::new(
                    Status::Internal,
                    "zd_model_create returned ZD_OK and no model",
                )
            })
    }

    pub fn from_script_path(client: &'c Client, path: impl AsRef<Path>) -> Result<Model<'c>> {
        Model::create(client, &ModelOptions::script_path(path))
    }

    pub fn from_script_text(client: &'c Client, text: &str) -> Result<Model<'c>> {
        Model::create(client, &ModelOptions::script_text(text))
    }

    /// The script `ZEROD_JOB` names (`zerod run --job` sets it).
    pub fn from_env(client: &'c Client) -> Result<Model<'c>> {
        Model::create(client, &ModelOptions::from_env())
    }

    /// Registers a parameter, before `finalize`. Every rank registers the
    /// same parameters in the same order.
    pub fn register_param(&mut self, desc: &ParamDesc<'_>) -> Result<ParamId> {
        let name = c_string("parameter name", desc.name)?;
        let module = c_string("module name", desc.module)?;
        let ndim = i32::try_from(desc.shape.len()).unwrap_or(i32::MAX);
        // zerod reads numel elements from init, a count it derives from the
        // shape, so the slice must hold exactly that many. A shape zerod will
        // refuse anyway goes without init, and zerod says what is wrong.
        let mut init = desc.init.ptr;
        if desc.has_init() {
            match desc.numel() {
                Some(n) if n != desc.init.len => {
                    return Err(Error::new(
                        Status::ShapeMismatch,
                        format!(
                            "zd_model_register_param: parameter '{}': init has {} elements, the shape {:?} needs {}",
                            desc.name, desc.init.len, desc.shape, n
                        ),
                    ))
                }
                Some(_) => {}
                None => init = ptr::null(),
            }
        }
        let d = ffi::zd_param_desc {
            dtype: desc.dtype.raw(),
            name: name.as_ptr(),
            module: module.as_ptr(),
            ndim,
            shape: desc.shape.as_ptr(),
            init,
            init_dtype: desc.init.dtype.raw(),
            ..Default::default()
        };
        let mut id: ffi::zd_param_id = -1;
        // SAFETY: a live model; the desc's strings, shape and init outlive
        // the call and init holds the numel elements zerod reads.
        let st = unsafe { ffi::zd_model_register_param(self.raw.as_ptr(), &d, &mut id) };
        self.check(st)?;
        Ok(ParamId(id))
    }

    /// Places and allocates the model state; no parameter can be added
    /// after it. With several ranks it returns once every rank has finalized.
    pub fn finalize(&mut self) -> Result<()> {
        // SAFETY: a live model.
        let st = unsafe { ffi::zd_model_finalize(self.raw.as_ptr()) };
        self.check(st)
    }

    pub fn find_module(&self, name: &str) -> Result<ModuleId> {
        let name = c_string("module name", name)?;
        let mut id = -1;
        // SAFETY: a live model, a C string, a valid out-pointer.
        let st = unsafe { ffi::zd_model_find_module(self.raw.as_ptr(), name.as_ptr(), &mut id) };
        self.check(st)?;
        Ok(ModuleId(id))
    }

    pub fn find_param(&self, name: &str) -> Result<ParamId> {
        let name = c_string("parameter name", name)?;
        let mut id = -1;
        // SAFETY: as find_module.
        let st = unsafe { ffi::zd_model_find_param(self.raw.as_ptr(), name.as_ptr(), &mut id) };
        self.check(st)?;
        Ok(ParamId(id))
    }

    pub fn param_count(&self) -> Result<usize> {
        let mut n = 0;
        // SAFETY: a live model, a valid out-pointer.
        let st = unsafe { ffi::zd_model_param_count(self.raw.as_ptr(), &mut n) };
        self.check(st)?;
        Ok(n.max(0) as usize)
    }

    pub fn module_count(&self) -> Result<usize> {
        let mut n = 0;
        // SAFETY: a live model, a valid out-pointer.
        let st = unsafe { ffi::zd_model_module_count(self.raw.as_ptr(), &mut n) };
        self.check(st)?;
        Ok(n.max(0) as usize)
    }

    pub fn param_info(&self, id: ParamId) -> Result<ParamInfo> {
        let mut info = ffi::zd_param_info::default();
        // SAFETY: a live model and a complete out struct.
        let st = unsafe { ffi::zd_model_param_info(self.raw.as_ptr(), id.0, &mut info) };
        self.check(st)?;
        let dtype = Dtype::from_raw(info.dtype).ok_or_else(|| {
            Error::new(
                Status::NotImplemented,
                format!(
                    "zd_model_param_info: dtype {} is unknown to this zerod crate",
                    info.dtype
                ),
            )
        })?;
        let ndim = info.ndim.clamp(0, ffi::ZD_MAX_DIMS as i32) as usize;
        Ok(ParamInfo {
            // SAFETY: the name is owned by the live model.
            name: unsafe { string_from(info.name) },
            dtype,
            module: ModuleId(info.module),
            shape: info.shape[..ndim].to_vec(),
            numel: info.numel,
        })
    }

    pub fn module_info(&self, id: ModuleId) -> Result<ModuleInfo> {
        let mut name = ptr::null();
        let mut count = 0;
        // SAFETY: a live model; ids NULL asks for the count only.
        let st = unsafe {
            ffi::zd_model_module_info(
                self.raw.as_ptr(),
                id.0,
                &mut name,
                ptr::null_mut(),
                &mut count,
            )
        };
        self.check(st)?;
        let mut ids = vec![0; count.max(0) as usize];
        // SAFETY: ids has room for count; count says so.
        let st = unsafe {
            ffi::zd_model_module_info(
                self.raw.as_ptr(),
                id.0,
                &mut name,
                ids.as_mut_ptr(),
                &mut count,
            )
        };
        self.check(st)?;
        ids.truncate(count.max(0) as usize);
        Ok(ModuleInfo {
            // SAFETY: the name is owned by the live model.
            name: unsafe { string_from(name) },
            params: ids.into_iter().map(ParamId).collect(),
        })
    }

    /// Begins a forward of `module` (`zd_forward_begin`): its parameters are
    /// resident until the guard ends.
    pub fn forward(&mut self, module: ModuleId) -> Result<ForwardGuard<'_>> {
        ForwardGuard::begin(self.raw, module)
    }

    /// Begins a backward of `module` (`zd_backward_begin`): its gradient
    /// views are zero now, and what they hold when the guard ends is added to
    /// the gradients.
    pub fn backward(&mut self, module: ModuleId) -> Result<BackwardGuard<'_>> {
        BackwardGuard::begin(self.raw, module)
    }

    /// Ends a micro-batch (`zd_step`); at an accumulation boundary it runs
    /// the optimizer.
    pub fn step(&mut self) -> Result<StepResult> {
        let mut r = ffi::zd_step_result::default();
        // SAFETY: a live model and a complete out struct.
        let st = unsafe { ffi::zd_step(self.raw.as_ptr(), &mut r) };
        self.check(st)?;
        Ok(StepResult {
            boundary: r.flags & ffi::ZD_STEP_BOUNDARY != 0,
            applied: r.flags & ffi::ZD_STEP_APPLIED != 0,
            skipped: r.flags & ffi::ZD_STEP_SKIPPED != 0,
            flags: r.flags,
            step: r.step,
            micro_step: r.micro_step,
            lr: r.lr,
            loss_scale: r.loss_scale,
            grad_norm: r.grad_norm,
        })
    }

    /// The factor the trainer multiplies its loss by (1.0 unless fp16).
    pub fn loss_scale(&self) -> Result<f64> {
        let mut s = 0.0;
        // SAFETY: a live model, a valid out-pointer.
        let st = unsafe { ffi::zd_model_loss_scale(self.raw.as_ptr(), &mut s) };
        self.check(st)?;
        Ok(s)
    }

    /// Writes a checkpoint of the model state into `dir` (`zd_model_save`):
    /// every rank calls it, between steps; it loads at any world size and
    /// ZeRO stage.
    pub fn save(&mut self, dir: impl AsRef<Path>) -> Result<()> {
        let d = path_c_string(dir.as_ref())?;
        // SAFETY: a live model, a NUL-terminated path that outlives the call.
        let st = unsafe { ffi::zd_model_save(self.raw.as_ptr(), d.as_ptr()) };
        self.check(st)
    }

    /// Loads a checkpoint `save` wrote (`zd_model_load`): every rank, between steps.
    pub fn load(&mut self, dir: impl AsRef<Path>) -> Result<()> {
        let d = path_c_string(dir.as_ref())?;
        // SAFETY: a live model, a NUL-terminated path that outlives the call.
        let st = unsafe { ffi::zd_model_load(self.raw.as_ptr(), d.as_ptr()) };
        self.check(st)
    }

    /// The stream the trainer computes on, on a cuda device
    /// (`zd_model_set_stream`): begin calls make it wait for zerod's copies,
    /// backward_end makes zerod wait for it. Null is the default stream; the
    /// cpu device takes only null.
    ///
    /// # Safety
    /// `stream` is null or a `cudaStream_t` of the model's GPU that lives as
    /// long as the model uses it.
    pub unsafe fn set_stream(&mut self, stream: *mut c_void) -> Result<()> {
        // SAFETY: a live model; the caller vouches for the stream.
        let st = unsafe { ffi::zd_model_set_stream(self.raw.as_ptr(), stream) };
        self.check(st)
    }

    /// Copies a parameter's full fp32 master value into `dst`, converted to
    /// `T` (`zd_param_read`); `dst` holds exactly its element count. With
    /// ZeRO on several ranks every rank reads the same parameters in the
    /// same order.
    pub fn param_read<T: Element>(&mut self, param: ParamId, dst: &mut [T]) -> Result<()> {
        let bytes = (dst.len() * T::DTYPE.size()) as u64;
        // SAFETY: zerod checks bytes against the parameter's size before it
        // writes, and writes no more than bytes.
        let st = unsafe {
            ffi::zd_param_read(
                self.raw.as_ptr(),
                param.0,
                T::DTYPE.raw(),
                dst.as_mut_ptr() as *mut c_void,
                bytes,
            )
        };
        self.check(st)
    }

    /// `param_read` into a new vector of the parameter's length.
    pub fn param_read_vec<T: Element>(&mut self, param: ParamId) -> Result<Vec<T>> {
        let numel = self.param_info(param)?.numel.max(0) as usize;
        let mut v = vec![T::default(); numel];
        self.param_read(param, &mut v)?;
        Ok(v)
    }

    /// Overwrites a parameter's master and working copies from `src`
    /// (`zd_param_write`), between steps; optimizer state is kept.
    pub fn param_write<T: Element>(&mut self, param: ParamId, src: &[T]) -> Result<()> {
        let bytes = (src.len() * T::DTYPE.size()) as u64;
        // SAFETY: zerod checks bytes against the parameter's size before it
        // reads, and reads no more than bytes.
        let st = unsafe {
            ffi::zd_param_write(
                self.raw.as_ptr(),
                param.0,
                T::DTYPE.raw(),
                src.as_ptr() as *const c_void,
                bytes,
            )
        };
        self.check(st)
    }

    /// The optimizer, its state slots and the updates applied so far
    /// (`zd_model_optimizer_info`): what a checkpoint saves besides the
    /// parameters.
    pub fn optimizer_info(&self) -> Result<OptimizerInfo> {
        let mut raw = ffi::zd_optimizer_info::default();
        // SAFETY: a live model and a complete out struct.
        let st = unsafe { ffi::zd_model_optimizer_info(self.raw.as_ptr(), &mut raw) };
        self.check(st)?;
        let slots = (0..raw.state_slots.max(0) as usize)
            .filter(|&s| s < ffi::ZD_MAX_STATE_SLOTS)
            // SAFETY: zerod's strings live as long as the model.
            .map(|s| unsafe { string_from(raw.slot_names[s]) })
            .collect();
        Ok(OptimizerInfo {
            // SAFETY: as above.
            name: unsafe { string_from(raw.name) },
            slots,
            step: raw.step,
        })
    }

    /// One optimizer state slot of a parameter, whole
    /// (`zd_optimizer_state_read`); a collective like `param_read`.
    pub fn optimizer_state_read<T: Element>(&mut self, param: ParamId, slot: i32, dst: &mut [T]) -> Result<()> {
        let bytes = (dst.len() * T::DTYPE.size()) as u64;
        // SAFETY: zerod checks bytes against the parameter's size before it
        // writes, and writes no more than bytes.
        let st = unsafe {
            ffi::zd_optimizer_state_read(
                self.raw.as_ptr(),
                param.0,
                slot,
                T::DTYPE.raw(),
                dst.as_mut_ptr() as *mut c_void,
                bytes,
            )
        };
        self.check(st)
    }

    /// Overwrites one optimizer state slot of a parameter
    /// (`zd_optimizer_state_write`), between steps.
    pub fn optimizer_state_write<T: Element>(&mut self, param: ParamId, slot: i32, src: &[T]) -> Result<()> {
        let bytes = (src.len() * T::DTYPE.size()) as u64;
        // SAFETY: zerod checks bytes against the parameter's size before it
        // reads, and reads no more than bytes.
        let st = unsafe {
            ffi::zd_optimizer_state_write(
                self.raw.as_ptr(),
                param.0,
                slot,
                T::DTYPE.raw(),
                src.as_ptr() as *const c_void,
                bytes,
            )
        };
        self.check(st)
    }

    /// Restores the count of applied updates from a checkpoint
    /// (`zd_model_set_step`), dropping the gradients no `step()` applied.
    /// Only between steps: inside an accumulation window (after a `step()`
    /// that ended no window) zerod refuses it with `InvalidState`.
    pub fn set_step(&mut self, step: i64) -> Result<()> {
        // SAFETY: a live model.
        let st = unsafe { ffi::zd_model_set_step(self.raw.as_ptr(), step) };
        self.check(st)
    }

    /// Sets the learning rate of every update from the next accumulation
    /// boundary on, in place of the job's schedule, until set again
    /// (`zd_model_set_lr`, ABI 1.7): finite and >= 0, between modules. On
    /// several ranks every rank sets the same value (a collective; values
    /// that differ are refused on every rank). Checkpoints keep it with the
    /// step; `StepResult::lr` says what an update used.
    pub fn set_lr(&mut self, lr: f64) -> Result<()> {
        // SAFETY: a live model.
        let st = unsafe { ffi::zd_model_set_lr(self.raw.as_ptr(), lr) };
        self.check(st)
    }

    /// Reports what this rank processed since its last report (tokens,
    /// samples; 0 = not counted) and its loss (`zd_model_report`, ABI 1.3):
    /// the daemon's metrics and the trace's loss curve come from it.
    pub fn report(&mut self, tokens: u64, samples: u64, loss: Option<f64>) -> Result<()> {
        let p = ffi::zd_progress {
            flags: if loss.is_some() { ffi::ZD_PROGRESS_HAS_LOSS } else { 0 },
            tokens,
            samples,
            loss: loss.unwrap_or(0.0),
            ..Default::default()
        };
        // SAFETY: a live model and a complete struct.
        let st = unsafe { ffi::zd_model_report(self.raw.as_ptr(), &p) };
        self.check(st)
    }

    /// This rank's collective traffic so far (`zd_model_comm_figures`).
    pub fn comm_figures(&self) -> Result<CommFigures> {
        let mut raw = ffi::zd_comm_figures::default();
        // SAFETY: a live model and a complete out struct.
        let st = unsafe { ffi::zd_model_comm_figures(self.raw.as_ptr(), -1, &mut raw) };
        self.check(st)?;
        Ok(CommFigures {
            bytes_sent: raw.bytes_sent,
            network_bytes_sent: raw.network_bytes_sent,
            collectives: raw.collectives,
        })
    }

    /// This rank's bytes of one kind in one tier.
    pub fn memory(&self, tier: Tier, kind: MemKind) -> Result<MemoryFigures> {
        self.memory_of_rank(-1, tier, kind)
    }

    /// Another rank's bytes (-1 = this rank's).
    pub fn memory_of_rank(&self, rank: i32, tier: Tier, kind: MemKind) -> Result<MemoryFigures> {
        let mut m = ffi::zd_memory_figures::default();
        // SAFETY: a live model and a complete out struct.
        let st = unsafe {
            ffi::zd_model_memory(self.raw.as_ptr(), rank, tier.raw(), kind.raw(), &mut m)
        };
        self.check(st)?;
        Ok(MemoryFigures::from_raw(&m))
    }

    /// The message of the last failed call on this model, or "".
    pub fn last_error(&self) -> String {
        // SAFETY: a live model.
        unsafe { model_error(self.raw.as_ptr()) }
    }

    /// The raw handle, for calls this crate does not wrap. It stays owned by
    /// the Model.
    pub fn as_ptr(&self) -> *mut ffi::zd_model {
        self.raw.as_ptr()
    }

    fn check(&self, status: ffi::zd_status) -> Result<()> {
        check(status, || self.last_error())
    }
}

/// The optimizer of a model (`zd_optimizer_info`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptimizerInfo {
    /// The plugin, e.g. "adamw".
    pub name: String,
    /// Its state slots, e.g. ["exp_avg", "exp_avg_sq"].
    pub slots: Vec<String>,
    /// Optimizer updates applied so far.
    pub step: i64,
}

/// A rank's collective traffic (`zd_comm_figures`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommFigures {
    /// Bytes sent to other ranks, as a ring puts them on links.
    pub bytes_sent: u64,
    /// Bytes this rank's node sent to other nodes (0 on one node).
    pub network_bytes_sent: u64,
    /// Collectives completed.
    pub collectives: u64,
}

impl Drop for Model<'_> {
    fn drop(&mut self) {
        // SAFETY: a live model; guards and views borrow it, so none is left.
        unsafe { ffi::zd_model_destroy(self.raw.as_ptr()) }
    }
}

impl fmt::Debug for Model<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Model").field("raw", &self.raw).finish()
    }
}

/// The model's last error (`zd_model_last_error`).
///
/// # Safety
/// `model` is a live model.
pub(crate) unsafe fn model_error(model: *const ffi::zd_model) -> String {
    string_from(ffi::zd_model_last_error(model))
}

/// A path as a C string, or `Status::InvalidArgument` when it holds a NUL.
fn path_c_string(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| {
        Error::new(
            Status::InvalidArgument,
            format!("path contains a NUL byte: {}", p.display()),
        )
    })
}
