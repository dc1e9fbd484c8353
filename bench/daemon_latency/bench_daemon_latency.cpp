// Round-trip latency of zd_forward_begin + zd_forward_end: embedded (the
// engine in this process) against a zerod daemon in another process (a
// `zerod serve` this program starts), on the same model, in one run.
// Prints the median and the 99th percentile in microseconds, and their
// ratio. Stage 0 (views only) and stage 3 (a gather per begin).
//
//   bench_daemon_latency [--iters 20000] [--numel 4096]
#include <zerod/zerod.h>

#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#ifndef ZEROD_EXE
#error "the build passes ZEROD_EXE"
#endif

extern char** environ;

namespace {

struct Figures {
  double median_us, p99_us;
};

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "%s failed: %s\n", what, zd_last_error());
  std::exit(1);
}

Figures measure(const char* uri, const std::string& job, int iters, int64_t numel) {
  zd_client* c = nullptr;
  if (zd_connect(uri, nullptr, &c)) die("zd_connect");
  zd_model_options o = ZD_MODEL_OPTIONS_INIT;
  o.script_text = job.c_str();
  zd_model* m = nullptr;
  if (zd_model_create(c, &o, &m)) die("zd_model_create");
  zd_param_desc d = ZD_PARAM_DESC_INIT;
  d.name = "w";
  d.module = "block";
  d.ndim = 1;
  d.shape = &numel;
  if (zd_model_register_param(m, &d, nullptr) || zd_model_finalize(m)) die("register/finalize");
  std::vector<double> us;
  us.reserve(static_cast<size_t>(iters));
  for (int i = 0; i < iters + 1000; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (zd_forward_begin(m, 0) || zd_forward_end(m, 0)) die("forward_begin/end");
    const auto t1 = std::chrono::steady_clock::now();
    if (i >= 1000) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  zd_model_destroy(m);
  zd_disconnect(c);
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[static_cast<size_t>(static_cast<double>(us.size()) * 0.99)]};
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20000;
  int64_t numel = 4096;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--numel") && i + 1 < argc) numel = std::atoll(argv[++i]);
  }
  // A daemon in its own process, as trainers see it.
  char dir[] = "/tmp/zerod-bench-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  const std::string sock = std::string(dir) + "/zerod.sock", job = std::string(dir) + "/job.lua";
  FILE* f = std::fopen(job.c_str(), "w");
  std::fputs("return { optimizer = { type = 'sgd' } }\n", f);
  std::fclose(f);
  const char* args[] = {ZEROD_EXE, "serve", "--nproc", "1", "--job", job.c_str(), "--socket", sock.c_str(), nullptr};
  pid_t daemon = 0;
  if (posix_spawn(&daemon, ZEROD_EXE, nullptr, nullptr, const_cast<char**>(args), environ)) return 1;
  for (int i = 0; i < 200; ++i) {
    struct stat st{};
    if (stat(sock.c_str(), &st) == 0) break;
    usleep(20000);
  }
  setenv("ZEROD_RANK", "0", 1);
  setenv("ZEROD_WORLD_SIZE", "1", 1);
  const std::string uri = "unix:" + sock;

  std::printf("bench_daemon_latency: zd_forward_begin + zd_forward_end, one module of %lld f32, "
              "%d calls after 1000 warm-up\n\n",
              static_cast<long long>(numel), iters);
  std::printf("%-8s %-22s %12s %12s\n", "stage", "mode", "median us", "p99 us");
  for (int stage : {0, 3}) {
    const std::string j = "return { optimizer = { type = 'sgd' }, zero = { stage = " +
                          std::to_string(stage) + (stage == 3 ? ", param_persistence_threshold = 0" : "") +
                          " } }";
    const Figures e = measure("embedded:", j, iters, numel);
    const Figures d = measure(uri.c_str(), j, iters, numel);
    std::printf("%-8d %-22s %12.2f %12.2f\n", stage, "embedded", e.median_us, e.p99_us);
    std::printf("%-8d %-22s %12.2f %12.2f\n", stage, "daemon (unix socket)", d.median_us, d.p99_us);
    std::printf("%-8d %-22s %11.1fx %11.1fx\n", stage, "daemon / embedded", d.median_us / e.median_us,
                d.p99_us / e.p99_us);
  }
  kill(daemon, SIGTERM);
  waitpid(daemon, nullptr, 0);
  unlink(job.c_str());
  rmdir(dir);
  return 0;
}
