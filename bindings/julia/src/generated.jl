# GENERATED FILE -- DO NOT EDIT.
# Written by bindings/julia/gen/generate.py from include/zerod/zerod.h; rerun it after
# changing the header (ctest's julia.generated_matches_header fails until then).
#
# NEVER EXECUTED: no Julia runtime could be installed where zerod is developed.
# What is checked instead, without Julia: that this file is what the generator
# writes from the header; that the struct layouts below (computed from Julia's
# isbits layout rules) and _LAYOUT are the C compiler's sizeof/offsetof; that
# each field's and typedef's C type, each constant's value and each ZD_*_INIT
# default are the compiler's; that each C prototype quoted here is the
# header's (compiled against it) and maps to its ccall's types; and that every
# zd_* symbol libzerod exports has a wrapper (tests/julia/check_generated.py).
#
# The raw C API, one to one: the header's names, constants as C's `int`
# (Int32), structs as isbits mirrors with explicit padding, one thin wrapper
# per call. `Zerod` (Zerod.jl) is the layer to use; this is what it stands on.
# Layouts assume LP64 (64-bit Linux and macOS); the module checks on load.
module LibZerod

using Libdl

# ---- Constants (each is an `int` in C) ----

const ZD_ABI_VERSION_MAJOR     = Int32(1)
const ZD_ABI_VERSION_MINOR     = Int32(7)
const ZD_ABI_VERSION           = Int32(65543)
const ZD_MAX_DIMS              = Int32(8)
const ZD_MAX_STATE_SLOTS       = Int32(4)
const ZD_OK                    = Int32(0)
const ZD_ERR_INVALID_ARGUMENT  = Int32(1)
const ZD_ERR_INVALID_STATE     = Int32(2)
const ZD_ERR_NOT_FOUND         = Int32(3)
const ZD_ERR_SHAPE_MISMATCH    = Int32(4)
const ZD_ERR_CONFIG            = Int32(5)
const ZD_ERR_PLUGIN            = Int32(6)
const ZD_ERR_OUT_OF_MEMORY     = Int32(7)
const ZD_ERR_BUDGET            = Int32(8)
const ZD_ERR_IO                = Int32(9)
const ZD_ERR_NOT_IMPLEMENTED   = Int32(10)
const ZD_ERR_VERSION           = Int32(11)
const ZD_ERR_PEER_LOST         = Int32(12)
const ZD_ERR_TIMEOUT           = Int32(13)
const ZD_ERR_BUFFER_TOO_SMALL  = Int32(14)
const ZD_ERR_INTERNAL          = Int32(15)
const ZD_DTYPE_F32             = Int32(1)
const ZD_DTYPE_BF16            = Int32(2)
const ZD_DTYPE_F16             = Int32(3)
const ZD_TIER_DEVICE           = Int32(0)
const ZD_TIER_HOST             = Int32(1)
const ZD_TIER_NVME             = Int32(2)
const ZD_TIER_COUNT            = Int32(3)
const ZD_MEM_ALL               = Int32(-1)
const ZD_MEM_PARAMS            = Int32(0)
const ZD_MEM_GRADS             = Int32(1)
const ZD_MEM_MASTER            = Int32(2)
const ZD_MEM_OPTIMIZER         = Int32(3)
const ZD_MEM_BUFFERS           = Int32(4)
const ZD_MEM_KIND_COUNT        = Int32(5)
const ZD_MODEL_ALLOW_SCRIPT_IO = Int32(1)
const ZD_VIEW_READ_ONLY        = Int32(1)
const ZD_DEVICE_CPU            = Int32(1)
const ZD_DEVICE_CUDA           = Int32(2)
const ZD_STEP_BOUNDARY         = Int32(1)
const ZD_STEP_APPLIED          = Int32(2)
const ZD_STEP_SKIPPED          = Int32(4)
const ZD_PROGRESS_HAS_LOSS     = Int32(1)

# ---- Scalar typedefs ----

const zd_status = Int32  # typedef int32_t zd_status
const zd_dtype = Int32  # typedef int32_t zd_dtype
const zd_tier = Int32  # typedef int32_t zd_tier
const zd_mem_kind = Int32  # typedef int32_t zd_mem_kind
const zd_param_id = Int32  # typedef int32_t zd_param_id
const zd_module_id = Int32  # typedef int32_t zd_module_id

# ---- Opaque handles (only ever behind a Ptr) ----

mutable struct zd_client end  # typedef struct zd_client zd_client
mutable struct zd_model end  # typedef struct zd_model zd_model

# ---- Structs ----
#
# Fields in the header's order and types; `_padN` fields are the bytes C
# leaves between fields or at the end, so that Julia's layout needs none of
# its own. Each struct has a keyword constructor whose defaults are its
# ZD_*_INIT macro: `zd_view()` is ZD_VIEW_INIT, `zd_view(; dtype = 2)` too
# with one field changed.

struct zd_connect_options
    struct_size::UInt32  # uint32_t struct_size
    abi_version::UInt32  # uint32_t abi_version
    timeout_ms::UInt32   # uint32_t timeout_ms
    reserved::UInt32     # uint32_t reserved
