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
// The peer, same run, after each stage's rows: DeepSpeed's counterpart of a
// pair, the time ZeRO's forward hooks (the gather of the module's
// parameters before its forward, their release after) add to the forward
// of one module holding the same --numel fp32 parameters, world size 1,
// median and p99 (deepspeed_hooks.py, in the build's venv python: torch 2.x
// and DeepSpeed, as a user installing today gets them), then zerod's rows
// over it. ZeRO stage 0 puts no hooks on a module: its row is noise, about
// nothing, and gets no ratio. DeepSpeed's once-a-forward engine work is a
// row of its own ("whole forward"), not in the ratio. Where DeepSpeed
// cannot run, one line says why and the bench goes on; --no-deepspeed
// leaves the peer out.
//
//   bench_daemon_latency [--iters 20000] [--numel 4096] [--ranks 2] [--device cpu|cuda] [--zerod PATH]
//                        [--no-deepspeed]
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

#include "../python_peer.h"

#ifndef ZEROD_EXE
#error "the build passes ZEROD_EXE"
#endif
#if !defined(ZEROD_BENCH_DEEPSPEED_SCRIPT) || !defined(ZEROD_BENCH_VENV_PYTHON)
#error "the build passes ZEROD_BENCH_DEEPSPEED_SCRIPT and ZEROD_BENCH_VENV_PYTHON"
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

// One stage of the DeepSpeed peer (deepspeed_hooks.py), or why it has none.
struct DeepSpeedRun {
  std::string version;  // "0.19.8 torch 2.x device cpu backend gloo"
  std::string error;    // why it measured nothing; empty when it did
  Figures hooks;        // per module: the time ZeRO's forward hooks add to its forward
  Figures whole;        // engine(x) over model(x): once a forward, besides the hooks
};

// Figures from a line "<key> median_us X p99_us Y ...", when `line` is one.
bool parse_figures(const char* line, const char* key, Figures& f) {
  const size_t n = std::strlen(key);
  return std::strncmp(line, key, n) == 0 &&
         std::sscanf(line + n, " median_us %lf p99_us %lf", &f.median_us, &f.p99_us) == 2;
}

// deepspeed_hooks.py at `stage` on a module of `numel` fp32 on `device`,
// in the venv's python (else the system's), one thread as a rank's pairs
// run on one. Its stderr is folded in: its last line says why it failed.
DeepSpeedRun deepspeed_peer(int stage, int iters, int64_t numel, const std::string& device) {
  DeepSpeedRun r;
  const std::string python = zerod::bench::peer_python("", ZEROD_BENCH_VENV_PYTHON);
  const std::string cmd = "DS_ACCELERATOR=" + device + " OMP_NUM_THREADS=1 '" + python + "' '" +
                          ZEROD_BENCH_DEEPSPEED_SCRIPT + "' --stages " + std::to_string(stage) + " --iters " +
                          std::to_string(iters) + " --warmup 1000 --numel " + std::to_string(numel) +
                          " --device " + device + " 2>&1";
  const std::string hooks_key = "stage" + std::to_string(stage), whole_key = hooks_key + "_forward";
  bool hooks = false, whole = false;
  std::string last;
  const int status = zerod::bench::run_peer_lines(cmd, [&](const char* line) {
    if (parse_figures(line, (hooks_key + " ").c_str(), r.hooks)) hooks = true;
    else if (parse_figures(line, (whole_key + " ").c_str(), r.whole)) whole = true;
    else if (std::strncmp(line, "deepspeed ", 10) == 0) r.version = line + 10;
    else if (line[0] != '\0') last = line;
  });
  if (status == 0 && hooks && whole) return r;
  r.error = status < 0 ? "cannot run " + python : last.empty() ? python + ": no result" : last;
  return r;
}

struct Row {
  std::string mode;
  Figures f;
};

void print_row(int stage, const std::string& mode, const Figures& f) {
  std::printf("%-6d %-32s %12.2f %12.2f\n", stage, mode.c_str(), f.median_us, f.p99_us);
}

// "0.004x" or, where DeepSpeed's figure is no time at all, "n/a".
std::string ratio(double zerod, double deepspeed) {
  if (deepspeed <= 0) return "n/a";
  char s[32];
  std::snprintf(s, sizeof s, "%.3gx", zerod / deepspeed);
  return s;
}

