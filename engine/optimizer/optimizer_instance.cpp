// OptimizerInstance: an optimizer plugin configured, called through the
// current table (zd_optimizer_v4) whatever version the plugin is.
#include "runtime/plugin_host.h"

#include "error.h"
#include "optimizer/optimizer_adapters.h"

#include <string>

namespace zerod {

using plugin_detail::check_value_count;
using plugin_detail::refused;

namespace {

// The tensor scalars and statistics a plugin may ask for.
constexpr uint32_t kMaxTensorValues = 16;

std::string op_name(zd_plan_op op) {
  switch (op) {
    case ZD_OP_PASS: return "PASS";
    case ZD_OP_PASS_GRAD: return "PASS_GRAD";
    case ZD_OP_PREPARE: return "PREPARE";
    case ZD_OP_EXCHANGE: return "EXCHANGE";
    default: return "op " + std::to_string(op);
  }
}

}  // namespace

std::unique_ptr<OptimizerInstance> OptimizerInstance::create(const std::shared_ptr<const Plugin>& plugin,
                                                             const std::vector<double>& values) {
  check_value_count(*plugin, values);
  const auto& d = plugin->descriptor<zd_optimizer_v1>();
  char err[512] = {0};
  void* inst = nullptr;
  const zd_status st = d.create(host_services(), values.data(), values.size(), &inst, err, sizeof err);
  err[sizeof err - 1] = 0;
  if (st != ZD_OK || !inst) refused(*plugin, st, err);
  auto o = std::unique_ptr<OptimizerInstance>(new OptimizerInstance(plugin, inst, d.destroy, values));
  o->bind();
  return o;
}

OptimizerInstance::~OptimizerInstance() = default;

void OptimizerInstance::bind() {
  const uint32_t version = plugin().header().abi_version;
  const std::string who = "optimizer plugin '" + plugin().name() + "' (" + plugin().path() + ")";
  if (version >= 4) {
    table_ = plugin().descriptor<zd_optimizer_v4>();
    callee_ = raw();
  } else if (version == 3) {
    table_ = lift_optimizer_v3(plugin().descriptor<zd_optimizer_v3>());
    callee_ = raw();
  } else {
    auto a = std::make_shared<AdaptedOptimizer>(AdaptedOptimizer{&plugin().header(), raw()});
    if (version == 2) {
      const auto& v2 = plugin().descriptor<zd_optimizer_v2>();
      if (v2.compression_start(raw()) > 0) {
        if (!v2.momentum_slot || !v2.momentum)
          fail(ZD_ERR_PLUGIN, who + " compresses its momentum but leaves momentum_slot or momentum empty");
        if (v2.momentum_slot(raw()) >= state_slots_raw(v2))
          fail(ZD_ERR_PLUGIN, "optimizer plugin '" + plugin().name() + "' names momentum slot " +
                                  std::to_string(v2.momentum_slot(raw())) + " of " +
                                  std::to_string(state_slots_raw(v2)));
      }
      table_ = lift_optimizer_v2(v2);
    } else {
      table_ = lift_optimizer_v1(plugin().descriptor<zd_optimizer_v1>());
    }
    callee_ = a.get();
    adapted_ = std::move(a);
  }
  compresses_ = table_.compresses(callee_) != 0;
  tensor_scalars_ = table_.tensor_scalars(callee_);
  tensor_stats_ = table_.tensor_stats(callee_);
  if (tensor_scalars_ > kMaxTensorValues || tensor_stats_ > kMaxTensorValues)
    fail(ZD_ERR_PLUGIN, who + " asks for " + std::to_string(tensor_scalars_) + " tensor scalars and " +
                            std::to_string(tensor_stats_) + " statistics; at most " +
                            std::to_string(kMaxTensorValues) + " of each");
  if ((tensor_scalars_ || tensor_stats_) && !table_.tensor_step)
    fail(ZD_ERR_PLUGIN, who + " has tensor scalars or statistics but no tensor_step");
  if (compresses_ && average_slot() >= state_slots() && state_slots() > 0)
    fail(ZD_ERR_PLUGIN, who + " names average slot " + std::to_string(average_slot()) + " of " +
                            std::to_string(state_slots()));
}

uint32_t OptimizerInstance::state_slots_raw(const zd_optimizer_v2& d) const { return d.state_slots(raw()); }

uint32_t OptimizerInstance::state_slots() const { return table_.state_slots(callee_); }

std::string OptimizerInstance::state_name(uint32_t slot) const {
  const char* n = table_.state_name(callee_, slot);
  return n ? n : "state" + std::to_string(slot);
}

void OptimizerInstance::update(zd_isa isa, const zd_optimizer_update& u) const {
  const zd_status st = table_.update(callee_, isa, &u);
  if (st != ZD_OK) fail(st, "optimizer '" + plugin().name() + "' update failed: " + status_name(st));
}

bool OptimizerInstance::has_cuda() const { return table_.update_cuda != nullptr; }

void OptimizerInstance::update_cuda(const zd_optimizer_update& u, void* stream) const {
  if (!table_.update_cuda) fail(ZD_ERR_NOT_IMPLEMENTED, "optimizer '" + plugin().name() + "' has no CUDA kernels");
  const zd_status st = table_.update_cuda(callee_, &u, stream);
  if (st != ZD_OK) fail(st, "optimizer '" + plugin().name() + "' CUDA update failed: " + status_name(st));
}

bool OptimizerInstance::supports_state_dtype(zd_dtype dtype) const {
  return table_.supports_state_dtype(callee_, dtype) != 0;
}

std::string OptimizerInstance::state_dtype_refusal(zd_dtype dtype) const {
  if (dtype == ZD_DTYPE_F32) return "";
  if (dtype != ZD_DTYPE_BF16) return "the state is kept in fp32 or bf16";
  if (state_slots() == 0) return "";  // nothing to keep: the job runs as with fp32
  const std::string who = "optimizer '" + plugin().name() + "' (plugin ABI version " +
                          std::to_string(plugin().header().abi_version) + ", " + plugin().path() + ")";
  if (!supports_state_dtype(dtype))
    return who + " keeps its state in fp32 only; remove state_dtype (or set \"fp32\"), or use an optimizer " +
           "that keeps bf16 state (adam, adamw)";
  if (compresses_)
    return who + " compresses what the ranks exchange, and zerod's exchange, kept averages and " +
           "compression.replay read and write its state as fp32; remove state_dtype (or set \"fp32\")";
  return "";
}

zd_optimizer_plan OptimizerInstance::plain_plan() {
  zd_optimizer_plan p{};
  p.struct_size = sizeof p;
  p.grads = ZD_GRADS_AVERAGED;
  p.ops[0] = ZD_OP_PASS_GRAD;
  return p;
}

bool OptimizerInstance::is_plain(const zd_optimizer_plan& p) {
  return p.grads == ZD_GRADS_AVERAGED && p.ops[0] == ZD_OP_PASS_GRAD && p.ops[1] == ZD_OP_END && !p.reset_errors;
}

zd_optimizer_plan OptimizerInstance::plan(int64_t step, int warmup, int sync) const {
  zd_optimizer_plan p{};
  p.struct_size = sizeof p;
  const std::string who = "optimizer '" + plugin().name() + "'";
  const zd_status st = table_.plan(callee_, step, warmup, sync, &p);
  if (st != ZD_OK) fail(st, who + " could not plan update " + std::to_string(step) + ": " + status_name(st));
  if (p.grads != ZD_GRADS_AVERAGED && p.grads != ZD_GRADS_LOCAL)
    fail(ZD_ERR_PLUGIN, who + " planned update " + std::to_string(step) + " with grads = " + std::to_string(p.grads));
  bool ended = false, passes = false, prepared = false;
  for (zd_plan_op op : p.ops) {
    if (ended) {
      if (op != ZD_OP_END)
        fail(ZD_ERR_PLUGIN, who + " planned an op after ZD_OP_END for update " + std::to_string(step));
      continue;
    }
    switch (op) {
      case ZD_OP_END: ended = true; break;
      case ZD_OP_PASS:
      case ZD_OP_PASS_GRAD: passes = true; break;
      case ZD_OP_PREPARE:
        if (!table_.prepare) fail(ZD_ERR_PLUGIN, who + " plans a PREPARE but has no prepare()");
        prepared = true;
        break;
      case ZD_OP_EXCHANGE:
        if (!compresses_) fail(ZD_ERR_PLUGIN, who + " plans an EXCHANGE but said it never compresses");
        break;
      default: fail(ZD_ERR_PLUGIN, who + " planned " + op_name(op) + " for update " + std::to_string(step));
    }
  }
  if (!passes) fail(ZD_ERR_PLUGIN, who + " planned update " + std::to_string(step) + " without a pass");
  if (p.replay_slots != 0) {
    const uint32_t slots = state_slots();
    // PREPARE, EXCHANGE, then passes without the gradient: the first is
    // replayed with the exchange, the later ones after the owners' (1.5).
    bool shape = p.ops[0] == ZD_OP_PREPARE && p.ops[1] == ZD_OP_EXCHANGE && p.ops[2] == ZD_OP_PASS;
    for (size_t i = 3; i < ZD_PLAN_MAX_OPS && p.ops[i] != ZD_OP_END; ++i) shape = shape && p.ops[i] == ZD_OP_PASS;
    if (!shape || (slots < 32 && (p.replay_slots >> slots) != 0))
      fail(ZD_ERR_PLUGIN, who + " planned update " + std::to_string(step) + " with replay_slots = " +
                              std::to_string(p.replay_slots) + ": they must name some of its " +
                              std::to_string(slots) + " state slots, in a plan PREPARE, EXCHANGE, PASS (and "
                              "more PASSes)");
  }
  if ((p.grads == ZD_GRADS_LOCAL || prepared) && !compresses_)
    fail(ZD_ERR_PLUGIN, who + " keeps gradients local in update " + std::to_string(step) +
                            " but said it never compresses");
  return p;
}

void OptimizerInstance::prepare(zd_isa isa, const zd_optimizer_update& u) const {
  if (!table_.prepare) fail(ZD_ERR_INTERNAL, "optimizer '" + plugin().name() + "' has no prepare()");
  const zd_status st = table_.prepare(callee_, isa, &u);
  if (st != ZD_OK) fail(st, "optimizer '" + plugin().name() + "' prepare failed: " + status_name(st));
}

uint32_t OptimizerInstance::average_slot() const { return table_.average_slot(callee_); }

zd_stat_op OptimizerInstance::stat_op(uint32_t stat) const { return table_.stat_op(callee_, stat); }

void OptimizerInstance::tensor_step(const zd_tensor_step& s) const {
  if (!table_.tensor_step) return;
  const zd_status st = table_.tensor_step(callee_, &s);
  if (st != ZD_OK) fail(st, "optimizer '" + plugin().name() + "' tensor_step failed: " + status_name(st));
}

void OptimizerInstance::check_partitions(uint32_t partitions) const {
  char err[512] = {0};
  const zd_status st = table_.check_partitions(callee_, partitions, err, sizeof err);
  err[sizeof err - 1] = 0;
  if (st == ZD_OK) return;
  fail(st == ZD_ERR_CONFIG ? ZD_ERR_CONFIG : st,
       "optimizer '" + plugin().name() + "': " + (err[0] ? std::string(err) : std::string(status_name(st))));
}

}  // namespace zerod
