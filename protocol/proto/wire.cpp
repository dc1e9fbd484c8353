#include "wire.h"

#include "error.h"

#include <algorithm>
#include <string>

namespace zerod::wire {

void send(transport::Connection& c, FrameType type, uint32_t request_id,
          const google::protobuf::MessageLite& msg, std::span<const int> fds, int timeout_ms) {
  std::string body;
  if (!msg.SerializeToString(&body)) fail(ZD_ERR_INTERNAL, "cannot serialize a protocol message");
  send_bytes(c, type, request_id, std::as_bytes(std::span<const char>(body.data(), body.size())), fds, timeout_ms);
}

void parse(const transport::Frame& f, google::protobuf::MessageLite* msg, const char* what) {
  if (!msg->ParseFromArray(f.body.data(), static_cast<int>(f.body.size())))
    fail(ZD_ERR_INVALID_ARGUMENT, std::string("malformed ") + what + ": the body of frame " +
                                      std::to_string(f.header.request_id) + " (" +
                                      std::to_string(f.body.size()) + " bytes) is not a valid " +
                                      what);
}

void set_error(v1::Reply* reply, zd_status status, const std::string& message) {
  reply->mutable_error()->set_status(status);
  reply->mutable_error()->set_message(message);
}

void send_bytes(transport::Connection& c, FrameType type, uint32_t request_id, std::span<const std::byte> body,
                std::span<const int> fds, int timeout_ms) {
  transport::FrameHeader h;
  h.length = static_cast<uint32_t>(body.size());
  h.request_id = request_id;
  h.type = type;
  c.send(h, body, fds, timeout_ms);
}

uint32_t arena_frames(size_t arenas) {
  return static_cast<uint32_t>((arenas + transport::kMaxFdsPerFrame - 1) / transport::kMaxFdsPerFrame);
}

void send_arenas(transport::Connection& c, uint32_t request_id, const v1::Reply& all, std::span<const int> fds,
                 int timeout_ms) {
  if (static_cast<size_t>(all.new_arenas_size()) != fds.size())
    fail(ZD_ERR_INTERNAL, "announcing " + std::to_string(all.new_arenas_size()) + " new arenas with " +
                              std::to_string(fds.size()) + " fds");
  for (size_t first = 0; first < fds.size(); first += transport::kMaxFdsPerFrame) {
    const size_t n = std::min(transport::kMaxFdsPerFrame, fds.size() - first);
    v1::Reply batch;
    batch.mutable_ok();
    for (size_t i = first; i < first + n; ++i) *batch.add_new_arenas() = all.new_arenas(static_cast<int>(i));
    send(c, kReply, request_id, batch, fds.subspan(first, n), timeout_ms);
  }
}

void to_proto(const StepFigures& f, v1::StepFigures* s) {
  s->set_boundary(f.boundary);
  s->set_applied(f.applied);
  s->set_skipped(f.skipped);
  s->set_step(f.step);
  s->set_micro_step(f.micro_step);
  s->set_lr(f.lr);
  s->set_loss_scale(f.loss_scale);
  s->set_grad_norm(f.grad_norm);
}

void to_proto(const RingView& v, v1::View* out) {
  out->set_param(v.param);
  out->set_gradient(v.gradient != 0);
  out->set_arena(v.arena);
  out->set_offset(v.offset);
  out->set_bytes(v.bytes);
}

}  // namespace zerod::wire
