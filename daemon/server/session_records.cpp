// A session's model calls (session.h): each is a call record
// (ring_call.h), from the call ring's request slot or from a wire::kCall
// socket frame, and is answered with the same bytes on either carrier: the
// reply record, the views of a _begin call and any text, in the ring's
// reply slot or in a wire::kCallReply frame. New arena fds go on the
// socket first, in the v1::Reply frames the record says follow
// (wire::send_arenas).
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

namespace {

// Text after the views: what fits of it (an error's message is cut; the
// caller of optimizer_info checks that its names fit).
uint32_t put_text(std::span<std::byte> room, size_t after_views, const std::string& text) {
  const auto n = static_cast<uint32_t>(std::min(text.size(), room.size() - after_views));
  std::memcpy(room.data() + after_views, text.data(), n);
  return n;
}

// A reply record that says only an error: its status and message, no views.
// Returns the bytes written.
size_t put_error(std::span<std::byte> slot, zd_status status, const std::string& message) {
  wire::RingReply rep{};
  rep.status = status;
  rep.message_bytes = put_text(slot.subspan(sizeof rep), 0, message);
  std::memcpy(slot.data(), &rep, sizeof rep);
  return sizeof rep + rep.message_bytes;
}

// optimizer_info's names, each ended by a NUL (ring_call.h).
std::string names_of(const calls::Outcome& o) {
  std::string s = o.optimizer + '\0';
  for (const std::string& slot : o.slots) s += slot + '\0';
  return s;
}

}  // namespace

uint32_t Session::record_views(ModelHost& m, int module, bool gradients, std::span<std::byte> room) {
  uint32_t n = 0;
  for_each_view(m.model(), rank_, module, gradients, [&](const wire::RingView& rv) {
    if ((n + 1) * sizeof rv > room.size())
      fail(ZD_ERR_INTERNAL, "module '" + m.model().registry().module(module).name +
                                "' has more views than a call's reply holds");
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
    fail(ZD_ERR_INVALID_ARGUMENT, "a call record may carry only a deferred zd_forward_end (has_deferred = " +
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

size_t Session::answer_record(const wire::RingRequest& req, std::span<std::byte> slot, v1::Reply* arenas,
                              std::vector<int>* fds) {
  const std::span<std::byte> room = slot.subspan(sizeof(wire::RingReply));
  wire::RingReply rep{};
  std::string text;
  try {
    if (req.kind != wire::RingKind::call)
      fail(ZD_ERR_INVALID_ARGUMENT, "unknown call record kind " + std::to_string(static_cast<uint32_t>(req.kind)));
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
      case calls::Op::save:
      case calls::Op::load:
        // A zero-byte request stands for a NULL buffer (the check names it).
        data = a.bytes ? staging_at(req.staging_offset, a.bytes, calls::name(a.op)) : nullptr;
        break;
      case calls::Op::set_stream:
      case calls::Op::param_view:
      case calls::Op::grad_view:
        // Answered by the client itself: a stream and a view's address are
        // the trainer process's.
        fail(ZD_ERR_INVALID_ARGUMENT, std::string(calls::name(a.op)) + " is answered by libzerod, not the daemon");
      default: break;
    }
    const calls::Outcome o = run_call(*host, a, data);
    rep.figures = static_cast<const calls::Figures&>(o);
    if (is_begin(a.op)) rep.view_count = record_views(*host, a.module, a.op == calls::Op::backward_begin, room);
    if (a.op == calls::Op::optimizer_info) {
      text = names_of(o);
      if (text.size() > room.size())
        fail(ZD_ERR_INTERNAL, "the optimizer's names do not fit a call's reply (" + std::to_string(text.size()) +
                                  " bytes)");
    }
    // New arenas (a finalize, a gather that grew the pool): their fds go on
    // the socket, before the reply that says how many frames they take.
    add_new_arenas(*host, arenas, fds, /*one_frame=*/!arena_batches_);
    rep.arenas_follow = wire::arena_frames(fds->size());
  } catch (const Error& e) {
    rep = wire::RingReply{};
    rep.status = e.code();
    text = e.what();
  } catch (const std::exception& e) {
    rep = wire::RingReply{};
    rep.status = ZD_ERR_INTERNAL;
    text = std::string("internal error: ") + e.what();
  }
  if (rep.status != ZD_OK) {
    arenas->Clear();
    fds->clear();
  }
  const size_t after_views = rep.view_count * sizeof(wire::RingView);
  rep.message_bytes = put_text(room, after_views, text);
  std::memcpy(slot.data(), &rep, sizeof rep);
  return sizeof rep + after_views + rep.message_bytes;
}

std::span<const std::byte> Session::answer_call(const transport::Frame& frame, v1::Reply* arenas,
                                                std::vector<int>* fds) {
  if (call_reply_.empty()) call_reply_.resize(wire::kCallReplyBytes);
  wire::RingRequest req{};
  try {
    require_rank("a model call");
    if (frame.body.size() != sizeof req)
      fail(ZD_ERR_INVALID_ARGUMENT, "a call frame carries one call record of " + std::to_string(sizeof req) +
                                        " bytes, not " + std::to_string(frame.body.size()));
    if (!frame.fds.empty()) fail(ZD_ERR_INVALID_ARGUMENT, "a call frame carries no fds");
  } catch (const Error& e) {
    return std::span(call_reply_).first(put_error(call_reply_, e.code(), e.what()));
  }
  std::memcpy(&req, frame.body.data(), sizeof req);
  return std::span(call_reply_).first(answer_record(req, call_reply_, arenas, fds));
}

void Session::answer_ring(const wire::RingRequest& req) {
  v1::Reply arenas;
  std::vector<int> fds;
  const std::span<std::byte> slot = ring_.reply_slot();
  answer_record(req, slot, &arenas, &fds);
  if (fds.empty()) return;
  try {
    wire::send_arenas(conn_, 0, arenas, fds, kSendTimeoutMs);
  } catch (const std::exception& e) {
    // The client cannot be told of its arenas: the reply says why instead.
    const auto* err = dynamic_cast<const Error*>(&e);
    put_error(slot, err ? err->code() : ZD_ERR_INTERNAL, e.what());
  }
}

}  // namespace zerod::server
