// Comm plugins of older ABI versions lifted to the current table
// (zd_comm_v3), as optimizer_adapters.h does for optimizers: CommInstance
// picks the table once, when the plugin is instantiated, and every call
// after goes through that one table without asking the version. One
// adapter per older version: comm_v1_adapter.cpp, comm_v2_adapter.cpp.
#pragma once

#include <zerod/zerod_plugin.h>

#include <string>

namespace zerod {

// What the lifted table's functions receive as their instance: the plugin's
// own descriptor and instance.
struct AdaptedComm {
  const zd_comm_v1* descriptor;
  void* instance;
};

// The current table for a plugin of version 1: the same collectives, abort
// and last_error, called with an AdaptedComm*; figures() fills bytes_sent
// from the plugin's bytes_sent() and leaves the rest zero. Version 1 has no
// all_to_all and no compressed all-reduce: those entries are null; its
// collectives take host memory (memory()). destroy is the plugin's own (it
// takes the plugin's instance); create is null, as its signature differs:
// create_comm_v1 makes the instance.
zd_comm_v3 lift_comm_v1(const zd_comm_v1& d);

// The current table for a plugin of version 2: its own functions, called
// with its own instance, and memory() answering host memory only (v2 said
// nothing of device memory, and every v2 plugin reads its buffers on the
// host).
zd_comm_v3 lift_comm_v2(const zd_comm_v2& d);

// What the adapters' memory() answers: host memory only.
zd_comm_memory comm_host_memory_only(const void* instance);

// Creates a version-1 instance for the rank layout a v2 create() takes. A
// version-1 plugin serves every rank of the job from one daemon: any other
// layout throws ZD_ERR_CONFIG naming the plugin (`name`) and the backend to
// use instead.
zd_status create_comm_v1(const zd_comm_v1& d, const std::string& name, const zd_host_services* host,
                         const double* values, size_t value_count, const zd_comm_config& config,
                         void** out_instance, char* err, size_t err_size);

}  // namespace zerod
