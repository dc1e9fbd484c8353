#include "gloo_nodes.h"

#include "../python_peer.h"

#include <cstdio>
#include <set>

namespace zerod::bench {
namespace {

std::string command_line(const GlooNodesRun& run) {
  std::string mib;
  for (size_t m : run.mib) mib += (mib.empty() ? "" : ",") + std::to_string(m);
  return "GLOO_SOCKET_IFNAME='" + run.ifname + "' '" + run.python + "' '" + run.script + "' --node " +
         std::to_string(run.node) + " --nodes " + std::to_string(run.nodes) + " --master '" + run.master +
         "' --mib " + mib + " --iters " + std::to_string(run.iters) + " 2>&1";
}

// Node 0 must have every size checked and timed and both latencies; the
// others print only their checks.
std::string missing(const GlooNodesRun& run, const GlooNodesResult& r, const std::set<size_t>& checked) {
  for (size_t m : run.mib) {
    if (checked.count(m) == 0) return "no checked all_reduce of " + std::to_string(m) + " MiB";
    if (run.node == 0 && r.seconds.count(m) == 0) return "no time for all_reduce of " + std::to_string(m) + " MiB";
  }
  if (run.node == 0 && (r.all_reduce_latency <= 0 || r.barrier_latency <= 0)) return "no latency figures";
  return "";
}

}  // namespace

GlooNodesResult run_gloo_nodes(const GlooNodesRun& run) {
  GlooNodesResult r;
  std::set<size_t> checked;
  const PeerRun ran = run_peer_script(command_line(run), run.python, [&](const char* line) {
    char version[64];
    size_t mib = 0;
    double s = 0.0;
    if (std::sscanf(line, "time all_reduce %zu %lf", &mib, &s) == 2 && s > 0.0) {
      r.seconds[mib] = s;
    } else if (std::sscanf(line, "checked all_reduce %zu", &mib) == 1) {
      checked.insert(mib);
    } else if (std::sscanf(line, "latency all_reduce %lf", &s) == 1 && s > 0.0) {
      r.all_reduce_latency = s;
    } else if (std::sscanf(line, "latency barrier %lf", &s) == 1 && s > 0.0) {
      r.barrier_latency = s;
    } else if (std::sscanf(line, "torch %63s gloo", version) == 1) {
      r.version = version;
    } else {
      return false;
    }
    return true;
  });
  r.error = ran.error;
  if (r.error.empty()) {
    r.error = missing(run, r, checked);
    if (!r.error.empty() && !ran.last.empty()) r.error += " (" + ran.last + ")";
  }
  if (!r.error.empty()) r.seconds.clear(), r.all_reduce_latency = r.barrier_latency = 0;
  return r;
}

}  // namespace zerod::bench
