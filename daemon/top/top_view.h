// One frame of `zerod top`: the daemon's models and ranks, each rank's step
// rate, step time, tokens per second and loss, its tiers filling, and where
// its time went since the last frame (waiting on prefetch, on the
// overlapped update, on other ranks, on reductions, on NVMe). Built from the
// status reply and the metrics text it carries; the rates come from the
// difference to the previous frame.
#pragma once

#include "prom_text.h"
#include "zerod_v1.pb.h"

#include <map>
#include <string>
#include <utility>

namespace zerod::top {

// The figures of one frame, kept for the next one's rates.
struct Snapshot {
  double t = 0;  // seconds, monotonic
  // (model, rank) -> metric name (with extra labels) -> value
  std::map<std::pair<int, int>, std::map<std::string, double>> ranks;
};

Snapshot snapshot(const v1::StatusReply& status, double t);

// The frame's text, lines of at most `width` columns (no escape codes).
std::string render_frame(const v1::StatusReply& status, const Snapshot& now, const Snapshot* before, int width);

}  // namespace zerod::top
