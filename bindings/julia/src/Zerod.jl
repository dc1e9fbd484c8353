"""
    Zerod

zerod's C ABI (`zerod.h`) from Julia: the model state (parameters, gradients,
optimizer state) lives in zerod, the trainer keeps doing its own math.

**This code has never been executed.** No Julia runtime could be installed
where zerod is developed. The raw layer (`LibZerod`, generated.jl) is
generated from the header and held to it by a test that needs no Julia
(tests/julia/check_generated.py: layouts, types, constants, INIT defaults,
prototypes, exported symbols); this file is written against that layer and
has not run. See docs/julia.md.

- `Client(uri)` and `Model(client; script_path = ...)` are handles; their
  finalizers call `zd_disconnect` / `zd_model_destroy`, and `close` does it
  at once.
- A failed call throws a `ZerodError` with the status and zerod's message.
- `param_view` / `grad_view` are `Array`s over zerod's memory, not copies.
  zerod's shapes are row-major (C); a Julia array over the same bytes has the
  dimensions reversed, so a parameter of shape `[out, in]` is a Julia
  `in × out` matrix `W` with `W[i, o]` the C `w[o][i]`. Every shape this
  module takes or returns is in Julia order unless its name says `shape`.
"""
module Zerod

using Libdl

include("generated.jl")
using .LibZerod

export ZerodError, Client, Model, BFloat16
export ClientInfo, ParamInfo, StepResult, MemoryFigures, CommFigures, OptimizerInfo
export abi_version, register_param!, finalize!, find_module, find_param, param_count, module_count,
    param_info, module_info, forward_begin, forward_end, backward_begin, backward_end, forward, backward,
    param_view, grad_view, raw_param_view, raw_grad_view, step!, isboundary, isapplied, isskipped,
    loss_scale, set_stream!, set_lr!, report!, param_read, param_read!, param_write!, optimizer_info,
    optimizer_state_read, optimizer_state_read!, optimizer_state_write!, save, load!, set_step!,
    memory, comm_figures

# The header's constants (ZD_TIER_HOST, ZD_STEP_BOUNDARY, ...) come with `using Zerod`.
for name in names(LibZerod)
    startswith(String(name), "ZD_") && @eval export $name
end

# ---------------------------------------------------------------------------
# The library
# ---------------------------------------------------------------------------

const _lib = Ref{Ptr{Cvoid}}(C_NULL)
const _lib_path = Ref{String}("")

"""The path of the libzerod this session loaded."""
library_path() = _lib_path[]

function _candidates()
    env = get(ENV, "ZEROD_LIB", "")
    # An explicit choice is the only one tried: falling back to another build
    # would hide a wrong path.
    isempty(env) || return [env], "ZEROD_LIB=$env"
    tree = normpath(joinpath(@__DIR__, "..", "..", "..", "build", "lib", "libzerod.so"))
    return [tree, "libzerod.so.1", "libzerod"], "$tree (this checkout's build tree) and the system library path"
end

function __init__()
    paths, where = _candidates()
    reasons = String[]
    for path in paths
        try
            _lib[] = Libdl.dlopen(path, Libdl.RTLD_LAZY | Libdl.RTLD_LOCAL)
            _lib_path[] = path
            break
        catch e
            # The loader's own reason (no such file, wrong ELF class, a
            # dependency it cannot find): throw_error = false dropped it.
            push!(reasons, sprint(showerror, e))
        end
    end
    _lib[] == C_NULL && error("Zerod: cannot load libzerod; looked at $where:\n  " * join(reasons, "\n  ") *
                              "\nAfter `cmake --install`, run `sudo ldconfig` (so that the dynamic linker " *
                              "finds <prefix>/lib), or set ZEROD_LIB=<prefix>/lib/libzerod.so; from a checkout, " *
                              "build it (`cmake --preset default && ninja -C build zerod`).")
    # The struct mirrors must have C's layout in this Julia (LP64).
    LibZerod.check_layout()
    LibZerod.bind!(_lib[])
    have = zd_abi_version()
    if have >> 16 != ZD_ABI_VERSION_MAJOR
        error("Zerod: $(_lib_path[]) provides ABI $(have >> 16).$(have & 0xffff), but this package " *
              "speaks ABI $ZD_ABI_VERSION_MAJOR.x; use the bindings/julia that came with that libzerod")
    end
    return nothing
