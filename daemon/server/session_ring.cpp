// A session's call ring (session.h): each request record is one table call
// (with a deferred zd_forward_end before it), answered in the reply slot by
// a record, the views of a _begin call and any error text; new arena fds
// go on the socket first.
#include "session.h"

#include "model_host.h"
#include "session_internal.h"
#include "wire.h"

#include "error.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <string>

namespace zerod::server {

using namespace session_detail;

uint32_t Session::ring_views(ModelHost& m, int module, bool gradients, std::span<std::byte> room) {
  uint32_t n = 0;
  for_each_view(m.model(), rank_, module, gradients, [&](const wire::RingView& rv) {
    if ((n + 1) * sizeof rv > room.size())
      fail(ZD_ERR_INTERNAL, "module '" + m.model().registry().module(module).name +
                                "' has more views than the call ring's reply slot holds");
    std::memcpy(room.data() + n * sizeof rv, &rv, sizeof rv);
    ++n;
  });
  return n;
}

// The zd_forward_end a client deferred to this request (remote.cpp): run
// before the request's own call. Its error is the reply's, said to be its,
// and the request's call does not run.
void Session::run_deferred(ModelHost& host, const wire::RingRequest& req) {
  if (req.has_deferred != 1 || req.deferred.op != calls::Op::forward_end)
    fail(ZD_ERR_INVALID_ARGUMENT, "a call ring request may carry only a deferred zd_forward_end (has_deferred = " +
                                      std::to_string(req.has_deferred) + ")");
  try {
    run_call(host, req.deferred, nullptr);
  } catch (const Error& e) {
    fail(e.code(), std::string(e.what()) + "\n(this is the error of zd_forward_end of module " +
                       std::to_string(req.deferred.module) + ", which the client sent with this rank's next call, " +
                       calls::name(req.args.op) + "; that call did not run. ZEROD_SYNC_END=1 makes zd_forward_end "
                       "wait for the daemon.)");
  }
}

void Session::answer_ring(const wire::RingRequest& req) {
  const std::span<std::byte> slot = ring_.reply_slot();
  const std::span<std::byte> room = slot.subspan(sizeof(wire::RingReply));
  wire::RingReply rep{};
  std::string message;
  try {
    if (req.kind != wire::RingKind::call)
      fail(ZD_ERR_INVALID_ARGUMENT, "unknown call ring request kind " + std::to_string(static_cast<uint32_t>(req.kind)));
    const calls::Args& a = req.args;
    if (!calls::valid(static_cast<uint32_t>(a.op)))
      fail(ZD_ERR_INVALID_ARGUMENT, "unknown model call " + std::to_string(static_cast<uint32_t>(a.op)));
    auto host = model_of(req.model);
    if (req.has_deferred != 0) run_deferred(*host, req);
    void* data = nullptr;
    switch (a.op) {
      case calls::Op::param_read:
      case calls::Op::param_write:
      case calls::Op::state_read:
      case calls::Op::state_write:
        data = a.bytes ? staging_at(req.staging_offset, a.bytes, calls::name(a.op)) : nullptr;
        break;
      case calls::Op::set_stream:
      case calls::Op::optimizer_info:
      case calls::Op::param_view:
      case calls::Op::grad_view:
      case calls::Op::save:
      case calls::Op::load:
        // Answered by the client itself, or through a socket frame: their
        // answers (or a directory's name) do not fit a fixed record or hold
        // pointers.
        fail(ZD_ERR_INVALID_ARGUMENT, std::string(calls::name(a.op)) + " does not travel through the call ring");
      default: break;
    }
    const calls::Outcome o = run_call(*host, a, data);
    rep.figures = static_cast<const calls::Figures&>(o);
    if (is_begin(a.op)) rep.view_count = ring_views(*host, a.module, a.op == calls::Op::backward_begin, room);
    // New arenas (a finalize, a gather that grew the pool): their fds go on
    // the socket, before the reply that says so.
    v1::Reply arenas;
    std::vector<int> fds;
    add_new_arenas(*host, &arenas, &fds);
    if (!fds.empty()) {
      arenas.mutable_ok();
      wire::send(conn_, wire::kReply, 0, arenas, fds, kSendTimeoutMs);
      rep.arenas_follow = 1;
    }
  } catch (const Error& e) {
    rep = wire::RingReply{};
    rep.status = e.code();
    message = e.what();
  } catch (const std::exception& e) {
    rep = wire::RingReply{};
    rep.status = ZD_ERR_INTERNAL;
    message = std::string("internal error: ") + e.what();
  }
  const size_t after_views = rep.view_count * sizeof(wire::RingView);
  rep.message_bytes = static_cast<uint32_t>(std::min(message.size(), room.size() - after_views));
  std::memcpy(room.data() + after_views, message.data(), rep.message_bytes);
  std::memcpy(slot.data(), &rep, sizeof rep);
}

}  // namespace zerod::server
