//! The raw C ABI of `include/zerod/zerod.h`, declared by hand.
//!
//! Names, types and layouts follow the header one for one (the C typedef
//! names are kept, so `zd_status` here is `zd_status` there);
//! `tests/abi_layout.rs` compiles a C program against the header and fails
//! when a size, alignment, offset, constant or signature here differs. The
//! `Default` of each struct is the header's `ZD_*_INIT` macro.
//!
//! Everything here is `unsafe` to call; the rest of the crate is the safe
//! layer over it.
#![allow(non_camel_case_types)]

use std::marker::{PhantomData, PhantomPinned};
use std::os::raw::{c_char, c_void};
use std::ptr;

// Versions ---------------------------------------------------------------

pub const ZD_ABI_VERSION_MAJOR: u32 = 1;
pub const ZD_ABI_VERSION_MINOR: u32 = 7;
pub const ZD_ABI_VERSION: u32 = (ZD_ABI_VERSION_MAJOR << 16) | ZD_ABI_VERSION_MINOR;

// Status codes -----------------------------------------------------------

pub type zd_status = i32;
pub const ZD_OK: zd_status = 0;
pub const ZD_ERR_INVALID_ARGUMENT: zd_status = 1;
pub const ZD_ERR_INVALID_STATE: zd_status = 2;
pub const ZD_ERR_NOT_FOUND: zd_status = 3;
pub const ZD_ERR_SHAPE_MISMATCH: zd_status = 4;
pub const ZD_ERR_CONFIG: zd_status = 5;
pub const ZD_ERR_PLUGIN: zd_status = 6;
pub const ZD_ERR_OUT_OF_MEMORY: zd_status = 7;
pub const ZD_ERR_BUDGET: zd_status = 8;
pub const ZD_ERR_IO: zd_status = 9;
pub const ZD_ERR_NOT_IMPLEMENTED: zd_status = 10;
pub const ZD_ERR_VERSION: zd_status = 11;
pub const ZD_ERR_PEER_LOST: zd_status = 12;
pub const ZD_ERR_TIMEOUT: zd_status = 13;
pub const ZD_ERR_BUFFER_TOO_SMALL: zd_status = 14;
pub const ZD_ERR_INTERNAL: zd_status = 15;

// Enumerations -----------------------------------------------------------

pub type zd_dtype = i32;
pub const ZD_DTYPE_F32: zd_dtype = 1;
pub const ZD_DTYPE_BF16: zd_dtype = 2;
pub const ZD_DTYPE_F16: zd_dtype = 3;

pub type zd_tier = i32;
pub const ZD_TIER_DEVICE: zd_tier = 0;
pub const ZD_TIER_HOST: zd_tier = 1;
pub const ZD_TIER_NVME: zd_tier = 2;
pub const ZD_TIER_COUNT: zd_tier = 3;

pub type zd_mem_kind = i32;
pub const ZD_MEM_ALL: zd_mem_kind = -1;
pub const ZD_MEM_PARAMS: zd_mem_kind = 0;
pub const ZD_MEM_GRADS: zd_mem_kind = 1;
pub const ZD_MEM_MASTER: zd_mem_kind = 2;
pub const ZD_MEM_OPTIMIZER: zd_mem_kind = 3;
pub const ZD_MEM_BUFFERS: zd_mem_kind = 4;
pub const ZD_MEM_KIND_COUNT: zd_mem_kind = 5;

pub type zd_param_id = i32;
pub const ZD_MODEL_ALLOW_SCRIPT_IO: u32 = 1 << 0;
pub type zd_module_id = i32;
pub const ZD_MAX_DIMS: usize = 8;

pub const ZD_VIEW_READ_ONLY: u32 = 1 << 0;
pub const ZD_DEVICE_CPU: i32 = 1;
pub const ZD_DEVICE_CUDA: i32 = 2;

