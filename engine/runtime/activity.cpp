#include "runtime/activity.h"

#include <cstdio>

namespace zerod {

ActivityTable::ActivityTable(int world_size) : ranks_(static_cast<size_t>(world_size)) {
  const auto now = std::chrono::steady_clock::now();
  for (auto& r : ranks_) r.since = now;
}

void ActivityTable::enter(int rank, const char* call, const std::string& module) {
  std::lock_guard<std::mutex> lock(mu_);
  RankActivity& a = ranks_.at(static_cast<size_t>(rank));
  a.call = call;
  a.module = module;
  a.since = std::chrono::steady_clock::now();
  a.in_call = true;
  a.called = true;
}

void ActivityTable::leave(int rank, int64_t step, int64_t micro_step) {
  std::lock_guard<std::mutex> lock(mu_);
  RankActivity& a = ranks_.at(static_cast<size_t>(rank));
  a.in_call = false;
  a.since = std::chrono::steady_clock::now();
  a.step = step;
  a.micro_step = micro_step;
}

void ActivityTable::mark_lost(int rank, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  RankActivity& a = ranks_.at(static_cast<size_t>(rank));
  a.lost = true;
  a.lost_reason = reason;
}

void ActivityTable::mark_joined(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  RankActivity& a = ranks_.at(static_cast<size_t>(rank));
  a.joined = true;
  if (!a.called) a.since = std::chrono::steady_clock::now();
  joins_known_ = true;
}

void ActivityTable::clear_lost() {
  std::lock_guard<std::mutex> lock(mu_);
  for (RankActivity& a : ranks_) {
    a.lost = false;
    a.lost_reason.clear();
    a.in_call = false;
  }
}

void ActivityTable::record_step(int rank, double lr, double loss_scale, double grad_norm,
                                bool skipped) {
  std::lock_guard<std::mutex> lock(mu_);
  RankActivity& a = ranks_.at(static_cast<size_t>(rank));
  a.lr = lr;
  a.loss_scale = loss_scale;
  a.grad_norm = grad_norm;
  a.last_skipped = skipped;
}

void ActivityTable::set_local(int first, int count) {
  std::lock_guard<std::mutex> lock(mu_);
  first_local_ = first;
  local_count_ = count;
}

std::vector<RankActivity> ActivityTable::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ranks_;
}

std::string ActivityTable::describe() const {
  const auto now = std::chrono::steady_clock::now();
  const std::vector<RankActivity> all = snapshot();
  std::string out;
  int first = 0, count = static_cast<int>(all.size());
  bool joins_known = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (local_count_ >= 0) first = first_local_, count = local_count_;
    joins_known = joins_known_;
  }
  auto remote = [&](size_t lo, size_t hi) {  // [lo, hi)
    if (lo >= hi) return;
    out += (out.empty() ? "" : "\n") + std::string("  rank") + (hi - lo > 1 ? "s " : " ") + std::to_string(lo) +
           (hi - lo > 1 ? ".." + std::to_string(hi - 1) : "") +
           ": served by another node's daemon (its log says where they were)";
  };
  remote(0, static_cast<size_t>(first));
  for (size_t r = static_cast<size_t>(first); r < static_cast<size_t>(first + count); ++r) {
    const RankActivity& a = all[r];
    const double secs = std::chrono::duration<double>(now - a.since).count();
    char line[512];
    const std::string target = a.call + (a.module.empty() ? "" : "('" + a.module + "')");
    if (a.lost) {
      std::snprintf(line, sizeof line, "  rank %zu: lost (%s); last call %s", r,
                    a.lost_reason.c_str(), target.c_str());
    } else if (!a.called) {
      // Not "returned from (none yet)": a rank that never came is not one
      // that stopped calling. Nor "never connected": the model does not
      // know whether the rank is connected to the daemon, maybe still at
      // another model of its trainer's, which it creates first.
      if (joins_known && !a.joined)
        std::snprintf(line, sizeof line, "  rank %zu: has not created this model (no zd_model_create of it yet)",
                      r);
      else if (a.joined)
        std::snprintf(line, sizeof line, "  rank %zu: joined the model %.1f s ago and has made no call since", r,
                      secs);
      else
        std::snprintf(line, sizeof line, "  rank %zu: has made no call yet", r);
    } else if (a.in_call) {
      std::snprintf(line, sizeof line, "  rank %zu: in %s for %.1f s (step %lld, micro-step %lld)", r,
                    target.c_str(), secs, static_cast<long long>(a.step),
                    static_cast<long long>(a.micro_step));
    } else {
      std::snprintf(line, sizeof line,
                    "  rank %zu: returned from %s %.1f s ago and has not called since (step %lld, "
                    "micro-step %lld)",
                    r, target.c_str(), secs, static_cast<long long>(a.step),
                    static_cast<long long>(a.micro_step));
    }
    if (!out.empty()) out += "\n";
    out += line;
  }
  remote(static_cast<size_t>(first + count), all.size());
  return out;
}

}  // namespace zerod
