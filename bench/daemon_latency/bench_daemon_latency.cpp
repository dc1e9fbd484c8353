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
// median and p99 (deepspeed_hooks.py, in --python, else the build's venv
// python: torch 2.x and DeepSpeed, as a user installing today gets them,
// else the system's), then zerod's rows
// over it. ZeRO stage 0 puts no hooks on a module: its row is noise, about
// nothing, and gets no ratio. DeepSpeed's once-a-forward engine work is a
// row of its own ("whole forward"), not in the ratio. Where DeepSpeed
// cannot run, one line says why and the bench goes on; --no-deepspeed
// leaves the peer out.
//
// A daemon it started does not outlive it: a rank that fails, a daemon
// that does not come up, SIGTERM or SIGINT stop it and remove its folder
// (/tmp/zerod-bench-*) before the bench exits 1 (or 128 + the signal).
//
//   bench_daemon_latency [--iters 20000] [--numel 4096] [--ranks 2] [--device cpu|cuda] [--zerod PATH]
//                        [--python PATH] [--no-deepspeed]
// --python: a machine without the build's venv (a GPU image whose torch is
// in an environment of its own: bench/gpu/daemon.py passes its own Python)
#include <zerod/zerod.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
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

// The `zerod serve` running now (0: none) and the folder holding its socket
// and job file. Plain values, set before the SIGTERM/SIGINT handler can
// read them, so that it too can take the daemon down and remove the folder.
volatile std::sig_atomic_t g_daemon = 0;
static_assert(sizeof(pid_t) <= sizeof(std::sig_atomic_t));
char g_dir[] = "/tmp/zerod-bench-XXXXXX";
char g_sock[sizeof g_dir + 16], g_job[sizeof g_dir + 16];

// Stops the daemon and waits for it. kill and waitpid are async-signal-safe:
// the signal handler calls this too.
void stop_daemon() {
  const pid_t daemon = static_cast<pid_t>(g_daemon);
  if (daemon <= 0) return;
  kill(daemon, SIGTERM);
  waitpid(daemon, nullptr, 0);
  g_daemon = 0;
}

// unlink and rmdir are async-signal-safe too.
void remove_folder() {
  unlink(g_sock);
  unlink(g_job);
  rmdir(g_dir);
}

void on_stop_signal(int sig) {
  stop_daemon();
  remove_folder();
  _exit(128 + sig);
}

// The folder (g_dir, g_sock, g_job), then the handler that cleans it up.
bool make_folder() {
  if (!mkdtemp(g_dir)) {
    std::fprintf(stderr, "bench_daemon_latency: cannot make %s: %s\n", g_dir, std::strerror(errno));
    return false;
  }
  std::snprintf(g_sock, sizeof g_sock, "%s/zerod.sock", g_dir);
  std::snprintf(g_job, sizeof g_job, "%s/job.lua", g_dir);
  struct sigaction sa{};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  return true;
}

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

// Rank r's process (forked before this process touches libzerod): its
// timed pairs go down `out`, and it exits 0, or 1 when a call failed.
[[noreturn]] void rank_process(int r, int ranks, Path path, int out, const char* uri, const std::string& job,
                               int iters, int64_t numel) {
  // A rank dies of a stop signal; the daemon and folder are the bench's.
  signal(SIGTERM, SIG_DFL);
  signal(SIGINT, SIG_DFL);
  setenv("ZEROD_RANK", std::to_string(r).c_str(), 1);
  setenv("ZEROD_WORLD_SIZE", std::to_string(ranks).c_str(), 1);
  if (path == Path::socket) setenv("ZEROD_NO_RING", "1", 1);
  else unsetenv("ZEROD_NO_RING");
  if (path == Path::ring_sync_end) setenv("ZEROD_SYNC_END", "1", 1);
  else unsetenv("ZEROD_SYNC_END");
  const std::vector<double> us = rank_loop(uri, job, iters, numel);
  const size_t bytes = us.size() * sizeof(double);
  for (size_t done = 0; done < bytes;) {
    const ssize_t n = write(out, reinterpret_cast<const char*>(us.data()) + done, bytes - done);
    if (n <= 0) std::_Exit(1);
    done += static_cast<size_t>(n);
  }
  std::_Exit(0);
}

// Every rank's `iters` samples from its pipe, read as they come: a rank
// blocked on a full pipe must not wait for another's to be read, and a
// rank that dies must be seen at once, not after the ones before it (which
// may wait on it in a collective for good). False when a pipe closes short.
bool collect(const std::vector<int>& pipes, int iters, std::vector<double>& all) {
  const size_t bytes = static_cast<size_t>(iters) * sizeof(double);
  std::vector<std::vector<double>> us(pipes.size(), std::vector<double>(static_cast<size_t>(iters)));
  std::vector<size_t> done(pipes.size(), 0);
  std::vector<pollfd> fds;
  for (int fd : pipes) fds.push_back({fd, POLLIN, 0});
  for (size_t open = fds.size(); open > 0;) {
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].fd < 0 || fds[k].revents == 0) continue;
      const ssize_t n = read(fds[k].fd, reinterpret_cast<char*>(us[k].data()) + done[k], bytes - done[k]);
      if (n < 0 && errno == EINTR) continue;
      if (n > 0) done[k] += static_cast<size_t>(n);
      if (n > 0 && done[k] < bytes) continue;
      if (done[k] != bytes) return false;  // closed short: the rank died
      fds[k].fd = -1;
      --open;
    }
  }
  for (const auto& u : us) all.insert(all.end(), u.begin(), u.end());
  return true;
}

