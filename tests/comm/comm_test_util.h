// What the comm plugin tests share: the plugin loaded as the engine loads it
// (dlopen from the plugin folder, reached only through its descriptor), an
// instance per test, rank threads, and a plain scalar reference of the
// reductions to compare with.
#ifndef ZEROD_TESTS_COMM_TEST_UTIL_H
#define ZEROD_TESTS_COMM_TEST_UTIL_H

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <zerod/kit/half.h>
#include <zerod/zerod_plugin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#ifndef ZEROD_TEST_PLUGIN_DIR
#error "ZEROD_TEST_PLUGIN_DIR must name the folder holding zd_comm_local.so"
#endif

namespace zerod::comm::test {

// The descriptor of kind comm and `version` in a plugin of the plugin
// folder, dlopen'ed once per (file, version) and kept for the whole test
// program; NULL with the reason in *error when it is not there.
inline const zd_plugin_header* comm_descriptor(const std::string& file, uint32_t version,
                                               std::string* error = nullptr) {
  const std::string path = std::string(ZEROD_TEST_PLUGIN_DIR) + "/" + file;
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    if (error != nullptr) *error = dlerror();
    return nullptr;
  }
  auto entry = reinterpret_cast<zd_plugin_entry_fn>(dlsym(handle, ZD_PLUGIN_ENTRY_SYMBOL));
  if (entry == nullptr) {
    if (error != nullptr) *error = "no " ZD_PLUGIN_ENTRY_SYMBOL " in " + path;
    return nullptr;
  }
  for (const zd_plugin_header* const* h = entry(); *h != nullptr; ++h) {
    if ((*h)->kind == ZD_PLUGIN_COMM && (*h)->abi_version == version) return *h;
  }
  if (error != nullptr) *error = "no comm v" + std::to_string(version) + " descriptor in " + path;
  return nullptr;
}

// The "local" plugin's v2 descriptor (what the tests use) and its v1
// descriptor (kept for older hosts).
inline const zd_comm_v2* local_plugin(std::string* error = nullptr) {
  static std::string why;
  static const auto* d = reinterpret_cast<const zd_comm_v2*>(comm_descriptor("zd_comm_local.so", 2, &why));
  if (error != nullptr) *error = why;
  return d;
}
inline const zd_comm_v1* local_plugin_v1(std::string* error = nullptr) {
  static std::string why;
  static const auto* d = reinterpret_cast<const zd_comm_v1*>(comm_descriptor("zd_comm_local.so", 1, &why));
  if (error != nullptr) *error = why;
  return d;
}

inline zd_comm_config config_of(int world, int first = 0, int ranks = -1) {
  zd_comm_config c{};
  c.struct_size = sizeof c;
  c.world_size = world;
  c.first_local_rank = first;
  c.local_ranks = ranks < 0 ? world : ranks;
  return c;
}

// An instance for `world` ranks, destroyed at scope end.
class Comm {
 public:
  explicit Comm(int world, double spin_us = 50.0) : d_(local_plugin()) {
    if (d_ == nullptr) {
      ADD_FAILURE() << "plugin not loaded";
      return;
    }
    char err[256] = "";
    const double values[] = {spin_us};
    const zd_comm_config cfg = config_of(world);
    const zd_status st = d_->create(nullptr, values, 1, &cfg, &inst_, err, sizeof err);
    EXPECT_EQ(st, ZD_OK) << err;
  }
  ~Comm() {
    if (d_ != nullptr) d_->destroy(inst_);
  }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  const zd_comm_v2& d() const { return *d_; }
  void* inst() const { return inst_; }
  std::string error(int rank) const { return d_->last_error(inst_, rank); }
  zd_comm_figures figures(int rank) const {
    zd_comm_figures f = ZD_COMM_FIGURES_INIT;
    d_->figures(inst_, rank, &f);
    return f;
  }
  uint64_t sent(int rank) const { return figures(rank).bytes_sent; }

 private:
  const zd_comm_v2* d_;
  void* inst_ = nullptr;
};

inline zd_comm_call call_for(int rank, uint64_t tag = 0, const char* what = "test", uint32_t timeout_ms = 0) {
  zd_comm_call c{};
  c.struct_size = sizeof c;
  c.rank = rank;
  c.tag = tag;
  c.timeout_ms = timeout_ms;
  c.what = what;
  return c;
}

