// torch.distributed's gloo backend on the same collectives, the figure a
// user on a CPU would otherwise get (DeepSpeed's comm runs on it there):
// torch_gloo.py in a subprocess, run by the project's venv python.
#ifndef ZEROD_BENCH_COMM_GLOO_PEER_H
#define ZEROD_BENCH_COMM_GLOO_PEER_H

#include <cstddef>
#include <map>
#include <string>

namespace zerod::bench {

struct GlooOptions {
  std::string python;  // empty: the venv's (venv_python) when it is there, else /usr/bin/python3
  std::string venv_python;
  std::string script;
  size_t mib = 0;
  int iters = 0;
  int warmup = 0;
};

struct GlooResult {
  std::map<std::string, double> seconds;      // collective -> median seconds, each one checked by the script
  std::map<std::string, std::string> refused;  // collective -> why this torch's gloo does not run it
  std::string version;                    // torch's
  std::string python;
  std::string error;  // why there are no figures; empty when there are
};

// Runs torch_gloo.py on `ranks` processes; every collective of
// bench_comm_local must come back checked and timed, or refused by gloo
// with a reason, else error says why.
GlooResult run_gloo(const GlooOptions& o, int ranks);

}  // namespace zerod::bench

#endif  // ZEROD_BENCH_COMM_GLOO_PEER_H
