//! Module guards: a `forward_begin` / `backward_begin` whose drop is the
//! matching `_end`.
//!
//! A guard borrows its model mutably, and views borrow the guard, so while a
//! view is alive no call that could end the module, step, or write a
//! parameter can be made; a nested begin (a module inside a module, a
//! recomputed forward inside a backward) borrows the outer guard mutably, so
//! the outer guard's views end first. A leaked guard (`mem::forget`) only
//! leaves its module begun: later calls then fail with `InvalidState`.
//!
//! `backward_end` adds whatever the gradient views hold, so a backward guard
//! dropped while its thread panics zeroes its module's gradient views first
//! (on the cpu device; device memory the host cannot write): a panic half
//! way through the gradients adds nothing of this backward.
//! `BackwardGuard::discard` does the same for an error returned early. A
//! guard dropped otherwise (a `?` before `end()`) ends the backward with
//! what was written. Device memory (a cuda job) the trainer zeroes itself
//! before `end()` (`cudaMemsetAsync` on `grad_raw(p).data`): once added,
//! gradients go only through `Model::set_step(model.optimizer_info()?.step)`,
//! which zerod allows between steps alone (at a window's first micro-batch,
//! before its `step()`) and refuses inside the window with `InvalidState`.

use std::fmt;
use std::marker::PhantomData;
use std::ptr::{self, NonNull};

use crate::error::{check, Error, Result, Status};
use crate::ffi;
use crate::model::model_error;
use crate::param::{ModuleId, ParamId};
use crate::view::{overlap, GradView, ParamView};

type Call = unsafe extern "C" fn(*mut ffi::zd_model, ffi::zd_module_id) -> ffi::zd_status;
type ViewCall =
    unsafe extern "C" fn(*mut ffi::zd_model, ffi::zd_param_id, *mut ffi::zd_view) -> ffi::zd_status;

/// What both guards hold: the model, the module, and the call that ends it.
struct Scope<'m> {
    model: NonNull<ffi::zd_model>,
    module: ModuleId,
    end: Call,
    open: bool,
    /// A backward: its gradient views are zeroed before an end made while
    /// the thread panics.
    backward: bool,
    _model: PhantomData<&'m mut ffi::zd_model>,
}

impl<'m> Scope<'m> {
    fn begin(
        model: NonNull<ffi::zd_model>,
        module: ModuleId,
        begin: Call,
        end: Call,
        backward: bool,
    ) -> Result<Scope<'m>> {
        // SAFETY: a live model, exclusively borrowed for 'm by the caller.
        let st = unsafe { begin(model.as_ptr(), module.0) };
        // SAFETY: as above; the message is read right after the failure.
        check(st, || unsafe { model_error(model.as_ptr()) })?;
        Ok(Scope {
            model,
            module,
            end,
            open: true,
            backward,
            _model: PhantomData,
        })
    }

    /// Zeroes the gradient views of this scope's module, so that its end
    /// adds nothing: as they were at `backward_begin`. Views in device
    /// memory (a cuda job) cannot be written from here: Err names them.
    fn zero_grads(&self) -> Result<()> {
        let model = self.model.as_ptr();
        let mut count = 0;
        // SAFETY: a live model; ids NULL asks for the count only.
        let st = unsafe {
            ffi::zd_model_module_info(
                model,
                self.module.0,
                ptr::null_mut(),
                ptr::null_mut(),
                &mut count,
            )
        };
        check(st, || unsafe { model_error(model) })?;
        let mut ids = vec![0; count.max(0) as usize];
        // SAFETY: ids has room for count; count says so.
        let st = unsafe {
            ffi::zd_model_module_info(
                model,
                self.module.0,
                ptr::null_mut(),
                ids.as_mut_ptr(),
                &mut count,
            )
        };
        check(st, || unsafe { model_error(model) })?;
        ids.truncate(count.max(0) as usize);
        let mut in_device_memory = 0;
        for id in ids {
            let v = self.grad(ParamId(id))?;
            if v.device_type != ffi::ZD_DEVICE_CPU {
                in_device_memory += 1;
            } else if !v.data.is_null() {
                // SAFETY: zerod.h: the buffer is nbytes of host memory, the
                // module's, writable until backward_end; no GradView of this
                // guard is alive (they borrow it), so nothing else refers
                // to it here.
                unsafe { ptr::write_bytes(v.data.cast::<u8>(), 0, v.nbytes as usize) };
            }
        }
        if in_device_memory > 0 {
            return Err(Error::new(
                Status::NotImplemented,
                format!(
                    "zd_backward_end: {} gradient view(s) of module {} are in device memory, which this crate \
                     cannot zero, so the backward's end added what they held; zero them yourself before end() \
                     (cudaMemsetAsync on grad_raw(p).data). At a window's first micro-batch (no step() yet in \
                     the window) Model::set_step(model.optimizer_info()?.step) drops them; later in the window \
                     zerod refuses it",
                    in_device_memory, self.module.0
                ),
            ));
        }
        Ok(())
    }

    fn end(&mut self) -> Result<()> {
        if !self.open {
            return Ok(());
        }
        self.open = false;
        let model = self.model.as_ptr();
        // SAFETY: the model is live for 'm; every view of this scope borrowed
        // the guard, so none is left when it ends.
        let st = unsafe { (self.end)(model, self.module.0) };
        check(st, || unsafe { model_error(model) })
    }

    fn view(&self, param: ParamId, call: ViewCall) -> Result<ffi::zd_view> {
        let mut v = ffi::zd_view::default();
        let model = self.model.as_ptr();
        // SAFETY: a live model and a complete out struct.
        let st = unsafe { call(model, param.0, &mut v) };
        check(st, || unsafe { model_error(model) })?;
        Ok(v)
    }

    fn param(&self, param: ParamId) -> Result<ParamView<'_>> {
        let raw = self.view(param, ffi::zd_param_view)?;
        // SAFETY: zerod.h: valid until the module's matching _end, and
        // read-only; the view borrows self, which ends the module only after
        // the view is gone.
        unsafe { ParamView::new(raw) }
    }

    fn grad(&self, param: ParamId) -> Result<ffi::zd_view> {
        self.view(param, ffi::zd_grad_view)
    }

    /// A nested scope: it borrows this one mutably, so this one's views end
    /// before it begins.
    fn nested(
        &mut self,
        module: ModuleId,
        begin: Call,
        end: Call,
        backward: bool,
    ) -> Result<Scope<'_>> {
        Scope::begin(self.model, module, begin, end, backward)
    }
}

