# The Zerod module against an embedded engine: what tests/rust's api.rs and
# tests/python's test_core.py check, from Julia. SGD without momentum keeps
# every expected value computable by hand.
#
# NEVER EXECUTED: no Julia runtime could be installed where zerod is
# developed. ctest runs it as julia.runtests where `julia` is on the PATH
# (and reports it skipped, with the reason, where it is not):
#
#   ZEROD_LIB=build/lib/libzerod.so julia --project=bindings/julia bindings/julia/test/runtests.jl

using Test
using Zerod
using Zerod.LibZerod

sgd(lr, extra = "") = "return { optimizer = { type = 'sgd', lr = $lr }, $extra }"

# A finalized model with one parameter "w" (init's values) in module "layer".
function one_param(client, job, init::Vector{Float32})
    model = Model(client; script_text = job)
    w = register_param!(model, "w", "layer", init)
    finalize!(model)
    return model, w, find_module(model, "layer")
end

# One micro-batch whose gradient for w is given.
function micro_step(model, layer, w, grad)
    forward(model, layer) do; end
    backward(model, layer) do
        grad_view(model, w) .= grad
    end
    return step!(model)
end

@testset "Zerod" begin
    @testset "the library and the layouts" begin
        @test Zerod.abi_version().major == ZD_ABI_VERSION_MAJOR
        @test !isempty(Zerod.version())
        @test LibZerod.check_layout() === nothing
        @test sizeof(zd_view) == 120 && sizeof(zd_param_desc) == 56
        @test zd_view().arena == -1 && zd_view().struct_size == sizeof(zd_view)
        @test zd_connect_options().abi_version == ZD_ABI_VERSION
    end

    @testset "a library that does not load is refused with the loader's reason" begin
        # This file is no ELF object: dlopen's own text must reach the
        # message, not only the path that was tried.
        cmd = `$(Base.julia_cmd()) --project=$(dirname(@__DIR__)) -e "using Zerod"`
        out = IOBuffer()
        loaded = success(pipeline(addenv(cmd, "ZEROD_LIB" => @__FILE__); stdout = out, stderr = out))
        text = String(take!(out))
        @test !loaded
        @test occursin("cannot load libzerod", text) && occursin("invalid ELF header", text)
    end

    @testset "an embedded client is rank 0 of 1" begin
        Client("embedded:") do c
            @test (c.info.rank, c.info.world_size, c.info.local_rank, c.info.embedded) == (0, 1, 0, true)
        end
    end

    @testset "errors are ZerodErrors with zerod's message" begin
        e = try
            Client("tcp:somewhere")
            nothing
        catch err
            err
        end
        @test e isa ZerodError && e.status == ZD_ERR_INVALID_ARGUMENT && e.name == "ZD_ERR_INVALID_ARGUMENT"
        c = Client("embedded:")
        e = try
            Model(c; script_text = "return { optimizer = { type = 'sgd', lr = 'fast' } }", script_name = "bad.lua")
            nothing
        catch err
            err
        end
        @test e isa ZerodError && e.status == ZD_ERR_CONFIG && occursin("bad.lua:1", e.message)
        model, _, layer = one_param(c, sgd(0.5), Float32[1, 2, 3])
        e = try
            find_module(model, "nope")
            nothing
        catch err
            err
        end
        @test e isa ZerodError && e.status == ZD_ERR_NOT_FOUND && occursin("nope", e.message)
        forward_begin(model, layer)
        @test_throws ZerodError step!(model)  # ZD_ERR_INVALID_STATE: a step inside a forward
        forward_end(model, layer)
        close(c)
        @test_throws ZerodError param_count(model)  # its client is closed: freed with it
    end

    @testset "an SGD step through views, without copies" begin
        c = Client("embedded:")
        model, w, layer = one_param(c, sgd(0.5), Float32[1, 2, 3])
        @test param_info(model, w).dims == (3,) && param_info(model, w).eltype == Float32
        @test module_info(model, layer) == ("layer", Int32[w])
        forward(model, layer) do
            v = param_view(model, w)
            @test v == Float32[1, 2, 3]
            @test pointer(v) == Ptr{Float32}(raw_param_view(model, w).data)  # the same memory
        end
        r = micro_step(model, layer, w, Float32[0.5, -1, 2])
        @test isboundary(r) && isapplied(r) && !isskipped(r) && r.step == 1
        @test param_read(model, w) == Float32[0.75, 2.5, 2.0]
        param_write!(model, w, Float32[4, 5, 6])
        @test param_read(model, w) == Float32[4, 5, 6]
        @test optimizer_info(model).name == "sgd"
        report!(model; samples = 3, loss = 0.25)
        @test memory(model; tier = ZD_TIER_DEVICE).current > 0
        close(model)
        @test !isopen(model)
        close(c)
    end

    @testset "an error in a backward adds none of its gradients" begin
        c = Client("embedded:")
        model, w, layer = one_param(c, sgd(0.5), Float32[1, 2, 3])
        forward(model, layer) do; end
        e = try
            backward(model, layer) do
                grad_view(model, w) .= Float32[4, 4, 4]
                error("the trainer's backward fails half way")
            end
            nothing
        catch err
            err
        end
        @test e isa ErrorException  # f's error, rethrown after the end
        r = step!(model)  # the module ended: no ZD_ERR_INVALID_STATE
        @test isapplied(r) && r.grad_norm == 0
        @test param_read(model, w) == Float32[1, 2, 3]  # its gradients were zeroed before the end
        close(c)
    end

    @testset "set_lr! replaces the schedule from the next boundary" begin
        c = Client("embedded:")
        model, w, layer = one_param(c, sgd(0.5), Float32[1, 2])
        @test micro_step(model, layer, w, Float32[1, 1]).lr == 0.5
        set_lr!(model, 0.25)
        @test micro_step(model, layer, w, Float32[1, 1]).lr == 0.25
        @test param_read(model, w) == Float32[0.25, 1.25]
        for bad in (NaN, Inf, -0.5)
            e = try
                set_lr!(model, bad)
                nothing
            catch err
                err
            end
            @test e isa ZerodError && e.status == ZD_ERR_INVALID_ARGUMENT
        end
        @test micro_step(model, layer, w, Float32[0, 0]).lr == 0.25  # a refused value leaves the lr in force
        close(c)
    end

    @testset "2-d parameters are viewed with their dims reversed" begin
        c = Client("embedded:")
        model = Model(c; script_text = sgd(1.0))
        init = Float32[1 2 3; 4 5 6]  # 2 × 3 in Julia: zerod's [3, 2], row-major
        p = register_param!(model, "m", "layer", init)
        finalize!(model)
        @test param_info(model, p).shape == [3, 2] && param_info(model, p).dims == (2, 3)
        layer = find_module(model, "layer")
        forward(model, layer) do
            @test param_view(model, p) == init
        end
        @test param_read(model, p) == init
        close(c)
    end

    @testset "bf16 parameters" begin
        c = Client("embedded:")
        model = Model(c; script_text = "return { precision = 'bf16', optimizer = { type = 'sgd', lr = 1.0 } }")
        w = register_param!(model, "w", "layer", (4,); dtype = BFloat16, init = Float32[1, 2, 3, 4])
        finalize!(model)
        layer = find_module(model, "layer")
        forward(model, layer) do
            v = param_view(model, w)
            @test eltype(v) == BFloat16 && Float32.(v) == Float32[1, 2, 3, 4]
        end
        micro_step(model, layer, w, Float32[0.5, 0.5, 0.5, 0.5])
        @test param_read(model, w) == Float32[0.5, 1.5, 2.5, 3.5]
        @test Float32(BFloat16(1.0f0 + 2.0f0^-8)) == 1.0f0                # a tie: to even
        @test Float32(BFloat16(1.0f0 + 3 * 2.0f0^-8)) == 1.0f0 + 2.0f0^-6  # a tie: to even
        @test isnan(Float32(BFloat16(NaN32)))
        # From a Float64, rounded once: through Float32 (to nearest) these
        # first became a tie and then went to even, the wrong way.
        bf16_bits(x) = reinterpret(UInt16, BFloat16(x))
        @test bf16_bits(1.0 + 2.0^-8 + 2.0^-40) == 0x3f81                     # 1.0078125, not 1.0
        @test Float32(BFloat16(1.0 + 2.0^-8 + 2.0^-40)) == 1.0078125f0
        @test bf16_bits(-(1.0 + 2.0^-8 + 2.0^-40)) == 0xbf81
        @test bf16_bits(1.0 + 2.0^-8) == 0x3f80                               # a true tie: to even
        @test bf16_bits(1.0 + 2.0^-8 - 2.0^-40) == 0x3f80
        @test bf16_bits(2.5078126012719) == 0x4021                            # 2.515625
        @test bf16_bits(2.0^-134 * (1 + 2.0^-40)) == 0x0001                   # just over half the least subnormal
        @test bf16_bits(2.0^-134) == 0x0000                                   # half of it: to even, zero
        @test bf16_bits(-5.0e-324) == 0x8000                                  # a signed zero
        overflow = 2.0^127 * (2 - 2.0^-8)                                     # floatmax's bits 0x7f7f plus half an ulp
        @test bf16_bits(prevfloat(overflow)) == 0x7f7f && bf16_bits(overflow) == 0x7f80
        @test bf16_bits(1.0e300) == 0x7f80 && bf16_bits(-Inf) == 0xff80
        @test bf16_bits(NaN) == 0x7fc0
        @test bf16_bits(257) == 0x4380                                        # an Int through Float64: a tie, to 256
        @test reinterpret(UInt16, convert(BFloat16, 1.0 + 2.0^-8 + 2.0^-40)) == 0x3f81
        close(c)
    end

    @testset "finalizers free what is dropped" begin
        for _ in 1:50
            c = Client("embedded:")
            one_param(c, sgd(0.1), zeros(Float32, 1000))
        end
        GC.gc(true)
        GC.gc(true)
        @test true  # no crash: each model freed once, before or with its client
    end
end