end

"""The loaded library's ABI version (`zd_abi_version`), as major.minor."""
function abi_version()
    v = zd_abi_version()
    return VersionNumber(v >> 16, v & 0xffff)
end

"""The loaded library's release (`zd_version`), e.g. "0.1.0"."""
version() = unsafe_string(zd_version())

# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------

"""
    ZerodError(status, name, message)

A zerod call returned a status other than `ZD_OK`. `status` is the
`zd_status` (compare it with `ZD_ERR_CONFIG` and friends), `name` its name
("ZD_ERR_CONFIG"), `message` zerod's text, which names the culprit: the
parameter, the module, the job script's file and line.
"""
struct ZerodError <: Exception
    status::Int32
    name::String
    message::String
end

Base.showerror(io::IO, e::ZerodError) = print(io, "ZerodError: ", e.name, ": ", e.message)

function ZerodError(status::Integer, message::AbstractString)
    return ZerodError(Int32(status), unsafe_string(zd_status_str(status)), String(message))
end

# A call on a client only: the message is this thread's (no task switch can
# come between the call and the read: neither yields).
@inline _check(status) = status == ZD_OK ? nothing : throw(ZerodError(status, unsafe_string(zd_last_error())))

_closed(what) = throw(ZerodError(ZD_ERR_INVALID_ARGUMENT, "this zerod $what is closed"))

# ---------------------------------------------------------------------------
# bfloat16
# ---------------------------------------------------------------------------

"""
    BFloat16

The bits of a bfloat16, the element type of bf16 views. `Float32(x)` reads
one; `BFloat16(x)` (or storing a number into a bf16 array) rounds to nearest
even, as zerod does: once, from a Float64 or anything narrower (a wider type,
such as BigFloat, is first rounded to Float64). No arithmetic: convert, or
`reinterpret` the array to `BFloat16s.BFloat16` where that package is at hand.
"""
primitive type BFloat16 16 end

Base.Float32(x::BFloat16) = reinterpret(Float32, UInt32(reinterpret(UInt16, x)) << 16)
Base.Float64(x::BFloat16) = Float64(Float32(x))
function BFloat16(f::Float32)
    b = reinterpret(UInt32, f)
    (b & 0x7fffffff) > 0x7f800000 && return reinterpret(BFloat16, 0x7fc0)  # every NaN: PyTorch's quiet NaN, as zerod rounds
    b += 0x00007fff + ((b >> 16) & 0x00000001)
    return reinterpret(BFloat16, UInt16(b >> 16))
end
# Rounding x to Float32 first, to nearest, could make a tie that x is not
# (1 + 2^-8 + 2^-40 became 1 + 2^-8, then 1.0 by ties to even; 1.0078125 is
# nearest). Rounded to odd instead (toward zero, then the last bit set when
# inexact), the Float32 keeps which side of every bfloat16 tie x is on: it
# has 16 bits more than bfloat16, and two more are enough (Boldo and
# Melquiond, "Emulation of FMA and correctly rounded sums: proved
# algorithms using rounding to odd", 2008). Overflow (the Float32 is Inf)
# comes back as floatmax(Float32) with its last bit set, which rounds to Inf
# as x does; below Float32's subnormals x becomes its smallest, which rounds
# to a signed zero.
function BFloat16(x::Float64)
    isnan(x) && return reinterpret(BFloat16, 0x7fc0)  # every NaN: PyTorch's quiet NaN, as zerod rounds
    f = Float32(x)
    b = reinterpret(UInt32, f)
    if Float64(f) != x
        # Toward zero: one less in magnitude (the bits are sign and magnitude;
        # f is not zero here, as |f| > |x|).
        abs(Float64(f)) > abs(x) && (b -= 0x00000001)
        b |= 0x00000001
    end
    return BFloat16(reinterpret(Float32, b))
end
# Float64(x) is exact for Float16, Int32, integers up to 2^53 and the like.
BFloat16(x::Real) = BFloat16(Float64(x))
Base.convert(::Type{BFloat16}, x::Real) = BFloat16(x)
Base.zero(::Type{BFloat16}) = reinterpret(BFloat16, 0x0000)
Base.show(io::IO, x::BFloat16) = print(io, "BFloat16(", Float32(x), ")")

