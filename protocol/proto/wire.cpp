#include "wire.h"

#include "error.h"

#include <string>

namespace zerod::wire {

void send(transport::Connection& c, FrameType type, uint32_t request_id,
          const google::protobuf::MessageLite& msg, std::span<const int> fds, int timeout_ms) {
  std::string body;
  if (!msg.SerializeToString(&body)) fail(ZD_ERR_INTERNAL, "cannot serialize a protocol message");
  transport::FrameHeader h;
  h.length = static_cast<uint32_t>(body.size());
  h.request_id = request_id;
  h.type = type;
  c.send(h, std::as_bytes(std::span<const char>(body.data(), body.size())), fds, timeout_ms);
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

StepFigures from_proto(const v1::StepFigures& s) {
  StepFigures f;
  f.boundary = s.boundary();
  f.applied = s.applied();
  f.skipped = s.skipped();
  f.step = s.step();
  f.micro_step = s.micro_step();
  f.lr = s.lr();
  f.loss_scale = s.loss_scale();
  f.grad_norm = s.grad_norm();
  return f;
}

void to_proto(const RingView& v, v1::View* out) {
  out->set_param(v.param);
  out->set_gradient(v.gradient != 0);
  out->set_arena(v.arena);
  out->set_offset(v.offset);
  out->set_bytes(v.bytes);
}

RingView from_proto(const v1::View& v) {
  return RingView{v.param(), v.gradient() ? 1 : 0, v.arena(), 0, v.offset(), v.bytes()};
}

}  // namespace zerod::wire
