// Optimizer plugins of older ABI versions, lifted to the current table
// (zd_optimizer_v4), one adapter per old version (optimizer_v1_adapter.cpp,
// optimizer_v2_adapter.cpp, optimizer_v3_adapter.cpp), as NCCL lifts its net
// plugins: the engine calls one table and never asks which version a plugin
// is.
#pragma once

#include <zerod/zerod_plugin.h>

namespace zerod {

// What the lifted table's functions receive as their instance: the plugin's
// own descriptor and instance.
struct AdaptedOptimizer {
  const void* descriptor;  // a zd_optimizer_v1 or zd_optimizer_v2
  void* instance;
};

// The v4 table for a plugin of version 1 (every step: averaged gradients,
// one pass) and of version 2 (1-bit Adam's fixed protocol: plain steps
// before compression_start(), then local momentum, its kept compressed
// average, and an update with grad NULL). The tables' functions take an
// AdaptedOptimizer*; update_cuda is set only when the plugin has one.
zd_optimizer_v4 lift_optimizer_v1(const zd_optimizer_v1& d);
zd_optimizer_v4 lift_optimizer_v2(const zd_optimizer_v2& d);
// The v4 table for a plugin of version 3: its own functions, called with its
// own instance (no AdaptedOptimizer), and state kept in fp32 only.
zd_optimizer_v4 lift_optimizer_v3(const zd_optimizer_v3& d);

// What every older table lifts the same way, for the adapters.
namespace adapted {

template <class Desc>
const Desc& desc(const void* a) {
  return *static_cast<const Desc*>(static_cast<const AdaptedOptimizer*>(a)->descriptor);
}
inline void* instance(const void* a) { return static_cast<const AdaptedOptimizer*>(a)->instance; }

template <class Desc>
uint32_t state_slots(const void* a) {
  return desc<Desc>(a).state_slots(instance(a));
}
template <class Desc>
const char* state_name(const void* a, uint32_t slot) {
  return desc<Desc>(a).state_name(instance(a), slot);
}
template <class Desc>
zd_status update_cuda(const void* a, const zd_optimizer_update* u, void* stream) {
  return desc<Desc>(a).update_cuda(instance(a), u, stream);
}
inline uint32_t zero(const void*) { return 0; }
inline zd_stat_op sum(const void*, uint32_t) { return ZD_STAT_SUM; }
inline zd_status any_partitions(const void*, uint32_t, char*, size_t) { return ZD_OK; }
inline int32_t never(const void*) { return 0; }
// What no version before 4 can do: keep its state in anything but fp32
// (it reads zd_optimizer_update.state_dtype as a reserved field).
inline int32_t f32_state_only(const void*, zd_dtype dtype) { return dtype == ZD_DTYPE_F32 ? 1 : 0; }

// The fields an older table shares with v4, forwarded, and v4's answers for
// what no older version has: no per-tensor scalars or statistics, no kept
// average, no compression, any partitioning, fp32 state only. The adapter
// sets update and plan, and overrides what its version does have.
template <class Desc>
zd_optimizer_v4 lift_common(const Desc& d) {
  zd_optimizer_v4 t{};
  t.header = d.header;
  t.hparams = d.hparams;
  t.hparam_count = d.hparam_count;
  t.create = d.create;  // the host creates and destroys through the plugin's own table
  t.destroy = d.destroy;
  t.supports_isa = d.supports_isa;
  t.state_slots = state_slots<Desc>;
  t.state_name = state_name<Desc>;
  t.update_cuda = d.update_cuda ? update_cuda<Desc> : nullptr;
  t.prepare = nullptr;
  t.average_slot = zero;
  t.tensor_scalars = zero;
  t.tensor_stats = zero;
  t.stat_op = sum;
  t.tensor_step = nullptr;
  t.check_partitions = any_partitions;
  t.compresses = never;
  t.supports_state_dtype = f32_state_only;
  return t;
}

}  // namespace adapted

}  // namespace zerod
