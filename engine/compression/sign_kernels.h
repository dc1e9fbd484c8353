// The sign packing of the 1-bit exchange's kept average
// (MomentumCompression): a bit per element, set where the value has no sign
// bit, in the packed order of a group, so that the average of the last step
// is kept at 1/32 of an fp32 copy and rebuilt exactly (scale times signs).
// Beside grad_math's loops: the engine's other kernels with an ISA path.
#pragma once

#include <cstdint>

namespace zerod {

// x[i] = +sc where bit e0 + i is set, -sc where not, for i < n.
void unpack_signs(const uint8_t* bits, uint64_t e0, float sc, float* x, uint64_t n);

// Bit e0 + i set where x[i] has no sign bit, cleared where it has, for
// i < n: whole bytes are written, the unaligned ends bit by bit (they may
// share a byte with a neighbouring tensor's bits, which keep their values).
void pack_signs(const float* x, uint64_t n, uint8_t* bits, uint64_t e0);

// The vector path the two take in this build: "sse2" (every x86-64) or
// "portable".
const char* sign_kernels_isa();

namespace detail {
// The portable byte loops alone: the reference for the tests.
void unpack_signs_portable(const uint8_t* bits, uint64_t e0, float sc, float* x, uint64_t n);
void pack_signs_portable(const float* x, uint64_t n, uint8_t* bits, uint64_t e0);
}  // namespace detail

}  // namespace zerod
