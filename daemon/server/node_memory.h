// The node's host memory as one budget for every job a `zerod serve --jobs`
// serves: each model's planned state is charged here at finalize (before
// anything is allocated), all of its ranks on the node at once or none, and
// given back when its model goes, so that jobs cannot together take more
// than the node has, and two jobs started at once cannot each get part of
// their ranks in and hold that memory while both fail. A job's own budgets
// (`budgets = { host = ... }`) still bound each of its ranks; this bounds
// all of them together. What counts is what lives in host RAM: the host
// tier, and the device tier when the device is host memory (the cpu and
// emulated devices). GPU memory and NVMe are not charged here (each rank's
// device pool is bounded by its GPU, and the NVMe store checks its disk).
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
  // One line a model holding memory: "job ..., model 3: ranks 0-3, 40.0 MiB".
  std::string holders() const;
  // The same with what each model's ranks have held in host RAM at their
  // peaks, by model id (`zerod status`): "job ..., model 3: ranks 0-3,
  // 40.0 MiB planned, peak 56.0 MiB". The planned state is what is charged;
  // the peak adds the short-lived buffers that are not.
  std::string holders(const std::map<int, uint64_t>& peak_by_model) const;

  // The gate one model's ranks pass (Model::set_memory_admission): the
  // first of them to arrive charges them all; the others share its answer.
  // device_is_host_memory: its device tier is host RAM too.
  std::shared_ptr<MemoryAdmission> for_model(const std::string& job_label, int model_id,
                                             bool device_is_host_memory);

  // --- for the gate ---
  // Every rank of the model on this node (bytes by rank), in one decision:
  // all are charged, or none and ZD_ERR_BUDGET is thrown.
  void charge_model(const std::string& job_label, int model_id, const std::map<int, uint64_t>& bytes_by_rank);
  // Everything charge_model charged for the model.
  void give_back_model(int model_id) noexcept;

 private:
  struct Charge {
    std::string job;
    uint64_t bytes = 0;
  };
  uint64_t held_locked() const;
  std::string holders_locked(const std::map<int, uint64_t>* peak_by_model = nullptr) const;
  [[noreturn]] void refuse_locked(const std::string& job_label, const std::map<int, uint64_t>& bytes_by_rank,
                                  uint64_t bytes, uint64_t held) const;

  const uint64_t capacity_;
  mutable std::mutex mu_;
  std::map<std::pair<int, int>, Charge> charges_;  // by (model, rank): a model's ranks come and go together
};

// The default capacity of `zerod serve --jobs`: 90% of the node's RAM
// (MemTotal), leaving the rest to the trainers' own memory and the system.
uint64_t default_node_capacity();

}  // namespace zerod::server
