// zd_comm_mpi.so: the "mpi" comm plugin, collectives across daemons (one per
// node, started by mpirun or srun) and among each daemon's ranks. This file
// is the ABI glue: the descriptor (plugin ABI v2 only: v1 cannot say which
// ranks a daemon serves), the hyperparameters and create(); glue.h turns
// each entry point's arguments into a Call for the Node (node.h).
#include <zerod/kit/plugin_descriptor.h>
#include <zerod/zerod_plugin.h>

#include <array>
#include <cmath>
#include <cstdio>

#include "glue.h"
#include "node.h"
#include "create_checks.h"
#include "plugin_text.h"

namespace {

namespace mpi = zerod::comm::mpi;

constexpr std::array<zd_hparam_spec, 3> kSpecs = {{
    {"timeout", ZD_HPARAM_NUMBER, 1, {300.0, 0, 0, 0}, 0.0, 1e7, 0,
     "seconds to wait for the other daemons where a call sets no limit of its own: create() waits this long for "
     "every daemon to create its instance, and a collective whose calls pass timeout_ms = 0 fails after this long "
     "at the arrival across nodes or without progress in the exchange; 0 = no limit. The same key as the job's "
     "comm.timeout, which the engine also passes with every call"},
    {"spin_us", ZD_HPARAM_NUMBER, 1, {0.0, 0, 0, 0}, 0.0, 1e6, 0,
     "microseconds a rank, or the network thread, polls flat out before it sleeps (the network thread still "
     "yields between polls for 1 ms); the waits here are network waits of tens of microseconds, and spinning "
     "takes cores the ranks or the transport need (two daemons on two cores: 23 us per small all-reduce at 0, "
     "127 us at 50); raise it where cores are to spare"},
    {"segment", ZD_HPARAM_INTEGER, 1, {1048576.0, 0, 0, 0}, 4096.0, 1073741824.0, 0,
     "bytes: the largest MPI message, and the size of a node's chunk of one all_reduce round (rounds are "
     "pipelined two deep); a wait fails when no message completes within the timeout, so one must cross the "
     "slowest link well within it"},
}};


zd_status create(const zd_host_services* host, const double* values, size_t value_count, const zd_comm_config* config,
                 void** out_instance, char* err, size_t err_size) noexcept {
  if (const zd_status st = zerod::comm::check_create_args(kSpecs.data(), kSpecs.size(), values, value_count, config,
                                                          out_instance, err, err_size);
      st != ZD_OK)
    return st;
  const zd_comm_config& c = *config;
  mpi::Settings s;
  s.timeout_s = values[0];
  s.spin_us = values[1];
  s.segment = static_cast<uint64_t>(values[2]);
  std::unique_ptr<mpi::Node> node;
  const zd_status st = mpi::Node::create(host, s, c, &node, err, err_size);
  if (st != ZD_OK) return st;
  *out_instance = node.release();
  return ZD_OK;
}

using Glue = zerod::comm::Glue<mpi::Node>;

const zd_comm_v2 kDescriptor = {
    ZD_DESCRIPTOR_HEAD(ZD_PLUGIN_COMM, zd_comm_v2, 2, 0, 1, "mpi",
                       "collectives across daemons over MPI (one daemon per node), reduced over shared "
                       "memory inside each daemon first",
                       kSpecs.data(), kSpecs.size()),
    .create = create,
    ZD_COMM_GLUE_V2_FUNCTIONS(Glue),
};

}  // namespace

ZD_PLUGIN_DESCRIPTORS(&kDescriptor.header)
