// Comm ABI version 2 lifted to the current table (version 3): the same
// functions with the plugin's own instance, and memory() saying host
// memory only, so that a device pool's collectives through a v2 plugin
// (local, mpi) keep going through host memory (device_comm.h).
#include "comm_adapters.h"

namespace zerod {

zd_comm_memory comm_host_memory_only(const void*) { return ZD_COMM_MEMORY_HOST; }

zd_comm_v3 lift_comm_v2(const zd_comm_v2& d) {
  zd_comm_v3 t{};
  t.header = d.header;
  t.hparams = d.hparams;
  t.hparam_count = d.hparam_count;
  t.create = d.create;
  t.destroy = d.destroy;
  t.all_reduce = d.all_reduce;
  t.reduce_scatter = d.reduce_scatter;
  t.all_gather = d.all_gather;
  t.broadcast = d.broadcast;
  t.barrier = d.barrier;
  t.abort = d.abort;
  t.last_error = d.last_error;
  t.all_to_all = d.all_to_all;
  t.compressed_all_reduce = d.compressed_all_reduce;
  t.figures = d.figures;
  t.memory = comm_host_memory_only;
  return t;
}

}  // namespace zerod
