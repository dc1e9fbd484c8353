// Comm ABI version 1 lifted to the current table (version 3): the
// collectives forward to the plugin's own functions with its own instance;
// bytes_sent() becomes the bytes_sent of figures(); host memory only.
#include "comm_adapters.h"

#include "error.h"

namespace zerod {
namespace {

const zd_comm_v1& desc(const void* a) { return *static_cast<const AdaptedComm*>(a)->descriptor; }
void* inst(const void* a) { return static_cast<const AdaptedComm*>(a)->instance; }

zd_status all_reduce(void* a, const zd_comm_call* c, void* buf, uint64_t count, zd_comm_dtype dt, zd_reduce_op op) {
  return desc(a).all_reduce(inst(a), c, buf, count, dt, op);
}
zd_status reduce_scatter(void* a, const zd_comm_call* c, const void* send, void* recv, uint64_t recv_count,
                         zd_comm_dtype dt, zd_reduce_op op) {
  return desc(a).reduce_scatter(inst(a), c, send, recv, recv_count, dt, op);
}
zd_status all_gather(void* a, const zd_comm_call* c, const void* send, void* recv, uint64_t send_count,
                     zd_comm_dtype dt) {
  return desc(a).all_gather(inst(a), c, send, recv, send_count, dt);
}
zd_status broadcast(void* a, const zd_comm_call* c, void* buf, uint64_t count, zd_comm_dtype dt, int32_t root) {
  return desc(a).broadcast(inst(a), c, buf, count, dt, root);
}
zd_status barrier(void* a, const zd_comm_call* c) { return desc(a).barrier(inst(a), c); }
void abort_all(void* a, zd_status status, const char* reason) { desc(a).abort(inst(a), status, reason); }
const char* last_error(const void* a, int32_t rank) { return desc(a).last_error(inst(a), rank); }
void figures(const void* a, int32_t rank, zd_comm_figures* out) {
  out->bytes_sent = desc(a).bytes_sent(inst(a), rank);
}

}  // namespace

zd_comm_v3 lift_comm_v1(const zd_comm_v1& d) {
  zd_comm_v3 t{};
  t.header = d.header;
  t.hparams = d.hparams;
  t.hparam_count = d.hparam_count;
  t.create = nullptr;  // create_comm_v1
  t.destroy = d.destroy;
  t.all_reduce = all_reduce;
  t.reduce_scatter = reduce_scatter;
  t.all_gather = all_gather;
  t.broadcast = broadcast;
  t.barrier = barrier;
  t.abort = abort_all;
  t.last_error = last_error;
  t.all_to_all = nullptr;
  t.compressed_all_reduce = nullptr;
  t.figures = figures;
  t.memory = comm_host_memory_only;
  return t;
}

zd_status create_comm_v1(const zd_comm_v1& d, const std::string& name, const zd_host_services* host,
                         const double* values, size_t value_count, const zd_comm_config& config,
                         void** out_instance, char* err, size_t err_size) {
  if (config.local_ranks != config.world_size)
    fail(ZD_ERR_CONFIG, "comm plugin '" + name + "' (plugin ABI version 1) serves the ranks of " +
                            "one daemon only, but this daemon serves " + std::to_string(config.local_ranks) +
                            " of " + std::to_string(config.world_size) +
                            " ranks; use a backend that spans nodes "
                            "(comm = { backend = \"mpi\" })");
  return d.create(host, values, value_count, config.world_size, out_instance, err, err_size);
}

}  // namespace zerod
