#include "gloo_peer.h"

#include "../python_peer.h"

#include <cstdio>
#include <set>

namespace zerod::bench {

GlooResult run_gloo(const GlooOptions& o, int ranks) {
  GlooResult r;
  r.python = peer_python(o.python, o.venv_python);
  r.error = peer_python_missing(r.python);
  if (!r.error.empty()) return r;
  const std::string cmd = "'" + r.python + "' '" + o.script + "' --ranks " + std::to_string(ranks) + " --mib " +
                          std::to_string(o.mib) + " --iters " + std::to_string(o.iters) + " --warmup " +
                          std::to_string(o.warmup) + " 2>&1";
  std::set<std::string> checked;
  const PeerRun run = run_peer_script(cmd, r.python, [&](const char* line) {
    char op[32], version[64];
    int n = 0;
    double s = 0.0;
    if (std::sscanf(line, "time %31s %d %lf", op, &n, &s) == 3 && n == ranks && s > 0.0) {
      r.seconds[op] = s;
    } else if (std::sscanf(line, "checked %31s %d", op, &n) == 2 && n == ranks) {
      checked.insert(op);
    } else if (int at = 0; std::sscanf(line, "unsupported %31s %d %n", op, &n, &at) == 2 && n == ranks && at > 0) {
      r.refused[op] = std::string("not in torch ") + (r.version.empty() ? "?" : r.version) + "'s gloo: " + (line + at);
    } else if (std::sscanf(line, "torch %63s gloo", version) == 1) {
      r.version = version;
    } else {
      return false;
    }
    return true;
  });
  r.error = run.error;
  if (r.error.empty()) {
    for (const char* op : {"all_reduce", "reduce_scatter", "all_gather", "all_to_all"}) {
      if ((r.seconds.count(op) == 0 || checked.count(op) == 0) && r.refused.count(op) == 0) {
        r.error = std::string("no checked figure for ") + op + (run.last.empty() ? "" : " (" + run.last + ")");
        break;
      }
    }
  }
  if (!r.error.empty()) r.seconds.clear(), r.refused.clear();
  return r;
}

}  // namespace zerod::bench
