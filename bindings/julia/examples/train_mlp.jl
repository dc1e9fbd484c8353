# A trainer in Julia over the Zerod module: examples/c/train_mlp.c's
# three-layer MLP on a three-armed spiral it generates itself. The trainer
# does all the math; zerod owns the parameters, gradients and optimizer
# state, and applies the optimizer the job script names.
#
# NEVER EXECUTED: no Julia runtime could be installed where zerod is
# developed (docs/julia.md says what is checked instead). It follows
# train_mlp.c step for step -- the same generator, initialisation, data
# order, loops and float/double choices -- so it should print the lines the C
# trainer prints, up to the last digits where Julia's exp, log, sin and cos
# round differently from the C library's.
#
#   julia --project=bindings/julia bindings/julia/examples/train_mlp.jl \
#         [--job job.lua] [--steps N] [--dtype f32|bf16|f16] [--quiet]
#   zerod run --nproc 2 --job examples/c/job.lua -- \
#         julia --project=bindings/julia bindings/julia/examples/train_mlp.jl   (data parallel)
#
# It connects where the environment says (embedded when run alone, the
# daemon under `zerod run`, the node's daemon it starts on demand under
# another launcher: torchrun, mpirun, srun). Every rank walks the same shuffled order and
# takes its own slice of each global batch of BATCH * world_size points.
# Rank 0 prints the loss at every step.
#
# Arrays are Julia's (column-major): a batch is a features × points matrix,
# and a weight of zerod shape [out, in] is viewed as an in × out matrix W
# with W[i, o] the C code's w[o * in + i] -- the same bytes.

using Zerod
using Printf

const CLASSES = 3
const PER_CLASS = 300
const POINTS = CLASSES * PER_CLASS
const HIDDEN = 64
const BATCH = 100

# A small deterministic generator (xorshift64*), so every run is the same.
const rng_state = Ref{UInt64}(0x9E3779B97F4A7C15)
function rand_uniform()
    s = rng_state[]
    s ⊻= s >> 12
    s ⊻= s << 25
    s ⊻= s >> 27
    rng_state[] = s
    return Float64((s * 0x2545F4914F6CDD1D) >> 11) / 9007199254740992.0
end
function rand_normal()
    u = rand_uniform()
    v = rand_uniform()
    u < 1e-12 && (u = 1e-12)
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v)
end

# One dense layer y = W^T x + b (zerod's weight [out, in]), as a zerod module.
mutable struct Layer
    name::String
    in::Int
    out::Int
    mod::Int32
    weight::Int32
    bias::Int32
    w::Matrix{Float32}  # fp32 copies of the params while the module runs: in × out
    b::Vector{Float32}
end
Layer(name, in, out) = Layer(name, in, out, 0, 0, 0, zeros(Float32, in, out), zeros(Float32, out))

function layer_register!(model, L::Layer, dtype)
    init = Matrix{Float32}(undef, L.in, L.out)  # the C code's init[o * in + i], in its order
    scale = sqrt(2.0 / L.in)                    # He initialisation for ReLU
    for k in 1:(L.in * L.out)
        init[k] = Float32(rand_normal() * scale)
    end
    L.weight = register_param!(model, "$(L.name).weight", L.name, (L.in, L.out); dtype = dtype, init = init)
    L.bias = register_param!(model, "$(L.name).bias", L.name, (L.out,); dtype = dtype)  # biases start at zero
end

# Copies the module's resident params into fp32 scratch (they may be 16-bit).
function layer_fetch!(model, L::Layer)
    v = param_view(model, L.weight)  # in × out, no copy
    for k in eachindex(v)
        L.w[k] = Float32(v[k])
    end
    vb = param_view(model, L.bias)
    for k in eachindex(vb)
        L.b[k] = Float32(vb[k])
    end
end

# x: in × n, y: out × n.
function layer_forward!(model, L::Layer, x, y, n, relu)
    forward(model, L.mod) do
        layer_fetch!(model, L)
        for r in 1:n, o in 1:L.out
            s = L.b[o]
            for i in 1:L.in
                s += x[i, r] * L.w[i, o]
            end
            y[o, r] = relu && s < 0 ? 0.0f0 : s
        end
    end
end

