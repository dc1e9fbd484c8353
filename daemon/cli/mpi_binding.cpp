#include "mpi_binding.h"

#include "runtime/thread_pool.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace zerod::cli {

namespace {

std::vector<int> online_cpus() {
  std::ifstream f("/sys/devices/system/cpu/online");
  std::string line;
  if (f && std::getline(f, line)) {
    std::vector<int> cpus = parse_cpu_list(line);
    if (!cpus.empty()) return cpus;
  }
  // No sysfs (a bare container): the configured count, numbered from 0.
  std::vector<int> cpus;
  const long n = sysconf(_SC_NPROCESSORS_CONF);
  for (long c = 0; c < n && c < CPU_SETSIZE; ++c) cpus.push_back(static_cast<int>(c));
  return cpus;
}

}  // namespace

bool should_release_mpi_binding(const std::map<std::string, std::string>& env, const std::vector<int>& allowed,
                                const std::vector<int>& online) {
  if (!env.contains("OMPI_COMM_WORLD_SIZE")) return false;
  if (env.contains("OMPI_MCA_hwloc_base_binding_policy")) return false;
  if (allowed.empty()) return false;  // could not read it: leave it alone
  return std::any_of(online.begin(), online.end(),
                     [&](int c) { return std::find(allowed.begin(), allowed.end(), c) == allowed.end(); });
}

std::vector<int> parse_cpu_list(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    while (!part.empty() && (part.back() == '\n' || part.back() == ' ')) part.pop_back();
    if (part.empty()) continue;
    char* end = nullptr;
    const long first = std::strtol(part.c_str(), &end, 10);
    long last = first;
    if (*end == '-') last = std::strtol(end + 1, &end, 10);
    if (end == part.c_str() || *end != '\0' || first < 0 || last < first || last >= CPU_SETSIZE) return {};
    for (long c = first; c <= last; ++c) out.push_back(static_cast<int>(c));
  }
  return out;
}

std::string format_cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(cpus[i]);
    if (j > i) out += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

std::string release_mpi_binding(const std::map<std::string, std::string>& env) {
  const std::vector<int> before = affinity_cpus(), online = online_cpus();
  if (!should_release_mpi_binding(env, before, online)) return "";
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : online) CPU_SET(c, &set);
  // The kernel keeps the new set within our cpuset (a container's, a batch
  // system's); it refuses only a set with none of those CPUs in it.
  if (sched_setaffinity(0, sizeof set, &set) != 0) return "";
  const std::vector<int> after = affinity_cpus();
  if (after == before) return "";
  return "mpirun bound this process to CPUs " + format_cpu_list(before) +
         " (its default binding); the daemon and its ranks run on CPUs " + format_cpu_list(after) +
         " instead. mpirun --bind-to ... keeps a binding you choose";
}

}  // namespace zerod::cli
