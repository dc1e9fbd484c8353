// The protobuf model calls (zerod_v1.proto's ModelCall, ParamData,
// MemoryQuery) that libzerod sent on the socket before call records
// travelled there too: translated to the call record's Args, run like any
// call, and answered in the protobuf reply that client reads. Today's
// libzerod never sends them; nothing new is added here (a new call exists
// only as a record).
#include "session.h"

#include "model_host.h"
#include "session_internal.h"
#include "wire.h"

#include "error.h"

#include <string>

namespace zerod::server {

using namespace session_detail;

void Session::v1_add_views(ModelHost& m, int module, bool gradients, v1::CallReply* out) {
  for_each_view(m.model(), rank_, module, gradients,
                [&](const wire::RingView& rv) { wire::to_proto(rv, out->add_views()); });
}

namespace {

// The protobuf ModelCall ops and the table's.
calls::Op op_of(v1::ModelCall::Op op) {
  switch (op) {
    case v1::ModelCall::FINALIZE: return calls::Op::finalize;
    case v1::ModelCall::FORWARD_BEGIN: return calls::Op::forward_begin;
    case v1::ModelCall::FORWARD_END: return calls::Op::forward_end;
    case v1::ModelCall::BACKWARD_BEGIN: return calls::Op::backward_begin;
    case v1::ModelCall::BACKWARD_END: return calls::Op::backward_end;
    case v1::ModelCall::STEP: return calls::Op::step;
    case v1::ModelCall::LOSS_SCALE: return calls::Op::loss_scale;
    case v1::ModelCall::SET_STEP: return calls::Op::set_step;
    case v1::ModelCall::OPTIMIZER_INFO: return calls::Op::optimizer_info;
    case v1::ModelCall::COMM_FIGURES: return calls::Op::comm_figures;
    case v1::ModelCall::SAVE: return calls::Op::save;
    case v1::ModelCall::LOAD: return calls::Op::load;
    case v1::ModelCall::REPORT: return calls::Op::report;
    default: break;
  }
  fail(ZD_ERR_INVALID_ARGUMENT, "unknown model call " + std::to_string(op));
}

}  // namespace

void Session::v1_call(const v1::ModelCall& c, v1::Reply* reply) {
  auto host = model_of(c.model());
  calls::Args a;
  a.op = op_of(c.op());
  a.module = c.module();
  a.step = c.step();
  a.rank = c.rank();
  a.tokens = c.progress().tokens();
  a.samples = c.progress().samples();
  a.has_loss = c.progress().has_loss() ? 1 : 0;
  a.value = c.progress().loss();
  // save, load: the directory (made absolute by libzerod).
  std::string path = c.path();
  a.bytes = path.size();
  const calls::Outcome o = run_call(*host, a, path.empty() ? nullptr : path.data());
  v1::CallReply* out = reply->mutable_call();
  if (is_begin(a.op)) v1_add_views(*host, a.module, a.op == calls::Op::backward_begin, out);
  if (a.op == calls::Op::step) wire::to_proto(o.step, out->mutable_step());
  if (a.op == calls::Op::optimizer_info) {
    v1::OptimizerInfo* info = out->mutable_optimizer();
    info->set_name(o.optimizer);
    for (const auto& s : o.slots) info->add_slots(s);
    info->set_step(o.applied_steps);
  }
  if (a.op == calls::Op::comm_figures) {
    v1::CommFigures* cf = out->mutable_comm();
    cf->set_bytes_sent(o.bytes_sent);
    cf->set_network_bytes_sent(o.network_bytes_sent);
    cf->set_collectives(o.collectives);
  }
  out->set_loss_scale(o.loss_scale);
}

void Session::v1_data_call(calls::Op op, const v1::ParamData& p, v1::Reply* reply) {
  auto host = model_of(p.model());
  calls::Args a;
  a.op = op;
  a.param = p.param();
  a.slot = p.slot();
  a.dtype = p.dtype();
  a.bytes = p.bytes();
  // A zero-byte request stands for a NULL buffer (the check names it).
  void* data = p.bytes() ? staging_at(p.staging_offset(), p.bytes(), calls::name(op)) : nullptr;
  run_call(*host, a, data);
  reply->mutable_ok();
}

}  // namespace zerod::server