const _ELTYPES = Dict{Int32,DataType}(ZD_DTYPE_F32 => Float32, ZD_DTYPE_BF16 => BFloat16, ZD_DTYPE_F16 => Float16)

function _eltype(dtype::Integer)
    T = get(_ELTYPES, Int32(dtype), nothing)
    T === nothing && throw(ZerodError(ZD_ERR_NOT_IMPLEMENTED, "zerod dtype $dtype has no Julia element type here"))
    return T
end

_dtype(::Type{Float32}) = ZD_DTYPE_F32
_dtype(::Type{BFloat16}) = ZD_DTYPE_BF16
_dtype(::Type{Float16}) = ZD_DTYPE_F16
_dtype(T::Type) = throw(ArgumentError("zerod holds Float32, BFloat16 and Float16 values, not $T"))

# ---------------------------------------------------------------------------
# Strings for the C side
# ---------------------------------------------------------------------------

function _string(s)
    s === nothing && return nothing
    str = String(s)
    occursin('\0', str) && throw(ArgumentError("a NUL inside a string for zerod: $(repr(str))"))
    return str
end

# A String's bytes are NUL-terminated; the caller keeps it alive (GC.@preserve).
_pointer(s::Nothing) = Ptr{UInt8}(C_NULL)
_pointer(s::String) = pointer(s)

# ---------------------------------------------------------------------------
# Client
# ---------------------------------------------------------------------------

"""What `zd_client_get_info` says: this trainer's rank, the job's size, ..."""
struct ClientInfo
    rank::Int
    world_size::Int
    local_rank::Int
    embedded::Bool
end

"""
    Client(uri = nothing; timeout_ms = 0)

A connection to an engine: `"embedded:"` runs it in this process, one rank;
`"unix:/path.sock"` talks to a zerod daemon; `nothing` uses ZEROD_ENDPOINT
(as `zerod run` sets it); else, in a process that torchrun, mpirun, srun or
another launcher started as one of several ranks, the node's daemon for that
launch, which the first rank starts and which needs ZEROD_JOB (the job
script) set before any rank connects; else embedded. `timeout_ms` bounds
waits on other ranks (0: the job script's value).

`close(client)` disconnects and frees every model still open on it; the
finalizer does the same when the client is collected. A client and its
models are used by one task at a time; each call takes the client's lock, so
a finalizer on another thread never frees a model while a call runs.
"""
mutable struct Client
    handle::Ptr{zd_client}
    lock::ReentrantLock
    info::ClientInfo
end

function Client(uri::Union{AbstractString,Nothing} = nothing; timeout_ms::Integer = 0)
    u = _string(uri)
    opts = Ref(zd_connect_options(; timeout_ms = timeout_ms))
    out = Ref{Ptr{zd_client}}(C_NULL)
    _check(zd_connect(u === nothing ? _pointer(nothing) : u, opts, out))  # a typed NULL converts to Cstring
    c = Client(out[], ReentrantLock(), ClientInfo(0, 1, 0, true))
    finalizer(_finalize_client, c)
    info = Ref(zd_client_info())
    _locked(c) do
        c.handle == C_NULL && _closed("client")
        _check(zd_client_get_info(c.handle, info))
    end
    i = info[]
    c.info = ClientInfo(i.rank, i.world_size, i.local_rank, i.embedded != 0)
    return c
end

"""`Client(f, uri; ...)`: runs `f(client)` and closes the client after, as `open` does."""
function Client(f::Function, uri::Union{AbstractString,Nothing} = nothing; kw...)
    c = Client(uri; kw...)
    try
        return f(c)
    finally
        close(c)
    end
end

function _locked(f, c::Client)
    lock(c.lock)
    try
        return f()
    finally
        unlock(c.lock)
    end
end

function Base.close(c::Client)
    _locked(c) do
        if c.handle != C_NULL
            zd_disconnect(c.handle)  # frees the models too; theirs see c.handle == C_NULL
            c.handle = C_NULL
        end
    end
    return nothing
end

