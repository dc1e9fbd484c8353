// A model call as it crosses the call ring (transport/ring.h): fixed
// records copied byte for byte, both ends built from the same source. The
// call itself is base/call_record.h's Args, and the step's figures are its
// StepFigures, the very types the engine's dispatcher takes and returns. The
// daemon copies a request out of the shared slot before it reads any field,
// and checks every field it uses.
#pragma once

#include "call_record.h"

#include <cstdint>
#include <type_traits>

namespace zerod::wire {

enum class RingKind : uint32_t {
  call = 1,          // a table call: RingRequest::args
  socket_frame = 2,  // the request is the next frame on the socket, and so is its reply
};

struct RingRequest {
  RingKind kind;
  int32_t model;
  uint64_t staging_offset;  // whole-parameter and state calls: where the data is in the staging memfd
  calls::Args args;
  // 1: a zd_forward_end the client deferred (`deferred`, same model) runs
  // first; if it fails, the reply carries its error and `args` does not run.
  // Only forward_end is deferred: no other rank waits for it (remote.cpp).
  int32_t has_deferred;
  int32_t reserved;
  calls::Args deferred;
};

// A view in the rank's arenas, as a _begin call returns it.
struct RingView {
  int32_t param;
  int32_t gradient;  // 0 or 1
  int32_t arena;
  int32_t reserved;
  uint64_t offset;
  uint64_t bytes;
};

struct RingReply {
  int32_t status;          // a zd_status
  uint32_t message_bytes;  // the error message, after the views
  uint32_t view_count;     // RingViews after this record
  uint32_t arenas_follow;  // 1: a socket frame with new arena fds was sent before this reply
  StepFigures step;
  double loss_scale;
  uint64_t current, peak, budget;
  uint64_t bytes_sent, network_bytes_sent, collectives;
  int64_t applied_steps;
};

static_assert(std::is_trivially_copyable_v<RingRequest> && std::is_trivially_copyable_v<RingReply> &&
                  std::is_trivially_copyable_v<RingView>,
              "ring records are copied as bytes");

// The size the ring's request slot has, and the reply slot's least size.
inline constexpr uint64_t kRingRequestBytes = 256;
static_assert(sizeof(RingRequest) <= kRingRequestBytes);

}  // namespace zerod::wire