# Given dy (out × n, already through the activation), writes dW, db into
# zerod's gradient views and dx (in × n, if wanted) for the layer below.
function layer_backward!(model, L::Layer, x, dy, dx, n)
    backward(model, L.mod) do
        layer_fetch!(model, L)
        gw = grad_view(model, L.weight)  # in × out, zero at backward_begin
        gb = grad_view(model, L.bias)
        for o in 1:L.out
            sb = 0.0f0
            for r in 1:n
                sb += dy[o, r]
            end
            gb[o] = sb  # converted to the view's element type (Float32, BFloat16, Float16)
            for i in 1:L.in
                s = 0.0f0
                for r in 1:n
                    s += dy[o, r] * x[i, r]
                end
                gw[i, o] = s
            end
        end
        if dx !== nothing
            for r in 1:n, i in 1:L.in
                s = 0.0f0
                for o in 1:L.out
                    s += dy[o, r] * L.w[i, o]
                end
                dx[i, r] = s
            end
        end
    end
end

function make_spiral!(X, Y)
    for c in 0:(CLASSES - 1), i in 0:(PER_CLASS - 1)
        r = i / PER_CLASS
        t = c * 4.0 + 4.0 * r + rand_normal() * 0.2
        k = c * PER_CLASS + i + 1
        X[1, k] = Float32(r * sin(t))
        X[2, k] = Float32(r * cos(t))
        Y[k] = c
    end
end

function usage()
    println(stderr, "usage: train_mlp.jl [--job job.lua] [--steps N] [--dtype f32|bf16|f16] [--quiet]")
    exit(2)
end

