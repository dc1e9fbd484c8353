// What the three files of Session share, and nothing else includes:
//   session.cpp         the connection: its thread, the socket frames and the
//                       ring it waits on, the hello, models and staging, and
//                       the requests' dispatch (handle)
//   session_ring.cpp    the call ring's records: a table call and its reply
//   session_frames.cpp  model calls as protobuf socket frames (no ring)
#pragma once

#include "calls/dispatch.h"
#include "model.h"

namespace zerod::server::session_detail {

// A client that does not read its replies, or trickles a rejected body, does
// not hold its session thread longer than this.
constexpr int kSendTimeoutMs = 30000;
constexpr int kDiscardTimeoutMs = 10000;

inline ViewInfo view_of(Model& m, int rank, zd_param_id p, bool gradient) {
  return gradient ? m.grad_view(rank, p) : m.param_view(rank, p);
}

inline bool is_begin(calls::Op op) { return op == calls::Op::forward_begin || op == calls::Op::backward_begin; }

}  // namespace zerod::server::session_detail
