// The dispatcher's table (dispatch.h): one entry per Op, each running its
// call on the Model after check().
#include "dispatch.h"

#include "error.h"

#include <cstring>
#include <iterator>

namespace zerod::calls {

namespace {

struct Entry {
  Op op;
  // Runs the call on the model as `rank`, after check().
  void (*run)(Model& m, int rank, const Args& a, void* data, Outcome& out);
};

void run_finalize(Model& m, int rank, const Args&, void*, Outcome&) { m.finalize(rank); }
void run_forward_begin(Model& m, int rank, const Args& a, void*, Outcome&) { m.forward_begin(rank, a.module); }
void run_forward_end(Model& m, int rank, const Args& a, void*, Outcome&) { m.forward_end(rank, a.module); }
void run_backward_begin(Model& m, int rank, const Args& a, void*, Outcome&) { m.backward_begin(rank, a.module); }
void run_backward_end(Model& m, int rank, const Args& a, void*, Outcome&) { m.backward_end(rank, a.module); }
void run_param_view(Model& m, int rank, const Args& a, void*, Outcome& o) { o.view = m.param_view(rank, a.param); }
void run_grad_view(Model& m, int rank, const Args& a, void*, Outcome& o) { o.view = m.grad_view(rank, a.param); }
void run_step(Model& m, int rank, const Args&, void*, Outcome& o) { o.step = m.step(rank); }
void run_loss_scale(Model&, int, const Args&, void*, Outcome&) {}  // every outcome carries it
void run_set_stream(Model& m, int rank, const Args&, void* data, Outcome&) { m.set_stream(rank, data); }
void run_param_read(Model& m, int rank, const Args& a, void* data, Outcome&) {
  m.read_param(rank, a.param, a.dtype, data, a.bytes);
}
void run_param_write(Model& m, int rank, const Args& a, void* data, Outcome&) {
  m.write_param(rank, a.param, a.dtype, data, a.bytes);
}
void run_state_read(Model& m, int rank, const Args& a, void* data, Outcome&) {
  m.read_state(rank, a.param, a.slot, a.dtype, data, a.bytes);
}
void run_state_write(Model& m, int rank, const Args& a, void* data, Outcome&) {
  m.write_state(rank, a.param, a.slot, a.dtype, data, a.bytes);
}
void run_set_step(Model& m, int rank, const Args& a, void*, Outcome&) { m.set_applied_steps(rank, a.step); }
void run_set_lr(Model& m, int rank, const Args& a, void*, Outcome&) { m.set_lr(rank, a.value); }
void run_optimizer_info(Model& m, int rank, const Args&, void*, Outcome& o) {
  o.optimizer = m.optimizer().plugin().name();
  for (uint32_t s = 0; s < m.optimizer().state_slots(); ++s) o.slots.emplace_back(m.optimizer().state_name(s));
  o.applied_steps = m.applied_steps(rank);
}
int asked_rank(const Model& m, int rank, const Args& a, const char* what) {
  const int r = a.rank < 0 ? rank : a.rank;
  if (!m.is_local(r))
    fail(ZD_ERR_INVALID_ARGUMENT, "rank " + std::to_string(r) + " is served by another node's daemon; ask that rank for its " + what);
  return r;
}
void run_memory(Model& m, int rank, const Args& a, void*, Outcome& o) {
  const MemoryLedger& l = m.ledger(asked_rank(m, rank, a, "memory figures"));
  o.current = l.current(a.tier, a.kind);
  o.peak = l.peak(a.tier, a.kind);
  o.budget = l.budget(a.tier);
}
void run_comm_figures(Model& m, int rank, const Args& a, void*, Outcome& o) {
  const zd_comm_figures f = m.comm_figures(asked_rank(m, rank, a, "figures"));
  o.bytes_sent = f.bytes_sent;
  o.network_bytes_sent = f.network_bytes_sent;
  o.collectives = f.collectives;
}

std::string path_of(const Args& a, const void* data) { return std::string(static_cast<const char*>(data), a.bytes); }
void run_save(Model& m, int rank, const Args& a, void* data, Outcome&) { m.save_checkpoint(rank, path_of(a, data)); }
void run_load(Model& m, int rank, const Args& a, void* data, Outcome&) { m.load_checkpoint(rank, path_of(a, data)); }
void run_report(Model& m, int rank, const Args& a, void*, Outcome&) {
  m.report(rank, a.tokens, a.samples, a.has_loss != 0, a.value);
}

// Indexed by Op (the names are call_record.h's).
constexpr Entry kTable[] = {
    {Op{0}, nullptr},
    {Op::finalize, run_finalize},
    {Op::forward_begin, run_forward_begin},
    {Op::forward_end, run_forward_end},
    {Op::backward_begin, run_backward_begin},
    {Op::backward_end, run_backward_end},
    {Op::param_view, run_param_view},
    {Op::grad_view, run_grad_view},
    {Op::step, run_step},
    {Op::loss_scale, run_loss_scale},
    {Op::set_stream, run_set_stream},
    {Op::param_read, run_param_read},
    {Op::param_write, run_param_write},
    {Op::state_read, run_state_read},
    {Op::state_write, run_state_write},
    {Op::set_step, run_set_step},
    {Op::optimizer_info, run_optimizer_info},
    {Op::memory, run_memory},
    {Op::comm_figures, run_comm_figures},
    {Op::save, run_save},
    {Op::load, run_load},
    {Op::report, run_report},
    {Op::set_lr, run_set_lr},
};
static_assert(std::size(kTable) == kOpCount, "one table entry per Op");

constexpr bool table_in_order() {
  for (uint32_t i = 1; i < kOpCount; ++i)
    if (static_cast<uint32_t>(kTable[i].op) != i) return false;
  return true;
}
static_assert(table_in_order(), "kTable is indexed by Op");

void require(bool ok, zd_status code, const std::string& message) {
  if (!ok) fail(code, message);
}

void check_rank(int world_size, int32_t rank) {
  require(rank >= -1 && rank < world_size, ZD_ERR_INVALID_ARGUMENT,
          "rank " + std::to_string(rank) + " is outside the job's " + std::to_string(world_size) +
              " ranks (-1 = your own)");
}

}  // namespace

void check(const Registry& reg, int world_size, const Args& a, const void* data) {
  switch (a.op) {
    case Op::forward_begin:
    case Op::forward_end:
    case Op::backward_begin:
    case Op::backward_end:
      (void)reg.module(a.module);  // an unknown id is refused with its value
      return;
    case Op::param_view:
    case Op::grad_view: (void)reg.param(a.param); return;
    case Op::param_read:
    case Op::param_write:
    case Op::state_read:
    case Op::state_write:
      // The slot against the optimizer's slots: the Model's (it knows them).
      check_whole_param(name(a.op), reg.param(a.param), a.dtype, data, a.bytes);
      return;
    case Op::memory:
      require(a.tier >= 0 && a.tier < ZD_TIER_COUNT, ZD_ERR_INVALID_ARGUMENT,
              "tier " + std::to_string(a.tier) + " is out of range: a zd_tier is 0.." + std::to_string(ZD_TIER_COUNT - 1));
      require(a.kind >= ZD_MEM_ALL && a.kind < ZD_MEM_KIND_COUNT, ZD_ERR_INVALID_ARGUMENT,
              "kind " + std::to_string(a.kind) + " is out of range: not a zd_mem_kind");
      check_rank(world_size, a.rank);
      return;
    case Op::comm_figures: check_rank(world_size, a.rank); return;
    case Op::save:
    case Op::load:
      // A directory name: not empty, no NUL inside, and no longer than a path can be.
      require(data != nullptr && a.bytes > 0, ZD_ERR_INVALID_ARGUMENT,
              std::string(name(a.op)) + ": the checkpoint directory is empty");
      require(a.bytes < 4096, ZD_ERR_INVALID_ARGUMENT,
              std::string(name(a.op)) + ": the checkpoint directory's name is " + std::to_string(a.bytes) +
                  " bytes, longer than a path can be (4095)");
      require(std::memchr(data, 0, a.bytes) == nullptr, ZD_ERR_INVALID_ARGUMENT,
              std::string(name(a.op)) + ": the checkpoint directory's name has a NUL byte inside");
      return;
    case Op::report:
      require(a.has_loss == 0 || a.has_loss == 1, ZD_ERR_INVALID_ARGUMENT,
              "zd_model_report: has_loss must be 0 or 1, got " + std::to_string(a.has_loss));
      return;
    case Op::set_step:  // a negative step: the Model's check, in its words
    case Op::set_lr:    // likewise a learning rate that is not finite or is negative
    case Op::finalize:
    case Op::step:
    case Op::loss_scale:
    case Op::set_stream:
    case Op::optimizer_info: return;
  }
  fail(ZD_ERR_INVALID_ARGUMENT, "unknown model call " + std::to_string(static_cast<uint32_t>(a.op)));
}

Outcome dispatch(Model& m, int rank, const Args& a, void* data) {
  check(m.registry(), m.world_size(), a, data);
  Outcome out;
  kTable[static_cast<uint32_t>(a.op)].run(m, rank, a, data, out);
  out.loss_scale = m.loss_scale(rank);
  return out;
}

}  // namespace zerod::calls
