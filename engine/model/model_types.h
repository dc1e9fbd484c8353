// Plain figures a model hands its callers: a tensor view, the result of a
// step.
#pragma once

#include "call_record.h"  // StepFigures: the same record the call ring carries

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

}  // namespace zerod
