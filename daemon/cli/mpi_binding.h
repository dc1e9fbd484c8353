// Open MPI's mpirun binds every process it starts to one core by default (to
// a socket or NUMA node from three processes on). That suits one MPI process
// per core. A `zerod run` or `zerod serve` is a node's daemon and the parent
// of all its ranks, so under that binding the ranks, the optimizer's threads
// and the comm thread all share one core: bench/onebit ran both of its
// "hosts" on CPU 0 of 2 until this was found. When Open MPI started this
// process and nobody asked for a binding, the daemon takes every CPU it may
// use before it starts any thread or rank. A binding asked for (mpirun's
// --bind-to, which reaches us as OMPI_MCA_hwloc_base_binding_policy) is kept.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace zerod::cli {

// Whether to widen: Open MPI started us (OMPI_COMM_WORLD_SIZE), no binding
// policy was asked for, and `allowed` (our CPUs now) leaves out some of
// `online`.
bool should_release_mpi_binding(const std::map<std::string, std::string>& env, const std::vector<int>& allowed,
                                const std::vector<int>& online);

// "0-3,8,10-11" (the kernel's list format, as in /sys/devices/system/cpu/online)
// as CPU numbers; empty for text it cannot read.
std::vector<int> parse_cpu_list(const std::string& text);
// The other way round, for messages.
std::string format_cpu_list(const std::vector<int>& cpus);

// Widens the calling thread's CPUs (and so those of every thread and rank
// started after it) to every online CPU, which the kernel narrows to the
// cpuset we run in, when should_release_mpi_binding says so. Returns what it
// did for the log ("" when it changed nothing). Call it first, on the main
// thread: a thread that already runs keeps its CPUs.
std::string release_mpi_binding(const std::map<std::string, std::string>& env);

}  // namespace zerod::cli
