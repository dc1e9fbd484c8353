#include "node_memory.h"

#include "error.h"
#include "memory/ledger.h"

#include <unistd.h>

#include <set>

namespace zerod::server {

namespace {

class ModelAdmission final : public MemoryAdmission {
 public:
  ModelAdmission(std::shared_ptr<NodeMemory> node, std::string job, int model, bool device_is_host)
      : node_(std::move(node)), job_(std::move(job)), model_(model), device_is_host_(device_is_host) {}

  void admit(int rank, const std::array<uint64_t, ZD_TIER_COUNT>& need) override {
    uint64_t bytes = need[ZD_TIER_HOST];
    if (device_is_host_) bytes += need[ZD_TIER_DEVICE];
    node_->charge(job_, model_, rank, bytes);
  }
  void release(int rank) noexcept override { node_->give_back(model_, rank); }

 private:
  std::shared_ptr<NodeMemory> node_;
  std::string job_;
  int model_;
  bool device_is_host_;
};

std::string with_bytes(uint64_t b) { return format_bytes(b) + " (" + std::to_string(b) + " bytes)"; }

}  // namespace

std::shared_ptr<MemoryAdmission> NodeMemory::for_model(const std::string& job_label, int model_id,
                                                       bool device_is_host_memory) {
  return std::make_shared<ModelAdmission>(shared_from_this(), job_label, model_id, device_is_host_memory);
}

uint64_t NodeMemory::held_locked() const {
  uint64_t sum = 0;
  for (const auto& [at, c] : charges_) sum += c.bytes;
  return sum;
}

uint64_t NodeMemory::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_locked();
}

std::string NodeMemory::holders_locked() const {
  std::string out;
  // One line a model: its job, its ranks, what they hold together.
  std::map<int, std::pair<std::string, std::set<int>>> by_model;
  std::map<int, uint64_t> bytes;
  for (const auto& [at, c] : charges_) {
    by_model[at.first].first = c.job;
    by_model[at.first].second.insert(at.second);
    bytes[at.first] += c.bytes;
  }
  for (const auto& [model, who] : by_model) {
    std::string ranks;
    for (const int r : who.second) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
    out += "  " + who.first + ", model " + std::to_string(model) + ": rank" + (who.second.size() == 1 ? " " : "s ") +
           ranks + ", " + format_bytes(bytes[model]) + "\n";
  }
  return out;
}

std::string NodeMemory::holders() const {
  std::lock_guard<std::mutex> lock(mu_);
  return holders_locked();
}

void NodeMemory::charge(const std::string& job_label, int model_id, int rank, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t held = held_locked();
  if (bytes > capacity_ - std::min(held, capacity_))
    fail(ZD_ERR_BUDGET,
         job_label + ": rank " + std::to_string(rank) + "'s model state needs " + with_bytes(bytes) +
             " of the node's host memory, but this daemon's jobs may hold " + format_bytes(capacity_) +
             " together (zerod serve --host-memory) and " + format_bytes(held) + " of it is held" +
             (charges_.empty() ? std::string(".") : ":\n" + holders_locked()) +
             "\nwait for a job to end, lower this job's need (zerod plan; offload to NVMe, bf16 optimizer "
             "state, fewer ranks), or give the daemon more with --host-memory");
  charges_[{model_id, rank}] = Charge{job_label, bytes};
}

void NodeMemory::give_back(int model_id, int rank) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  charges_.erase({model_id, rank});
}

uint64_t default_node_capacity() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 10 * 9;
}

}  // namespace zerod::server
