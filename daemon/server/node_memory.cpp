#include "node_memory.h"

#include "error.h"
#include "memory/ledger.h"
#include "memory/saturating.h"

#include <unistd.h>

#include <iterator>
#include <limits>
#include <optional>
#include <set>

namespace zerod::server {

namespace {

// One model's gate. Its ranks reach finalize's admission each on its own
// thread; charged one by one, two models started at once could each get
// some ranks in and hold that memory until their other ranks' refusals
// failed both. So the first rank to arrive charges the whole model and the
// others take its answer: the charge (held until every rank that took it
// has released it) or the refusal (each rank is told it once; a rank told
// before asks afresh, its finalize retried).
// Lock order: mu_, then NodeMemory's; neither calls out under it.
class ModelAdmission final : public MemoryAdmission {
 public:
  ModelAdmission(std::shared_ptr<NodeMemory> node, std::string job, int model, bool device_is_host)
      : node_(std::move(node)), job_(std::move(job)), model_(model), device_is_host_(device_is_host) {}
  ModelAdmission(const ModelAdmission&) = delete;
  ModelAdmission& operator=(const ModelAdmission&) = delete;
  // The model's ranks release theirs as it goes (~Model); this only makes
  // sure no charge outlives its model.
  ~ModelAdmission() override {
    if (!holders_.empty()) node_->give_back_model(model_);
  }

  void admit(int rank, const std::map<int, TierBytes>& local_needs) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!holders_.empty()) {  // charged for every local rank already
      holders_.insert(rank);
      return;
    }
    if (refusal_ && told_.insert(rank).second) throw *refusal_;
    refusal_.reset();
    told_.clear();
    try {
      node_->charge_model(job_, model_, host_bytes(local_needs));
    } catch (const Error& e) {
      refusal_ = e;
      told_.insert(rank);
      throw;
    }
    holders_.insert(rank);
  }

  void release(int rank) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    // A rank whose finalize failed before it came: its retry asks afresh.
    if (refusal_) told_.insert(rank);
    if (holders_.erase(rank) != 0 && holders_.empty()) node_->give_back_model(model_);
  }

 private:
  // What each rank holds in host RAM.
  std::map<int, uint64_t> host_bytes(const std::map<int, TierBytes>& local_needs) const {
    std::map<int, uint64_t> bytes;
    for (const auto& [rank, need] : local_needs)
      bytes[rank] = saturating_add(need[ZD_TIER_HOST], device_is_host_ ? need[ZD_TIER_DEVICE] : 0);
    return bytes;
  }

  std::shared_ptr<NodeMemory> node_;
  std::string job_;
  int model_;
  bool device_is_host_;
  std::mutex mu_;
  std::set<int> holders_;        // ranks that took the charge and hold it
  std::optional<Error> refusal_;  // the last decision, when it was a refusal
  std::set<int> told_;           // ranks that have had that refusal
};

// "0,1,4-7": a model of many ranks is named in a line.
std::string rank_list(const std::set<int>& ranks) {
  std::string out;
  for (auto it = ranks.begin(); it != ranks.end();) {
    auto last = it;
    while (std::next(last) != ranks.end() && *std::next(last) == *last + 1) ++last;
    out += (out.empty() ? "" : ",") + std::to_string(*it);
    if (*last - *it >= 2)
      out += "-" + std::to_string(*last);
    else if (last != it)
      out += "," + std::to_string(*last);
    it = std::next(last);
  }
  return out;
}

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

std::string NodeMemory::holders_locked(const std::map<int, uint64_t>* peak_by_model) const {
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
    out += "  " + who.first + ", model " + std::to_string(model) + ": rank" + (who.second.size() == 1 ? " " : "s ") +
           rank_list(who.second) + ", " + format_bytes(bytes[model]);
    if (peak_by_model) {
      const auto peak = peak_by_model->find(model);
      out += " planned";
      if (peak != peak_by_model->end()) out += ", peak " + format_bytes(peak->second);
    }
    out += "\n";
  }
  return out;
}

std::string NodeMemory::holders() const {
  std::lock_guard<std::mutex> lock(mu_);
  return holders_locked();
}

std::string NodeMemory::holders(const std::map<int, uint64_t>& peak_by_model) const {
  std::lock_guard<std::mutex> lock(mu_);
  return holders_locked(&peak_by_model);
}

void NodeMemory::charge_model(const std::string& job_label, int model_id,
                              const std::map<int, uint64_t>& bytes_by_rank) {
  uint64_t bytes = 0;
  for (const auto& [rank, b] : bytes_by_rank) bytes = saturating_add(bytes, b);
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t held = held_locked();
  if (bytes > capacity_ - std::min(held, capacity_)) refuse_locked(job_label, bytes_by_rank, bytes, held);
  for (const auto& [rank, b] : bytes_by_rank) charges_[{model_id, rank}] = Charge{job_label, b};
}

void NodeMemory::refuse_locked(const std::string& job_label, const std::map<int, uint64_t>& bytes_by_rank,
                               uint64_t bytes, uint64_t held) const {
  std::set<int> ranks;
  for (const auto& [rank, b] : bytes_by_rank) ranks.insert(rank);
  const std::string whose = ranks.size() == 1 ? "rank " + rank_list(ranks) + "'s model state needs "
                                              : "the model state of its ranks " + rank_list(ranks) +
                                                    " on this node needs ";
  fail(ZD_ERR_BUDGET,
       job_label + ": " + whose + with_bytes(bytes) + " of the node's host memory" +
           (ranks.size() == 1 ? "" : " together (a model is admitted whole or not at all)") +
           ", but this daemon's jobs may hold " + format_bytes(capacity_) +
           " together (zerod serve --host-memory) and " + format_bytes(held) + " of it is held" +
           (charges_.empty() ? std::string(".") : ":\n" + holders_locked()) +
           "\nwait for a job to end, lower this job's need (zerod plan; offload to NVMe, bf16 optimizer "
           "state, fewer ranks), or give the daemon more with --host-memory");
}

void NodeMemory::give_back_model(int model_id) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  charges_.erase(charges_.lower_bound({model_id, std::numeric_limits<int>::min()}),
                 charges_.upper_bound({model_id, std::numeric_limits<int>::max()}));
}

uint64_t default_node_capacity() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 10 * 9;
}

}  // namespace zerod::server
