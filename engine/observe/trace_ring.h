// The events one thread recorded: a ring of fixed capacity, allocated at the
// first event, so a long trace window costs bounded memory; when it is full
// the oldest events are overwritten and counted as dropped. One thread
// appends; the writer copies it out under the same (uncontended) lock.
#pragma once

#include "trace_event.h"

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace zerod::observe {

class TraceRing {
 public:
  TraceRing(size_t capacity, int track, std::string name)
      : capacity_(capacity == 0 ? 1 : capacity), track_(track), name_(std::move(name)) {}

  void push(const TraceEvent& e);
  // The events in the order they were recorded (oldest kept first).
  std::vector<TraceEvent> snapshot() const;
  uint64_t dropped() const;

  int track() const { return track_; }
  const std::string& name() const { return name_; }

 private:
  const size_t capacity_;
  const int track_;
  const std::string name_;
  mutable std::mutex mu_;
  std::vector<TraceEvent> events_;  // grows to capacity_, then wraps
  size_t next_ = 0;                 // where the next event goes once full
  uint64_t dropped_ = 0;
};

}  // namespace zerod::observe
