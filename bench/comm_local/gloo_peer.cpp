#include "gloo_peer.h"

#include "../python_peer.h"

#include <unistd.h>

#include <cstdio>
#include <set>

namespace zerod::bench {

GlooResult run_gloo(const GlooOptions& o, int ranks) {
  GlooResult r;
  r.python = peer_python(o.python, o.venv_python);
  if (access(r.python.c_str(), X_OK) != 0) {
    r.error = r.python + " not found (make the venv with scripts/python-venv.sh)";
    return r;
  }
  const std::string cmd = "'" + r.python + "' '" + o.script + "' --ranks " + std::to_string(ranks) + " --mib " +
                          std::to_string(o.mib) + " --iters " + std::to_string(o.iters) + " --warmup " +
                          std::to_string(o.warmup) + " 2>&1";
  std::string last;
  std::set<std::string> checked;
  const int status = run_peer_lines(cmd, [&](const char* line) {
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
    } else if (line[0] != '\0') {
      last = line;
    }
  });
  if (status < 0) {
    r.error = "cannot run " + r.python;
    return r;
  }
  if (status != 0) {
    r.error = last.empty() ? "exit status " + std::to_string(status) : last;
  } else {
    for (const char* op : {"all_reduce", "reduce_scatter", "all_gather", "all_to_all"}) {
      if ((r.seconds.count(op) == 0 || checked.count(op) == 0) && r.refused.count(op) == 0) {
        r.error = std::string("no checked figure for ") + op + (last.empty() ? "" : " (" + last + ")");
        break;
      }
    }
  }
  if (!r.error.empty()) r.seconds.clear(), r.refused.clear();
  return r;
}

}  // namespace zerod::bench
