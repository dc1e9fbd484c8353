//! Views into zerod's memory: a parameter's working copy (read-only) and its
//! gradient buffer (writable), as slices that live no longer than the guard
//! of the module they belong to.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::mem;
use std::slice;

use crate::dtype::{Bf16, Dtype, Element, F16};
use crate::error::{Error, Result, Status};
use crate::ffi;

/// A view's elements as a slice of their own type.
#[derive(Clone, Copy, Debug)]
pub enum Elements<'a> {
    F32(&'a [f32]),
    Bf16(&'a [Bf16]),
    F16(&'a [F16]),
}

/// A gradient view's elements as a mutable slice of their own type.
#[derive(Debug)]
pub enum ElementsMut<'a> {
    F32(&'a mut [f32]),
    Bf16(&'a mut [Bf16]),
    F16(&'a mut [F16]),
}

/// What every view holds: the C struct, and the checked element type,
/// address and count the slices are made from.
#[derive(Clone, Copy)]
struct Checked {
    raw: ffi::zd_view,
    dtype: Dtype,
    data: *mut u8,
    len: usize,
}

impl Checked {
    /// Refuses a view whose bytes cannot be a Rust slice, rather than make
    /// one that is undefined behaviour to touch.
    fn new(call: &str, raw: ffi::zd_view) -> Result<Checked> {
        let fail = |status, what: String| Err(Error::new(status, format!("{}: {}", call, what)));
        let dtype = match Dtype::from_raw(raw.dtype) {
            Some(d) => d,
            None => {
                return fail(
                    Status::NotImplemented,
                    format!(
                        "the view has dtype {}, which this zerod crate does not know",
                        raw.dtype
                    ),
                )
            }
        };
        if raw.device_type != ffi::ZD_DEVICE_CPU {
            return fail(
                Status::NotImplemented,
                format!("the view is in device memory (device type {}); slices need host memory: use the raw view", raw.device_type),
            );
        }
        let size = dtype.size() as u64;
        let ndim = raw.ndim.clamp(0, ffi::ZD_MAX_DIMS as i32) as usize;
        let numel = raw.shape[..ndim]
            .iter()
            .try_fold(1u64, |n, &e| n.checked_mul(u64::try_from(e).ok()?));
        if raw.ndim < 0
            || raw.ndim as usize > ffi::ZD_MAX_DIMS
            || numel.and_then(|n| n.checked_mul(size)) != Some(raw.nbytes)
        {
            return fail(
                Status::Internal,
                format!(
                    "the view's {} bytes do not match its shape {:?}",
                    raw.nbytes,
                    &raw.shape[..ndim]
                ),
            );
        }
        if raw.nbytes > isize::MAX as u64 {
            return fail(
                Status::Internal,
                format!("the view's {} bytes exceed this address space", raw.nbytes),
            );
        }
        let data = raw.data as *mut u8;
        if raw.nbytes > 0 && (data.is_null() || data as usize % align(dtype) != 0) {
            return fail(
                Status::Internal,
                format!(
                    "the view's address {:p} cannot hold {:?} elements",
                    data, dtype
                ),
            );
        }
        Ok(Checked {
            raw,
            dtype,
            data,
            len: (raw.nbytes / size) as usize,
        })
    }

    fn shape(&self) -> &[i64] {
        &self.raw.shape[..self.raw.ndim as usize]
    }

    /// # Safety
    /// The view's memory is valid and not written for `'a`.
    unsafe fn slice<'a, T: Element>(&self) -> Option<&'a [T]> {
        if T::DTYPE != self.dtype {
            return None;
        }
        Some(if self.len == 0 {
            &[]
        } else {
            slice::from_raw_parts(self.data as *const T, self.len)
        })
    }

    /// # Safety
    /// The view's memory is valid for `'a` and reached through nothing else.
    unsafe fn slice_mut<'a, T: Element>(&self) -> Option<&'a mut [T]> {
        if T::DTYPE != self.dtype {
            return None;
        }
        Some(if self.len == 0 {
            &mut []
        } else {
            slice::from_raw_parts_mut(self.data as *mut T, self.len)
        })
    }

    fn byte_range(&self) -> (usize, usize) {
        (
            self.data as usize,
            self.data as usize + self.len * self.dtype.size(),
        )
    }
}

fn align(dtype: Dtype) -> usize {
    match dtype {
        Dtype::F32 => mem::align_of::<f32>(),
        Dtype::Bf16 => mem::align_of::<Bf16>(),
        Dtype::F16 => mem::align_of::<F16>(),
    }
}

/// The working copy of a parameter whose module is begun (`zd_param_view`):
/// read-only, row-major, valid while the guard it came from lives.
pub struct ParamView<'a> {
    view: Checked,
    _guard: PhantomData<&'a [u8]>,
}

impl<'a> ParamView<'a> {
    /// # Safety
    /// The view's memory stays valid and unwritten for `'a`.
    pub(crate) unsafe fn new(raw: ffi::zd_view) -> Result<ParamView<'a>> {
        Ok(ParamView {
            view: Checked::new("zd_param_view", raw)?,
            _guard: PhantomData,
        })
    }

    pub fn dtype(&self) -> Dtype {
        self.view.dtype
    }

    pub fn shape(&self) -> &[i64] {
        self.view.shape()
    }

    /// The element count.
    pub fn len(&self) -> usize {
        self.view.len
    }

    pub fn is_empty(&self) -> bool {
        self.view.len == 0
    }

    /// The elements in their own type.
    pub fn elements(&self) -> Elements<'a> {
        // SAFETY: the constructor's contract; the dtype picks the slice type.
        unsafe {
            match self.view.dtype {
                Dtype::F32 => Elements::F32(self.view.slice().unwrap_or(&[])),
                Dtype::Bf16 => Elements::Bf16(self.view.slice().unwrap_or(&[])),
                Dtype::F16 => Elements::F16(self.view.slice().unwrap_or(&[])),
            }
        }
    }

    /// The elements as `T`, or None when the view holds another type.
    pub fn as_slice<T: Element>(&self) -> Option<&'a [T]> {
        // SAFETY: the constructor's contract.
        unsafe { self.view.slice() }
    }

    /// Element `i` as f32. Panics when `i` is out of range.
    pub fn get(&self, i: usize) -> f32 {
        match self.elements() {
            Elements::F32(s) => s[i],
            Elements::Bf16(s) => s[i].to_f32(),
            Elements::F16(s) => s[i].to_f32(),
        }
    }

    /// The elements as f32: borrowed when they are f32, converted otherwise.
    pub fn to_f32(&self) -> Cow<'a, [f32]> {
        match self.elements() {
            Elements::F32(s) => Cow::Borrowed(s),
            Elements::Bf16(s) => Cow::Owned(s.iter().map(|x| x.to_f32()).collect()),
            Elements::F16(s) => Cow::Owned(s.iter().map(|x| x.to_f32()).collect()),
        }
    }

    /// Copies the elements, converted to f32, into `dst`. Panics when the
    /// lengths differ.
    pub fn copy_to_f32(&self, dst: &mut [f32]) {
        assert_eq!(dst.len(), self.len(), "copy_to_f32: destination length");
        match self.elements() {
            Elements::F32(s) => dst.copy_from_slice(s),
            Elements::Bf16(s) => dst.iter_mut().zip(s).for_each(|(d, x)| *d = x.to_f32()),
            Elements::F16(s) => dst.iter_mut().zip(s).for_each(|(d, x)| *d = x.to_f32()),
        }
    }

    /// True when the trainer must not write (always, for parameters).
    pub fn read_only(&self) -> bool {
        self.view.raw.flags & ffi::ZD_VIEW_READ_ONLY != 0
    }

    /// The C struct: device, arena and offset (daemon mode), for DLPack and
    /// the like.
    pub fn raw(&self) -> &ffi::zd_view {
        &self.view.raw
    }
}

