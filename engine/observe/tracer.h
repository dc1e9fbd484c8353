// The timeline of one model: which steps are recorded, a ring per thread
// that records, and the Chrome trace file written from them.
//
// A rank records from the first call of a step in [from, to] to the end of
// the zd_step that closes it; nothing between steps (steps count
// applied optimizer updates from 1, as zd_step_result.step does after the
// boundary). When every rank this process serves has finished step `to`,
// the file is written (by the thread of the last rank to finish, at the end
// of its zd_step); it is written again when the model goes, with every loss
// the trainer reported, so a run that stops early still leaves its trace.
//
// Thread-safety: record() from any thread; each thread appends to a ring of
// its own (found through a thread-local cache), so recording threads never
// contend with each other. step_started/step_finished from the rank's
// calling thread. recording() is a relaxed atomic load: the cost of tracing
// when a rank is outside its window, or when a model has no tracer, is that
// load (or a null check).
#pragma once

#include "trace_event.h"
#include "trace_ring.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace zerod::observe {

struct TraceSettings {
  std::string path;            // where the file goes
  int64_t from = 2, to = 6;    // steps, inclusive
  size_t events_per_thread = size_t{1} << 16;
};

// What the writer needs to turn numbers into names, and the file's header.
struct TraceContext {
  std::string job;                              // the job script's name
  std::vector<std::string> modules;             // by module id
  // What a collective was for, by the purpose number in the top byte of
  // its tag (the engine's CommOp): "gather", "bucket reduce", ...
  std::vector<std::string> tag_purposes;
  int world_size = 1;
  int zero_stage = 0;
};

// A loss / tokens report from the trainer, kept for the whole run (bounded).
struct Report {
  int64_t ts_ns = 0;
  int32_t rank = 0;
  int64_t step = 0;  // optimizer steps applied when it was reported
  uint64_t tokens = 0, samples = 0;
  double loss = 0;
  bool has_loss = false;
};

// The role of the calling thread, named in its track ("calls", "collectives",
// "workers"); static strings. A thread that never sets one records as
// "calls" (the trainer's calling thread, or the daemon's session thread).
void set_thread_role(const char* role);
const char* thread_role();

// Why a trace could not be written to `path`, or "" if it can: its folder
// is made as the writer makes it, and a file is created in that folder and
// removed. Asked where the trace is asked for (`zerod run --trace`, a
// model's creation), so that a path the process cannot write is an error
// before training, not a warning after it that the trace is lost.
std::string trace_path_problem(const std::string& path);

class Tracer {
 public:
  // Serves ranks [first_rank, first_rank + ranks).
  Tracer(TraceSettings settings, int first_rank, int ranks);
  ~Tracer();  // writes the file if a step of the window was recorded
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  const TraceSettings& settings() const { return settings_; }
  // The names behind the numbers (at finalize, when the registry is known).
  void set_context(TraceContext ctx);

  bool recording(int rank) const {
    const int i = rank - first_;
    return i >= 0 && i < ranks_ && recording_[static_cast<size_t>(i)].load(std::memory_order_relaxed);
  }
  // Nanoseconds since this tracer began (what events carry).
  int64_t since_epoch(int64_t now) const { return now - epoch_ns_; }

  // Appends to the calling thread's ring (no check of the window: callers
  // ask recording() first).
  void record(const TraceEvent& e);
  // Trainer reports: kept whatever the window (up to a bound).
  void report(const Report& r);

  // The rank begins work on `step` (its first call after the last boundary):
  // recording starts if the step is in the window.
  void step_started(int rank, int64_t step);
  // The rank's step `step` is applied: recording stops after `to`, and the
  // file is written once every rank is past it (if a step of the window
  // was recorded: a run resumed past it leaves an earlier run's file).
  void step_finished(int rank, int64_t step);

  // Writes the file now (atomically: a temporary file renamed over it).
  // Returns false, with a logged reason, if it cannot be written.
  bool write();
  uint64_t events_recorded() const;

 private:
  TraceRing& ring_of_this_thread();
  bool traced() const;  // an event of the window was recorded
  // Worth writing at the end: an event of the window, or reports of a run
  // that began before the window (stopped short of it: its losses are what
  // `zerod plot` draws). Not a run resumed past the window, whose file would
  // replace the one an earlier run wrote.
  bool worth_writing() const;

  const TraceSettings settings_;
  const int first_;
  const int ranks_;
  const int64_t epoch_ns_;
  const uint64_t id_;  // tells this tracer's rings from another's in the thread-local cache
  std::unique_ptr<std::atomic<bool>[]> recording_;

  mutable std::mutex mu_;  // the rings list, the context, reports, window state
  std::map<std::thread::id, std::shared_ptr<TraceRing>> rings_;
  TraceContext ctx_;
  std::vector<Report> reports_;
  uint64_t reports_dropped_ = 0;
  std::vector<bool> finished_;  // per rank: past the window
  bool window_written_ = false;
  std::atomic<bool> stepped_{false};  // a rank began a step: a model that never trains warns of nothing
  std::atomic<bool> began_before_window_{false};  // a rank began a step before trace.steps' first
};

}  // namespace zerod::observe