// Waits for every rank (killing them first where one failed, as the others
// may wait on it for good); whether all exited 0.
bool reap(const std::vector<pid_t>& kids, bool kill_first) {
  bool ok = true;
  for (pid_t k : kids) {
    if (kill_first) kill(k, SIGKILL);
    int st = 0;
    waitpid(k, &st, 0);
    ok = ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }
  return ok;
}

// Runs `ranks` rank processes and pools their samples; nothing, said on
// stderr, when one failed.
std::optional<Figures> run_ranks(const char* uri, const std::string& job, int iters, int64_t numel, int ranks,
                                 Path path) {
  std::vector<pid_t> kids;
  std::vector<int> pipes;
  bool started = true;
  for (int r = 0; r < ranks && started; ++r) {
    int fd[2];
    pid_t pid = -1;
    int error = 0;
    if (pipe(fd) == 0) {
      pid = fork();
      error = errno;
      if (pid == 0) {
        close(fd[0]);
        rank_process(r, ranks, path, fd[1], uri, job, iters, numel);
      }
      close(fd[1]);
      if (pid < 0) close(fd[0]);
    } else {
      error = errno;
    }
    started = pid > 0;
    if (!started) {
      std::fprintf(stderr, "cannot start rank %d: %s\n", r, std::strerror(error));
      continue;
    }
    kids.push_back(pid);
    pipes.push_back(fd[0]);
  }
  std::vector<double> all;
  const bool reported = started && collect(pipes, iters, all);
  for (int fd : pipes) close(fd);
  if (started && !reported) std::fprintf(stderr, "a rank died before reporting\n");
  if (!reap(kids, !reported) || !reported) return std::nullopt;
  std::sort(all.begin(), all.end());
  return Figures{all[all.size() / 2], all[static_cast<size_t>(static_cast<double>(all.size()) * 0.99)]};
}

// A `zerod serve` for `ranks` ranks at g_sock (g_daemon), its socket there;
// false, said on stderr, when it did not come up (and is not running).
bool start_daemon(const char* zerod, int ranks) {
  unlink(g_sock);
  const std::string n = std::to_string(ranks);
  const char* args[] = {zerod, "serve", "--nproc", n.c_str(), "--job", g_job, "--socket", g_sock, nullptr};
  posix_spawn_file_actions_t quiet;  // its banner would break the table
  posix_spawn_file_actions_init(&quiet);
  posix_spawn_file_actions_addopen(&quiet, 1, "/dev/null", O_WRONLY, 0);
  // The stop signals wait until g_daemon holds the pid (a signal in between
  // would leave the daemon behind); the daemon starts with the mask as it was.
  sigset_t stop, before;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  sigprocmask(SIG_BLOCK, &stop, &before);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setsigmask(&attr, &before);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t daemon = 0;
  const int failed = posix_spawn(&daemon, zerod, &quiet, &attr, const_cast<char**>(args), environ);
  if (!failed) g_daemon = daemon;
  sigprocmask(SIG_SETMASK, &before, nullptr);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&quiet);
  if (failed) {
    std::fprintf(stderr, "cannot start %s: %s\n", zerod, std::strerror(failed));
    return false;
  }
  for (int i = 0; i < 500; ++i) {
    struct stat st{};
    if (stat(g_sock, &st) == 0) return true;
    usleep(10000);
  }
  std::fprintf(stderr, "zerod serve did not create %s\n", g_sock);
  stop_daemon();
  return false;
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
// in `given` (--python; else the venv's python, else the system's), one
// thread as a rank's pairs run on one. Its stderr is folded in: its last
// line says why it failed.
DeepSpeedRun deepspeed_peer(int stage, int iters, int64_t numel, const std::string& device,
                            const std::string& given) {
  DeepSpeedRun r;
  const std::string python = zerod::bench::peer_python(given, ZEROD_BENCH_VENV_PYTHON);
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
  std::string python;  // the DeepSpeed peer's; empty: peer_python's choice
  bool deepspeed = true;
};

// Fewer timed pairs would make the 99th percentile one of the few slowest.
constexpr int kMinIters = 100;

void usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--iters N >= %d] [--numel N >= 1] [--ranks N >= 1] [--device cpu|cuda] [--zerod PATH] "
               "[--python PATH] [--no-deepspeed]\n",
               argv0, kMinIters);
}

