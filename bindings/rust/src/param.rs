//! Parameters and modules: ids, the description a parameter is registered
//! with, and what a model says about them.

use std::marker::PhantomData;
use std::os::raw::c_void;
use std::ptr;

use crate::dtype::{Dtype, Element};
use crate::ffi;

/// A parameter: dense, 0-based, in registration order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ParamId(pub i32);

/// A module, the unit of residency: dense, 0-based, in order of first
/// mention at registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModuleId(pub i32);

/// What `Model::register_param` registers:
///
/// ```
/// # use zerod::{Dtype, ParamDesc};
/// let init = vec![0.1_f32; 64 * 2];
/// let desc = ParamDesc::new("fc1.weight", "fc1", &[64, 2]).dtype(Dtype::Bf16).init(&init);
/// # let _ = desc;
/// ```
#[derive(Clone, Copy, Debug)]
pub struct ParamDesc<'a> {
    pub(crate) name: &'a str,
    pub(crate) module: &'a str,
    pub(crate) shape: &'a [i64],
    pub(crate) dtype: Dtype,
    pub(crate) init: Init<'a>,
}

/// Initial values as the C struct wants them: a pointer, a count and their
/// type, kept alive by the borrow.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Init<'a> {
    pub(crate) ptr: *const c_void,
    pub(crate) len: usize,
    pub(crate) dtype: Dtype,
    _values: PhantomData<&'a [u8]>,
}

impl<'a> ParamDesc<'a> {
    /// An f32 parameter `name` of `module` with this shape (row-major), whose
    /// values start at zero.
    pub fn new(name: &'a str, module: &'a str, shape: &'a [i64]) -> ParamDesc<'a> {
        ParamDesc {
            name,
            module,
            shape,
            dtype: Dtype::F32,
            init: Init {
                ptr: ptr::null(),
                len: 0,
                dtype: Dtype::F32,
                _values: PhantomData,
            },
        }
    }

    /// The working copy's type: F32, or the job's 16-bit precision.
    pub fn dtype(mut self, dtype: Dtype) -> ParamDesc<'a> {
        self.dtype = dtype;
        self
    }

    /// Initial values, one per element, in any element type (they are
    /// converted). Rank 0's are used in a job of several ranks.
    pub fn init<T: Element>(mut self, values: &'a [T]) -> ParamDesc<'a> {
        self.init = Init {
            ptr: values.as_ptr() as *const c_void,
            len: values.len(),
            dtype: T::DTYPE,
            _values: PhantomData,
        };
        self
    }

    pub(crate) fn has_init(&self) -> bool {
        !self.init.ptr.is_null()
    }

    /// The element count of the shape, or None when the shape is one zerod
    /// will refuse (no dimension or more than `ZD_MAX_DIMS`, a non-positive
    /// extent, an overflow), so that zerod's own error names the fault.
    pub(crate) fn numel(&self) -> Option<usize> {
        if self.shape.is_empty() || self.shape.len() > ffi::ZD_MAX_DIMS {
            return None;
        }
        self.shape.iter().try_fold(1usize, |n, &e| {
            if e > 0 {
                n.checked_mul(usize::try_from(e).ok()?)
            } else {
                None
            }
        })
    }
}

/// A registered parameter (`zd_param_info`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamInfo {
    pub name: String,
    pub dtype: Dtype,
    pub module: ModuleId,
    pub shape: Vec<i64>,
    pub numel: i64,
}

/// A module and its parameters (`zd_model_module_info`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleInfo {
    pub name: String,
    pub params: Vec<ParamId>,
}
