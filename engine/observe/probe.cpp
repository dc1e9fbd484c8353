#include "probe.h"

#include "memory/ledger.h"

namespace zerod::observe {

void RankProbe::attach(Tracer* tracer, int first_rank, int ranks) {
  tracer_ = tracer;
  counters_ = std::make_unique<RankCounters>(first_rank, ranks);
}

void RankProbe::record(EventKind kind, const char* cat, const char* name, int64_t t0, int64_t t1,
                       const EventArgs& a) const {
  TraceEvent e;
  e.ts_ns = tracer_->since_epoch(t0);
  e.dur_ns = t1 > t0 ? t1 - t0 : 0;
  e.name = name;
  e.cat = cat;
  e.step = step();
  e.rank = rank_;
  e.kind = kind;
  e.args = a;
  tracer_->record(e);
}

void RankProbe::span(const char* cat, const char* name, int64_t t0, int64_t t1, const EventArgs& a) const {
  if (tracing()) record(EventKind::Span, cat, name, t0, t1, a);
}

void RankProbe::async_span(const char* cat, const char* name, int64_t t0, int64_t t1, const EventArgs& a) const {
  if (tracing()) record(EventKind::Async, cat, name, t0, t1, a);
}

void RankProbe::instant(const char* cat, const char* name, const EventArgs& a) const {
  if (!tracing()) return;
  const int64_t t = now_ns();
  record(EventKind::Instant, cat, name, t, t, a);
}

void RankProbe::open_memory_interval(MemoryLedger& l, int64_t t) {
  if (!t || !tracing()) {
    memory_from_ns_ = 0;
    return;
  }
  if (memory_from_ns_) return;  // the interval runs on from the last sample
  l.take_peaks_since_last();
  memory_from_ns_ = t;
}

void RankProbe::memory(MemoryLedger& l) {
  if (!tracing() || !memory_from_ns_) return;
  const std::array<uint64_t, ZD_TIER_COUNT> peaks = l.take_peaks_since_last();
  EventArgs a;
  a.value = static_cast<int64_t>(peaks[ZD_TIER_DEVICE]);
  a.value2 = static_cast<int64_t>(peaks[ZD_TIER_HOST]);
  a.value3 = static_cast<int64_t>(peaks[ZD_TIER_NVME]);
  const int64_t t = now_ns();
  record(EventKind::Counter, "memory", "memory", memory_from_ns_, memory_from_ns_, a);
  memory_from_ns_ = t;
}

int64_t RankProbe::call_entered() {
  if (step_open_) return 0;
  step_open_ = true;
  step_open_ns_ = now_ns();
  if (tracer_) tracer_->step_started(rank_, step());
  return step_open_ns_;
}

void RankProbe::boundary(int64_t applied, int64_t t_end) {
  const int64_t step = this->step();
  RankCounters& c = *counters_;
  const int64_t last = c.last_boundary_ns.exchange(t_end, std::memory_order_relaxed);
  // The first step's time runs from its first call (finalize and the
  // trainer's setup are not a step).
  const int64_t from = last ? last : (step_open_ ? step_open_ns_ : t_end);
  c.step_seconds.observe(static_cast<double>(t_end - from) / 1e9);
  // A skipped update (fp16 overflow) applied nothing: the step goes on to
  // the boundary that applies it, one span "step N" (several would read as
  // one step recorded twice: `zerod plot --check` refuses that).
  if (applied < step) return;
  c.steps_applied.fetch_add(1, std::memory_order_relaxed);
  if (step_open_) span("step", "step", step_open_ns_, t_end);
  step_open_ = false;
  if (tracer_) tracer_->step_finished(rank_, step);
  step_.store(applied + 1, std::memory_order_relaxed);
}

void RankProbe::restart(int64_t applied) {
  step_open_ = false;
  memory_from_ns_ = 0;
  step_.store(applied + 1, std::memory_order_relaxed);
  counters_->last_boundary_ns.store(0, std::memory_order_relaxed);
}

void RankProbe::report(uint64_t tokens, uint64_t samples, bool has_loss, double loss, int64_t applied) {
  RankCounters& c = *counters_;
  const int64_t t = now_ns();
  const uint64_t tok = c.tokens.fetch_add(tokens, std::memory_order_relaxed) + tokens;
  const uint64_t smp = c.samples.fetch_add(samples, std::memory_order_relaxed) + samples;
  if (tokens) c.tokens_rate.add(t, tok);
  if (samples) c.samples_rate.add(t, smp);
  if (has_loss) {
    c.set_loss(loss);
    c.reports_with_loss.fetch_add(1, std::memory_order_relaxed);
  }
  c.reports.fetch_add(1, std::memory_order_relaxed);
  if (!tracer_) return;
  Report r;
  r.ts_ns = t;
  r.rank = rank_;
  r.step = applied;
  r.tokens = tokens;
  r.samples = samples;
  r.loss = loss;
  r.has_loss = has_loss;
  tracer_->report(r);
  if (tracing()) {
    EventArgs a;
    a.value = static_cast<int64_t>(tokens);
    instant("report", "report", a);
  }
}

}  // namespace zerod::observe

namespace zerod::observe {

void nvme_done(const RankProbe& p, bool write, uint64_t bytes, int64_t t0, int64_t t1, bool sync) {
  RankCounters& c = p.counters();
  add_relaxed(write ? c.nvme_write_bytes : c.nvme_read_bytes, bytes);
  if (sync) add_relaxed(c.nvme_wait_ns, t1 - t0);
  if (!p.tracing()) return;
  EventArgs a;
  a.bytes = bytes;
  a.flags = write ? kFlagWrite : 0;
  const char* name = write ? "nvme write" : "nvme read";
  if (sync)
    p.span("nvme", name, t0, t1, a);
  else
    p.async_span("nvme", name, t0, t1, a);
}

}  // namespace zerod::observe
