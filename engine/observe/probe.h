// What the engine's parts call to be seen: one RankProbe per rank holds the
// rank's live counters (always kept) and, when the job records a trace, the
// tracer. Recording an event costs a check of the rank's trace window
// first; outside it, or without a tracer, nothing else happens.
#pragma once

#include "clock.h"
#include "rank_counters.h"
#include "trace_event.h"
#include "tracer.h"

#include <atomic>
#include <memory>

namespace zerod {
class MemoryLedger;
}

namespace zerod::observe {

class RankProbe {
 public:
  explicit RankProbe(int rank) : rank_(rank), counters_(std::make_unique<RankCounters>(rank, 1)) {}
  RankProbe(const RankProbe&) = delete;
  RankProbe& operator=(const RankProbe&) = delete;

  // At model construction, before any call: the tracer (or null) and the
  // ranks a collective of this process may wait for.
  void attach(Tracer* tracer, int first_rank, int ranks);

  int rank() const { return rank_; }
  bool tracing() const { return tracer_ && tracer_->recording(rank_); }
  RankCounters& counters() const { return *counters_; }
  // The step in progress on this rank (applied updates + 1).
  int64_t step() const { return step_.load(std::memory_order_relaxed); }

  // Events; each does nothing unless tracing().
  void span(const char* cat, const char* name, int64_t t0, int64_t t1, const EventArgs& a = {}) const;
  void async_span(const char* cat, const char* name, int64_t t0, int64_t t1, const EventArgs& a = {}) const;
  void instant(const char* cat, const char* name, const EventArgs& a = {}) const;
  // --- the memory counter (a track per rank), from the calling thread ---
  // At every call's entry, t the call's start when tracing, else 0: the
  // first traced call starts the counter's first interval (what the ledger
  // held at its peak before the window is not in the window).
  void open_memory_interval(MemoryLedger& ledger, int64_t t);
  // At a traced call's return: the most each tier held since the previous
  // sample, stamped where that interval began, so the counter reads as the
  // most held from its time to the next sample's. A buffer allocated and
  // freed inside a call (zd_step's reduce buffers), or between calls by
  // the rank's other threads, still shows.
  void memory(MemoryLedger& ledger);

  // --- from the rank's calling thread -------------------------------------
  // A call of a step begins (forward/backward begin or end, zd_step): the
  // first one after a boundary opens the step and returns when (else 0).
  // The clock is read once per step here; the rest only when tracing.
  int64_t call_entered();
  // An accumulation boundary was reached: `applied` updates are now applied.
  // The step closes if it applied; a skipped one (fp16 overflow) stays open.
  void boundary(int64_t applied, int64_t t_end);
  // After a restart from kept state: the next step is applied + 1.
  void restart(int64_t applied);
  // The trainer's report (zd_model_report).
  void report(uint64_t tokens, uint64_t samples, bool has_loss, double loss, int64_t applied);

 private:
  void record(EventKind kind, const char* cat, const char* name, int64_t t0, int64_t t1, const EventArgs& a) const;

  const int rank_;
  Tracer* tracer_ = nullptr;
  std::unique_ptr<RankCounters> counters_;
  std::atomic<int64_t> step_{1};
  bool step_open_ = false;  // calling thread only
  int64_t step_open_ns_ = 0;
  int64_t memory_from_ns_ = 0;  // calling thread only; 0 outside the window
};

// A span on the calling thread, recorded at its end when the rank is
// tracing; with `add_to`, its duration is also added to that counter
// whether tracing or not.
class Span {
 public:
  Span(const RankProbe& p, const char* cat, const char* name, const EventArgs& a = {},
       std::atomic<int64_t>* add_to = nullptr)
      : p_(p), cat_(cat), name_(name), args_(a), add_to_(add_to),
        t0_(add_to || p.tracing() ? now_ns() : 0) {}
  ~Span() { end(); }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

  EventArgs& args() { return args_; }
  // Ends it now (the destructor then does nothing); returns its duration.
  int64_t end() {
    if (!t0_) return 0;
    const int64_t t1 = now_ns();
    const int64_t d = t1 - t0_;
    if (add_to_) add_relaxed(*add_to_, d);
    p_.span(cat_, name_, t0_, t1, args_);
    t0_ = 0;
    return d;
  }

 private:
  const RankProbe& p_;
  const char* cat_;
  const char* name_;
  EventArgs args_;
  std::atomic<int64_t>* add_to_;
  int64_t t0_;
};

}  // namespace zerod::observe

namespace zerod::observe {

// An NVMe transfer of `bytes` that was in flight from t0 to t1: counted as
// the rank's; on the timeline a span of the calling thread when it waited
// for the whole of it (sync), else an overlapping (async) span.
void nvme_done(const RankProbe& p, bool write, uint64_t bytes, int64_t t0, int64_t t1, bool sync);

}  // namespace zerod::observe