end
# ZD_CONNECT_OPTIONS_INIT
zd_connect_options(;
    struct_size = sizeof(zd_connect_options),
    abi_version = ZD_ABI_VERSION,
    timeout_ms = 0,
    reserved = 0,
) = zd_connect_options(struct_size, abi_version, timeout_ms, reserved)

struct zd_client_info
    struct_size::UInt32  # uint32_t struct_size
    rank::Int32          # int32_t rank
    world_size::Int32    # int32_t world_size
    local_rank::Int32    # int32_t local_rank
    embedded::Int32      # int32_t embedded
end
# ZD_CLIENT_INFO_INIT
zd_client_info(;
    struct_size = sizeof(zd_client_info),
    rank = 0,
    world_size = 0,
    local_rank = 0,
    embedded = 0,
) = zd_client_info(struct_size, rank, world_size, local_rank, embedded)

struct zd_model_options
    struct_size::UInt32      # uint32_t struct_size
    flags::UInt32            # uint32_t flags
    script_path::Ptr{UInt8}  # const char* script_path
    script_text::Ptr{UInt8}  # const char* script_text
    script_name::Ptr{UInt8}  # const char* script_name
    device::Ptr{UInt8}       # const char* device
end
# ZD_MODEL_OPTIONS_INIT
zd_model_options(;
    struct_size = sizeof(zd_model_options),
    flags = 0,
    script_path = C_NULL,
    script_text = C_NULL,
    script_name = C_NULL,
    device = C_NULL,
) = zd_model_options(struct_size, flags, script_path, script_text, script_name, device)

struct zd_param_desc
    struct_size::UInt32   # uint32_t struct_size
    dtype::zd_dtype       # zd_dtype dtype
    name::Ptr{UInt8}      # const char* name
    module_::Ptr{UInt8}   # const char* module
    ndim::Int32           # int32_t ndim
    _pad0::UInt32         # padding: 4 bytes
    shape::Ptr{Int64}     # const int64_t* shape
    init::Ptr{Cvoid}      # const void* init
    init_dtype::zd_dtype  # zd_dtype init_dtype
    _pad1::UInt32         # padding: 4 bytes
end
# ZD_PARAM_DESC_INIT
zd_param_desc(;
    struct_size = sizeof(zd_param_desc),
    dtype = ZD_DTYPE_F32,
    name = C_NULL,
    module_ = C_NULL,
    ndim = 0,
    shape = C_NULL,
    init = C_NULL,
    init_dtype = 0,
) = zd_param_desc(struct_size, dtype, name, module_, ndim, 0, shape, init, init_dtype, 0)

struct zd_param_info
    struct_size::UInt32      # uint32_t struct_size
    dtype::zd_dtype          # zd_dtype dtype
    name::Ptr{UInt8}         # const char* name
    module_::zd_module_id    # zd_module_id module
    ndim::Int32              # int32_t ndim
    shape::NTuple{8, Int64}  # int64_t shape[ZD_MAX_DIMS]
    numel::Int64             # int64_t numel
end
# ZD_PARAM_INFO_INIT
zd_param_info(;
    struct_size = sizeof(zd_param_info),
    dtype = 0,
    name = C_NULL,
    module_ = 0,
    ndim = 0,
    shape = (0, 0, 0, 0, 0, 0, 0, 0),
    numel = 0,
) = zd_param_info(struct_size, dtype, name, module_, ndim, shape, numel)

struct zd_view
    struct_size::UInt32      # uint32_t struct_size
    flags::UInt32            # uint32_t flags
    data::Ptr{Cvoid}         # void* data
    nbytes::UInt64           # uint64_t nbytes
    dtype::zd_dtype          # zd_dtype dtype
    ndim::Int32              # int32_t ndim
    shape::NTuple{8, Int64}  # int64_t shape[ZD_MAX_DIMS]
    device_type::Int32       # int32_t device_type
    device_id::Int32         # int32_t device_id
    arena::Int32             # int32_t arena
    reserved::Int32          # int32_t reserved
    offset::UInt64           # uint64_t offset
end
# ZD_VIEW_INIT
zd_view(;
    struct_size = sizeof(zd_view),
    flags = 0,
    data = C_NULL,
    nbytes = 0,
    dtype = 0,
    ndim = 0,
    shape = (0, 0, 0, 0, 0, 0, 0, 0),
    device_type = 0,
    device_id = 0,
    arena = -1,
    reserved = 0,
    offset = 0,
) = zd_view(struct_size, flags, data, nbytes, dtype, ndim, shape, device_type, device_id, arena, reserved, offset)

struct zd_step_result
    struct_size::UInt32  # uint32_t struct_size
    flags::UInt32        # uint32_t flags
    step::Int64          # int64_t step
    micro_step::Int64    # int64_t micro_step
    lr::Float64          # double lr
    loss_scale::Float64  # double loss_scale
    grad_norm::Float64   # double grad_norm