function main(args)
    # The C example's job script, found from this file wherever Julia runs
    # (as the C example finds it); nothing: ZEROD_JOB names the job.
    job = haskey(ENV, "ZEROD_JOB") ? nothing : normpath(joinpath(@__DIR__, "..", "..", "..", "examples", "c", "job.lua"))
    steps, quiet, dtype = 300, false, Float32
    i = 1
    while i <= length(args)
        a = args[i]
        if a == "--job" && i < length(args)
            job = args[i += 1]
        elseif a == "--steps" && i < length(args)
            steps = parse(Int, args[i += 1])
        elseif a == "--quiet"
            quiet = true
        elseif a == "--dtype" && i < length(args)
            d = args[i += 1]
            if d in ("f32", "fp32")
                dtype = Float32
            elseif d == "bf16"
                dtype = BFloat16
            elseif d in ("f16", "fp16")
                dtype = Float16
            else  # an unknown name is refused, not taken as f32 (as in the C example)
                println(stderr, "train_mlp.jl: --dtype $d: f32, bf16 or f16")
                exit(2)
            end
        else
            usage()
        end
        i += 1
    end

    X = Matrix{Float32}(undef, 2, POINTS)
    Y = Vector{Int}(undef, POINTS)
    make_spiral!(X, Y)

    # Under another launcher (torchrun, mpirun, srun) with no ZEROD_ENDPOINT,
    # Client() joins this node's daemon or starts it, and that daemon needs
    # the job script before any rank connects: ZEROD_JOB, unless the caller
    # set it (as the C example does).
    job === nothing || haskey(ENV, "ZEROD_JOB") || (ENV["ZEROD_JOB"] = job)
    client = Client()  # ZEROD_ENDPOINT; else, under a launcher, the node's daemon; else embedded
    rank, world = client.info.rank, client.info.world_size
    if world > POINTS ÷ BATCH
        println(stderr, "at most $(POINTS ÷ BATCH) ranks: a global batch must fit the data")
        exit(2)
    end
    model = Model(client; script_path = job)

    layers = [Layer("fc1", 2, HIDDEN), Layer("fc2", HIDDEN, HIDDEN), Layer("fc3", HIDDEN, CLASSES)]
    for L in layers
        layer_register!(model, L, dtype)
    end
    finalize!(model)
    for L in layers
        L.mod = find_module(model, L.name)
    end

    xb = zeros(Float32, 2, BATCH)
    h1 = zeros(Float32, HIDDEN, BATCH)
    h2 = zeros(Float32, HIDDEN, BATCH)
    logits = zeros(Float32, CLASSES, BATCH)
    dlogits = zeros(Float32, CLASSES, BATCH)
    dh2 = zeros(Float32, HIDDEN, BATCH)
    dh1 = zeros(Float32, HIDDEN, BATCH)
    yb = zeros(Int, BATCH)
    order = collect(1:POINTS)
    cursor = POINTS
    loss = 0.0

    while true
        # A fresh shuffled pass over the data when one ends (the same order on
        # every rank: the generator is seeded alike). i counts as the C code's does.
        if cursor + BATCH * world > POINTS
            for i in (POINTS - 1):-1:1
                j = trunc(Int, rand_uniform() * (i + 1))
                order[i + 1], order[j + 1] = order[j + 1], order[i + 1]
            end
            cursor = 0
        end
        for r in 1:BATCH
            k = order[cursor + rank * BATCH + r]
            xb[1, r] = X[1, k]
            xb[2, r] = X[2, k]
            yb[r] = Y[k]
        end
        cursor += BATCH * world

        layer_forward!(model, layers[1], xb, h1, BATCH, true)
        layer_forward!(model, layers[2], h1, h2, BATCH, true)
        layer_forward!(model, layers[3], h2, logits, BATCH, false)

        # Softmax cross-entropy, mean over the batch; the gradient is scaled
        # by the loss scale (1 unless the job is fp16). Float32 differences,
        # Float64 exponentials and sums, as in C.
        scale = loss_scale(model)
        loss = 0.0
        for r in 1:BATCH
            mx = logits[1, r]
            for c in 2:CLASSES
                mx = max(mx, logits[c, r])
            end
            z = 0.0
            for c in 1:CLASSES
                z += exp(Float64(logits[c, r] - mx))
            end
            for c in 1:CLASSES
                p = exp(Float64(logits[c, r] - mx)) / z
                dlogits[c, r] = Float32((p - (c - 1 == yb[r])) / BATCH * scale)
            end
            loss -= Float64(logits[yb[r] + 1, r] - mx) - log(z)
        end
        loss /= BATCH

        layer_backward!(model, layers[3], h2, dlogits, dh2, BATCH)
        for k in eachindex(dh2)
            dh2[k] = h2[k] > 0 ? dh2[k] : 0.0f0
        end
        layer_backward!(model, layers[2], h1, dh2, dh1, BATCH)
        for k in eachindex(dh1)
            dh1[k] = h1[k] > 0 ? dh1[k] : 0.0f0
        end
        layer_backward!(model, layers[1], xb, dh1, nothing, BATCH)

        sr = step!(model)
        # What this rank processed and its loss: zerod's metrics and the trace's loss plot.
        report!(model; samples = BATCH, loss = loss)
        if isboundary(sr)
            if rank == 0 && (!quiet || sr.step == steps)
                @printf("step %4d  loss %.4f  lr %.5f  grad_norm %.4f%s\n", sr.step, loss, sr.lr, sr.grad_norm,
                        isskipped(sr) ? "  (skipped: overflow)" : "")
            end
            sr.step >= steps && break
        end
    end

    # Accuracy on the whole dataset, reading the trained weights back.
    correct = 0
    for k in 1:POINTS
        layer_forward!(model, layers[1], view(X, :, k:k), h1, 1, true)
        layer_forward!(model, layers[2], h1, h2, 1, true)
        layer_forward!(model, layers[3], h2, logits, 1, false)
        best = 1
        for c in 2:CLASSES
            logits[c, 1] > logits[best, 1] && (best = c)
        end
        correct += best - 1 == Y[k]
    end
    # Every tier's bytes: with offload (job_offload.lua) most state is off the device.
    mem = [memory(model; tier = t, kind = ZD_MEM_ALL) for t in (ZD_TIER_DEVICE, ZD_TIER_HOST, ZD_TIER_NVME)]
    if rank == 0
        @printf("final loss %.4f  accuracy %.1f%%  ranks %d  model state per rank: device %d bytes (peak %d), host %d, nvme %d\n",
                loss, 100.0 * correct / POINTS, world, mem[1].current, mem[1].peak, mem[2].current, mem[3].current)
    end

    close(model)
    close(client)
    return 0
end

if abspath(PROGRAM_FILE) == @__FILE__
    exit(main(ARGS))
end
