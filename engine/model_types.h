// Plain figures a model hands its callers: a tensor view, the result of a
// step.
#pragma once

#include <zerod/zerod.h>

#include <cstdint>
#include <vector>

namespace zerod {

// A tensor in zerod's memory, as zd_view reports it.
struct ViewInfo {
  void* data = nullptr;
  uint64_t bytes = 0;
  int32_t arena = -1;  // the pool region it lies in (Device::exports), or -1
  uint64_t offset = 0;
  zd_dtype dtype = ZD_DTYPE_F32;
  const std::vector<int64_t>* shape = nullptr;
  bool read_only = false;
  int32_t device_type = ZD_DEVICE_CPU;  // DLPack's numbers
  int32_t device_id = 0;
};

struct StepFigures {
  bool boundary = false;
  bool applied = false;
  bool skipped = false;
  int64_t step = 0;
  int64_t micro_step = 0;
  double lr = 0.0;
  double loss_scale = 1.0;
  double grad_norm = 0.0;
};

}  // namespace zerod