# The strategy of the Julia manual ("Safe use of Finalizers"): a finalizer
# that cannot take the lock at once (another task is in a call, or this task
# is, the finalizer having interrupted it) puts itself back for a later
# collection.
function _finalize_client(c::Client)
    c.handle == C_NULL && return nothing
    if islocked(c.lock) || !trylock(c.lock)
        finalizer(_finalize_client, c)
        return nothing
    end
    try
        if c.handle != C_NULL
            zd_disconnect(c.handle)
            c.handle = C_NULL
        end
    finally
        unlock(c.lock)
    end
    return nothing
end

Base.isopen(c::Client) = c.handle != C_NULL

function Base.show(io::IO, c::Client)
    print(io, "Zerod.Client(")
    if c.handle == C_NULL
        print(io, "closed")
    else
        print(io, "rank ", c.info.rank, " of ", c.info.world_size, c.info.embedded ? ", embedded" : ", daemon")
    end
    print(io, ")")
end

# ---------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------

"""A registered parameter. `dims` is the Julia shape (what views have),
`shape` zerod's (row-major, C order): `dims == reverse(shape)`."""
struct ParamInfo
    name::String
    eltype::DataType
    module_id::Int32
    shape::Vector{Int}
    dims::Tuple{Vararg{Int}}
    numel::Int
end

"""
    Model(client; script_path = nothing, script_text = nothing, script_name = nothing,
          allow_script_io = false, device = nothing)

One job's model state, from a Lua job script (a path, or its text; with
neither, the script ZEROD_JOB names, as `zerod run --job` sets it).
`device` ("cpu", "cuda", "auto") overrides the script's. Every error of the
script comes back together in one `ZerodError` (ZD_ERR_CONFIG), each with
file:line.

Parameter and module ids are zerod's: `Int32`, dense, 0-based.
`close(model)` frees it; the finalizer does when it is collected (not if
its client was closed first: that freed it).
"""
mutable struct Model
    handle::Ptr{zd_model}
    client::Client
    params::Dict{Int32,ParamInfo}
end

function Model(c::Client; script_path = nothing, script_text = nothing, script_name = nothing,
               allow_script_io::Bool = false, device = nothing)
    sp, st, sn, dv = _string(script_path), _string(script_text), _string(script_name), _string(device)
    out = Ref{Ptr{zd_model}}(C_NULL)
    GC.@preserve sp st sn dv begin
        opts = Ref(zd_model_options(; flags = allow_script_io ? ZD_MODEL_ALLOW_SCRIPT_IO : 0,
                                    script_path = _pointer(sp), script_text = _pointer(st),
                                    script_name = _pointer(sn), device = _pointer(dv)))
        _locked(c) do
            c.handle == C_NULL && _closed("client")
            _check(zd_model_create(c.handle, opts, out))
        end
    end
    m = Model(out[], c, Dict{Int32,ParamInfo}())
    finalizer(_finalize_model, m)
    return m
end

# Runs f(handle) -> zd_status under the client's lock; a failure throws with
# the model's message (zd_model_last_error, which no other thread's calls
# can overwrite).
function _call(f, m::Model)
    c = m.client
    lock(c.lock)
    try
        (m.handle == C_NULL || c.handle == C_NULL) && _closed(m.handle == C_NULL ? "model" : "model's client")
        status = f(m.handle)
        status == ZD_OK || throw(ZerodError(status, unsafe_string(zd_model_last_error(m.handle))))
    finally
        unlock(c.lock)
    end
    return nothing
end

function Base.close(m::Model)
    _locked(m.client) do
        if m.handle != C_NULL && m.client.handle != C_NULL
            zd_model_destroy(m.handle)
        end
        m.handle = C_NULL
    end
    return nothing
end

function _finalize_model(m::Model)
    c = m.client
    # Closed, or freed with its client: nothing to do.
    (m.handle == C_NULL || c.handle == C_NULL) && return nothing
    if islocked(c.lock) || !trylock(c.lock)
        finalizer(_finalize_model, m)
        return nothing
    end
    try
        if m.handle != C_NULL && c.handle != C_NULL
            zd_model_destroy(m.handle)
        end
        m.handle = C_NULL
    finally
        unlock(c.lock)
    end
    return nothing
end

Base.isopen(m::Model) = m.handle != C_NULL && m.client.handle != C_NULL

Base.show(io::IO, m::Model) = print(io, "Zerod.Model(", isopen(m) ? "open" : "closed", ")")

