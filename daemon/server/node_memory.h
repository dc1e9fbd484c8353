// The node's host memory as one budget for every job a `zerod serve --jobs`
// serves: each rank's planned model state is charged here at finalize
// (before anything is allocated) and given back when its model goes, so
// that jobs started one after another cannot together take more than the
// node has. A job's own budgets (`budgets = { host = ... }`) still bound each of its
// ranks; this bounds all of them together. What counts is what lives in
// host RAM: the host tier, and the device tier when the device is host
// memory (the cpu and emulated devices). GPU memory and NVMe are not
// charged here (each rank's device pool is bounded by its GPU, and the NVMe
// store checks its disk).
#pragma once

#include "memory/memory_admission.h"

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

namespace zerod::server {

class NodeMemory : public std::enable_shared_from_this<NodeMemory> {
 public:
  // capacity: the bytes of host RAM the jobs may hold together.
  explicit NodeMemory(uint64_t capacity) : capacity_(capacity) {}

  uint64_t capacity() const { return capacity_; }
  uint64_t held() const;
  // One line a model holding memory: "job ... model 3: ranks 0-1, 40.0 MiB".
  std::string holders() const;

  // The gate one model's ranks pass (Model::set_memory_admission).
  // device_is_host_memory: its device tier is host RAM too.
  std::shared_ptr<MemoryAdmission> for_model(const std::string& job_label, int model_id,
                                             bool device_is_host_memory);

  // --- for the gate ---
  void charge(const std::string& job_label, int model_id, int rank, uint64_t bytes);
  void give_back(int model_id, int rank) noexcept;

 private:
  struct Charge {
    std::string job;
    uint64_t bytes = 0;
  };
  uint64_t held_locked() const;
  std::string holders_locked() const;

  const uint64_t capacity_;
  mutable std::mutex mu_;
  std::map<std::pair<int, int>, Charge> charges_;  // by (model, rank)
};

// The default capacity of `zerod serve --jobs`: 90% of the node's RAM
// (MemTotal), leaving the rest to the trainers' own memory and the system.
uint64_t default_node_capacity();

}  // namespace zerod::server
