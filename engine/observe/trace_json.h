// Writes recorded events as Chrome trace event JSON (the "JSON Object
// Format" that Perfetto and chrome://tracing open): a process per rank, a
// thread track per recording thread, spans as complete events ("X"),
// overlapping spans as async begin/end pairs ("b"/"e"), counters ("C").
// Names are composed here from the events' numbers and the context.
#pragma once

#include "trace_event.h"
#include "tracer.h"

#include <ostream>
#include <string>
#include <vector>

namespace zerod::observe {

// The events one thread recorded.
struct TrackEvents {
  int track = 0;
  std::string name;  // the thread's role
  std::vector<TraceEvent> events;
  uint64_t dropped = 0;
};

struct TraceFile {
  const TraceSettings* settings = nullptr;
  const TraceContext* context = nullptr;
  int first_rank = 0, ranks = 1;
  std::vector<TrackEvents> tracks;
  std::vector<Report> reports;  // the whole run's
  uint64_t reports_dropped = 0;
  int64_t epoch_ns = 0;         // reports carry absolute times
};

void write_chrome_trace(std::ostream& out, const TraceFile& f);

// JSON string contents: quotes, backslashes and control characters escaped.
std::string json_escape(const std::string& s);

}  // namespace zerod::observe