"""The message of the model's last failed call (`zd_model_last_error`), or ""."""
function last_error(m::Model)
    _locked(m.client) do
        isopen(m) ? unsafe_string(zd_model_last_error(m.handle)) : ""
    end
end

# -- registration -----------------------------------------------------------

function _init_array(init::AbstractArray, dims)
    size(init) == Tuple(dims) ||
        throw(DimensionMismatch("init has size $(size(init)); the parameter's dims are $(Tuple(dims))"))
    T = eltype(init)
    return T in (Float32, Float16, BFloat16) ? Array{T}(init) : Array{Float32}(init)
end

"""
    register_param!(model, name, module_name, dims; dtype = Float32, init = nothing) -> Int32
    register_param!(model, name, module_name, init::AbstractArray; dtype = Float32) -> Int32

Registers a parameter (before `finalize!`) and returns its id. `dims` is the
Julia shape of its views (zerod's shape is `reverse(dims)`); `dtype` the
working copy's type (Float32, or the job's 16-bit type: BFloat16, Float16);
`init` rank 0's initial values (Float32, Float16, BFloat16 or anything that
converts to Float32), zeros if `nothing`.
"""
function register_param!(m::Model, name::AbstractString, module_name::AbstractString,
                         dims::Tuple{Vararg{Integer}}; dtype::Type = Float32,
                         init::Union{AbstractArray,Nothing} = nothing)
    nm, md = _string(name), _string(module_name)
    shape = reverse!(Int64[d for d in dims])
    arr = init === nothing ? nothing : _init_array(init, dims)
    out = Ref{zd_param_id}(-1)
    GC.@preserve nm md shape arr begin
        desc = Ref(zd_param_desc(; dtype = _dtype(dtype), name = pointer(nm), module_ = pointer(md),
                                 ndim = length(shape), shape = pointer(shape),
                                 init = arr === nothing ? C_NULL : pointer(arr),
                                 init_dtype = arr === nothing ? 0 : _dtype(eltype(arr))))
        _call(h -> zd_model_register_param(h, desc, out), m)
    end
    return out[]
end

register_param!(m::Model, name::AbstractString, module_name::AbstractString, init::AbstractArray;
                dtype::Type = Float32) = register_param!(m, name, module_name, size(init); dtype = dtype, init = init)

"""
    finalize!(model)

Places and allocates the model state (`zd_model_finalize`); no parameter can
be added after. (Not `Base.finalize`, which runs an object's finalizers.)
"""
finalize!(m::Model) = _call(zd_model_finalize, m)

# -- lookups ------------------------------------------------------------------

"""The id of the module called `name`."""
function find_module(m::Model, name::AbstractString)
    out = Ref{zd_module_id}(-1)
    s = _string(name)
    _call(h -> zd_model_find_module(h, s, out), m)
    return out[]
end

"""The id of the parameter called `name`."""
function find_param(m::Model, name::AbstractString)
    out = Ref{zd_param_id}(-1)
    s = _string(name)
    _call(h -> zd_model_find_param(h, s, out), m)
    return out[]
end

function param_count(m::Model)
    out = Ref{Int32}(0)
    _call(h -> zd_model_param_count(h, out), m)
    return Int(out[])
end

function module_count(m::Model)
    out = Ref{Int32}(0)
    _call(h -> zd_model_module_count(h, out), m)
    return Int(out[])
end

"""What zerod knows of a parameter (asked once: a parameter never changes)."""
function param_info(m::Model, p::Integer)
    known = get(m.params, Int32(p), nothing)
    known === nothing || return known
    info = Ref(zd_param_info())
    _call(h -> zd_model_param_info(h, p, info), m)
    i = info[]
    shape = [Int(i.shape[k]) for k in 1:i.ndim]
    known = ParamInfo(unsafe_string(i.name), _eltype(i.dtype), i.module_, shape, Tuple(reverse(shape)), Int(i.numel))
    m.params[Int32(p)] = known
    return known
end

"""`(name, parameter ids)` of a module."""
function module_info(m::Model, mod::Integer)
    name = Ref{Ptr{UInt8}}(C_NULL)
    count = Ref{Int32}(0)
    _call(h -> zd_model_module_info(h, mod, name, C_NULL, count), m)
    ids = Vector{zd_param_id}(undef, max(count[], 1))
    count[] = length(ids)
    _call(h -> zd_model_module_info(h, mod, name, ids, count), m)
    return unsafe_string(name[]), ids[1:count[]]