end
# ZD_STEP_RESULT_INIT
zd_step_result(;
    struct_size = sizeof(zd_step_result),
    flags = 0,
    step = 0,
    micro_step = 0,
    lr = 0.0,
    loss_scale = 0.0,
    grad_norm = 0.0,
) = zd_step_result(struct_size, flags, step, micro_step, lr, loss_scale, grad_norm)

struct zd_progress
    struct_size::UInt32  # uint32_t struct_size
    flags::UInt32        # uint32_t flags
    tokens::UInt64       # uint64_t tokens
    samples::UInt64      # uint64_t samples
    loss::Float64        # double loss
    reserved::UInt64     # uint64_t reserved
end
# ZD_PROGRESS_INIT
zd_progress(;
    struct_size = sizeof(zd_progress),
    flags = 0,
    tokens = 0,
    samples = 0,
    loss = 0.0,
    reserved = 0,
) = zd_progress(struct_size, flags, tokens, samples, loss, reserved)

struct zd_optimizer_info
    struct_size::UInt32                # uint32_t struct_size
    state_slots::Int32                 # int32_t state_slots
    step::Int64                        # int64_t step
    name::Ptr{UInt8}                   # const char* name
    slot_names::NTuple{4, Ptr{UInt8}}  # const char* slot_names[ZD_MAX_STATE_SLOTS]
end
# ZD_OPTIMIZER_INFO_INIT
zd_optimizer_info(;
    struct_size = sizeof(zd_optimizer_info),
    state_slots = 0,
    step = 0,
    name = C_NULL,
    slot_names = (C_NULL, C_NULL, C_NULL, C_NULL),
) = zd_optimizer_info(struct_size, state_slots, step, name, slot_names)

struct zd_memory_figures
    struct_size::UInt32  # uint32_t struct_size
    reserved::UInt32     # uint32_t reserved
    current::UInt64      # uint64_t current
    peak::UInt64         # uint64_t peak
    budget::UInt64       # uint64_t budget
end
# ZD_MEMORY_FIGURES_INIT
zd_memory_figures(;
    struct_size = sizeof(zd_memory_figures),
    reserved = 0,
    current = 0,
    peak = 0,
    budget = 0,
) = zd_memory_figures(struct_size, reserved, current, peak, budget)

struct zd_comm_figures
    struct_size::UInt32         # uint32_t struct_size
    reserved::UInt32            # uint32_t reserved
    bytes_sent::UInt64          # uint64_t bytes_sent
    network_bytes_sent::UInt64  # uint64_t network_bytes_sent
    collectives::UInt64         # uint64_t collectives
end
# ZD_COMM_FIGURES_INIT
zd_comm_figures(;
    struct_size = sizeof(zd_comm_figures),
    reserved = 0,
    bytes_sent = 0,
    network_bytes_sent = 0,
    collectives = 0,
) = zd_comm_figures(struct_size, reserved, bytes_sent, network_bytes_sent, collectives)

# The layouts the generator computed (LP64 C rules): (struct, sizeof, alignment,
# ((field, offset, size), ...)). The test holds them to the C compiler's;
# check_layout() holds them to Julia's.
const _LAYOUT = (
    (zd_connect_options, 16, 4, ((:struct_size, 0, 4), (:abi_version, 4, 4), (:timeout_ms, 8, 4), (:reserved, 12, 4),)),
    (zd_client_info, 20, 4, ((:struct_size, 0, 4), (:rank, 4, 4), (:world_size, 8, 4), (:local_rank, 12, 4), (:embedded, 16, 4),)),
    (zd_model_options, 40, 8, ((:struct_size, 0, 4), (:flags, 4, 4), (:script_path, 8, 8), (:script_text, 16, 8), (:script_name, 24, 8), (:device, 32, 8),)),
    (zd_param_desc, 56, 8, ((:struct_size, 0, 4), (:dtype, 4, 4), (:name, 8, 8), (:module_, 16, 8), (:ndim, 24, 4), (:shape, 32, 8), (:init, 40, 8), (:init_dtype, 48, 4),)),
    (zd_param_info, 96, 8, ((:struct_size, 0, 4), (:dtype, 4, 4), (:name, 8, 8), (:module_, 16, 4), (:ndim, 20, 4), (:shape, 24, 64), (:numel, 88, 8),)),
    (zd_view, 120, 8, ((:struct_size, 0, 4), (:flags, 4, 4), (:data, 8, 8), (:nbytes, 16, 8), (:dtype, 24, 4), (:ndim, 28, 4), (:shape, 32, 64), (:device_type, 96, 4), (:device_id, 100, 4), (:arena, 104, 4), (:reserved, 108, 4), (:offset, 112, 8),)),
    (zd_step_result, 48, 8, ((:struct_size, 0, 4), (:flags, 4, 4), (:step, 8, 8), (:micro_step, 16, 8), (:lr, 24, 8), (:loss_scale, 32, 8), (:grad_norm, 40, 8),)),
    (zd_progress, 40, 8, ((:struct_size, 0, 4), (:flags, 4, 4), (:tokens, 8, 8), (:samples, 16, 8), (:loss, 24, 8), (:reserved, 32, 8),)),
    (zd_optimizer_info, 56, 8, ((:struct_size, 0, 4), (:state_slots, 4, 4), (:step, 8, 8), (:name, 16, 8), (:slot_names, 24, 32),)),
    (zd_memory_figures, 32, 8, ((:struct_size, 0, 4), (:reserved, 4, 4), (:current, 8, 8), (:peak, 16, 8), (:budget, 24, 8),)),
    (zd_comm_figures, 32, 8, ((:struct_size, 0, 4), (:reserved, 4, 4), (:bytes_sent, 8, 8), (:network_bytes_sent, 16, 8), (:collectives, 24, 8),)),
)

