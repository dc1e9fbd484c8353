#include "rank_counters.h"

#include <algorithm>
#include <cstring>

namespace zerod::observe {

void Histogram::observe(double seconds) {
  size_t i = 0;
  while (i < kBounds.size() && seconds > kBounds[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  const double ns = std::max(0.0, seconds) * 1e9;
  sum_ns_.fetch_add(static_cast<uint64_t>(ns), std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  uint64_t running = 0;
  for (size_t i = 0; i < kBounds.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = running;
  }
  s.count = running + buckets_[kBounds.size()].load(std::memory_order_relaxed);
  s.sum = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9;
  return s;
}

void RateWindow::add(int64_t now_ns, uint64_t total) {
  std::lock_guard<std::mutex> lock(mu_);
  ring_[next_] = {now_ns, total};
  next_ = (next_ + 1) % ring_.size();
  size_ = std::min(size_ + 1, ring_.size());
}

double RateWindow::rate(int64_t now_ns, int64_t window_ns) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (size_ < 2) return 0;
  const size_t newest = (next_ + ring_.size() - 1) % ring_.size();
  // A trainer that stopped reporting is not running at its last rate.
  if (now_ns - ring_[newest].first > window_ns) return 0;
  size_t oldest = newest;
  for (size_t k = 1; k < size_; ++k) {
    const size_t i = (newest + ring_.size() - k) % ring_.size();
    if (now_ns - ring_[i].first > window_ns) break;
    oldest = i;
  }
  if (oldest == newest) {
    // One report inside the window: the rate since the one before it.
    oldest = (newest + ring_.size() - 1) % ring_.size();
  }
  const double secs = static_cast<double>(ring_[newest].first - ring_[oldest].first) / 1e9;
  if (secs <= 0) return 0;
  return static_cast<double>(ring_[newest].second - ring_[oldest].second) / secs;
}

RankCounters::RankCounters(int first, int n)
    : peer_wait_by_late(new std::atomic<int64_t>[static_cast<size_t>(n)]),
      late_count(new std::atomic<uint64_t>[static_cast<size_t>(n)]),
      first_rank(first),
      ranks(n) {
  for (int i = 0; i < n; ++i) {
    peer_wait_by_late[static_cast<size_t>(i)].store(0);
    late_count[static_cast<size_t>(i)].store(0);
  }
  for (auto& t : optimizer_ns) t.store(0);
}

uint64_t ring_bytes(RingCollective kind, uint64_t bytes, int world) {
  if (world < 2) return 0;
  const uint64_t n = static_cast<uint64_t>(world);
  switch (kind) {
    case RingCollective::all_reduce: {
      // 128 bits, as the plugins: 2 (N-1) * bytes may pass 2^64.
      const unsigned __int128 twice = static_cast<unsigned __int128>(2 * (n - 1)) * bytes;
      return static_cast<uint64_t>(twice / n);
    }
    case RingCollective::reduce_scatter:
    case RingCollective::all_gather: return (n - 1) * bytes;
  }
  return 0;
}

void RankCounters::count_direct(RingCollective kind, uint64_t bytes, int world) {
  add_relaxed(direct_bytes_sent, ring_bytes(kind, bytes, world));
  add_relaxed(direct_collectives, 1);
}

void RankCounters::forget_direct() {
  direct_bytes_sent.store(0, std::memory_order_relaxed);
  direct_collectives.store(0, std::memory_order_relaxed);
}

double RankCounters::loss() const {
  const uint64_t bits = loss_bits.load(std::memory_order_relaxed);
  double v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

void RankCounters::set_loss(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof v);
  loss_bits.store(bits, std::memory_order_relaxed);
}

}  // namespace zerod::observe
