// What the three files of Session share, and nothing else includes:
//   session.cpp           the connection: its thread, the socket frames and
//                         the ring it waits on, the hello, models and
//                         staging, and the requests' dispatch (handle)
//   session_records.cpp   model calls: a call record, from the ring or a
//                         socket frame, and its reply record
//   session_v1_calls.cpp  the protobuf model calls of an older libzerod
#pragma once

#include "calls/dispatch.h"
#include "model/model.h"
#include "ring_call.h"

namespace zerod::server::session_detail {

// A client that does not read its replies, or trickles a rejected body, does
// not hold its session thread longer than this.
constexpr int kSendTimeoutMs = 30000;
constexpr int kDiscardTimeoutMs = 10000;
// When a rank's connection ends with its trainer's last GPU record not run
// (transport/process_exit.h): after this long the log says the daemon is
// still waiting for the process (a killed one exits within milliseconds of
// its socket closing), and a trainer whose pid is not visible here is taken
// for dead.
constexpr int kTrainerExitMs = 10000;

// The views of a _begin call's module as view records (the protobuf calls
// of an older client convert each with wire::to_proto):
// each parameter's, then, after a backward_begin, its gradient's. emit is
// called once per record, so they are written into the reply without
// allocating.
template <class Emit>
void for_each_view(Model& m, int rank, int module, bool gradients, Emit&& emit) {
  for (zd_param_id pid : m.registry().module(module).params) {
    for (bool g : {false, true}) {
      if (g && !gradients) continue;
      const ViewInfo v = g ? m.grad_view(rank, pid) : m.param_view(rank, pid);
      emit(wire::RingView{pid, g ? 1 : 0, v.arena, 0, v.offset, v.bytes});
    }
  }
}

inline bool is_begin(calls::Op op) { return op == calls::Op::forward_begin || op == calls::Op::backward_begin; }

}  // namespace zerod::server::session_detail
