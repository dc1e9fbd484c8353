// Several ranks over one engine Model, each on a thread of its own, the way
// the daemon runs them. The plugins are the real ones from the build tree.
#pragma once

#include "runtime/dtype.h"
#include "error.h"
#include "model/model.h"
#include "opaque_device.h"
#include "runtime/plugin_host.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#ifndef ZEROD_PLUGIN_DIR
#error "the build passes ZEROD_PLUGIN_DIR"
#endif

namespace zerod_test {

using namespace zerod;

struct JobOptions {
  int stage = 0;
  std::string optimizer = "adamw";
  std::vector<std::pair<std::string, double>> optimizer_hparams;  // overrides
  std::vector<std::pair<std::string, double>> zero_hparams;
  zd_dtype precision = ZD_DTYPE_F32;
  int64_t accumulation = 1;
  double clipping = 0.0;
  double timeout_s = 30;
  uint64_t device_budget = MemoryLedger::kNoBudget;
  uint64_t host_budget = MemoryLedger::kNoBudget;
  uint64_t nvme_budget = MemoryLedger::kNoBudget;
  unsigned threads = 1;
  OffloadConfig offload;   // tiers beyond the device pool
  JobPolicy* policy = nullptr;
  SnapshotConfig snapshot;
  // "cpu", "cuda", or "opaque": the emulated device the host cannot
  // address (opaque_device.h).
  std::string device = "cpu";
  // Opens each rank's device instead (a test's stand-in); null: by `device`.
  zerod::DeviceFactory device_factory;
  bool compression_replay = false;
  zd_dtype state_dtype = ZD_DTYPE_F32;  // optimizer.state_dtype
  double static_loss_scale = 0.0;       // fp16.loss_scale: > 0 a static scale, 0 dynamic
  zd_dtype grad_accum_dtype = 0;        // grad_accum_dtype: 0 the working type, ZD_DTYPE_F32 fp32
};

inline std::vector<double> values_with(const Plugin& p,
                                       const std::vector<std::pair<std::string, double>>& over) {
  std::vector<double> v = p.default_values();
  for (const auto& [name, value] : over) {
    const int at = p.value_index(name);
    if (at < 0) throw std::runtime_error("no hyperparameter " + name + " in " + p.name());
    v[static_cast<size_t>(at)] = value;
  }
  return v;
}

// The whole job's model, or (local_ranks >= 0) one daemon's of several:
// ranks [first_local, first_local + local_ranks).
inline std::unique_ptr<Model> make_model(const JobOptions& o, int world, int first_local = 0, int local_ranks = -1) {
#ifdef ZEROD_FAKE_PLUGIN_DIR
  const std::vector<std::string> dirs = {ZEROD_PLUGIN_DIR, ZEROD_FAKE_PLUGIN_DIR};  // test-only plugins too
#else
  const std::vector<std::string> dirs = {ZEROD_PLUGIN_DIR};
#endif
  auto opt = Plugin::load(ZD_PLUGIN_OPTIMIZER, o.optimizer, dirs);
  auto part = Plugin::load(ZD_PLUGIN_PARTITIONER, "stage" + std::to_string(o.stage), dirs);
  auto comm = Plugin::load(ZD_PLUGIN_COMM, "local", dirs);
  JobConfig c;
  c.source = "test job";
  c.device = o.device;
  c.precision = o.precision;
  c.gradient_accumulation_steps = o.accumulation;
  c.gradient_clipping = o.clipping;
  c.loss_scale.enabled = o.precision == ZD_DTYPE_F16;
  c.loss_scale.static_scale = o.static_loss_scale;
  c.zero_stage = o.stage;
  c.threads = o.threads;
  c.device_budget = o.device_budget;
  c.host_budget = o.host_budget;
  c.nvme_budget = o.nvme_budget;
  c.comm_timeout_s = o.timeout_s;
  c.offload = o.offload;
  c.snapshot = o.snapshot;
  c.compression_replay = o.compression_replay;
  c.optimizer_state_dtype = o.state_dtype;
  c.grad_accum_dtype = o.grad_accum_dtype;
  ModelPlugins p;
  p.optimizer = OptimizerInstance::create(opt, values_with(*opt, o.optimizer_hparams));
  p.partitioner = PartitionerInstance::create(part, values_with(*part, o.zero_hparams), world);
  p.comm = CommInstance::create(comm, comm->default_values(), world);
  p.host_tier = Plugin::load(ZD_PLUGIN_TIER, "host", dirs);
  p.nvme_tier = Plugin::load(ZD_PLUGIN_TIER, "nvme", dirs);
  if (c.offload.host_values.empty()) c.offload.host_values = p.host_tier->default_values();
  if (c.offload.nvme_values.empty()) c.offload.nvme_values = p.nvme_tier->default_values();
  DeviceFactory open = o.device_factory;
  if (!open && o.device == "opaque")
    open = [](const std::string&, MemoryLedger& ledger, Workers& workers, int, const std::string&) {
      return std::unique_ptr<Device>(std::make_unique<OpaqueDevice>(ledger, workers));
    };
  return std::make_unique<Model>(c, std::move(p), o.policy, world, first_local, local_ranks, open);
}

// Runs fn(rank) on `world` threads and waits for all; the first exception
// (with its rank) is rethrown.
inline void run_ranks(int world, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  std::mutex mu;
  std::exception_ptr first;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

// One parameter per module ("w<i>" in module "m<i>", sizes[i] elements,
// sin-initialised), registered on `rank`, which then finalizes: their ids.
inline std::vector<zd_param_id> register_sine_modules(Model& model, int rank, const std::vector<int64_t>& sizes,
                                                      zd_dtype precision) {
  std::vector<zd_param_id> ids;
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<float> init(static_cast<size_t>(sizes[i]));
    for (size_t j = 0; j < init.size(); ++j) init[j] = std::sin(static_cast<float>(j + 3 * i)) * 0.1f;
    ids.push_back(model.register_param(rank, "w" + std::to_string(i), "m" + std::to_string(i), precision, {sizes[i]},
                                       init.data(), ZD_DTYPE_F32));
  }
  model.finalize(rank);
  return ids;
}

// The trainer's side on any device (one the host cannot address too): a
// view's values as fp32, read through the device.
inline std::vector<float> read_view(Device& d, const ViewInfo& v) {
  std::vector<std::byte> raw(v.bytes);
  d.copy_to_host(raw.data(), v.data, v.bytes);
  std::vector<float> out(v.bytes / dtype_size(v.dtype));
  convert(raw.data(), v.dtype, out.data(), ZD_DTYPE_F32, out.size());
  return out;
}

// fp32 values into a view, converted to its dtype, through the device.
inline void write_view(Device& d, const ViewInfo& v, const std::vector<float>& values) {
  std::vector<std::byte> raw(v.bytes);
  convert(values.data(), ZD_DTYPE_F32, raw.data(), v.dtype, values.size());
  d.copy_to_device(v.data, raw.data(), raw.size());
}

// A forward over those modules in order: what each module's parameter
// holds, read through the device between its begin and end calls.
inline std::vector<std::vector<float>> forward_reading(Model& model, Device& d, int rank,
                                                       const std::vector<zd_param_id>& ids) {
  std::vector<std::vector<float>> w(ids.size());
  for (size_t m = 0; m < ids.size(); ++m) {
    model.forward_begin(rank, static_cast<zd_module_id>(m));
    w[m] = read_view(d, model.param_view(rank, ids[m]));
    model.forward_end(rank, static_cast<zd_module_id>(m));
  }
  return w;
}

// The fp32 values a view holds.
inline std::vector<float> view_values(const ViewInfo& v) {
  const size_t n = v.bytes / (v.dtype == ZD_DTYPE_F32 ? 4 : 2);
  std::vector<float> out(n);
  if (v.dtype == ZD_DTYPE_F32) std::memcpy(out.data(), v.data, v.bytes);
  return out;
}

}  // namespace zerod_test