"""
    check_layout()

Throws unless every struct here has, in this Julia, the size and field
offsets C gives it (as recorded in `_LAYOUT`). `Zerod` calls it on load.
"""
function check_layout()
    for (T, size, _, fields) in _LAYOUT
        sizeof(T) == size || error("LibZerod: sizeof($T) is $(sizeof(T)) in this Julia, $size in C")
        for (name, offset, _) in fields
            i = findfirst(==(name), fieldnames(T))
            got = fieldoffset(T, i)
            got == offset || error("LibZerod: $T.$name is at byte $got in this Julia, $offset in C")
        end
    end
    return nothing
end

# ---- Calls ----
#
# One wrapper per exported call, through a function pointer that bind!() looks
# up once the library is open (a library path chosen at run time, not when
# the package was precompiled). Arguments are converted as ccall converts
# them: a Ref or an Array passes as a Ptr, a String as a Cstring.

const _fp_zd_abi_version = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_version = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_status_str = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_last_error = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_connect = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_disconnect = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_client_get_info = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_model_create = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_model_destroy = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_model_last_error = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_model_register_param = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_model_finalize = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_model_find_module = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_model_find_param = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_model_param_count = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_model_module_count = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_model_param_info = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_model_module_info = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_forward_begin = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_forward_end = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_backward_begin = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_backward_end = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_param_view = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_grad_view = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_step = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_model_set_lr = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_model_loss_scale = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_model_set_stream = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_model_report = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_param_read = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_param_write = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_model_optimizer_info = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_optimizer_state_read = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_optimizer_state_write = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_model_save = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_model_load = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_model_set_step = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_model_memory = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_zd_model_comm_figures = Ref{Ptr{Cvoid}}(C_NULL)

# Every call of the header, in its order.
const FUNCTIONS = (
    :zd_abi_version,
    :zd_version,
    :zd_status_str,
    :zd_last_error,
    :zd_connect,
    :zd_disconnect,
    :zd_client_get_info,
    :zd_model_create,
    :zd_model_destroy,
    :zd_model_last_error,
    :zd_model_register_param,
    :zd_model_finalize,
    :zd_model_find_module,
    :zd_model_find_param,
    :zd_model_param_count,
    :zd_model_module_count,
    :zd_model_param_info,
    :zd_model_module_info,
    :zd_forward_begin,
    :zd_forward_end,
    :zd_backward_begin,
    :zd_backward_end,
    :zd_param_view,
    :zd_grad_view,
    :zd_step,
    :zd_model_set_lr,
    :zd_model_loss_scale,
    :zd_model_set_stream,
    :zd_model_report,
    :zd_param_read,
    :zd_param_write,
    :zd_model_optimizer_info,
    :zd_optimizer_state_read,
    :zd_optimizer_state_write,
    :zd_model_save,
    :zd_model_load,
    :zd_model_set_step,
    :zd_model_memory,
    :zd_model_comm_figures,
)

