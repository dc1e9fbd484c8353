#include "trace_ring.h"

namespace zerod::observe {

void TraceRing::push(const TraceEvent& e) {
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.size() < capacity_) {
    events_.push_back(e);
    return;
  }
  events_[next_] = e;
  next_ = (next_ + 1) % capacity_;
  ++dropped_;
}

std::vector<TraceEvent> TraceRing::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<TraceEvent> out;
  out.reserve(events_.size());
  out.insert(out.end(), events_.begin() + static_cast<std::ptrdiff_t>(next_), events_.end());
  out.insert(out.end(), events_.begin(), events_.begin() + static_cast<std::ptrdiff_t>(next_));
  return out;
}

uint64_t TraceRing::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

}  // namespace zerod::observe
