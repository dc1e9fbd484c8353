// The benchmarks' Python peers (torch, DeepSpeed) run as subprocesses: which
// python runs them, and the run itself, line by line. Shared by
// bench_cpu_adam, bench_comm_local and bench_offload_step.
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

}  // namespace zerod::bench

#endif  // ZEROD_BENCH_PYTHON_PEER_H
