// Optimizer plugins of older ABI versions, lifted to the current table
// (zd_optimizer_v3), one adapter per old version (optimizer_v1_adapter.cpp,
// optimizer_v2_adapter.cpp), as NCCL lifts its net plugins: the engine calls
// one table and never asks which version a plugin is.
#pragma once

#include <zerod/zerod_plugin.h>

namespace zerod {

// What the lifted table's functions receive as their instance: the plugin's
// own descriptor and instance.
struct AdaptedOptimizer {
  const void* descriptor;  // a zd_optimizer_v1 or zd_optimizer_v2
  void* instance;
};

// The v3 table for a plugin of version 1 (every step: averaged gradients,
// one pass) and of version 2 (1-bit Adam's fixed protocol: plain steps
// before compression_start(), then local momentum, its kept compressed
// average, and an update with grad NULL). The tables' functions take an
// AdaptedOptimizer*; update_cuda is set only when the plugin has one.
zd_optimizer_v3 lift_optimizer_v1(const zd_optimizer_v1& d);
zd_optimizer_v3 lift_optimizer_v2(const zd_optimizer_v2& d);

}  // namespace zerod
