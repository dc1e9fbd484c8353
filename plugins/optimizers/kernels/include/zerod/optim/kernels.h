// Optimizer update kernels: one contiguous range, one thread, no allocation,
// no exceptions. The host splits shards into ranges and threads them.
//
// Every algorithm has a scalar reference (also the fallback) and vector paths
// compiled for AVX2+FMA+F16C and AVX-512 F/BW/VL; the vector paths perform
// the same fp32 operations in the same order, so they match the reference to
// the last bit, and the tests hold them to it within a stated tolerance.
#ifndef ZEROD_OPTIM_KERNELS_H
#define ZEROD_OPTIM_KERNELS_H

#include <cstddef>
#include <cstdint>

namespace zerod::optim {

// Same numbers as zd_dtype, so the plugin glue can cast.
enum class Dtype : int32_t { f32 = 1, bf16 = 2, f16 = 3 };

// Same numbers as zd_isa (without AUTO: callers resolve it with best_isa()).
enum class Isa : int32_t { scalar = 1, avx2 = 2, avx512 = 3 };

// torch.optim.Adam (decoupled = false: L2 decay added to the gradient) and
// torch.optim.AdamW (decoupled = true: p -= lr*wd*p before the Adam step).
struct AdamParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled = false;
  bool bias_correction = true;
  int64_t step = 1;         // 1 for the first update
  double grad_scale = 1.0;  // each gradient is multiplied by this first
};

// torch.optim.SGD.
struct SgdParams {
  double lr = 1e-2;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  int64_t step = 1;  // on step 1 the momentum buffer is set to the gradient
  double grad_scale = 1.0;
};

// DeepSpeed's OnebitAdam (1-bit Adam): no bias correction, and weight decay
// added to the update, p -= lr * (m / (sqrt(v) + eps) + wd * p).
struct OnebitAdamParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double grad_scale = 1.0;  // each gradient is multiplied by this first
};

// What one 1-bit Adam call does.
enum class OnebitPhase : int32_t {
  // Before compression: m and v from the (averaged) gradient, then the step.
  warmup = 0,
  // Compression, before the average: m from the rank's local gradient only.
  // Reads grad, updates exp_avg; master, work and exp_avg_sq are unused.
  momentum = 1,
  // Compression, after the average: the step from m (now the compressed
  // average) and the frozen v. grad is unused and may be null.
  frozen = 2,
};

// The arrays of one range; element i of each is the same parameter element.
// Any alignment is accepted.
struct Range {
  size_t count = 0;
  float* master = nullptr;  // fp32, updated in place
  const void* grad = nullptr;
  Dtype grad_dtype = Dtype::f32;
  void* work = nullptr;     // working copy written from the new master, or null
  Dtype work_dtype = Dtype::f32;
};

// Adam state: exp_avg and exp_avg_sq, count elements each, in `dtype`:
// f32, or bf16 (uint16_t arrays behind the float pointers, as the plugin
// ABI passes them), which the kernels widen, update in fp32 exactly as an
// fp32 state and store rounded to nearest even (f32_to_bf16), so every ISA
// stores the same bits. f16 is refused (false). The 1-bit Adam kernels take
// f32 alone.
struct AdamState {
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  Dtype dtype = Dtype::f32;
};

// Whether a dtype value is one the kernels handle.
bool dtype_valid(Dtype d);

// An Adam range of this many elements or more that writes a working copy
// writes it by streaming (non-temporal) stores on the AVX2 and AVX-512 paths:
// it is only written, and plain stores first read each of its lines from
// DRAM (read-for-ownership). The size stands for "part of an update far
// larger than the caches": the engine cuts every update into tiles of this
// many elements (kTile, engine/runtime/workers.h; a test holds the two
// together), so a threshold above it would never be reached there. Measured
// on the 2-core Xeon VM of issue 33 (32M parameters in 32768-element tiles
// on 2 threads, fp32 working copy): 28-29 ms a step with plain stores,
// 19-21 ms with streaming ones, against 17 ms for no working copy at all.
inline constexpr size_t kStreamWork = size_t{1} << 15;

// Per-ISA entry points. They return false, writing nothing, when a dtype is
// not one of Dtype's values. Calling a vector path on a CPU without that ISA
// is undefined (SIGILL): check isa_supported first.
bool adam_scalar(const AdamParams& hp, const Range& r, const AdamState& s);
bool adam_avx2(const AdamParams& hp, const Range& r, const AdamState& s);
bool adam_avx512(const AdamParams& hp, const Range& r, const AdamState& s);

// momentum_buffer is used only when hp.momentum > 0 (and may be null otherwise).
bool sgd_scalar(const SgdParams& hp, const Range& r, float* momentum_buffer);
bool sgd_avx2(const SgdParams& hp, const Range& r, float* momentum_buffer);
bool sgd_avx512(const SgdParams& hp, const Range& r, float* momentum_buffer);

bool onebit_adam_scalar(const OnebitAdamParams& hp, OnebitPhase phase, const Range& r, const AdamState& s);
bool onebit_adam_avx2(const OnebitAdamParams& hp, OnebitPhase phase, const Range& r, const AdamState& s);
bool onebit_adam_avx512(const OnebitAdamParams& hp, OnebitPhase phase, const Range& r, const AdamState& s);

// Whether this build and this CPU (and its OS) can run the ISA's kernels.
bool isa_supported(Isa isa);
// The widest supported ISA.
Isa best_isa();
// "scalar", "avx2", "avx512", or "?".
const char* isa_name(Isa isa);

// Dispatch to the ISA's path; false if the ISA is unsupported or a dtype invalid.
bool adam_update(Isa isa, const AdamParams& hp, const Range& r, const AdamState& s);
bool sgd_update(Isa isa, const SgdParams& hp, const Range& r, float* momentum_buffer);
bool onebit_adam_update(Isa isa, const OnebitAdamParams& hp, OnebitPhase phase, const Range& r, const AdamState& s);

}  // namespace zerod::optim

#endif  // ZEROD_OPTIM_KERNELS_H