end

# -- one micro-batch ------------------------------------------------------------

forward_begin(m::Model, mod::Integer) = _call(h -> zd_forward_begin(h, mod), m)
forward_end(m::Model, mod::Integer) = _call(h -> zd_forward_end(h, mod), m)
backward_begin(m::Model, mod::Integer) = _call(h -> zd_backward_begin(h, mod), m)
backward_end(m::Model, mod::Integer) = _call(h -> zd_backward_end(h, mod), m)

# Zeroes the gradient views of a module in backward, as they were at
# backward_begin, so that backward_end adds nothing of them. Views in device
# memory (a job on the cuda device) cannot be written from here.
function _zero_grads(m::Model, mod::Integer)
    _, ids = module_info(m, mod)
    for p in ids
        v = raw_grad_view(m, p)
        if v.device_type == ZD_DEVICE_CPU && v.data != C_NULL
            ccall(:memset, Ptr{Cvoid}, (Ptr{Cvoid}, Cint, Csize_t), v.data, 0, v.nbytes)
        end
    end
    return nothing
end

function _bracket(f, m, mod, begin_, end_; zero_on_error = false)
    begin_(m, mod)
    result = try
        f()
    catch
        # End the call if zerod still can; the error that matters is f's.
        # A backward's gradients are half written: zeroed first, the end
        # adds nothing of them.
        try
            zero_on_error && _zero_grads(m, mod)
        catch
        end
        try
            end_(m, mod)
        catch
        end
        rethrow()
    end
    end_(m, mod)
    return result
end

"""
    forward(f, model, module)

`forward_begin`, `f()`, `forward_end`: the module's views are valid inside
`f` only.

    forward(model, fc1) do
        W = param_view(model, w)
        ...
    end
"""
forward(f, m::Model, mod::Integer) = _bracket(f, m, mod, forward_begin, forward_end)

"""
    backward(f, model, module)

`backward_begin`, `f()`, `backward_end`; as `forward`. If `f` throws, the
module's gradient views are zeroed before `backward_end` (on the cpu device),
so nothing of this backward is added, and the exception is rethrown.
`set_step!(model, optimizer_info(model).step)` drops the gradients added so
far only in a window's first micro-batch (before its `step`); later in the
window zerod refuses it.
"""
backward(f, m::Model, mod::Integer) = _bracket(f, m, mod, backward_begin, backward_end; zero_on_error = true)

"""The raw `zd_view` of a parameter's working copy (its module begun)."""
function raw_param_view(m::Model, p::Integer)
    v = Ref(zd_view())
    _call(h -> zd_param_view(h, p, v), m)
    return v[]
end

"""The raw `zd_view` of a parameter's gradient buffer (its module in backward)."""
function raw_grad_view(m::Model, p::Integer)
    v = Ref(zd_view())
    _call(h -> zd_grad_view(h, p, v), m)
    return v[]
end

function _array(v::zd_view)
    v.device_type == ZD_DEVICE_CPU ||
        throw(ZerodError(ZD_ERR_NOT_IMPLEMENTED,
                         "the view is in device memory (device_type $(v.device_type)), which a Julia Array " *
                         "cannot hold; take raw_param_view/raw_grad_view and wrap v.data with the GPU " *
                         "package's own unsafe_wrap (CUDA.jl: unsafe_wrap(CuArray, ...))"))
    T = _eltype(v.dtype)
    n = Int(v.ndim)
    dims = ntuple(k -> Int(v.shape[n - k + 1]), n)  # row-major shape, reversed
    prod(dims) * sizeof(T) == v.nbytes ||
        throw(ZerodError(ZD_ERR_INTERNAL, "a view of $(v.nbytes) bytes has the shape $(reverse(dims)) of $T"))
    return unsafe_wrap(Array, Ptr{T}(v.data), dims; own = false)
end

"""
    param_view(model, param) -> Array

The working copy of a parameter whose module is begun (forward or backward),
as an Array over zerod's memory: no copy. Read-only (ZD_VIEW_READ_ONLY;
Julia cannot enforce it: do not write), valid until the module's matching
`_end`: copy what must outlive it. Its dims are `param_info(model,
param).dims`, its element type the parameter's dtype.
"""
param_view(m::Model, p::Integer) = _array(raw_param_view(m, p))