"""
    bind!(lib::Ptr{Cvoid})

Looks every call up in `lib` (a handle from `Libdl.dlopen`). A call the
library lacks (one of an older minor ABI) stays unbound and throws when
called; nothing else is affected.
"""
function bind!(lib::Ptr{Cvoid})
    _fp_zd_abi_version[] = _lookup(lib, :zd_abi_version)
    _fp_zd_version[] = _lookup(lib, :zd_version)
    _fp_zd_status_str[] = _lookup(lib, :zd_status_str)
    _fp_zd_last_error[] = _lookup(lib, :zd_last_error)
    _fp_zd_connect[] = _lookup(lib, :zd_connect)
    _fp_zd_disconnect[] = _lookup(lib, :zd_disconnect)
    _fp_zd_client_get_info[] = _lookup(lib, :zd_client_get_info)
    _fp_zd_model_create[] = _lookup(lib, :zd_model_create)
    _fp_zd_model_destroy[] = _lookup(lib, :zd_model_destroy)
    _fp_zd_model_last_error[] = _lookup(lib, :zd_model_last_error)
    _fp_zd_model_register_param[] = _lookup(lib, :zd_model_register_param)
    _fp_zd_model_finalize[] = _lookup(lib, :zd_model_finalize)
    _fp_zd_model_find_module[] = _lookup(lib, :zd_model_find_module)
    _fp_zd_model_find_param[] = _lookup(lib, :zd_model_find_param)
    _fp_zd_model_param_count[] = _lookup(lib, :zd_model_param_count)
    _fp_zd_model_module_count[] = _lookup(lib, :zd_model_module_count)
    _fp_zd_model_param_info[] = _lookup(lib, :zd_model_param_info)
    _fp_zd_model_module_info[] = _lookup(lib, :zd_model_module_info)
    _fp_zd_forward_begin[] = _lookup(lib, :zd_forward_begin)
    _fp_zd_forward_end[] = _lookup(lib, :zd_forward_end)
    _fp_zd_backward_begin[] = _lookup(lib, :zd_backward_begin)
    _fp_zd_backward_end[] = _lookup(lib, :zd_backward_end)
    _fp_zd_param_view[] = _lookup(lib, :zd_param_view)
    _fp_zd_grad_view[] = _lookup(lib, :zd_grad_view)
    _fp_zd_step[] = _lookup(lib, :zd_step)
    _fp_zd_model_set_lr[] = _lookup(lib, :zd_model_set_lr)
    _fp_zd_model_loss_scale[] = _lookup(lib, :zd_model_loss_scale)
    _fp_zd_model_set_stream[] = _lookup(lib, :zd_model_set_stream)
    _fp_zd_model_report[] = _lookup(lib, :zd_model_report)
    _fp_zd_param_read[] = _lookup(lib, :zd_param_read)
    _fp_zd_param_write[] = _lookup(lib, :zd_param_write)
    _fp_zd_model_optimizer_info[] = _lookup(lib, :zd_model_optimizer_info)
    _fp_zd_optimizer_state_read[] = _lookup(lib, :zd_optimizer_state_read)
    _fp_zd_optimizer_state_write[] = _lookup(lib, :zd_optimizer_state_write)
    _fp_zd_model_save[] = _lookup(lib, :zd_model_save)
    _fp_zd_model_load[] = _lookup(lib, :zd_model_load)
    _fp_zd_model_set_step[] = _lookup(lib, :zd_model_set_step)
    _fp_zd_model_memory[] = _lookup(lib, :zd_model_memory)
    _fp_zd_model_comm_figures[] = _lookup(lib, :zd_model_comm_figures)
    return nothing
end

_lookup(lib, name) = something(Libdl.dlsym(lib, name; throw_error = false), C_NULL)

@noinline _unbound(name) = error("libzerod: $name is not bound: the loaded library lacks it " *
                                 "(an older minor ABI), or bind!() has not run")

# C: uint32_t zd_abi_version(void)
function zd_abi_version()
    fp = _fp_zd_abi_version[]
    fp == C_NULL && _unbound(:zd_abi_version)
    ccall(fp, UInt32, ())
end

# C: const char* zd_version(void)
function zd_version()
    fp = _fp_zd_version[]
    fp == C_NULL && _unbound(:zd_version)
    ccall(fp, Cstring, ())
end

# C: const char* zd_status_str(zd_status status)
function zd_status_str(status)
    fp = _fp_zd_status_str[]
    fp == C_NULL && _unbound(:zd_status_str)
    ccall(fp, Cstring, (zd_status,), status)
end

# C: const char* zd_last_error(void)
function zd_last_error()
    fp = _fp_zd_last_error[]
    fp == C_NULL && _unbound(:zd_last_error)
    ccall(fp, Cstring, ())
end

# C: zd_status zd_connect(const char* uri, const zd_connect_options* options, zd_client** out)
function zd_connect(uri, options, out)
    fp = _fp_zd_connect[]
    fp == C_NULL && _unbound(:zd_connect)
    ccall(fp, zd_status, (Cstring, Ptr{zd_connect_options}, Ptr{Ptr{zd_client}}), uri, options, out)
end

# C: void zd_disconnect(zd_client* client)
function zd_disconnect(client)
    fp = _fp_zd_disconnect[]
    fp == C_NULL && _unbound(:zd_disconnect)
    ccall(fp, Cvoid, (Ptr{zd_client},), client)
end

# C: zd_status zd_client_get_info(const zd_client* client, zd_client_info* out)
function zd_client_get_info(client, out)
    fp = _fp_zd_client_get_info[]
    fp == C_NULL && _unbound(:zd_client_get_info)
    ccall(fp, zd_status, (Ptr{zd_client}, Ptr{zd_client_info}), client, out)
end

# C: zd_status zd_model_create(zd_client* client, const zd_model_options* options, zd_model** out)
function zd_model_create(client, options, out)
    fp = _fp_zd_model_create[]
    fp == C_NULL && _unbound(:zd_model_create)
    ccall(fp, zd_status, (Ptr{zd_client}, Ptr{zd_model_options}, Ptr{Ptr{zd_model}}), client, options, out)
end

# C: void zd_model_destroy(zd_model* model)
function zd_model_destroy(model)
    fp = _fp_zd_model_destroy[]
    fp == C_NULL && _unbound(:zd_model_destroy)
    ccall(fp, Cvoid, (Ptr{zd_model},), model)
