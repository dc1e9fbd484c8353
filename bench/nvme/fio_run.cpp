#include "fio_run.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace zerod::bench {
namespace {

std::string run_command(const std::string& command, int* status) {
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) {
    *status = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  *status = pclose(p);
  return out;
}

// fio's JSON: {"jobs": [{ ..., "read": {..., "bw_bytes": N, ...}, "write": {...}}]}.
// The one number needed is found by key, without a JSON library.
double bw_bytes(const std::string& json, const char* rw) {
  const std::string key = std::string("\"") + rw + "\" : {";
  size_t at = json.find("\"jobs\"");
  if (at == std::string::npos) return -1;
  at = json.find(key, at);
  if (at == std::string::npos) return -1;
  at = json.find("\"bw_bytes\"", at);
  if (at == std::string::npos) return -1;
  at = json.find(':', at);
  if (at == std::string::npos) return -1;
  return std::strtod(json.c_str() + at + 1, nullptr);
}

}  // namespace

std::string fio_missing() {
  int status = 0;
  const std::string v = run_command("fio --version 2>/dev/null", &status);
  if (status != 0 || v.rfind("fio", 0) != 0) return "fio not found on PATH (Debian: apt-get install fio)";
  return "";
}

FioRun::FioRun(const Settings& settings) : s_(settings) {
  file_ = s_.dir + "/zerod-bench-fio." + std::to_string(getpid());
}

FioRun::~FioRun() { unlink(file_.c_str()); }

double FioRun::run(const char* rw) {
  const std::string command = "fio --name=zerod-bench --filename='" + file_ + "' --size=" + std::to_string(s_.size) +
                              " --bs=" + std::to_string(s_.block_size) + " --iodepth=" +
                              std::to_string(s_.queue_depth) + " --ioengine=libaio --direct=1 --rw=" + rw +
                              " --output-format=json 2>&1";
  int status = 0;
  const std::string out = run_command(command, &status);
  const double bw = bw_bytes(out, rw);
  if (status != 0 || bw <= 0) {
    error_ = "fio " + std::string(rw) + " failed (status " + std::to_string(status) + "): " + out.substr(0, 400);
    return -1;
  }
  return bw;
}

}  // namespace zerod::bench