// Runs fn(rank) on one thread per rank and joins them.
inline void on_ranks(int world, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

inline size_t size_of(zd_comm_dtype dt) {
  return dt == ZD_COMM_F64 ? 8 : dt == ZD_COMM_F32 ? 4 : dt == ZD_COMM_U8 ? 1 : 2;
}

inline const char* name_of(zd_comm_dtype dt) {
  return dt == ZD_COMM_F64    ? "f64"
         : dt == ZD_COMM_F32  ? "f32"
         : dt == ZD_COMM_BF16 ? "bf16"
         : dt == ZD_COMM_U8   ? "u8"
                              : "f16";
}

// Elements of one dtype as raw bytes.
struct Buffer {
  zd_comm_dtype dtype = ZD_COMM_F32;
  std::vector<unsigned char> bytes;

  Buffer() = default;
  Buffer(zd_comm_dtype dt, size_t count) : dtype(dt), bytes(count * size_of(dt)) {}
  size_t count() const { return bytes.size() / size_of(dtype); }
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  void* at(size_t i) { return bytes.data() + i * size_of(dtype); }

  // The value of element i, exactly.
  double get(size_t i) const {
    const unsigned char* p = bytes.data() + i * size_of(dtype);
    switch (dtype) {
      case ZD_COMM_F64: { double v; std::memcpy(&v, p, 8); return v; }
      case ZD_COMM_F32: { float v; std::memcpy(&v, p, 4); return v; }
      case ZD_COMM_BF16: { uint16_t h; std::memcpy(&h, p, 2); return bf16_to_f32(h); }
      case ZD_COMM_U8: return *p;
      default: { uint16_t h; std::memcpy(&h, p, 2); return f16_to_f32(h); }
    }
  }
  // Stores v rounded to the dtype (v must be exact in fp32 for 16-bit types
  // to round once).
  void set(size_t i, double v) {
    unsigned char* p = bytes.data() + i * size_of(dtype);
    switch (dtype) {
      case ZD_COMM_F64: std::memcpy(p, &v, 8); return;
      case ZD_COMM_F32: { const float f = static_cast<float>(v); std::memcpy(p, &f, 4); return; }
      case ZD_COMM_BF16: { const uint16_t h = f32_to_bf16(static_cast<float>(v)); std::memcpy(p, &h, 2); return; }
      case ZD_COMM_U8: *p = static_cast<unsigned char>(static_cast<int64_t>(v) & 0xff); return;
      default: { const uint16_t h = f32_to_f16(static_cast<float>(v)); std::memcpy(p, &h, 2); return; }
    }
  }
  bool is_nan(size_t i) const { return std::isnan(get(i)); }
};

// Random values in [-4, 4) (u8: random bytes); with `specials`, some NaN, infinities, signed
// zeros and subnormals of the dtype.
inline Buffer random_buffer(zd_comm_dtype dt, size_t count, uint64_t seed, bool specials = false) {
  Buffer b(dt, count);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  if (dt == ZD_COMM_U8) {
    for (size_t i = 0; i < count; ++i) b.bytes[i] = static_cast<unsigned char>(rng());
    return b;
  }
  for (size_t i = 0; i < count; ++i) b.set(i, u(rng));
  if (specials) {
    const double tiny = dt == ZD_COMM_F16    ? 0x1p-24
                        : dt == ZD_COMM_BF16 ? 0x1p-133
                        : dt == ZD_COMM_F64  ? 0x1p-1074
                                             : 0x1p-149;
    const double picks[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, tiny, -3 * tiny};
    for (size_t i = 0; i < count; ++i) {
      if (rng() % 11 == 0) b.set(i, picks[rng() % (sizeof picks / sizeof picks[0])]);
    }
  }
  return b;
}

// The plain reference: element by element, in rank order, 16-bit types in
// fp32 rounded once; MAX takes the later value when greater or NaN.
template <typename A>
A combine_ref(zd_reduce_op op, A acc, A x) {
  if (op == ZD_REDUCE_SUM) return acc + x;
  return (x > acc || std::isnan(x)) ? x : acc;
}

// dst[i] = reduction over k of srcs[k][offset + i], i < count.
inline void reference_reduce(zd_reduce_op op, const std::vector<const Buffer*>& srcs, size_t offset, size_t count,
                             Buffer* dst, size_t dst_offset) {
  const zd_comm_dtype dt = srcs[0]->dtype;
  for (size_t i = 0; i < count; ++i) {
    if (dt == ZD_COMM_F64) {
      double acc = srcs[0]->get(offset + i);
      for (size_t k = 1; k < srcs.size(); ++k) acc = combine_ref(op, acc, srcs[k]->get(offset + i));
      dst->set(dst_offset + i, acc);
    } else {
      float acc = static_cast<float>(srcs[0]->get(offset + i));
      for (size_t k = 1; k < srcs.size(); ++k) acc = combine_ref(op, acc, static_cast<float>(srcs[k]->get(offset + i)));
      dst->set(dst_offset + i, acc);
    }
  }
}

// Equal bits, or both NaN: which NaN an add of two NaNs gives (payload and
// sign: inf + -inf makes x86's negative default NaN) depends on the order in
// which the compiler put the operands, in the kernels and in this
// reference; IEEE 754 does not fix it. That holds for 16-bit sums too,
// which are fp32 adds rounded once. (Every rank still gets the same bits:
// each element is reduced once and copied; the tests check that apart.)
inline ::testing::AssertionResult same_values(const Buffer& want, const Buffer& got) {
  if (want.bytes.size() != got.bytes.size()) return ::testing::AssertionFailure() << "sizes differ";
  const size_t size = size_of(want.dtype);
  for (size_t i = 0; i < want.count(); ++i) {
    if (std::memcmp(want.bytes.data() + i * size, got.bytes.data() + i * size, size) == 0) continue;
    const bool floating = want.dtype != ZD_COMM_U8;
    if (floating && want.is_nan(i) && got.is_nan(i)) continue;
    return ::testing::AssertionFailure() << name_of(want.dtype) << " element " << i << " of " << want.count()
                                         << ": want " << want.get(i) << ", got " << got.get(i);
  }
  return ::testing::AssertionSuccess();
}

}  // namespace zerod::comm::test

#endif  // ZEROD_TESTS_COMM_TEST_UTIL_H
