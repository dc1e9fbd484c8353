// One timeline record, fixed-size and free of owned memory so that a thread
// appends it to its ring without allocating: names are static strings and
// the variable parts (module, bytes, tier, the rank waited for) are numbers
// the writer turns into text when the file is written.
#pragma once

#include <cstdint>

namespace zerod::observe {

enum class EventKind : uint8_t {
  Span,     // [ts, ts + dur) on the recording thread's track
  Async,    // [ts, ts + dur) that may overlap others: a module's forward as
            // the trainer saw it, an NVMe transfer in flight
  Instant,  // a moment: a prefetch issued, a release
  Counter,  // a sampled value: bytes per tier
};

// What an event's numbers mean; -1 / 0 = not set.
struct EventArgs {
  int32_t module = -1;    // a module id of the job's registry
  int32_t peer = -1;      // the rank a collective waited for (the last to arrive)
  int32_t tier = -1;      // a zd_tier
  uint32_t flags = 0;     // kFlag* below
  uint64_t bytes = 0;
  int64_t value = 0;      // per name: a bucket, a collective's tag, elements, a counter's device bytes
  int64_t value2 = 0;     // a counter's host bytes, a wait in ns
  int64_t value3 = 0;     // a counter's nvme bytes
};

constexpr uint32_t kFlagPrefetched = 1u << 0;  // a gather that was issued ahead (prefetch)
constexpr uint32_t kFlagWrite = 1u << 1;       // an NVMe transfer or copy that writes
constexpr uint32_t kFlagBackward = 1u << 2;    // a module's backward (else forward)

struct TraceEvent {
  int64_t ts_ns = 0;   // since the tracer's epoch
  int64_t dur_ns = 0;  // Span and Async
  const char* name = "";  // static
  const char* cat = "";   // static
  int64_t step = 0;       // the rank's step in progress when it was recorded
  int32_t rank = 0;
  EventKind kind = EventKind::Span;
  EventArgs args;
};

}  // namespace zerod::observe
