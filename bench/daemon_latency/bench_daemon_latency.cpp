// Latency of zd_forward_begin + zd_forward_end: embedded (the engine in the
// trainer's process, one rank) against a zerod daemon in another process (a
// `zerod serve` this program starts) serving N ranks, each a process of its
// own calling in a loop, through the socket (ZEROD_NO_RING=1, how every call
// went before the call ring), through the call ring with zd_forward_end
// waiting for the daemon (ZEROD_SYNC_END=1) and through the call ring as
// the client does by default (zd_forward_end sent with the next call, one
// round trip per pair); stage 0 (views
// only) and stage 3 (a gather per begin, a collective of all ranks), in one
// run. Prints the median and 99th percentile in microseconds over every
// rank's timed pairs. --device cuda puts the module on the GPU (the job's
// device = "cuda"): embedded, its views are the engine's device memory;
// under the daemon, the daemon's pools mapped into each rank, and every
// begin orders the rank's stream after the daemon's through a stream
// signal (issue 32: the time of a begin + end pair on a GPU).
//
//   bench_daemon_latency [--iters 20000] [--numel 4096] [--ranks 2] [--device cpu|cuda] [--zerod PATH]
#include <zerod/zerod.h>

#include <fcntl.h>
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
  double median_us = 0, p99_us = 0;
};

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "%s failed: %s\n", what, zd_last_error());
  std::_Exit(1);
}

// One rank's loop: its timed pairs, in microseconds.
std::vector<double> rank_loop(const char* uri, const std::string& job, int iters, int64_t numel) {
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
  return us;
}

enum class Path { socket, ring_sync_end, ring };

