// Optimizer ABI version 3 lifted to version 4: the plugin's own table, which
// v4 extends at the end, and a state kept in fp32 only (a v3 plugin reads
// zd_optimizer_update.state_dtype as its reserved field). The functions are
// the plugin's and take its own instance: nothing is adapted but the table.
#include "optimizer/optimizer_adapters.h"

namespace zerod {

zd_optimizer_v4 lift_optimizer_v3(const zd_optimizer_v3& d) {
  zd_optimizer_v4 t{};
  t.header = d.header;
  t.hparams = d.hparams;
  t.hparam_count = d.hparam_count;
  t.create = d.create;
  t.destroy = d.destroy;
  t.state_slots = d.state_slots;
  t.state_name = d.state_name;
  t.supports_isa = d.supports_isa;
  t.update = d.update;
  t.update_cuda = d.update_cuda;
  t.plan = d.plan;
  t.prepare = d.prepare;
  t.average_slot = d.average_slot;
  t.tensor_scalars = d.tensor_scalars;
  t.tensor_stats = d.tensor_stats;
  t.stat_op = d.stat_op;
  t.tensor_step = d.tensor_step;
  t.check_partitions = d.check_partitions;
  t.compresses = d.compresses;
  t.supports_state_dtype = adapted::f32_state_only;
  return t;
}

}  // namespace zerod