end

# C: const char* zd_model_last_error(const zd_model* model)
function zd_model_last_error(model)
    fp = _fp_zd_model_last_error[]
    fp == C_NULL && _unbound(:zd_model_last_error)
    ccall(fp, Cstring, (Ptr{zd_model},), model)
end

# C: zd_status zd_model_register_param(zd_model* model, const zd_param_desc* desc, zd_param_id* out_id)
function zd_model_register_param(model, desc, out_id)
    fp = _fp_zd_model_register_param[]
    fp == C_NULL && _unbound(:zd_model_register_param)
    ccall(fp, zd_status, (Ptr{zd_model}, Ptr{zd_param_desc}, Ptr{zd_param_id}), model, desc, out_id)
end

# C: zd_status zd_model_finalize(zd_model* model)
function zd_model_finalize(model)
    fp = _fp_zd_model_finalize[]
    fp == C_NULL && _unbound(:zd_model_finalize)
    ccall(fp, zd_status, (Ptr{zd_model},), model)
end

# C: zd_status zd_model_find_module(const zd_model* model, const char* name, zd_module_id* out_id)
function zd_model_find_module(model, name, out_id)
    fp = _fp_zd_model_find_module[]
    fp == C_NULL && _unbound(:zd_model_find_module)
    ccall(fp, zd_status, (Ptr{zd_model}, Cstring, Ptr{zd_module_id}), model, name, out_id)
end

# C: zd_status zd_model_find_param(const zd_model* model, const char* name, zd_param_id* out_id)
function zd_model_find_param(model, name, out_id)
    fp = _fp_zd_model_find_param[]
    fp == C_NULL && _unbound(:zd_model_find_param)
    ccall(fp, zd_status, (Ptr{zd_model}, Cstring, Ptr{zd_param_id}), model, name, out_id)
end

# C: zd_status zd_model_param_count(const zd_model* model, int32_t* out_count)
function zd_model_param_count(model, out_count)
    fp = _fp_zd_model_param_count[]
    fp == C_NULL && _unbound(:zd_model_param_count)
    ccall(fp, zd_status, (Ptr{zd_model}, Ptr{Int32}), model, out_count)
end

# C: zd_status zd_model_module_count(const zd_model* model, int32_t* out_count)
function zd_model_module_count(model, out_count)
    fp = _fp_zd_model_module_count[]
    fp == C_NULL && _unbound(:zd_model_module_count)
    ccall(fp, zd_status, (Ptr{zd_model}, Ptr{Int32}), model, out_count)
end

# C: zd_status zd_model_param_info(const zd_model* model, zd_param_id id, zd_param_info* out)
function zd_model_param_info(model, id, out)
    fp = _fp_zd_model_param_info[]
    fp == C_NULL && _unbound(:zd_model_param_info)
    ccall(fp, zd_status, (Ptr{zd_model}, zd_param_id, Ptr{zd_param_info}), model, id, out)
end

# C: zd_status zd_model_module_info(const zd_model* model, zd_module_id id, const char** out_name, zd_param_id* ids, int32_t* inout_count)
function zd_model_module_info(model, id, out_name, ids, inout_count)
    fp = _fp_zd_model_module_info[]
    fp == C_NULL && _unbound(:zd_model_module_info)
    ccall(fp, zd_status, (Ptr{zd_model}, zd_module_id, Ptr{Ptr{UInt8}}, Ptr{zd_param_id}, Ptr{Int32}), model, id, out_name, ids, inout_count)
end

# C: zd_status zd_forward_begin(zd_model* model, zd_module_id module)
function zd_forward_begin(model, module_)
    fp = _fp_zd_forward_begin[]
    fp == C_NULL && _unbound(:zd_forward_begin)
    ccall(fp, zd_status, (Ptr{zd_model}, zd_module_id), model, module_)
end

# C: zd_status zd_forward_end(zd_model* model, zd_module_id module)
function zd_forward_end(model, module_)
    fp = _fp_zd_forward_end[]
    fp == C_NULL && _unbound(:zd_forward_end)
    ccall(fp, zd_status, (Ptr{zd_model}, zd_module_id), model, module_)
end

# C: zd_status zd_backward_begin(zd_model* model, zd_module_id module)
function zd_backward_begin(model, module_)
    fp = _fp_zd_backward_begin[]
    fp == C_NULL && _unbound(:zd_backward_begin)
    ccall(fp, zd_status, (Ptr{zd_model}, zd_module_id), model, module_)
end

# C: zd_status zd_backward_end(zd_model* model, zd_module_id module)
function zd_backward_end(model, module_)
    fp = _fp_zd_backward_end[]
    fp == C_NULL && _unbound(:zd_backward_end)
    ccall(fp, zd_status, (Ptr{zd_model}, zd_module_id), model, module_)
end