impl Drop for Scope<'_> {
    fn drop(&mut self) {
        // A panic between backward_begin and backward_end leaves gradients
        // half written; the end would add them. Zeroed, it adds nothing.
        if self.open && self.backward && std::thread::panicking() {
            let _ = self.zero_grads();
        }
        // A failure here has nowhere to go; `end()` is the way to see it.
        let _ = self.end();
    }
}

/// A module between `forward_begin` and `forward_end` (`Model::forward`).
/// Dropping it ends the forward; `end()` does too and reports a failure.
pub struct ForwardGuard<'m> {
    scope: Scope<'m>,
}

impl<'m> ForwardGuard<'m> {
    pub(crate) fn begin(
        model: NonNull<ffi::zd_model>,
        module: ModuleId,
    ) -> Result<ForwardGuard<'m>> {
        Ok(ForwardGuard {
            scope: Scope::begin(
                model,
                module,
                ffi::zd_forward_begin,
                ffi::zd_forward_end,
                false,
            )?,
        })
    }

    pub fn module(&self) -> ModuleId {
        self.scope.module
    }

    /// The working copy of a parameter of this module (or of an enclosing
    /// begun one), read-only.
    pub fn param(&self, param: ParamId) -> Result<ParamView<'_>> {
        self.scope.param(param)
    }

    /// The C view of a parameter, unchecked: for memory a slice cannot
    /// describe (a CUDA device). Its pointer is valid while this guard lives.
    pub fn param_raw(&self, param: ParamId) -> Result<ffi::zd_view> {
        self.scope.view(param, ffi::zd_param_view)
    }

    /// Begins a module nested in this one.
    pub fn forward(&mut self, module: ModuleId) -> Result<ForwardGuard<'_>> {
        Ok(ForwardGuard {
            scope: self
                .scope
                .nested(module, ffi::zd_forward_begin, ffi::zd_forward_end, false)?,
        })
    }

    /// `forward_end`, with its result.
    pub fn end(mut self) -> Result<()> {
        self.scope.end()
    }
}

/// A module between `backward_begin` and `backward_end` (`Model::backward`).
/// Dropping it ends the backward; `end()` does too and reports a failure.
/// Dropped while the thread panics, it first zeroes the module's gradient
/// views, so the end adds nothing of this backward; `discard()` does that
/// on purpose (an error half way through the gradients).
pub struct BackwardGuard<'m> {
    scope: Scope<'m>,
}

