// Live figures of one rank, for the daemon's metrics and `zerod top`: kept
// whether or not a trace is recorded, as relaxed atomics that the rank's
// threads add to and a scrape reads at any time (each figure is consistent
// on its own; a scrape does not stop the ranks).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace zerod::observe {

// A Prometheus histogram of seconds with fixed bucket bounds.
class Histogram {
 public:
  static constexpr std::array<double, 16> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                     0.5,   1,      2.5,   5,    10,    25,    60,  300};
  void observe(double seconds);
  struct Snapshot {
    std::array<uint64_t, kBounds.size()> cumulative{};  // observations <= each bound
    uint64_t count = 0;
    double sum = 0;
  };
  Snapshot snapshot() const;

 private:
  std::array<std::atomic<uint64_t>, kBounds.size() + 1> buckets_{};  // the last: above every bound
  std::atomic<uint64_t> sum_ns_{0};
};

// Events per second over the last few seconds of reports.
class RateWindow {
 public:
  void add(int64_t now_ns, uint64_t total);
  // Per second over the reports of the last `window_ns` (0 when fewer than two).
  double rate(int64_t now_ns, int64_t window_ns = 10'000'000'000) const;

 private:
  mutable std::mutex mu_;
  std::array<std::pair<int64_t, uint64_t>, 64> ring_{};  // (time, running total)
  size_t next_ = 0, size_ = 0;
};

// The collectives the engine runs on its own, by what a ring sends for them.
enum class RingCollective { all_reduce, reduce_scatter, all_gather };

// What a comm plugin counts as sent (zd_comm_figures.bytes_sent, zerod.h)
// for one collective on a ring of `world` ranks: all_reduce 2 (N-1)/N of
// `bytes` (the buffer), reduce_scatter and all_gather (N-1) * `bytes` (the
// chunk received, the chunk sent). The local plugin's ring_bytes (call.h),
// which the mpi and nccl plugins count with too, in the engine's words.
uint64_t ring_bytes(RingCollective kind, uint64_t bytes, int world);

inline void add_relaxed(std::atomic<int64_t>& a, int64_t v) { a.fetch_add(v, std::memory_order_relaxed); }
inline void add_relaxed(std::atomic<uint64_t>& a, uint64_t v) { a.fetch_add(v, std::memory_order_relaxed); }

struct RankCounters {
  // late_ranks: how many ranks a collective may wait for (this process's).
  RankCounters(int first_rank, int ranks);

  Histogram step_seconds;         // between consecutive accumulation boundaries
  std::atomic<int64_t> last_boundary_ns{0};
  // Updates applied in this process: a Prometheus counter, which never goes
  // back or jumps (a load or a resume moves the step, not this).
  std::atomic<uint64_t> steps_applied{0};

  // Reported by the trainer (zd_model_report).
  std::atomic<uint64_t> tokens{0}, samples{0}, reports{0};
  std::atomic<uint64_t> loss_bits{0};  // a double; valid when reports_with_loss > 0
  std::atomic<uint64_t> reports_with_loss{0};
  RateWindow tokens_rate, samples_rate;

  // Time a begin call waited for its module's gather (stage 3), and how
  // many gathers were ready (prefetched) or not when asked for.
  std::atomic<int64_t> gather_wait_ns{0};
  std::atomic<uint64_t> gathers_waited{0}, gathers_ready{0};
  // Time zd_step waited for the collectives in flight and for the
  // gradient reduction, the optimizer per tier.
  std::atomic<int64_t> reduce_wait_ns{0};
  std::array<std::atomic<int64_t>, 3> optimizer_ns{};  // by zd_tier
  // offload.overlap: steps whose host update ran behind zd_step, and the
  // time begin calls waited for their module's update (what it left exposed).
  std::atomic<uint64_t> overlapped_updates{0};
  std::atomic<int64_t> update_wait_ns{0};

  // Collectives: time spent waiting for other ranks to arrive, in total and
  // by the rank that arrived last (index rank - first_rank).
  std::atomic<int64_t> peer_wait_ns{0};
  std::unique_ptr<std::atomic<int64_t>[]> peer_wait_by_late;
  std::unique_ptr<std::atomic<uint64_t>[]> late_count;  // collectives that rank was last at
  const int first_rank;
  const int ranks;

  // NVMe: bytes moved, and the time the rank's thread was blocked on the
  // disk (the pipeline's waits; the whole of a synchronous transfer).
  std::atomic<uint64_t> nvme_read_bytes{0}, nvme_write_bytes{0};
  std::atomic<int64_t> nvme_wait_ns{0};

  // Collectives the engine ran without the comm plugin: stage 3's one-sided
  // gathers (Residency::copy_module) and the collectives between a daemon's
  // GPUs (device_comm.cpp). The plugin never sees them, so they are counted
  // here as a plugin counts its own (ring bytes, one per call) and
  // Model::comm_figures adds them to the plugin's figures: a rank's comm
  // figures do not depend on which way its collectives went.
  std::atomic<uint64_t> direct_bytes_sent{0}, direct_collectives{0};
  void count_direct(RingCollective kind, uint64_t bytes, int world);
  // A new comm instance (a restart) counts from zero: so do these.
  void forget_direct();

  double loss() const;
  void set_loss(double v);
};

}  // namespace zerod::observe