# C: zd_status zd_param_view(zd_model* model, zd_param_id param, zd_view* out)
function zd_param_view(model, param, out)
    fp = _fp_zd_param_view[]
    fp == C_NULL && _unbound(:zd_param_view)
    ccall(fp, zd_status, (Ptr{zd_model}, zd_param_id, Ptr{zd_view}), model, param, out)
end

# C: zd_status zd_grad_view(zd_model* model, zd_param_id param, zd_view* out)
function zd_grad_view(model, param, out)
    fp = _fp_zd_grad_view[]
    fp == C_NULL && _unbound(:zd_grad_view)
    ccall(fp, zd_status, (Ptr{zd_model}, zd_param_id, Ptr{zd_view}), model, param, out)
end

# C: zd_status zd_step(zd_model* model, zd_step_result* out)
function zd_step(model, out)
    fp = _fp_zd_step[]
    fp == C_NULL && _unbound(:zd_step)
    ccall(fp, zd_status, (Ptr{zd_model}, Ptr{zd_step_result}), model, out)
end

# C: zd_status zd_model_set_lr(zd_model* model, double lr)
function zd_model_set_lr(model, lr)
    fp = _fp_zd_model_set_lr[]
    fp == C_NULL && _unbound(:zd_model_set_lr)
    ccall(fp, zd_status, (Ptr{zd_model}, Float64), model, lr)
end

# C: zd_status zd_model_loss_scale(const zd_model* model, double* out)
function zd_model_loss_scale(model, out)
    fp = _fp_zd_model_loss_scale[]
    fp == C_NULL && _unbound(:zd_model_loss_scale)
    ccall(fp, zd_status, (Ptr{zd_model}, Ptr{Float64}), model, out)
end

# C: zd_status zd_model_set_stream(zd_model* model, void* stream)
function zd_model_set_stream(model, stream)
    fp = _fp_zd_model_set_stream[]
    fp == C_NULL && _unbound(:zd_model_set_stream)
    ccall(fp, zd_status, (Ptr{zd_model}, Ptr{Cvoid}), model, stream)
end

# C: zd_status zd_model_report(zd_model* model, const zd_progress* progress)
function zd_model_report(model, progress)
    fp = _fp_zd_model_report[]
    fp == C_NULL && _unbound(:zd_model_report)
    ccall(fp, zd_status, (Ptr{zd_model}, Ptr{zd_progress}), model, progress)
end

# C: zd_status zd_param_read(zd_model* model, zd_param_id param, zd_dtype dtype, void* dst, uint64_t bytes)
function zd_param_read(model, param, dtype, dst, bytes)
    fp = _fp_zd_param_read[]
    fp == C_NULL && _unbound(:zd_param_read)
    ccall(fp, zd_status, (Ptr{zd_model}, zd_param_id, zd_dtype, Ptr{Cvoid}, UInt64), model, param, dtype, dst, bytes)
end

# C: zd_status zd_param_write(zd_model* model, zd_param_id param, zd_dtype dtype, const void* src, uint64_t bytes)
function zd_param_write(model, param, dtype, src, bytes)
    fp = _fp_zd_param_write[]
    fp == C_NULL && _unbound(:zd_param_write)
    ccall(fp, zd_status, (Ptr{zd_model}, zd_param_id, zd_dtype, Ptr{Cvoid}, UInt64), model, param, dtype, src, bytes)
end

# C: zd_status zd_model_optimizer_info(const zd_model* model, zd_optimizer_info* out)
function zd_model_optimizer_info(model, out)
    fp = _fp_zd_model_optimizer_info[]
    fp == C_NULL && _unbound(:zd_model_optimizer_info)
    ccall(fp, zd_status, (Ptr{zd_model}, Ptr{zd_optimizer_info}), model, out)
end

# C: zd_status zd_optimizer_state_read(zd_model* model, zd_param_id param, int32_t slot, zd_dtype dtype, void* dst, uint64_t bytes)
function zd_optimizer_state_read(model, param, slot, dtype, dst, bytes)
    fp = _fp_zd_optimizer_state_read[]
    fp == C_NULL && _unbound(:zd_optimizer_state_read)
    ccall(fp, zd_status, (Ptr{zd_model}, zd_param_id, Int32, zd_dtype, Ptr{Cvoid}, UInt64), model, param, slot, dtype, dst, bytes)
end

# C: zd_status zd_optimizer_state_write(zd_model* model, zd_param_id param, int32_t slot, zd_dtype dtype, const void* src, uint64_t bytes)
function zd_optimizer_state_write(model, param, slot, dtype, src, bytes)
    fp = _fp_zd_optimizer_state_write[]
    fp == C_NULL && _unbound(:zd_optimizer_state_write)
    ccall(fp, zd_status, (Ptr{zd_model}, zd_param_id, Int32, zd_dtype, Ptr{Cvoid}, UInt64), model, param, slot, dtype, src, bytes)
end

# C: zd_status zd_model_save(zd_model* model, const char* dir)
function zd_model_save(model, dir)
    fp = _fp_zd_model_save[]
    fp == C_NULL && _unbound(:zd_model_save)
    ccall(fp, zd_status, (Ptr{zd_model}, Cstring), model, dir)