impl<'m> BackwardGuard<'m> {
    pub(crate) fn begin(
        model: NonNull<ffi::zd_model>,
        module: ModuleId,
    ) -> Result<BackwardGuard<'m>> {
        Ok(BackwardGuard {
            scope: Scope::begin(
                model,
                module,
                ffi::zd_backward_begin,
                ffi::zd_backward_end,
                true,
            )?,
        })
    }

    pub fn module(&self) -> ModuleId {
        self.scope.module
    }

    /// The working copy of a parameter of this module, read-only.
    pub fn param(&self, param: ParamId) -> Result<ParamView<'_>> {
        self.scope.param(param)
    }

    /// The C view of a parameter, unchecked (see `ForwardGuard::param_raw`):
    /// a backward on a CUDA device reads W through it, as `param` refuses
    /// device memory. Its pointer is valid while this guard lives.
    pub fn param_raw(&self, param: ParamId) -> Result<ffi::zd_view> {
        self.scope.view(param, ffi::zd_param_view)
    }

    /// The gradient buffer of a parameter of this module.
    pub fn grad_mut(&mut self, param: ParamId) -> Result<GradView<'_>> {
        let raw = self.scope.grad(param)?;
        // SAFETY: zerod.h: valid until backward_end; the view borrows self
        // exclusively, so it is the only way to the buffer while it lives.
        unsafe { GradView::new(raw) }
    }

    /// The gradient buffers of several distinct parameters at once.
    pub fn grads_mut<const N: usize>(&mut self, params: [ParamId; N]) -> Result<[GradView<'_>; N]> {
        let (_, grads) = self.views::<0, N>([], params)?;
        Ok(grads)
    }

    /// Parameters to read and gradients to write, all at once (a layer's
    /// backward reads W while it writes dW): the gradient ids must be
    /// distinct, and no gradient may share memory with another view.
    pub fn views<const P: usize, const G: usize>(
        &mut self,
        params: [ParamId; P],
        grads: [ParamId; G],
    ) -> Result<([ParamView<'_>; P], [GradView<'_>; G])> {
        for (i, g) in grads.iter().enumerate() {
            if grads[..i].contains(g) {
                return Err(Error::new(
                    Status::InvalidArgument,
                    format!("zd_grad_view: parameter {} is asked for twice; a gradient can be borrowed mutably once", g.0),
                ));
            }
        }
        let mut p = Vec::with_capacity(P);
        for &id in &params {
            p.push(self.scope.param(id)?);
        }
        let mut g = Vec::with_capacity(G);
        for &id in &grads {
            let raw = self.scope.grad(id)?;
            // SAFETY: as in grad_mut; exclusivity is checked below, before
            // any of them is handed out.
            g.push(unsafe { GradView::new(raw)? });
        }
        for (i, a) in g.iter().enumerate() {
            let mut shared = g[..i]
                .iter()
                .map(GradView::byte_range)
                .chain(p.iter().map(ParamView::byte_range));
            if shared.any(|b| overlap(a.byte_range(), b)) {
                return Err(Error::new(
                    Status::Internal,
                    "zd_grad_view: a gradient buffer overlaps another view",
                ));
            }
        }
        Ok((into_array(p), into_array(g)))
    }

    /// The C view of a gradient, unchecked (see `ForwardGuard::param_raw`).
    pub fn grad_raw(&self, param: ParamId) -> Result<ffi::zd_view> {
        self.scope.grad(param)
    }

    /// Begins a forward inside this backward (activation recomputation).
    pub fn forward(&mut self, module: ModuleId) -> Result<ForwardGuard<'_>> {
        Ok(ForwardGuard {
            scope: self
                .scope
                .nested(module, ffi::zd_forward_begin, ffi::zd_forward_end, false)?,
        })
    }

    /// Begins a backward nested in this one.
    pub fn backward(&mut self, module: ModuleId) -> Result<BackwardGuard<'_>> {
        Ok(BackwardGuard {
            scope: self
                .scope
                .nested(module, ffi::zd_backward_begin, ffi::zd_backward_end, true)?,
        })
    }

    /// `backward_end`, with its result.
    pub fn end(mut self) -> Result<()> {
        self.scope.end()
    }

    /// Ends the backward adding nothing: the module's gradient views are
    /// zeroed first, as they were at `backward_begin` (contributions of
    /// earlier backwards stay). For an error half way through the
    /// gradients. On a cuda device the views cannot be zeroed from the
    /// host: the backward ends with what they hold, and the error says so.
    pub fn discard(mut self) -> Result<()> {
        let zeroed = self.scope.zero_grads();
        let ended = self.scope.end();
        ended.and(zeroed)
    }
}

impl fmt::Debug for ForwardGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ForwardGuard")
            .field("module", &self.scope.module)
            .field("open", &self.scope.open)
            .finish()
    }
}

impl fmt::Debug for BackwardGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackwardGuard")
            .field("module", &self.scope.module)
            .field("open", &self.scope.open)
            .finish()
    }
}

fn into_array<T, const N: usize>(v: Vec<T>) -> [T; N] {
    match v.try_into() {
        Ok(a) => a,
        Err(_) => unreachable!("one element was pushed per id"),
    }
}
