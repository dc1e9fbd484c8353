// Helpers shared by the kernel tests: typed buffers with guard zones, random
// inputs, ulp distance, and the ISA list.
#ifndef ZEROD_TESTS_KERNELS_TEST_UTIL_H
#define ZEROD_TESTS_KERNELS_TEST_UTIL_H

#include <zerod/kit/half.h>
#include <zerod/optim/kernels.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

namespace zerod::optim::test {

inline size_t dtype_size(Dtype d) { return d == Dtype::f32 ? 4 : 2; }

inline const char* dtype_name(Dtype d) {
  switch (d) {
    case Dtype::f32: return "f32";
    case Dtype::bf16: return "bf16";
    case Dtype::f16: return "f16";
  }
  return "?";
}

// Rounds an fp32 value to a dtype and back.
inline float round_to(Dtype d, float x) {
  switch (d) {
    case Dtype::f32: return x;
    case Dtype::bf16: return bf16_to_f32(f32_to_bf16(x));
    case Dtype::f16: return f16_to_f32(f32_to_f16(x));
  }
  return x;
}

// Elements of one dtype with guard bytes on both sides, and a data pointer
// that is deliberately not 32-byte aligned (kernels must use unaligned access).
class Buffer {
 public:
  static constexpr size_t kLead = 3;    // elements before the data
  static constexpr size_t kTrail = 40;  // elements after it, past any vector width
  static constexpr uint8_t kGuard = 0xA5;

  Buffer(Dtype d, size_t n) : dtype_(d), n_(n), bytes_((n + kLead + kTrail) * dtype_size(d), kGuard) {}

  void* data() { return bytes_.data() + kLead * dtype_size(dtype_); }
  float* f32() { return static_cast<float*>(data()); }
  Dtype dtype() const { return dtype_; }
  size_t size() const { return n_; }

  // Element i widened to fp32.
  float get(size_t i) const {
    const uint8_t* p = bytes_.data() + (kLead + i) * dtype_size(dtype_);
    if (dtype_ == Dtype::f32) {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, p, 2);
    return dtype_ == Dtype::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
  }
  // The raw bits of element i (fp32 bits or the 16-bit pattern).
  uint32_t bits(size_t i) const {
    const uint8_t* p = bytes_.data() + (kLead + i) * dtype_size(dtype_);
    if (dtype_ == Dtype::f32) {
      uint32_t u;
      std::memcpy(&u, p, 4);
      return u;
    }
    uint16_t h;
    std::memcpy(&h, p, 2);
    return h;
  }
  void set(size_t i, float x) {
    uint8_t* p = bytes_.data() + (kLead + i) * dtype_size(dtype_);
    if (dtype_ == Dtype::f32) {
      std::memcpy(p, &x, 4);
      return;
    }
    const uint16_t h = dtype_ == Dtype::bf16 ? f32_to_bf16(x) : f32_to_f16(x);
    std::memcpy(p, &h, 2);
  }
  // Whether the guard zones still hold their pattern.
  bool guards_intact() const {
    const size_t es = dtype_size(dtype_);
    for (size_t i = 0; i < kLead * es; ++i) {
      if (bytes_[i] != kGuard) return false;
    }
    for (size_t i = (kLead + n_) * es; i < bytes_.size(); ++i) {
      if (bytes_[i] != kGuard) return false;
    }
    return true;
  }

 private:
  Dtype dtype_;
  size_t n_;
  std::vector<uint8_t> bytes_;
};

// Distance in units in the last place; 0 when both are NaN, huge when only one is.
inline uint64_t ulp_distance(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return (std::isnan(a) && std::isnan(b)) ? 0 : UINT64_MAX;
  auto ordered = [](float x) {
    const int64_t u = f32_bits(x);
    return (u & 0x80000000) ? -(u & 0x7FFFFFFF) : u;  // -0 and +0 coincide
  };
  const int64_t d = ordered(a) - ordered(b);
  return static_cast<uint64_t>(d < 0 ? -d : d);
}

// The vector ISAs; each test skips those this CPU lacks.
inline const std::vector<Isa>& vector_isas() {
  static const std::vector<Isa> isas = {Isa::avx2, Isa::avx512};
  return isas;
}

inline std::string missing_isa_message(Isa isa) {
  return std::string("this CPU lacks ") +
         (isa == Isa::avx512 ? "AVX-512 F/BW/VL" : "AVX2+FMA+F16C") + ", so the " + isa_name(isa) +
         " path cannot run here";
}

}  // namespace zerod::optim::test

namespace zerod::optim {
// Readable test parameters in gtest output.
inline void PrintTo(Isa isa, std::ostream* os) { *os << isa_name(isa); }
inline void PrintTo(Dtype d, std::ostream* os) { *os << test::dtype_name(d); }
}  // namespace zerod::optim

#endif  // ZEROD_TESTS_KERNELS_TEST_UTIL_H
