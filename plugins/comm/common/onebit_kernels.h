// The memory work of the 1-bit compressed average (onebit.cpp), one kernel
// table per ISA level, picked at run time. Internal to zerod_comm_onebit; the
// tests include it to hold each path to the scalar reference.
//
// Bits: element i of a piece is bit (i % 8) of byte i / 8, set when the value
// is not negative (sign(0) = sign(-0) = +1; a NaN also counts as +1). The
// unused high bits of a piece's last byte are written as 0.
//
// Every path computes the fp32 values (x, y, errors, results) with the same
// IEEE operations in the same order, so they agree to the bit; only the
// double sums of squares may differ in their last bits (summation order).
#ifndef ZEROD_PLUGINS_COMM_COMMON_ONEBIT_KERNELS_H
#define ZEROD_PLUGINS_COMM_COMMON_ONEBIT_KERNELS_H

#include <cstddef>
#include <cstdint>

#include "onebit.h"

namespace zerod::comm::onebit::detail {

enum class Isa { scalar, avx2 };

// What the server sums: world blocks of packed signs (bits[k] from rank k,
// n elements each) weighted by w[k] = s_k / world, plus its error.
struct ServerInput {
  const uint8_t* const* bits = nullptr;
  const float* w = nullptr;
  int32_t world = 0;
};

struct Kernels {
  // Worker, before the exchange: x = buf + err; writes sign(x) into out
  // (ceil(n / 8) bytes) and returns the sum of x^2.
  double (*worker_pack)(const float* buf, const float* err, size_t n, uint8_t* out);
  // Worker, after it: err = x - s sign(x) with x = buf + err as before, and
  // buf = t sign_server (sign_server from `server`, n elements).
  void (*worker_commit)(float* buf, float* err, size_t n, float s, const uint8_t* server, float t);
  // Server, before the second exchange: y = sum_k (w_k sign_k) + err, summed
  // in rank order from rank 0; writes sign(y) into out, returns the sum of y^2.
  double (*server_pack)(const ServerInput& in, const float* err, size_t n, uint8_t* out);
  // Server, after it: err = y - t sign(y), y recomputed as in server_pack.
  void (*server_commit)(const ServerInput& in, float* err, size_t n, float t);
};

bool isa_supported(Isa isa);
// The widest ISA this CPU runs.
Isa best_isa();
const char* isa_name(Isa isa);
// The table of an ISA (the scalar one if this CPU lacks it; check first).
const Kernels& kernels(Isa isa);

// compressed_all_reduce with a given kernel table (the tests run each).
zd_status compressed_all_reduce_with(const Kernels& kernels, int32_t rank, int32_t world, float* buf, uint64_t count,
                                     float* worker_error, float* server_error, const Exchange& exchange,
                                     Scratch* scratch = nullptr);

namespace scalar {
extern const Kernels kTable;
}
#if ZEROD_ONEBIT_X86
namespace avx2 {
extern const Kernels kTable;
}
#endif

}  // namespace zerod::comm::onebit::detail

#endif  // ZEROD_PLUGINS_COMM_COMMON_ONEBIT_KERNELS_H