"""
    grad_view(model, param) -> Array

The gradient buffer of a parameter whose module is between
`backward_begin` and `backward_end`, as an Array over zerod's memory: zero
at `backward_begin`; what it holds at `backward_end` is added to the
parameter's gradient. Valid until `backward_end`.
"""
grad_view(m::Model, p::Integer) = _array(raw_grad_view(m, p))

"""What `step!` reports. `isboundary`, `isapplied`, `isskipped` read the flags."""
struct StepResult
    flags::UInt32
    step::Int64
    micro_step::Int64
    lr::Float64
    loss_scale::Float64
    grad_norm::Float64
end

isboundary(r::StepResult) = (r.flags & ZD_STEP_BOUNDARY) != 0
isapplied(r::StepResult) = (r.flags & ZD_STEP_APPLIED) != 0
isskipped(r::StepResult) = (r.flags & ZD_STEP_SKIPPED) != 0

"""
    step!(model) -> StepResult

Ends a micro-batch (`zd_step`); at an accumulation boundary of the job
script: overflow check, unscale, clipping, the learning rate, the optimizer.
"""
function step!(m::Model)
    r = Ref(zd_step_result())
    _call(h -> zd_step(h, r), m)
    s = r[]
    return StepResult(s.flags, s.step, s.micro_step, s.lr, s.loss_scale, s.grad_norm)
end

"""Sets the learning rate of every update from the next accumulation boundary
on, in place of the job's schedule, until set again (`zd_model_set_lr`, ABI
1.7): finite and >= 0, between modules. On several ranks every rank sets the
same value (a collective; values that differ are refused on every rank).
Checkpoints keep it with the step; `StepResult.lr` says what an update used."""
set_lr!(m::Model, lr::Real) = _call(h -> zd_model_set_lr(h, Float64(lr)), m)

"""The loss scale to multiply the loss by (1.0 unless fp16)."""
function loss_scale(m::Model)
    out = Ref{Float64}(0.0)
    _call(h -> zd_model_loss_scale(h, out), m)
    return out[]
end

"""The CUDA stream the trainer computes on (a `cudaStream_t`; `C_NULL` for the
default stream). On the cpu device only `C_NULL` is accepted."""
set_stream!(m::Model, stream::Ptr) = _call(h -> zd_model_set_stream(h, stream), m)

"""
    report!(model; tokens = 0, samples = 0, loss = nothing)

What this rank processed since its last report, and its loss (ABI 1.3):
zerod's live metrics and the trace's loss curve. Typically once per step.
"""
function report!(m::Model; tokens::Integer = 0, samples::Integer = 0, loss::Union{Real,Nothing} = nothing)
    p = Ref(zd_progress(; flags = loss === nothing ? 0 : ZD_PROGRESS_HAS_LOSS, tokens = tokens,
                        samples = samples, loss = loss === nothing ? 0.0 : Float64(loss)))
    _call(h -> zd_model_report(h, p), m)
end

# -- whole parameters -------------------------------------------------------------

function _dense(a::AbstractArray, dims, what)
    size(a) == Tuple(dims) || throw(DimensionMismatch("$what has size $(size(a)); the parameter's dims are $(Tuple(dims))"))
    T = eltype(a)
    return a isa Array && T in (Float32, Float16, BFloat16) ? a :
           T in (Float32, Float16, BFloat16) ? Array{T}(a) : Array{Float32}(a)
end

"""
    param_read!(dst::Array, model, param) -> dst

The full fp32 master value of a parameter, converted to `eltype(dst)`
(Float32, BFloat16, Float16), into `dst` (of the parameter's dims). After
`finalize!`. At ZeRO stage >= 1 on several ranks a collective: every rank
reads the same parameter, in the same order.
"""
function param_read!(dst::Array{T}, m::Model, p::Integer) where {T}
    size(dst) == param_info(m, p).dims || throw(DimensionMismatch("dst has size $(size(dst)); the parameter's dims are $(param_info(m, p).dims)"))
    _call(h -> zd_param_read(h, p, _dtype(T), dst, UInt64(sizeof(dst))), m)
    return dst
end

