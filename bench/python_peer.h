// The benchmarks' Python peers (torch, DeepSpeed) run as subprocesses: which
// python runs them, and the run itself, line by line. Shared by
// bench_cpu_adam, bench_comm_local, bench_comm_mpi, bench_daemon_latency and
// bench_offload_step.
#ifndef ZEROD_BENCH_PYTHON_PEER_H
#define ZEROD_BENCH_PYTHON_PEER_H

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

namespace zerod::bench {

// `given` (the bench's --python), else the venv's (torch 2.x and DeepSpeed,
// what a user installing today gets) when it is there, else the system's.
inline std::string peer_python(const std::string& given, const std::string& venv) {
  if (!given.empty()) return given;
  if (access(venv.c_str(), X_OK) == 0) return venv;
  return "/usr/bin/python3";
}

// Runs the shell command `cmd` (its stderr folded into stdout by the
// caller's "2>&1"), handing each line without its newline to on_line.
// Returns pclose's status, or -1 when the command could not be started.
inline int run_peer_lines(const std::string& cmd, const std::function<void(const char*)>& on_line) {
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) return -1;
  char line[1024];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    line[std::strcspn(line, "\n")] = '\0';
    on_line(line);
  }
  return pclose(f);
}

// Why `python` cannot run a peer script ("" when it can): the words the
// benches' smoke tests skip on when the venv was never made.
inline std::string peer_python_missing(const std::string& python) {
  if (access(python.c_str(), X_OK) == 0) return "";
  return python + " not found (make the venv with scripts/python-venv.sh)";
}

// How a peer script ended: error says why it failed ("" when it exited 0);
// last is the last line the caller did not understand (a script's error
// goes last, on stderr), to say why figures it should have printed are not
// there even when it exited 0.
struct PeerRun {
  std::string error;
  std::string last;
  int status = 0;  // pclose's wait status; -1 when the command could not be started
};

// Runs the peer command `cmd` of `python` ("2>&1" in it), handing each line
// to on_line, which says whether it understood it.
inline PeerRun run_peer_script(const std::string& cmd, const std::string& python,
                               const std::function<bool(const char*)>& on_line) {
  PeerRun r;
  r.status = run_peer_lines(cmd, [&](const char* line) {
    if (!on_line(line) && line[0] != '\0') r.last = line;
  });
  if (r.status < 0) {
    r.error = "cannot run " + python;
  } else if (r.status != 0) {
    r.error = r.last.empty() ? "exit status " + std::to_string(r.status) : r.last;
  }
  return r;
}

}  // namespace zerod::bench

#endif  // ZEROD_BENCH_PYTHON_PEER_H
