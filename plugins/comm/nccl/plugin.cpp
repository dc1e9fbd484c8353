// zd_comm_nccl.so: the "nccl" comm plugin, collectives across daemons (one
// per node, or one per GPU) with NCCL, on GPUs. This file is the ABI glue:
// the descriptors (plugin ABI v3, whose memory() says it takes CUDA
// memory, and v2 for older hosts; not v1, which cannot say which ranks a
// daemon serves), the hyperparameters and create(); glue.h (the local plugin's)
// turns each entry point's arguments into a Call for the Node (node.h).
//
// Compiled, never run on a GPU yet (docs/multinode.md).
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

namespace nccl = zerod::comm::nccl;

// The root's address is not a hyperparameter: hyperparameters are numbers
// (zd_hparam_spec), so the host comes from the environment (ZEROD_NCCL_ROOT
// or MASTER_ADDR, bootstrap.h) and only the port may come from the script.
constexpr std::array<zd_hparam_spec, 4> kSpecs = {{
    {"timeout", ZD_HPARAM_NUMBER, 1, {300.0, 0, 0, 0}, 0.0, 1e7, 0,
     "seconds to wait for the other daemons where a call sets no limit of its own: create() waits this long for "
     "every daemon to connect and for NCCL's communicator, and a collective whose calls pass timeout_ms = 0 fails "
     "after this long; 0 = no limit. The same key as the job's comm.timeout, which the engine also passes with "
     "every call"},
    {"port", ZD_HPARAM_INTEGER, 1, {0.0, 0, 0, 0}, 0.0, 65535.0, 0,
     "TCP port of the root daemon (node 0), where the others fetch NCCL's unique id; its host is MASTER_ADDR. 0 = "
     "MASTER_PORT + 2. ZEROD_NCCL_ROOT=host:port in the environment overrides both"},
    {"check", ZD_HPARAM_BOOL, 1, {1.0, 0, 0, 0}, 0.0, 1.0, 0,
     "compare every call across ranks before it runs (a 256-byte all-gather each), so that ranks in different "
     "collectives fail with a message naming them instead of hanging until the timeout or, where the calls "
     "have the same size, finishing with wrong results; false saves that latency per call"},
    {"spin_us", ZD_HPARAM_NUMBER, 1, {0.0, 0, 0, 0}, 0.0, 1e6, 0,
     "microseconds a rank polls its collective flat out before it sleeps 50 us between polls"},
}};


zd_status create(const zd_host_services* host, const double* values, size_t value_count, const zd_comm_config* config,
                 void** out_instance, char* err, size_t err_size) noexcept {
  if (const zd_status st = zerod::comm::check_create_args(kSpecs.data(), kSpecs.size(), values, value_count, config,
                                                          out_instance, err, err_size);
      st != ZD_OK)
    return st;
  const zd_comm_config& c = *config;
  nccl::Settings s;
  s.timeout_s = values[0];
  s.port = static_cast<int>(values[1]);
  s.check_calls = values[2] != 0;
  s.spin_us = values[3];
  std::unique_ptr<nccl::Node> node;
  const zd_status st = nccl::Node::create(host, s, c, &node, err, err_size);
  if (st != ZD_OK) return st;
  *out_instance = node.release();
  return ZD_OK;
}

using Glue = zerod::comm::Glue<nccl::Node>;

// Device pointers of the rank's GPU go to NCCL as they are (node.h).
zd_comm_memory memory(const void*) noexcept { return ZD_COMM_MEMORY_HOST | ZD_COMM_MEMORY_CUDA; }

constexpr const char* kDescription =
    "collectives across daemons with NCCL on GPUs (one NCCL rank per zerod rank; device buffers as they are, "
    "host buffers staged through the rank's GPU)";

// v3: the engine hands it the device pool's buffers.
const zd_comm_v3 kV3 = {
    ZD_DESCRIPTOR_HEAD(ZD_PLUGIN_COMM, zd_comm_v3, 3, 0, 1, "nccl", kDescription, kSpecs.data(), kSpecs.size()),
    .create = create,
    ZD_COMM_GLUE_V2_FUNCTIONS(Glue),
    .memory = memory,
};

// v2, for a host that knows no v3: it bounces device pools through host
// memory, which the plugin stages through the GPU.
const zd_comm_v2 kV2 = {
    ZD_DESCRIPTOR_HEAD(ZD_PLUGIN_COMM, zd_comm_v2, 2, 0, 1, "nccl", kDescription, kSpecs.data(), kSpecs.size()),
    .create = create,
    ZD_COMM_GLUE_V2_FUNCTIONS(Glue),
};

}  // namespace

ZD_PLUGIN_DESCRIPTORS(&kV3.header, &kV2.header)