"""`param_read(model, param; dtype = Float32)`: as `param_read!`, into a new Array."""
param_read(m::Model, p::Integer; dtype::Type = Float32) =
    param_read!(Array{dtype}(undef, param_info(m, p).dims), m, p)

"""
    param_write!(model, param, src::AbstractArray)

Overwrites a parameter's master and working copies (optimizer state kept),
between steps. On several ranks every rank writes the same value.
"""
function param_write!(m::Model, p::Integer, src::AbstractArray)
    a = _dense(src, param_info(m, p).dims, "src")
    _call(h -> zd_param_write(h, p, _dtype(eltype(a)), a, UInt64(sizeof(a))), m)
end

# -- optimizer state, for checkpoints ---------------------------------------------

"""The optimizer's name, its applied updates, and its state slots' names."""
struct OptimizerInfo
    name::String
    step::Int64
    slot_names::Vector{String}
end

function optimizer_info(m::Model)
    info = Ref(zd_optimizer_info())
    _call(h -> zd_model_optimizer_info(h, info), m)
    i = info[]
    names = [unsafe_string(i.slot_names[k]) for k in 1:i.state_slots]
    return OptimizerInfo(i.name == C_NULL ? "" : unsafe_string(i.name), i.step, names)
end

"""One state slot (0-based, as zerod counts them) of a parameter, whole, into `dst`."""
function optimizer_state_read!(dst::Array{T}, m::Model, p::Integer, slot::Integer) where {T}
    size(dst) == param_info(m, p).dims || throw(DimensionMismatch("dst has size $(size(dst)); the parameter's dims are $(param_info(m, p).dims)"))
    _call(h -> zd_optimizer_state_read(h, p, slot, _dtype(T), dst, UInt64(sizeof(dst))), m)
    return dst
end

optimizer_state_read(m::Model, p::Integer, slot::Integer; dtype::Type = Float32) =
    optimizer_state_read!(Array{dtype}(undef, param_info(m, p).dims), m, p, slot)

"""Overwrites a state slot of a parameter; every rank the same value, between steps."""
function optimizer_state_write!(m::Model, p::Integer, slot::Integer, src::AbstractArray)
    a = _dense(src, param_info(m, p).dims, "src")
    _call(h -> zd_optimizer_state_write(h, p, slot, _dtype(eltype(a)), a, UInt64(sizeof(a))), m)
end

"""Writes a checkpoint of the model state into `dir` (`zd_model_save`; every rank, between steps)."""
save(m::Model, dir::AbstractString) = (d = _string(dir); _call(h -> zd_model_save(h, d), m))

"""Loads a checkpoint `save` wrote (`zd_model_load`; every rank, between steps, at any world size and stage)."""
load!(m::Model, dir::AbstractString) = (d = _string(dir); _call(h -> zd_model_load(h, d), m))

"""Sets the count of applied updates (restoring a checkpoint by hand)."""
set_step!(m::Model, step::Integer) = _call(h -> zd_model_set_step(h, step), m)

# -- accounting -----------------------------------------------------------------------

"""Bytes held now, the most held at once, and the budget (`typemax(UInt64)`: none)."""
struct MemoryFigures
    current::UInt64
    peak::UInt64
    budget::UInt64
end

"""
    memory(model; tier = ZD_TIER_DEVICE, kind = ZD_MEM_ALL, rank = -1) -> MemoryFigures

Bytes of one kind (or all) in one tier, for one rank (-1: this one).
"""
function memory(m::Model; tier::Integer = ZD_TIER_DEVICE, kind::Integer = ZD_MEM_ALL, rank::Integer = -1)
    f = Ref(zd_memory_figures())
    _call(h -> zd_model_memory(h, rank, tier, kind, f), m)
    return MemoryFigures(f[].current, f[].peak, f[].budget)
end

"""Bytes this rank sent, its node sent to other nodes, and its collectives so far."""
struct CommFigures
    bytes_sent::UInt64
    network_bytes_sent::UInt64
    collectives::UInt64
end

function comm_figures(m::Model; rank::Integer = -1)
    f = Ref(zd_comm_figures())
    _call(h -> zd_model_comm_figures(h, rank, f), m)
    return CommFigures(f[].bytes_sent, f[].network_bytes_sent, f[].collectives)
end

end # module Zerod
