// Model: the calls of a micro-batch — forward/backward begin and end and the
// views — with their call-order rules; the work is the parts' (residency,
// gradients).
#include "model/model_rank.h"

#include "runtime/dtype.h"
#include "error.h"

namespace zerod {

namespace {

// A module's forward or backward as the trainer saw it: from its begin
// call's entry to the end of its end call. Modules' spans may overlap
// without nesting (a module's backward can end after the next one began),
// so they are async spans.
void module_done(const observe::RankProbe& probe, zd_module_id module, int64_t since, bool backward) {
  if (!since || !probe.tracing()) return;
  observe::EventArgs a;
  a.module = module;
  a.flags = backward ? observe::kFlagBackward : 0;
  probe.async_span("module", backward ? "backward" : "forward", since, observe::now_ns(), a);
}

}  // namespace

void Model::forward_begin(int rank, zd_module_id module) {
  Call call(*this, rank, "forward_begin", module, true);
  require_finalized("zd_forward_begin");
  RankState& rs = rank_state(rank);
  registry_.module(module);
  RankState::ModuleCalls& a = rs.modules[static_cast<size_t>(module)];
  if (a.forward)
    fail(ZD_ERR_INVALID_STATE, ctx_.module_label(module) +
                                   " is already in forward: zd_forward_begin called twice "
                                   "without zd_forward_end");
  if (a.backward)
    fail(ZD_ERR_INVALID_STATE, ctx_.module_label(module) +
                                   " is in backward: call zd_backward_end before running its "
                                   "forward again");
  // The last step's update of this module (OverlappedUpdate) first.
  rs.update.note_forward(module);
  wait_update(rs, module);
  // The trainer computes with the parameters zerod just made resident (or
  // a step wrote) only after that work is done: with partitioned
  // parameters, the module's gather (make_resident; the gathers ahead of
  // later modules, and the update's uploads they wait for, need not hold
  // it up).
  if (ctx_.params_partitioned())
    rs.residency.make_resident(module, false);
  else
    rs.res.device->trainer_waits();
  a.forward = true;
  a.since_ns = call.entered_ns();
  ++rs.active_modules;
}

void Model::forward_end(int rank, zd_module_id module) {
  Call call(*this, rank, "forward_end", module, true);
  require_finalized("zd_forward_end");
  RankState& rs = rank_state(rank);
  registry_.module(module);
  RankState::ModuleCalls& a = rs.modules[static_cast<size_t>(module)];
  if (!a.forward)
    fail(ZD_ERR_INVALID_STATE, ctx_.module_label(module) +
                                   " is not in forward: zd_forward_end without zd_forward_begin");
  a.forward = false;
  --rs.active_modules;
  if (ctx_.params_partitioned()) {
    // Its gathered copies go back to the pool: later work on them must not
    // start before the trainer is done reading them.
    rs.res.device->wait_for_trainer();
    rs.residency.release(module);
  }
  module_done(rs.res.probe, module, a.since_ns, false);
}

void Model::backward_begin(int rank, zd_module_id module) {
  Call call(*this, rank, "backward_begin", module, true);
  require_finalized("zd_backward_begin");
  RankState& rs = rank_state(rank);
  const ModuleRecord& mod = registry_.module(module);
  RankState::ModuleCalls& a = rs.modules[static_cast<size_t>(module)];
  if (a.backward)
    fail(ZD_ERR_INVALID_STATE, ctx_.module_label(module) +
                                   " is already in backward: zd_backward_begin called twice "
                                   "without zd_backward_end");
  if (a.forward)
    fail(ZD_ERR_INVALID_STATE, ctx_.module_label(module) +
                                   " is still in forward: call zd_forward_end before "
                                   "zd_backward_begin");
  // The window's first backward: its gradients are reduced as they come, or
  // (a compressing optimizer's local step) kept whole on the rank.
  if (!rs.grads.local() && next_plan(rs).grads == ZD_GRADS_LOCAL) rs.grads.set_local(true);
  // Its gradients go where the last update read them (and zeroed them, or
  // left them to be written over: GradReducer::update_zeroes).
  wait_update(rs, module);
  rs.grads.set_final_micro_batch((rs.micro_step + 1) % config_.gradient_accumulation_steps == 0);
  rs.grads.open(mod);
  // The gradient views open() zeroed, and accumulators the last update
  // zeroed, are zerod's work too: make_resident's wait covers them.
  try {
    if (ctx_.params_partitioned())
      rs.residency.make_resident(module, true);
    else
      rs.res.device->trainer_waits();
  } catch (...) {
    rs.grads.cancel(mod);
    throw;
  }
  rs.grads.activate(mod);
  a.backward = true;
  a.since_ns = call.entered_ns();
  ++rs.active_modules;
}

void Model::backward_end(int rank, zd_module_id module) {
  Call call(*this, rank, "backward_end", module, true);
  require_finalized("zd_backward_end");
  RankState& rs = rank_state(rank);
  const ModuleRecord& mod = registry_.module(module);
  RankState::ModuleCalls& a = rs.modules[static_cast<size_t>(module)];
  if (!a.backward)
    fail(ZD_ERR_INVALID_STATE, ctx_.module_label(module) +
                                   " is not in backward: zd_backward_end without "
                                   "zd_backward_begin");
  a.backward = false;
  --rs.active_modules;
  // close() makes zerod's later work wait for what the trainer wrote. A
  // bucket it fills and cannot send (ZD_ERR_BUDGET) keeps its gradients for
  // the next flush; the module's backward is over all the same, and its
  // gathered parameters go back.
  try {
    rs.grads.close(mod);
  } catch (...) {
    if (ctx_.params_partitioned()) rs.residency.release(module);
    throw;
  }
  if (ctx_.params_partitioned()) rs.residency.release(module);
  module_done(rs.res.probe, module, a.since_ns, true);
}

ViewInfo Model::param_view(int rank, zd_param_id param) {
  require_finalized("zd_param_view");
  require_healthy();
  RankState& rs = rank_state(rank);
  const ParamRecord& p = registry_.param(param);
  const RankState::ModuleCalls& a = rs.modules[static_cast<size_t>(p.module)];
  if (!a.forward && !a.backward)
    fail(ZD_ERR_INVALID_STATE, "parameter '" + p.name + "' is not resident: its " +
                                   ctx_.module_label(p.module) +
                                   " is not between a _begin and its _end call");
  const size_t esz = dtype_size(p.dtype);
  ViewInfo v;
  if (ctx_.params_partitioned()) {
    const Block& gb = rs.residency.gathered(param);
    v.data = gb.ptr;
    v.arena = gb.arena;
    v.offset = gb.offset;
  } else {
    const auto& seg = rs.buffers.of(p).working.segment_at(p.full_offset);
    v.data = seg.ptr + (p.full_offset - seg.begin) * esz;
    v.arena = seg.block.arena;
    v.offset = seg.block.offset + (p.full_offset - seg.begin) * esz;
  }
  v.bytes = static_cast<uint64_t>(p.numel) * esz;
  v.dtype = p.dtype;
  v.shape = &p.shape;
  v.read_only = true;
  v.device_type = rs.res.device->dlpack_type();
  v.device_id = rs.res.device->ordinal();
  return v;
}

ViewInfo Model::grad_view(int rank, zd_param_id param) {
  require_finalized("zd_grad_view");
  require_healthy();
  RankState& rs = rank_state(rank);
  const ParamRecord& p = registry_.param(param);
  if (!rs.grads.view_active(param))
    fail(ZD_ERR_INVALID_STATE, "parameter '" + p.name + "' has no gradient buffer now: its " +
                                   ctx_.module_label(p.module) +
                                   " is not between zd_backward_begin and zd_backward_end");
  ViewInfo v = rs.grads.view(param);
  v.device_type = rs.res.device->dlpack_type();
  v.device_id = rs.res.device->ordinal();
  return v;
}

void Model::set_stream(int rank, void* stream) {
  Call call(*this, rank, "set_stream");
  RankState& rs = rank_state(rank);
  // Changing streams inside a step would leave work ordered on the old one.
  // The cpu device has none (it takes NULL only), so there it is harmless.
  if (rs.active_modules > 0 && rs.res.device->has_streams())
    fail(ZD_ERR_INVALID_STATE, "zd_model_set_stream while modules are begun; set the stream between steps");
  rs.res.device->set_trainer_stream(stream);
}

}  // namespace zerod