// DeepSpeed's rows under zerod's of the same stage, then zerod's over
// DeepSpeed's hooks, row by row (stage 3; at stage 0 there is nothing to
// divide by).
void print_deepspeed(int stage, const DeepSpeedRun& ds, int64_t numel, const std::vector<Row>& zerod_rows) {
  const std::string z = "DeepSpeed ZeRO-" + std::to_string(stage);
  std::printf("       DeepSpeed %s, ZeRO stage %d, world size 1: its forward hooks on one module of %lld f32, "
              "over the bare module's forward\n",
              ds.version.c_str(), stage, static_cast<long long>(numel));
  print_row(stage, z + " hooks, 1 rank", ds.hooks);
  print_row(stage, z + ", whole forward", ds.whole);
  if (stage == 0) {
    std::printf("       no ratio: ZeRO stage 0 puts no hooks on a module and adds about nothing to its forward (the "
                "hooks row is noise); the whole-forward row is the engine's work once a forward\n");
    return;
  }
  std::string line = "       zerod / DeepSpeed's hooks, median and p99:";
  for (size_t k = 0; k < zerod_rows.size(); ++k)
    line += (k ? "; " : " ") + zerod_rows[k].mode + " " + ratio(zerod_rows[k].f.median_us, ds.hooks.median_us) +
            " " + ratio(zerod_rows[k].f.p99_us, ds.hooks.p99_us);
  std::printf("%s\n", line.c_str());
}

struct Options {
  int iters = 20000, ranks = 2;
  int64_t numel = 4096;
  std::string device = "cpu";
  const char* zerod = ZEROD_EXE;
  bool deepspeed = true;
};

// The options, or false (with the usage said) when they are not ones.
bool parse_options(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) o.iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--numel") && i + 1 < argc) o.numel = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--ranks") && i + 1 < argc) o.ranks = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--device") && i + 1 < argc) o.device = argv[++i];
    else if (!std::strcmp(argv[i], "--zerod") && i + 1 < argc) o.zerod = argv[++i];
    else if (!std::strcmp(argv[i], "--no-deepspeed")) o.deepspeed = false;
    else {
      std::fprintf(stderr,
                   "usage: %s [--iters N] [--numel N] [--ranks N] [--device cpu|cuda] [--zerod PATH] "
                   "[--no-deepspeed]\n",
                   argv[0]);
      return false;
    }
  }
  return o.iters >= 100 && o.ranks >= 1 && o.numel >= 1 && (o.device == "cpu" || o.device == "cuda");
}

// zerod's rows of one stage, each printed as it is measured: embedded, then
// a daemon for each path.
std::vector<Row> zerod_stage(const Options& o, int stage, const std::string& job_file, const std::string& sock) {
  const std::string j = "return { device = '" + o.device + "', optimizer = { type = 'sgd' }, zero = { stage = " +
                        std::to_string(stage) + (stage == 3 ? ", param_persistence_threshold = 0" : "") + " } }\n";
  FILE* f = std::fopen(job_file.c_str(), "w");
  std::fputs(j.c_str(), f);
  std::fclose(f);
  std::vector<Row> rows;
  rows.push_back({"embedded, 1 rank", run_ranks("embedded:", j, o.iters, o.numel, 1, Path::socket)});
  print_row(stage, rows.back().mode, rows.back().f);
  const std::string uri = "unix:" + sock;
  for (Path path : {Path::socket, Path::ring_sync_end, Path::ring}) {
    const pid_t daemon = start_daemon(o.zerod, job_file, sock, o.ranks);
    const Figures d = run_ranks(uri.c_str(), j, o.iters, o.numel, o.ranks, path);
    stop_daemon(daemon);
    const char* how = path == Path::socket          ? "daemon, socket, "
                      : path == Path::ring_sync_end ? "ring, synchronous end, "
                                                    : "daemon, call ring, ";
    rows.push_back({how + std::to_string(o.ranks) + (o.ranks == 1 ? " rank" : " ranks"), d});
    print_row(stage, rows.back().mode, rows.back().f);
  }
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse_options(argc, argv, o)) return 2;
  char dir[] = "/tmp/zerod-bench-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  const std::string sock = std::string(dir) + "/zerod.sock", job_file = std::string(dir) + "/job.lua";

  std::printf("bench_daemon_latency: zd_forward_begin + zd_forward_end, one module of %lld f32 on the %s device, %d "
              "timed pairs per rank after 1000 warm-up; daemon rows: %d ranks, each its own process, calling at "
              "once; %ld CPUs online\n\n",
              static_cast<long long>(o.numel), o.device.c_str(), o.iters, o.ranks, sysconf(_SC_NPROCESSORS_ONLN));
  std::printf("%-6s %-32s %12s %12s\n", "stage", "mode", "median us", "p99 us");
  std::fflush(stdout);
  bool deepspeed = o.deepspeed;
  for (int stage : {0, 3}) {
    const std::vector<Row> rows = zerod_stage(o, stage, job_file, sock);
    std::fflush(stdout);
    if (!deepspeed) continue;
    const DeepSpeedRun ds = deepspeed_peer(stage, o.iters, o.numel, o.device);
    if (ds.error.empty()) {
      print_deepspeed(stage, ds, o.numel, rows);
    } else {
      std::printf("DeepSpeed: not measured (%s)\n", ds.error.c_str());
      deepspeed = false;  // it would fail again, the same way, at the next stage
    }
    std::fflush(stdout);
  }
  unlink(job_file.c_str());
  rmdir(dir);
  return 0;
}