// Why the options are not ones ("" when they are).
std::string refusal(const Options& o) {
  if (o.iters < kMinIters)
    return "--iters must be at least " + std::to_string(kMinIters) + " (the p99 of fewer pairs is one of the few "
           "slowest), not " + std::to_string(o.iters);
  if (o.numel < 1) return "--numel must be at least 1, not " + std::to_string(o.numel);
  if (o.ranks < 1) return "--ranks must be at least 1, not " + std::to_string(o.ranks);
  if (o.device != "cpu" && o.device != "cuda") return "--device must be cpu or cuda, not " + o.device;
  return "";
}

// The options, or false with the reason and the usage said.
bool parse_options(int argc, char** argv, Options& o) {
  std::string why;
  for (int i = 1; i < argc && why.empty(); ++i) {
    const std::string a = argv[i];
    const bool valued =
        a == "--iters" || a == "--numel" || a == "--ranks" || a == "--device" || a == "--zerod" || a == "--python";
    if (a == "--no-deepspeed") {
      o.deepspeed = false;
      continue;
    }
    if (!valued || i + 1 >= argc) {
      why = a + (valued ? " needs a value" : ": no such option");
      continue;
    }
    const char* v = argv[++i];
    if (a == "--iters") o.iters = std::atoi(v);
    else if (a == "--numel") o.numel = std::atoll(v);
    else if (a == "--ranks") o.ranks = std::atoi(v);
    else if (a == "--device") o.device = v;
    else if (a == "--python") o.python = v;
    else o.zerod = v;
  }
  if (why.empty()) why = refusal(o);
  if (why.empty()) return true;
  std::fprintf(stderr, "bench_daemon_latency: %s\n", why.c_str());
  usage(argv[0]);
  return false;
}

// The job of a stage: written to g_job for the daemons, the text for the
// embedded rank.
std::optional<std::string> write_job(const Options& o, int stage) {
  const std::string j = "return { device = '" + o.device + "', optimizer = { type = 'sgd' }, zero = { stage = " +
                        std::to_string(stage) + (stage == 3 ? ", param_persistence_threshold = 0" : "") + " } }\n";
  FILE* f = std::fopen(g_job, "w");
  const bool written = f != nullptr && std::fputs(j.c_str(), f) >= 0;
  if (f == nullptr || std::fclose(f) != 0 || !written) {
    std::fprintf(stderr, "bench_daemon_latency: cannot write %s\n", g_job);
    return std::nullopt;
  }
  return j;
}

// zerod's rows of one stage, each printed as it is measured: embedded, then
// a daemon for each path; nothing when a run failed (its daemon stopped).
std::optional<std::vector<Row>> zerod_stage(const Options& o, int stage) {
  const std::optional<std::string> j = write_job(o, stage);
  if (!j) return std::nullopt;
  std::vector<Row> rows;
  const std::optional<Figures> embedded = run_ranks("embedded:", *j, o.iters, o.numel, 1, Path::socket);
  if (!embedded) return std::nullopt;
  rows.push_back({"embedded, 1 rank", *embedded});
  print_row(stage, rows.back().mode, rows.back().f);
  const std::string uri = std::string("unix:") + g_sock;
  for (Path path : {Path::socket, Path::ring_sync_end, Path::ring}) {
    if (!start_daemon(o.zerod, o.ranks)) return std::nullopt;
    const std::optional<Figures> d = run_ranks(uri.c_str(), *j, o.iters, o.numel, o.ranks, path);
    stop_daemon();
    if (!d) return std::nullopt;
    const char* how = path == Path::socket          ? "daemon, socket, "
                      : path == Path::ring_sync_end ? "ring, synchronous end, "
                                                    : "daemon, call ring, ";
    rows.push_back({how + std::to_string(o.ranks) + (o.ranks == 1 ? " rank" : " ranks"), *d});
    print_row(stage, rows.back().mode, rows.back().f);
  }
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse_options(argc, argv, o)) return 2;
  if (!make_folder()) return 1;

  std::printf("bench_daemon_latency: zd_forward_begin + zd_forward_end, one module of %lld f32 on the %s device, %d "
              "timed pairs per rank after 1000 warm-up; daemon rows: %d ranks, each its own process, calling at "
              "once; %ld CPUs online\n\n",
              static_cast<long long>(o.numel), o.device.c_str(), o.iters, o.ranks, sysconf(_SC_NPROCESSORS_ONLN));
  std::printf("%-6s %-32s %12s %12s\n", "stage", "mode", "median us", "p99 us");
  std::fflush(stdout);
  bool deepspeed = o.deepspeed;
  for (int stage : {0, 3}) {
    const std::optional<std::vector<Row>> rows = zerod_stage(o, stage);
    std::fflush(stdout);
    if (!rows) {
      stop_daemon();
      remove_folder();
      return 1;
    }
    if (!deepspeed) continue;
    const DeepSpeedRun ds = deepspeed_peer(stage, o.iters, o.numel, o.device, o.python);
    if (ds.error.empty()) {
      print_deepspeed(stage, ds, o.numel, *rows);
    } else {
      std::printf("DeepSpeed: not measured (%s)\n", ds.error.c_str());
      deepspeed = false;  // it would fail again, the same way, at the next stage
    }
    std::fflush(stdout);
  }
  remove_folder();
  return 0;
}