end

# C: zd_status zd_model_load(zd_model* model, const char* dir)
function zd_model_load(model, dir)
    fp = _fp_zd_model_load[]
    fp == C_NULL && _unbound(:zd_model_load)
    ccall(fp, zd_status, (Ptr{zd_model}, Cstring), model, dir)
end

# C: zd_status zd_model_set_step(zd_model* model, int64_t step)
function zd_model_set_step(model, step)
    fp = _fp_zd_model_set_step[]
    fp == C_NULL && _unbound(:zd_model_set_step)
    ccall(fp, zd_status, (Ptr{zd_model}, Int64), model, step)
end

# C: zd_status zd_model_memory(const zd_model* model, int32_t rank, zd_tier tier, zd_mem_kind kind, zd_memory_figures* out)
function zd_model_memory(model, rank, tier, kind, out)
    fp = _fp_zd_model_memory[]
    fp == C_NULL && _unbound(:zd_model_memory)
    ccall(fp, zd_status, (Ptr{zd_model}, Int32, zd_tier, zd_mem_kind, Ptr{zd_memory_figures}), model, rank, tier, kind, out)
end

# C: zd_status zd_model_comm_figures(const zd_model* model, int32_t rank, zd_comm_figures* out)
function zd_model_comm_figures(model, rank, out)
    fp = _fp_zd_model_comm_figures[]
    fp == C_NULL && _unbound(:zd_model_comm_figures)
    ccall(fp, zd_status, (Ptr{zd_model}, Int32, Ptr{zd_comm_figures}), model, rank, out)
end

export ZD_ABI_VERSION_MAJOR,
    ZD_ABI_VERSION_MINOR,
    ZD_ABI_VERSION,
    ZD_MAX_DIMS,
    ZD_MAX_STATE_SLOTS,
    ZD_OK,
    ZD_ERR_INVALID_ARGUMENT,
    ZD_ERR_INVALID_STATE,
    ZD_ERR_NOT_FOUND,
    ZD_ERR_SHAPE_MISMATCH,
    ZD_ERR_CONFIG,
    ZD_ERR_PLUGIN,
    ZD_ERR_OUT_OF_MEMORY,
    ZD_ERR_BUDGET,
    ZD_ERR_IO,
    ZD_ERR_NOT_IMPLEMENTED,
    ZD_ERR_VERSION,
    ZD_ERR_PEER_LOST,
    ZD_ERR_TIMEOUT,
    ZD_ERR_BUFFER_TOO_SMALL,
    ZD_ERR_INTERNAL,
    ZD_DTYPE_F32,
    ZD_DTYPE_BF16,
    ZD_DTYPE_F16,
    ZD_TIER_DEVICE,
    ZD_TIER_HOST,
    ZD_TIER_NVME,
    ZD_TIER_COUNT,
    ZD_MEM_ALL,
    ZD_MEM_PARAMS,
    ZD_MEM_GRADS,
    ZD_MEM_MASTER,
    ZD_MEM_OPTIMIZER,
    ZD_MEM_BUFFERS,
    ZD_MEM_KIND_COUNT,
    ZD_MODEL_ALLOW_SCRIPT_IO,
    ZD_VIEW_READ_ONLY,
    ZD_DEVICE_CPU,
    ZD_DEVICE_CUDA,
    ZD_STEP_BOUNDARY,
    ZD_STEP_APPLIED,
    ZD_STEP_SKIPPED,
    ZD_PROGRESS_HAS_LOSS,
    zd_status,
    zd_dtype,
    zd_tier,
    zd_mem_kind,
    zd_param_id,
    zd_module_id,
    zd_client,
    zd_model,
    zd_connect_options,
    zd_client_info,
    zd_model_options,
    zd_param_desc,
    zd_param_info,
    zd_view,
    zd_step_result,
    zd_progress,
    zd_optimizer_info,
    zd_memory_figures,
    zd_comm_figures,
    zd_abi_version,
    zd_version,
    zd_status_str,
    zd_last_error,
    zd_connect,
    zd_disconnect,
    zd_client_get_info,
    zd_model_create,
    zd_model_destroy,
    zd_model_last_error,
    zd_model_register_param,
    zd_model_finalize,
    zd_model_find_module,
    zd_model_find_param,
    zd_model_param_count,
    zd_model_module_count,
    zd_model_param_info,
    zd_model_module_info,
    zd_forward_begin,
    zd_forward_end,
    zd_backward_begin,
    zd_backward_end,
    zd_param_view,
    zd_grad_view,
    zd_step,
    zd_model_set_lr,
    zd_model_loss_scale,
    zd_model_set_stream,
    zd_model_report,
    zd_param_read,
    zd_param_write,
    zd_model_optimizer_info,
    zd_optimizer_state_read,
    zd_optimizer_state_write,
    zd_model_save,
    zd_model_load,
    zd_model_set_step,
    zd_model_memory,
    zd_model_comm_figures

end # module LibZerod