// Runs `ranks` processes of rank_loop (forked before this process touches
// libzerod) and pools their samples.
Figures run_ranks(const char* uri, const std::string& job, int iters, int64_t numel, int ranks, Path path) {
  std::vector<pid_t> kids;
  std::vector<int> pipes;
  for (int r = 0; r < ranks; ++r) {
    int fd[2];
    if (pipe(fd) != 0) std::exit(1);
    const pid_t pid = fork();
    if (pid == 0) {
      close(fd[0]);
      setenv("ZEROD_RANK", std::to_string(r).c_str(), 1);
      setenv("ZEROD_WORLD_SIZE", std::to_string(ranks).c_str(), 1);
      if (path == Path::socket) setenv("ZEROD_NO_RING", "1", 1);
      else unsetenv("ZEROD_NO_RING");
      if (path == Path::ring_sync_end) setenv("ZEROD_SYNC_END", "1", 1);
      else unsetenv("ZEROD_SYNC_END");
      const std::vector<double> us = rank_loop(uri, job, iters, numel);
      const size_t bytes = us.size() * sizeof(double);
      for (size_t done = 0; done < bytes;) {
        const ssize_t n = write(fd[1], reinterpret_cast<const char*>(us.data()) + done, bytes - done);
        if (n <= 0) std::_Exit(1);
        done += static_cast<size_t>(n);
      }
      std::_Exit(0);
    }
    close(fd[1]);
    kids.push_back(pid);
    pipes.push_back(fd[0]);
  }
  std::vector<double> all;
  for (int fd : pipes) {
    std::vector<double> us(static_cast<size_t>(iters));
    size_t done = 0;
    const size_t bytes = us.size() * sizeof(double);
    while (done < bytes) {
      const ssize_t n = read(fd, reinterpret_cast<char*>(us.data()) + done, bytes - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    close(fd);
    if (done != bytes) {
      std::fprintf(stderr, "a rank died before reporting\n");
      std::exit(1);
    }
    all.insert(all.end(), us.begin(), us.end());
  }
  for (pid_t k : kids) {
    int st = 0;
    waitpid(k, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) std::exit(1);
  }
  std::sort(all.begin(), all.end());
  return {all[all.size() / 2], all[static_cast<size_t>(static_cast<double>(all.size()) * 0.99)]};
}

// A `zerod serve` for `ranks` ranks at `sock`.
pid_t start_daemon(const char* zerod, const std::string& job_file, const std::string& sock, int ranks) {
  unlink(sock.c_str());
  const std::string n = std::to_string(ranks);
  const char* args[] = {zerod, "serve", "--nproc", n.c_str(), "--job", job_file.c_str(), "--socket", sock.c_str(),
                        nullptr};
  pid_t daemon = 0;
  posix_spawn_file_actions_t quiet;  // its banner would break the table
  posix_spawn_file_actions_init(&quiet);
  posix_spawn_file_actions_addopen(&quiet, 1, "/dev/null", O_WRONLY, 0);
  const int failed = posix_spawn(&daemon, zerod, &quiet, nullptr, const_cast<char**>(args), environ);
  posix_spawn_file_actions_destroy(&quiet);
  if (failed) std::exit(1);
  for (int i = 0; i < 500; ++i) {
    struct stat st{};
    if (stat(sock.c_str(), &st) == 0) return daemon;
    usleep(10000);
  }
  std::fprintf(stderr, "zerod serve did not create %s\n", sock.c_str());
  std::exit(1);
}

void stop_daemon(pid_t daemon) {
  kill(daemon, SIGTERM);
  waitpid(daemon, nullptr, 0);
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20000, ranks = 2;
  int64_t numel = 4096;
  std::string device = "cpu";
  const char* zerod = ZEROD_EXE;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--numel") && i + 1 < argc) numel = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--ranks") && i + 1 < argc) ranks = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
    else if (!std::strcmp(argv[i], "--zerod") && i + 1 < argc) zerod = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--iters N] [--numel N] [--ranks N] [--device cpu|cuda] [--zerod PATH]\n",
                   argv[0]);
      return 2;
    }
  }
  if (iters < 100 || ranks < 1 || numel < 1 || (device != "cpu" && device != "cuda")) return 2;
  char dir[] = "/tmp/zerod-bench-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  const std::string sock = std::string(dir) + "/zerod.sock", job_file = std::string(dir) + "/job.lua";
  const std::string uri = "unix:" + sock;

  std::printf("bench_daemon_latency: zd_forward_begin + zd_forward_end, one module of %lld f32 on the %s device, %d "
              "timed pairs per rank after 1000 warm-up; daemon rows: %d ranks, each its own process, calling at "
              "once; %ld CPUs online\n\n",
              static_cast<long long>(numel), device.c_str(), iters, ranks, sysconf(_SC_NPROCESSORS_ONLN));
  std::printf("%-6s %-32s %12s %12s\n", "stage", "mode", "median us", "p99 us");
  for (int stage : {0, 3}) {
    const std::string j = "return { device = '" + device + "', optimizer = { type = 'sgd' }, zero = { stage = " +
                          std::to_string(stage) + (stage == 3 ? ", param_persistence_threshold = 0" : "") + " } }\n";
    FILE* f = std::fopen(job_file.c_str(), "w");
    std::fputs(j.c_str(), f);
    std::fclose(f);
    const Figures e = run_ranks("embedded:", j, iters, numel, 1, Path::socket);
    std::printf("%-6d %-32s %12.2f %12.2f\n", stage, "embedded, 1 rank", e.median_us, e.p99_us);
    for (Path path : {Path::socket, Path::ring_sync_end, Path::ring}) {
      const pid_t daemon = start_daemon(zerod, job_file, sock, ranks);
      const Figures d = run_ranks(uri.c_str(), j, iters, numel, ranks, path);
      stop_daemon(daemon);
      const char* how = path == Path::socket          ? "daemon, socket, "
                        : path == Path::ring_sync_end ? "ring, synchronous end, "
                                                      : "daemon, call ring, ";
      const std::string label = how + std::to_string(ranks) + (ranks == 1 ? " rank" : " ranks");
      std::printf("%-6d %-32s %12.2f %12.2f\n", stage, label.c_str(), d.median_us, d.p99_us);
    }
    std::fflush(stdout);
  }
  unlink(job_file.c_str());
  rmdir(dir);
  return 0;
}