pub const ZD_STEP_BOUNDARY: u32 = 1 << 0;
pub const ZD_STEP_APPLIED: u32 = 1 << 1;
pub const ZD_STEP_SKIPPED: u32 = 1 << 2;
pub const ZD_PROGRESS_HAS_LOSS: u32 = 1;

// Handles ----------------------------------------------------------------

/// `zd_client`: opaque; only ever behind a pointer.
#[repr(C)]
pub struct zd_client {
    _opaque: [u8; 0],
    _not_send_sync_unpin: PhantomData<(*mut u8, PhantomPinned)>,
}

/// `zd_model`: opaque; only ever behind a pointer.
#[repr(C)]
pub struct zd_model {
    _opaque: [u8; 0],
    _not_send_sync_unpin: PhantomData<(*mut u8, PhantomPinned)>,
}

// Structs ----------------------------------------------------------------

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct zd_connect_options {
    pub struct_size: u32,
    pub abi_version: u32,
    pub timeout_ms: u32,
    pub reserved: u32,
}

impl Default for zd_connect_options {
    fn default() -> Self {
        zd_connect_options {
            struct_size: size_of_u32::<Self>(),
            abi_version: ZD_ABI_VERSION,
            timeout_ms: 0,
            reserved: 0,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct zd_client_info {
    pub struct_size: u32,
    pub rank: i32,
    pub world_size: i32,
    pub local_rank: i32,
    pub embedded: i32,
}

impl Default for zd_client_info {
    fn default() -> Self {
        zd_client_info {
            struct_size: size_of_u32::<Self>(),
            rank: 0,
            world_size: 0,
            local_rank: 0,
            embedded: 0,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct zd_model_options {
    pub struct_size: u32,
    pub flags: u32,
    pub script_path: *const c_char,
    pub script_text: *const c_char,
    pub script_name: *const c_char,
    /// Since ABI 1.1.
    pub device: *const c_char,
}

impl Default for zd_model_options {
    fn default() -> Self {
        zd_model_options {
            struct_size: size_of_u32::<Self>(),
            flags: 0,
            script_path: ptr::null(),
            script_text: ptr::null(),
            script_name: ptr::null(),
            device: ptr::null(),
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct zd_param_desc {
    pub struct_size: u32,
    pub dtype: zd_dtype,
    pub name: *const c_char,
    pub module: *const c_char,
    pub ndim: i32,
    pub shape: *const i64,
    pub init: *const c_void,
    pub init_dtype: zd_dtype,
}

impl Default for zd_param_desc {
    fn default() -> Self {
        zd_param_desc {
            struct_size: size_of_u32::<Self>(),
            dtype: ZD_DTYPE_F32,
            name: ptr::null(),
            module: ptr::null(),
            ndim: 0,
            shape: ptr::null(),
            init: ptr::null(),
            init_dtype: 0,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct zd_param_info {
    pub struct_size: u32,
    pub dtype: zd_dtype,
    pub name: *const c_char,
    pub module: zd_module_id,
    pub ndim: i32,
    pub shape: [i64; ZD_MAX_DIMS],
    pub numel: i64,
}

impl Default for zd_param_info {
    fn default() -> Self {
        zd_param_info {
            struct_size: size_of_u32::<Self>(),
            dtype: 0,
            name: ptr::null(),
            module: 0,
            ndim: 0,
            shape: [0; ZD_MAX_DIMS],
            numel: 0,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct zd_view {
    pub struct_size: u32,
    pub flags: u32,
    pub data: *mut c_void,
    pub nbytes: u64,
    pub dtype: zd_dtype,
    pub ndim: i32,
    pub shape: [i64; ZD_MAX_DIMS],
    pub device_type: i32,
    pub device_id: i32,
    pub arena: i32,
    pub reserved: i32,
    pub offset: u64,
}

impl Default for zd_view {
    fn default() -> Self {
        zd_view {
            struct_size: size_of_u32::<Self>(),
            flags: 0,
            data: ptr::null_mut(),
            nbytes: 0,
            dtype: 0,
            ndim: 0,
            shape: [0; ZD_MAX_DIMS],
            device_type: 0,
            device_id: 0,
            arena: -1,
            reserved: 0,
            offset: 0,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct zd_step_result {
    pub struct_size: u32,
    pub flags: u32,
    pub step: i64,
    pub micro_step: i64,
    pub lr: f64,
    pub loss_scale: f64,
    pub grad_norm: f64,
}

impl Default for zd_step_result {
    fn default() -> Self {
        zd_step_result {
            struct_size: size_of_u32::<Self>(),
            flags: 0,
            step: 0,
            micro_step: 0,
            lr: 0.0,
            loss_scale: 0.0,
            grad_norm: 0.0,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct zd_memory_figures {
    pub struct_size: u32,
    pub reserved: u32,
    pub current: u64,
    pub peak: u64,
    pub budget: u64,
}

impl Default for zd_memory_figures {
    fn default() -> Self {
        zd_memory_figures {
            struct_size: size_of_u32::<Self>(),
            reserved: 0,
            current: 0,
            peak: 0,
            budget: 0,
        }
    }
}

pub const ZD_MAX_STATE_SLOTS: usize = 4;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct zd_optimizer_info {
    pub struct_size: u32,
    pub state_slots: i32,
    pub step: i64,
    pub name: *const c_char,
    pub slot_names: [*const c_char; ZD_MAX_STATE_SLOTS],
}

impl Default for zd_optimizer_info {
    fn default() -> Self {
        zd_optimizer_info {
            struct_size: size_of_u32::<Self>(),
            state_slots: 0,
            step: 0,
            name: std::ptr::null(),
            slot_names: [std::ptr::null(); ZD_MAX_STATE_SLOTS],
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct zd_comm_figures {
    pub struct_size: u32,
    pub reserved: u32,
    pub bytes_sent: u64,
    pub network_bytes_sent: u64,
    pub collectives: u64,
}

impl Default for zd_comm_figures {
    fn default() -> Self {
        zd_comm_figures {
            struct_size: size_of_u32::<Self>(),
            reserved: 0,
            bytes_sent: 0,
            network_bytes_sent: 0,
            collectives: 0,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct zd_progress {
    pub struct_size: u32,
    pub flags: u32,
    pub tokens: u64,
    pub samples: u64,
    pub loss: f64,
    pub reserved: u64,
}

impl Default for zd_progress {
    fn default() -> Self {
        zd_progress {
            struct_size: size_of_u32::<Self>(),
            flags: 0,
            tokens: 0,
            samples: 0,
            loss: 0.0,
            reserved: 0,
        }
    }
}

/// `sizeof(T)` as the `uint32_t` every struct begins with.
const fn size_of_u32<T>() -> u32 {
    std::mem::size_of::<T>() as u32
}

// Functions --------------------------------------------------------------
// Linked by build.rs (cargo:rustc-link-lib=zerod).

extern "C" {
    pub fn zd_abi_version() -> u32;
    pub fn zd_version() -> *const c_char;

    pub fn zd_status_str(status: zd_status) -> *const c_char;
    pub fn zd_last_error() -> *const c_char;

    pub fn zd_connect(
        uri: *const c_char,
        options: *const zd_connect_options,
        out: *mut *mut zd_client,
    ) -> zd_status;
    pub fn zd_disconnect(client: *mut zd_client);
    pub fn zd_client_get_info(client: *const zd_client, out: *mut zd_client_info) -> zd_status;

    pub fn zd_model_create(
        client: *mut zd_client,
        options: *const zd_model_options,
        out: *mut *mut zd_model,
    ) -> zd_status;
    pub fn zd_model_destroy(model: *mut zd_model);
    pub fn zd_model_last_error(model: *const zd_model) -> *const c_char;
    pub fn zd_model_register_param(
        model: *mut zd_model,
        desc: *const zd_param_desc,
        out_id: *mut zd_param_id,
    ) -> zd_status;
    pub fn zd_model_finalize(model: *mut zd_model) -> zd_status;
    pub fn zd_model_find_module(
        model: *const zd_model,
        name: *const c_char,
        out_id: *mut zd_module_id,
    ) -> zd_status;
    pub fn zd_model_find_param(
        model: *const zd_model,
        name: *const c_char,
        out_id: *mut zd_param_id,
    ) -> zd_status;
    pub fn zd_model_param_count(model: *const zd_model, out_count: *mut i32) -> zd_status;
    pub fn zd_model_module_count(model: *const zd_model, out_count: *mut i32) -> zd_status;
    pub fn zd_model_param_info(
        model: *const zd_model,
        id: zd_param_id,
        out: *mut zd_param_info,
    ) -> zd_status;
    pub fn zd_model_module_info(
        model: *const zd_model,
        id: zd_module_id,
        out_name: *mut *const c_char,
        ids: *mut zd_param_id,
        inout_count: *mut i32,
    ) -> zd_status;

    pub fn zd_forward_begin(model: *mut zd_model, module: zd_module_id) -> zd_status;
    pub fn zd_forward_end(model: *mut zd_model, module: zd_module_id) -> zd_status;
    pub fn zd_backward_begin(model: *mut zd_model, module: zd_module_id) -> zd_status;
    pub fn zd_backward_end(model: *mut zd_model, module: zd_module_id) -> zd_status;
    pub fn zd_param_view(model: *mut zd_model, param: zd_param_id, out: *mut zd_view) -> zd_status;
    pub fn zd_grad_view(model: *mut zd_model, param: zd_param_id, out: *mut zd_view) -> zd_status;
    pub fn zd_step(model: *mut zd_model, out: *mut zd_step_result) -> zd_status;
    pub fn zd_model_loss_scale(model: *const zd_model, out: *mut f64) -> zd_status;
    pub fn zd_model_set_stream(model: *mut zd_model, stream: *mut c_void) -> zd_status;
    pub fn zd_model_save(model: *mut zd_model, dir: *const c_char) -> zd_status;
    pub fn zd_model_load(model: *mut zd_model, dir: *const c_char) -> zd_status;

    pub fn zd_param_read(
        model: *mut zd_model,
        param: zd_param_id,
        dtype: zd_dtype,
        dst: *mut c_void,
        bytes: u64,
    ) -> zd_status;
    pub fn zd_param_write(
        model: *mut zd_model,
        param: zd_param_id,
        dtype: zd_dtype,
        src: *const c_void,
        bytes: u64,
    ) -> zd_status;

    pub fn zd_model_memory(
        model: *const zd_model,
        rank: i32,
        tier: zd_tier,
        kind: zd_mem_kind,
        out: *mut zd_memory_figures,
    ) -> zd_status;

    pub fn zd_model_optimizer_info(model: *const zd_model, out: *mut zd_optimizer_info) -> zd_status;
    pub fn zd_optimizer_state_read(
        model: *mut zd_model,
        param: zd_param_id,
        slot: i32,
        dtype: zd_dtype,
        dst: *mut c_void,
        bytes: u64,
    ) -> zd_status;
    pub fn zd_optimizer_state_write(
        model: *mut zd_model,
        param: zd_param_id,
        slot: i32,
        dtype: zd_dtype,
        src: *const c_void,
        bytes: u64,
    ) -> zd_status;
    pub fn zd_model_set_step(model: *mut zd_model, step: i64) -> zd_status;
    pub fn zd_model_set_lr(model: *mut zd_model, lr: f64) -> zd_status;

    pub fn zd_model_comm_figures(
        model: *const zd_model,
        rank: i32,
        out: *mut zd_comm_figures,
    ) -> zd_status;

    pub fn zd_model_report(model: *mut zd_model, progress: *const zd_progress) -> zd_status;
}