/// The gradient buffer of a parameter whose module is in backward
/// (`zd_grad_view`): zero at `backward_begin`; what it holds at
/// `backward_end` is added to the parameter's gradient.
pub struct GradView<'a> {
    view: Checked,
    _guard: PhantomData<&'a mut [u8]>,
}

impl<'a> GradView<'a> {
    /// # Safety
    /// The view's memory stays valid for `'a` and nothing else reaches it.
    pub(crate) unsafe fn new(raw: ffi::zd_view) -> Result<GradView<'a>> {
        Ok(GradView {
            view: Checked::new("zd_grad_view", raw)?,
            _guard: PhantomData,
        })
    }

    pub fn dtype(&self) -> Dtype {
        self.view.dtype
    }

    pub fn shape(&self) -> &[i64] {
        self.view.shape()
    }

    pub fn len(&self) -> usize {
        self.view.len
    }

    pub fn is_empty(&self) -> bool {
        self.view.len == 0
    }

    pub fn elements(&self) -> Elements<'_> {
        // SAFETY: the constructor's contract; a shared borrow of self.
        unsafe {
            match self.view.dtype {
                Dtype::F32 => Elements::F32(self.view.slice().unwrap_or(&[])),
                Dtype::Bf16 => Elements::Bf16(self.view.slice().unwrap_or(&[])),
                Dtype::F16 => Elements::F16(self.view.slice().unwrap_or(&[])),
            }
        }
    }

    pub fn elements_mut(&mut self) -> ElementsMut<'_> {
        // SAFETY: the constructor's contract; an exclusive borrow of self.
        unsafe {
            match self.view.dtype {
                Dtype::F32 => ElementsMut::F32(self.view.slice_mut().unwrap_or(&mut [])),
                Dtype::Bf16 => ElementsMut::Bf16(self.view.slice_mut().unwrap_or(&mut [])),
                Dtype::F16 => ElementsMut::F16(self.view.slice_mut().unwrap_or(&mut [])),
            }
        }
    }

    pub fn as_slice<T: Element>(&self) -> Option<&[T]> {
        // SAFETY: the constructor's contract; a shared borrow of self.
        unsafe { self.view.slice() }
    }

    /// The elements as `T`, or None when the buffer holds another type.
    pub fn as_mut_slice<T: Element>(&mut self) -> Option<&mut [T]> {
        // SAFETY: the constructor's contract; an exclusive borrow of self.
        unsafe { self.view.slice_mut() }
    }

    /// Element `i` as f32. Panics when `i` is out of range.
    pub fn get(&self, i: usize) -> f32 {
        match self.elements() {
            Elements::F32(s) => s[i],
            Elements::Bf16(s) => s[i].to_f32(),
            Elements::F16(s) => s[i].to_f32(),
        }
    }

    /// Stores `x`, converted to the buffer's type. Panics when `i` is out of
    /// range.
    pub fn set(&mut self, i: usize, x: f32) {
        match self.elements_mut() {
            ElementsMut::F32(s) => s[i] = x,
            ElementsMut::Bf16(s) => s[i] = Bf16::from_f32(x),
            ElementsMut::F16(s) => s[i] = F16::from_f32(x),
        }
    }

    /// Overwrites the buffer with `src`, converted. Panics when the lengths
    /// differ.
    pub fn copy_from_f32(&mut self, src: &[f32]) {
        assert_eq!(src.len(), self.len(), "copy_from_f32: source length");
        match self.elements_mut() {
            ElementsMut::F32(s) => s.copy_from_slice(src),
            ElementsMut::Bf16(s) => s
                .iter_mut()
                .zip(src)
                .for_each(|(d, &x)| *d = Bf16::from_f32(x)),
            ElementsMut::F16(s) => s
                .iter_mut()
                .zip(src)
                .for_each(|(d, &x)| *d = F16::from_f32(x)),
        }
    }

    pub fn raw(&self) -> &ffi::zd_view {
        &self.view.raw
    }

    pub(crate) fn byte_range(&self) -> (usize, usize) {
        self.view.byte_range()
    }
}

impl ParamView<'_> {
    pub(crate) fn byte_range(&self) -> (usize, usize) {
        self.view.byte_range()
    }
}

impl fmt::Debug for ParamView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ParamView")
            .field("dtype", &self.dtype())
            .field("shape", &self.shape())
            .field("data", &self.view.data)
            .finish()
    }
}

impl fmt::Debug for GradView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GradView")
            .field("dtype", &self.dtype())
            .field("shape", &self.shape())
            .field("data", &self.view.data)
            .finish()
    }
}

/// Whether two byte ranges share a byte.
pub(crate) fn overlap(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 < b.1 && b.0 < a.1
}
