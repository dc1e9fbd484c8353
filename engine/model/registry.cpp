#include "model/registry.h"

#include "memory/align.h"

#include "runtime/dtype.h"
#include "error.h"

#include <algorithm>

namespace zerod {

namespace {

// The partitioner's shard length, refused if it cannot hold the tensor.
uint64_t checked_stride(const LayoutPolicy& policy, uint64_t numel, uint64_t align, uint64_t world) {
  const uint64_t stride = policy.stride(numel, align);
  if (stride * world < numel || stride % align != 0)
    fail(ZD_ERR_PLUGIN, "the partitioner cut a tensor of " + std::to_string(numel) + " elements into " +
                            std::to_string(world) + " shards of " + std::to_string(stride) +
                            " (at least " + std::to_string((numel + world - 1) / world) +
                            ", a multiple of " + std::to_string(align) + ", are needed)");
  return stride;
}

}  // namespace

uint64_t ParamRecord::shard_real(int rank) const {
  const uint64_t start = static_cast<uint64_t>(rank) * stride;
  const auto n = static_cast<uint64_t>(numel);
  if (start >= n) return 0;
  return std::min(stride, n - start);
}

zd_param_id Registry::add(const std::string& name, const std::string& module, zd_dtype dtype,
                          std::vector<int64_t> shape) {
  if (name.empty()) fail(ZD_ERR_INVALID_ARGUMENT, "a parameter needs a non-empty name");
  if (module.empty())
    fail(ZD_ERR_INVALID_ARGUMENT, "parameter '" + name + "' needs a module name");
  if (param_by_name_.count(name))
    fail(ZD_ERR_INVALID_ARGUMENT, "parameter '" + name + "' is already registered");
  if (shape.empty() || shape.size() > ZD_MAX_DIMS)
    fail(ZD_ERR_INVALID_ARGUMENT, "parameter '" + name + "' has " + std::to_string(shape.size()) +
                                      " dimensions; 1.." + std::to_string(ZD_MAX_DIMS) + " are allowed");
  int64_t numel = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] <= 0)
      fail(ZD_ERR_INVALID_ARGUMENT, "parameter '" + name + "' has extent " +
                                        std::to_string(shape[i]) + " in dimension " +
                                        std::to_string(i) + "; extents must be positive");
    if (numel > (int64_t{1} << 47) / shape[i])
      fail(ZD_ERR_INVALID_ARGUMENT, "parameter '" + name + "' is too large");
    numel *= shape[i];
  }
  zd_module_id mid;
  auto it = module_by_name_.find(module);
  if (it == module_by_name_.end()) {
    mid = static_cast<zd_module_id>(modules_.size());
    modules_.push_back(ModuleRecord{module, {}});
    module_by_name_.emplace(module, mid);
  } else {
    mid = it->second;
  }
  const auto id = static_cast<zd_param_id>(params_.size());
  ParamRecord p;
  p.name = name;
  p.module = mid;
  p.dtype = dtype;
  p.shape = std::move(shape);
  p.numel = numel;
  params_.push_back(std::move(p));
  modules_[static_cast<size_t>(mid)].params.push_back(id);
  param_by_name_.emplace(name, id);
  return id;
}

void Registry::lay_out(const LayoutPolicy& policy) {
  groups_.clear();
  partitioning_ = policy.partitioning;
  const auto world = static_cast<uint64_t>(world_size_);
  for (size_t i = 0; i < params_.size(); ++i) {
    ParamRecord& p = params_[i];
    const int cls = policy.group_class ? policy.group_class(i) : 0;
    auto g = std::find_if(groups_.begin(), groups_.end(),
                          [&](const ParamGroup& pg) { return pg.dtype == p.dtype && pg.state_class == cls; });
    if (g == groups_.end()) {
      groups_.push_back(ParamGroup{p.dtype, cls, {}, 0, 0, 0});
      g = groups_.end() - 1;
    }
    const auto n = static_cast<uint64_t>(p.numel);
    p.group = static_cast<int>(g - groups_.begin());
    p.full_offset = g->full_numel;
    g->full_numel = align_up(g->full_numel + n, kAlignElems);
    if (policy.partitioning == Partitioning::Param) {
      p.stride = checked_stride(policy, n, policy.param_align, world);
      p.flat_offset = g->flat_numel;
      g->flat_numel = align_up(g->flat_numel + p.stride, kAlignElems);
      p.persistent = n <= policy.persistence_threshold;
    } else {
      p.stride = n;
    }
    g->params.push_back(static_cast<zd_param_id>(i));
  }
  for (ParamGroup& g : groups_) {
    if (policy.partitioning == Partitioning::Group) {
      g.stride = checked_stride(policy, g.full_numel, kAlignElems, world);
      g.full_numel = g.stride * world;  // the tail of the last rank's range is padding
    } else {
      g.stride = g.full_numel;
    }
  }
}

const ParamRecord& Registry::param(zd_param_id id) const {
  if (id < 0 || static_cast<size_t>(id) >= params_.size())
    fail(ZD_ERR_NOT_FOUND, "no parameter with id " + std::to_string(id) + " (the model has " +
                               std::to_string(params_.size()) + ")");
  return params_[static_cast<size_t>(id)];
}

const ModuleRecord& Registry::module(zd_module_id id) const {
  if (id < 0 || static_cast<size_t>(id) >= modules_.size())
    fail(ZD_ERR_NOT_FOUND, "no module with id " + std::to_string(id) + " (the model has " +
                               std::to_string(modules_.size()) + ")");
  return modules_[static_cast<size_t>(id)];
}

zd_param_id Registry::find_param(const std::string& name) const {
  auto it = param_by_name_.find(name);
  return it == param_by_name_.end() ? -1 : it->second;
}

zd_module_id Registry::find_module(const std::string& name) const {
  auto it = module_by_name_.find(name);
  return it == module_by_name_.end() ? -1 : it->second;
}

uint64_t Registry::total_numel() const {
  uint64_t n = 0;
  for (const auto& p : params_) n += static_cast<uint64_t>(p.numel);
  return n;
}

}  // namespace zerod

namespace zerod {

void StagedValues::assign(const void* src, zd_dtype src_dt, uint64_t numel) {
  dtype = dtype_size(src_dt) == 2 ? src_dt : ZD_DTYPE_F32;
  bytes.resize(numel * dtype_size(dtype));
  convert(src, src_dt, bytes.data(), dtype, numel);
}

void StagedValues::resize(zd_dtype dt, uint64_t numel) {
  dtype = dt;
  bytes.resize(numel * dtype_size(dt));
}

void StagedValues::read_f32(uint64_t at, uint64_t n, float* dst) const {
  convert(bytes.data() + at * dtype_size(dtype), dtype, dst, ZD_DTYPE_F32, n);
}

}  // namespace zerod
