// The model calls that travel as protobuf socket frames
// (protocol/proto/zerod_v1.proto; remote_client.h): registration, destroy,
// save and load, the optimizer's description, and every table call to a
// daemon without the ring.
#include "remote_client.h"

#include "runtime/dtype.h"
#include "error.h"
#include "sizes.h"

#include <cstring>
#include <filesystem>
#include <string>
#include <utility>

namespace zerod::abi::remote {

RemoteModel::~RemoteModel() {
  try {
    client_.flush_deferred();  // on its own: its error must not keep the destroy from going out
  } catch (...) {
    // A broken job's end: the destroy below still detaches the model.
  }
  try {
    v1::Request req;
    req.mutable_destroy_model()->set_model(id_);
    client_.rpc(req);
  } catch (...) {
    // The daemon may be gone already; nothing is left to free then.
  }
}

zd_param_id RemoteModel::register_param(const std::string& name, const std::string& module,
                                        zd_dtype dtype, std::vector<int64_t> shape, const void* init,
                                        zd_dtype init_dtype) {
  v1::Request req;
  v1::RegisterParam* r = req.mutable_register_param();
  r->set_model(id_);
  r->set_name(name);
  r->set_module(module);
  r->set_dtype(dtype);
  for (int64_t e : shape) r->add_shape(e);
  r->set_init_dtype(init_dtype);
  if (init) {
    // The bytes to copy, from a checked shape and dtype (what the engine
    // would refuse is refused here, in its words, before anything is read).
    const std::string what = "parameter '" + name + "'";
    const zd_dtype idt = init_dtype ? init_dtype : dtype;
    if (!dtype_valid(idt))
      fail(ZD_ERR_INVALID_ARGUMENT, what + " has an invalid init_dtype (" + std::to_string(idt) + ")");
    const uint64_t bytes = checked_bytes(wire::checked_numel(shape, what), idt, what);
    std::memcpy(client_.staging(bytes), init, bytes);
    r->set_has_init(true);
    r->set_staging_offset(0);
  }
  const v1::Reply reply = client_.rpc(req);
  const zd_param_id id = registry_.add(name, module, dtype, std::move(shape));
  if (id != reply.register_param().param())
    fail(ZD_ERR_INTERNAL, "the daemon numbered parameter '" + name + "' " +
                              std::to_string(reply.register_param().param()) + ", this client " +
                              std::to_string(id));
  return id;
}

calls::Outcome RemoteModel::path_call(const calls::Args& a, void* data) {
  calls::check(registry_, client_.info().world_size, a, data);
  v1::Request req;
  v1::ModelCall* c = req.mutable_call();
  c->set_model(id_);
  c->set_op(a.op == calls::Op::save ? v1::ModelCall::SAVE : v1::ModelCall::LOAD);
  const std::string dir(static_cast<const char*>(data), a.bytes);
  c->set_path(std::filesystem::absolute(dir).lexically_normal().string());
  const v1::Reply r = client_.rpc(req);
  calls::Outcome o;
  o.loss_scale = loss_scale_ = r.call().loss_scale();
  return o;
}

calls::Outcome RemoteModel::optimizer_info() {
  v1::Request req;
  v1::ModelCall* c = req.mutable_call();
  c->set_model(id_);
  c->set_op(v1::ModelCall::OPTIMIZER_INFO);
  const v1::Reply r = client_.rpc(req);
  calls::Outcome o;
  o.optimizer = r.call().optimizer().name();
  o.slots.assign(r.call().optimizer().slots().begin(), r.call().optimizer().slots().end());
  o.applied_steps = r.call().optimizer().step();
  o.loss_scale = loss_scale_ = r.call().loss_scale();
  return o;
}

calls::Outcome RemoteModel::socket_call(const calls::Args& a) {
  v1::Request req;
  calls::Outcome o;
  o.loss_scale = loss_scale_;
  const auto data = [&](v1::ParamData* d) {
    d->set_model(id_);
    d->set_param(a.param);
    d->set_slot(a.slot);
    d->set_dtype(a.dtype);
    d->set_bytes(a.bytes);
    d->set_staging_offset(0);
  };
  switch (a.op) {
    case calls::Op::param_read: data(req.mutable_param_read()); client_.rpc(req); return o;
    case calls::Op::param_write: data(req.mutable_param_write()); client_.rpc(req); return o;
    case calls::Op::state_read: data(req.mutable_state_read()); client_.rpc(req); return o;
    case calls::Op::state_write: data(req.mutable_state_write()); client_.rpc(req); return o;
    case calls::Op::memory: {
      v1::MemoryQuery* q = req.mutable_memory();
      q->set_model(id_);
      q->set_rank(a.rank);
      q->set_tier(a.tier);
      q->set_kind(a.kind);
      const v1::MemoryReply r = client_.rpc(req).memory();
      o.current = r.current();
      o.peak = r.peak();
      o.budget = r.budget();
      return o;
    }
    default: break;
  }
  v1::ModelCall* c = req.mutable_call();
  c->set_model(id_);
  switch (a.op) {
    case calls::Op::finalize: c->set_op(v1::ModelCall::FINALIZE); break;
    case calls::Op::forward_begin: c->set_op(v1::ModelCall::FORWARD_BEGIN); break;
    case calls::Op::forward_end: c->set_op(v1::ModelCall::FORWARD_END); break;
    case calls::Op::backward_begin: c->set_op(v1::ModelCall::BACKWARD_BEGIN); break;
    case calls::Op::backward_end: c->set_op(v1::ModelCall::BACKWARD_END); break;
    case calls::Op::step: c->set_op(v1::ModelCall::STEP); break;
    case calls::Op::set_step: c->set_op(v1::ModelCall::SET_STEP); break;
    case calls::Op::comm_figures: c->set_op(v1::ModelCall::COMM_FIGURES); break;
    case calls::Op::report: {
      c->set_op(v1::ModelCall::REPORT);
      v1::Progress* p = c->mutable_progress();
      p->set_tokens(a.tokens);
      p->set_samples(a.samples);
      p->set_has_loss(a.has_loss != 0);
      p->set_loss(a.loss);
      break;
    }
    default: fail(ZD_ERR_INTERNAL, std::string(calls::name(a.op)) + " has no socket form");
  }
  c->set_module(a.module);
  c->set_step(a.step);
  c->set_rank(a.rank);
  std::vector<transport::UniqueFd> fds;
  const v1::Reply r = client_.rpc(req, &fds);
  take_arenas(r.new_arenas(), fds);
  const v1::CallReply& cr = r.call();
  for (const v1::View& v : cr.views()) socket_views_.push_back(wire::from_proto(v));
  o.step = wire::from_proto(cr.step());
  o.bytes_sent = cr.comm().bytes_sent();
  o.network_bytes_sent = cr.comm().network_bytes_sent();
  o.collectives = cr.comm().collectives();
  o.loss_scale = cr.loss_scale();
  return o;
}

}  // namespace zerod::abi::remote
