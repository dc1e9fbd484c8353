#include "node_daemon.h"

#include "error.h"
#include "transport/detail/socket_path.h"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#ifndef ZEROD_LIBDIR_TO_BINDIR
#error "ZEROD_LIBDIR_TO_BINDIR comes from cmake/InstallLayout.cmake (libzerod/CMakeLists.txt)"
#endif

namespace zerod::abi {

namespace {

using Clock = std::chrono::steady_clock;

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// This user's directory for on-demand daemons; refused when it is not a
// directory of this user's alone (another user could otherwise put a socket
// there for our ranks to connect to).
std::string launch_directory() {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  struct stat st {};
  // The socket's path, xdg + "/zerod-launch/job-<16 hex>.sock", must fit
  // sun_path (107 characters and the NUL).
  const bool use_xdg = xdg && xdg[0] == '/' && ::stat(xdg, &st) == 0 && S_ISDIR(st.st_mode) &&
                       ::access(xdg, W_OK | X_OK) == 0 && std::string(xdg).size() <= 68;
  const std::string dir = use_xdg ? std::string(xdg) + "/zerod-launch"
                                  : "/tmp/zerod-launch-" + std::to_string(::getuid());
  if (::mkdir(dir.c_str(), 0700) == -1 && errno != EEXIST)
    fail(ZD_ERR_IO, "creating " + dir + " for the node's zerod daemon: " + errno_text(errno));
  if (::lstat(dir.c_str(), &st) == -1)
    fail(ZD_ERR_IO, "checking " + dir + ": " + errno_text(errno));
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::getuid() || (st.st_mode & 077) != 0)
    fail(ZD_ERR_IO, dir + " must be a directory of this user's alone (mode 0700) to hold the node's zerod daemon "
                          "socket; it is not (another user's, or open to others): remove it, or set "
                          "XDG_RUNTIME_DIR");
  return dir;
}

// A file this user may run. A folder is searchable with X_OK too: beside
// libzerod, <libdir>/zerod is the plugins' folder, which was taken for the
// program ("could not start the node's daemon .../lib/zerod: Permission
// denied") instead of going on to PATH.
bool executable(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// `name` in a directory of PATH, or "" when none has it.
std::string on_path(const std::string& name) {
  if (const char* path = std::getenv("PATH")) {
    std::stringstream ss(path);
    std::string d;
    while (std::getline(ss, d, ':'))
      if (!d.empty() && executable(d + "/" + name)) return d + "/" + name;
  }
  return "";
}

// The zerod executable: ZEROD_DAEMON; else beside this libzerod (<libdir>/
// ZEROD_LIBDIR_TO_BINDIR, as installed and in the build tree: ../bin from
// lib or lib64, ../../bin from lib/<multiarch>); else on PATH.
std::string daemon_program() {
  if (const char* e = std::getenv("ZEROD_DAEMON"); e && *e) {
    if (!executable(e)) fail(ZD_ERR_CONFIG, std::string("ZEROD_DAEMON=") + e + " is not an executable");
    return e;
  }
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&node_daemon_socket), &info) && info.dli_fname) {
    std::string lib = info.dli_fname;
    const std::string dir = lib.find('/') == std::string::npos ? "." : lib.substr(0, lib.rfind('/'));
    for (const std::string& p : {dir + "/" ZEROD_LIBDIR_TO_BINDIR "/zerod", dir + "/zerod"})
      if (executable(p)) return p;
  }
  if (std::string p = on_path("zerod"); !p.empty()) return p;
  fail(ZD_ERR_CONFIG, "cannot find the zerod executable to start this node's daemon: not beside libzerod, not on "
                      "PATH; set ZEROD_DAEMON=/path/to/zerod");
}

// Whether the open file `fd` is the one at `path` now (not one unlinked
// since it was opened).
bool is_file_at(int fd, const std::string& path) {
  struct stat held {}, named {};
  return ::fstat(fd, &held) == 0 && ::lstat(path.c_str(), &named) == 0 && held.st_dev == named.st_dev &&
         held.st_ino == named.st_ino;
}

// An exclusive flock on `path`, given up after the deadline. The file it
// holds is the one at `path`: a launch's lock that another launch's rank
// removed (prune_ended_launches) while this one waited for it is opened
// again, so that no two ranks of a launch each hold a lock of their own.
class FileLock {
 public:
  FileLock(const std::string& path, Clock::time_point deadline) {
    do {
      if (fd_ != -1) ::close(fd_);
      fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
      if (fd_ == -1) fail(ZD_ERR_IO, "opening " + path + ": " + errno_text(errno));
      wait_for(path, deadline);
    } while (!is_file_at(fd_, path));
  }
  ~FileLock() { ::close(fd_); }  // unlocks
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

  // The daemon this lock's holder started, for a later launch to tell
  // whether it still runs (daemon_runs).
  void record_daemon(pid_t pid) const {
    const std::string text = std::to_string(pid) + "\n";
    if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, text.data(), text.size(), 0);
  }

 private:
  void wait_for(const std::string& path, Clock::time_point deadline) {
    while (::flock(fd_, LOCK_EX | LOCK_NB) == -1) {
      if (errno != EWOULDBLOCK && errno != EINTR) {
        const int err = errno;
        ::close(fd_);
        fail(ZD_ERR_IO, "locking " + path + ": " + errno_text(err));
      }
      if (Clock::now() > deadline) {
        ::close(fd_);
        fail(ZD_ERR_TIMEOUT, "another rank of this launch held " + path + " (it starts the node's daemon) too long");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  int fd_ = -1;
};

// Whether process `pid` has ended: gone, or a zombie its parent (init, for
// a detached daemon) has not reaped yet.
bool ended(pid_t pid) {
  if (::kill(pid, 0) == -1 && errno == ESRCH) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;  // no /proc here, or it just went: kill() says so next time
  // "pid (comm) S ...": the state follows the last ')' (comm may hold one).
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
}

// Stops a daemon that did not serve in time, giving it a moment to end and
// say why in its log (`zerod join` prints what it was waiting for when
// stopped).
void stop_and_wait(pid_t pid, std::chrono::milliseconds grace) {
  ::kill(pid, SIGTERM);
  const auto until = Clock::now() + grace;
  while (!ended(pid) && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

std::string tail_of(const std::string& path, size_t max_bytes = 4000) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() > max_bytes) text = "..." + text.substr(text.size() - max_bytes);
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

// --- the files of launches that ended -----------------------------------------
//
// Every launch has a key of its own (torchrun's run id and port, a PMIx
// namespace...), so each leaves a job-<hash>.lock and .log behind (its
// daemon removes only its socket). The rank that starts the next daemon
// removes those of launches whose daemon has ended, each under its lock, and
// keeps a log that says more than that the daemon started and stopped (a
// rank gone, a warning, an error) for a week, for the user to read.

constexpr auto kKeepTelling = std::chrono::hours(24 * 7);

// "job-<hash>" when `name` is a launch's lock or log, as node_daemon_socket
// names them (a log outlives its lock when it is kept); "" otherwise.
std::string launch_of(const std::string& name) {
  constexpr size_t kStem = 4 + 16;  // "job-" and 16 hex digits
  const std::string suffix = name.size() > kStem ? name.substr(kStem) : "";
  if (name.rfind("job-", 0) != 0 || (suffix != ".lock" && suffix != ".log")) return "";
  const bool hex = std::all_of(name.begin() + 4, name.begin() + kStem,
                               [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
  return hex ? name.substr(0, kStem) : "";
}

// The pid the launch's starter recorded in its lock (FileLock::record_daemon);
// 0 when none was.
pid_t recorded_daemon(int lock_fd) {
  char text[32] = {};
  const ssize_t n = ::pread(lock_fd, text, sizeof text - 1, 0);
  if (n <= 0) return 0;
  return static_cast<pid_t>(std::strtol(text, nullptr, 10));
}

// Whether the launch's daemon still runs: its pid has not ended and is still
// the program started for that socket (every command line node_daemon_socket
// starts names it), not another that took the pid since.
bool daemon_runs(pid_t pid, const std::string& sock) {
  if (pid <= 0 || ended(pid)) return false;
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  if (!in) return true;  // cannot tell: as if it ran
  const std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return cmdline.find(sock) != std::string::npos;
}

bool socket_serves(const std::string& sock) {
  try {
    return transport::detail::socket_is_live(sock);
  } catch (const Error&) {
    return true;  // cannot tell: as if it served
  }
}

// Whether a daemon's log holds only what one that ended well writes: its
// start lines and its stop line.
bool log_says_nothing_more(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const bool quiet = line.rfind("zerod serve: listening on ", 0) == 0 ||
                       line.rfind("  ranks connect with ", 0) == 0 ||
                       line == "zerod serve: every rank has left; stopping";
    if (!quiet) return false;
  }
  return true;
}

bool older_than(const std::string& path, std::chrono::seconds age) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && std::time(nullptr) - st.st_mtime > age.count();
}

// base: ".../job-<hash>". Under its lock, taken only if free (a rank of that
// launch starting its daemon holds it); made for a log kept alone.
void prune_if_ended(const std::string& base) {
  const std::string lock = base + ".lock", sock = base + ".sock", log = base + ".log";
  const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd == -1) return;
  const bool held = ::flock(fd, LOCK_EX | LOCK_NB) == 0 && is_file_at(fd, lock);
  if (held && !daemon_runs(recorded_daemon(fd), sock) && !socket_serves(sock)) {
    if (log_says_nothing_more(log) || older_than(log, kKeepTelling)) ::unlink(log.c_str());
    ::unlink(sock.c_str());             // a daemon that died without removing it
    ::unlink((base + ".uri").c_str());  // `zerod join`'s, likewise
    ::unlink(lock.c_str());             // last, while held (FileLock opens it again)
  }
  ::close(fd);
}

// Every other launch's files in `dir` whose daemon has ended. Best effort:
// what cannot be read or removed stays, and the launch goes on.
void prune_ended_launches(const std::string& dir, const std::string& own_base) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  std::set<std::string> bases;
  while (const dirent* e = ::readdir(d))
    if (const std::string launch = launch_of(e->d_name); !launch.empty()) bases.insert(dir + "/" + launch);
  ::closedir(d);
  bases.erase(own_base);
  for (const std::string& base : bases) prune_if_ended(base);
}

// Starts `argv` as a daemon of its own session (no launcher's signal to the
// ranks' process group reaches it; init reaps it), output into `log`.
// Returns its pid once it runs the program.
pid_t spawn_detached(const std::vector<std::string>& argv, const std::string& log,
                     const std::vector<std::string>& extra_env = {}) {
  // The environment is built here, before the fork: after it only
  // async-signal-safe calls are allowed, and setenv in the trainer would
  // race its other threads.
  std::vector<std::string> env_text(extra_env);
  for (char** e = environ; *e; ++e) env_text.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) == -1) fail(ZD_ERR_IO, "pipe for the node's daemon: " + errno_text(errno));
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t first = ::fork();
  if (first == -1) {
    const int err = errno;
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    fail(ZD_ERR_IO, "fork for the node's daemon: " + errno_text(err));
  }
  if (first == 0) {  // only async-signal-safe calls from here on
    ::setsid();
    const pid_t second = ::fork();
    if (second != 0) ::_exit(second == -1 ? 1 : 0);
    const pid_t self = ::getpid();
    (void)!::write(pipefd[1], &self, sizeof self);
    const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0600);
    const int in = ::open("/dev/null", O_RDONLY);
    if (out >= 0) {
      ::dup2(out, 1);
      ::dup2(out, 2);
    }
    if (in >= 0) ::dup2(in, 0);
    // Nothing of the rank's but the pipe (close-on-exec) goes with it: a
    // socket or file of the trainer kept open by the daemon would outlive it.
    for (int fd = 3; fd < 1024; ++fd)
      if (fd != pipefd[1]) ::close(fd);
    ::execve(args[0], args.data(), envp.data());
    const int err = -errno;
    (void)!::write(pipefd[1], &err, sizeof err);
    ::_exit(127);
  }
  ::close(pipefd[1]);
  int status = 0;
  while (::waitpid(first, &status, 0) == -1 && errno == EINTR) {
  }
  pid_t pid = 0;
  int exec_error = 0;
  const bool got_pid = ::read(pipefd[0], &pid, sizeof pid) == sizeof pid;
  const bool exec_failed = got_pid && ::read(pipefd[0], &exec_error, sizeof exec_error) == sizeof exec_error;
  ::close(pipefd[0]);
  if (!got_pid) fail(ZD_ERR_IO, "could not start the node's daemon (" + argv[0] + "): fork failed");
  if (exec_failed) fail(ZD_ERR_IO, "could not start the node's daemon " + argv[0] + ": " + errno_text(-exec_error));
  return pid;
}

// The program that starts a node's daemon for a job of several nodes:
// ZEROD_MPIRUN, else mpirun on PATH.
std::string mpirun_program() {
  if (const char* e = std::getenv("ZEROD_MPIRUN"); e && *e) {
    if (!executable(e)) fail(ZD_ERR_CONFIG, std::string("ZEROD_MPIRUN=") + e + " is not an executable");
    return e;
  }
  if (std::string p = on_path("mpirun"); !p.empty()) return p;
  fail(ZD_ERR_CONFIG, "the ranks of this job are on several nodes, whose daemons join through MPI, but mpirun is "
                      "not on PATH; install Open MPI or set ZEROD_MPIRUN=/path/to/mpirun");
}

// Where node 0's `zerod join` serves the name server's URI to the other
// nodes: ZEROD_RENDEZVOUS, else the launcher's MASTER_ADDR (node 0's host,
// which every node of torchrun, accelerate launch and Lightning knows) at
// MASTER_PORT + 1 (MASTER_PORT itself is the launcher's own store).
std::string rendezvous_address(const LauncherRanks& r) {
  if (const char* e = std::getenv("ZEROD_RENDEZVOUS"); e && *e) return e;
  const char* addr = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  char* end = nullptr;
  const long p = port ? std::strtol(port, &end, 10) : 0;
  if (addr && *addr && port && *end == 0 && p > 0 && p < 65535)
    return std::string(addr) + ":" + std::to_string(p + 1);
  fail(ZD_ERR_CONFIG, r.launcher + " started this process as rank " + std::to_string(r.rank) + " of " +
                          std::to_string(r.world) + " (" + r.where + "), with " + std::to_string(r.local_world) +
                          " of them on this node: the nodes' daemons join through an Open MPI name server, which "
                          "node 0 starts and hands to the others over TCP at MASTER_ADDR:MASTER_PORT+1, but "
                          "MASTER_ADDR and MASTER_PORT are not both set. Set ZEROD_RENDEZVOUS=<node 0's "
                          "host>:<a free port> in every rank, or ZEROD_OMPI_SERVER=file:/shared/uri naming an "
                          "`ompi-server --report-uri /shared/uri` of your own, or run one `zerod run --nproc " +
                          std::to_string(r.local_world) +
                          " --job job.lua -- <command>` per node under mpirun or srun (docs/multinode.md)");
}

}  // namespace

NodePlace node_place(const LauncherRanks& r) {
  NodePlace p;
  const std::string who = r.launcher + " (" + r.where + ")";
  if (r.local_world <= 0 || r.world % r.local_world != 0)
    fail(ZD_ERR_CONFIG, who + ": the job's " + std::to_string(r.world) + " ranks are not whole nodes of " +
                            std::to_string(r.local_world) + "; every node must run the same number of ranks");
  p.nodes = r.world / r.local_world;
  if (r.node < 0)
    fail(ZD_ERR_CONFIG, who + " does not say which node this is; set ZEROD_NODE_RANK (0.." +
                            std::to_string(p.nodes - 1) + ") in each node's ranks");
  p.node = r.node;
  if (p.node >= p.nodes || r.rank / r.local_world != p.node || r.rank % r.local_world != r.local_rank)
    fail(ZD_ERR_CONFIG, who + ", node " + std::to_string(p.node) + " of " + std::to_string(p.nodes) +
                            ": ranks must be numbered node by node (node k runs ranks k*" +
                            std::to_string(r.local_world) + " .. k*" + std::to_string(r.local_world) + "+" +
                            std::to_string(r.local_world - 1) + ", local rank = rank - k*" +
                            std::to_string(r.local_world) + ")");
  return p;
}

std::string node_daemon_socket(const LauncherRanks& r, const std::string& job, int timeout_ms) {
  // 0: the default connect timeout, for the daemons' MPI join below too
  // (taken as 0 there, it gave the other nodes 1 s to start their daemons).
  if (timeout_ms <= 0) timeout_ms = 30000;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  const std::string dir = launch_directory();
  const bool several = r.world != r.local_world;
  const char* ompi_server = std::getenv("ZEROD_OMPI_SERVER");
  const bool own_server = several && (!ompi_server || !*ompi_server);
  const std::string rendezvous = own_server ? rendezvous_address(r) : std::string();
  const NodePlace place = several ? node_place(r) : NodePlace{};
  // Several nodes of one job may share a machine (tests do): one daemon each.
  const std::string key = several ? r.job_key + "node=" + std::to_string(place.node) + ";" : r.job_key;
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(fnv1a(key)));
  const std::string base = dir + "/job-" + hash;
  const std::string sock = base + ".sock", log = base + ".log";
  // Whoever holds the lock starts the daemon; the others find it serving.
  const FileLock lock(base + ".lock", deadline);
  if (transport::detail::socket_is_live(sock)) return sock;
  std::vector<std::string> argv, extra_env;
  if (several) {
    // The same name on every node of the launch (not this node's hash).
    char job_hash[17];
    std::snprintf(job_hash, sizeof job_hash, "%016llx", static_cast<unsigned long long>(fnv1a(r.job_key)));
    const std::string timeout = std::to_string(std::max(1, timeout_ms / 1000));
    extra_env.push_back("ZEROD_MPI_JOIN=zerod-" + std::string(job_hash) + "," + std::to_string(place.node) + "," +
                        std::to_string(place.nodes) + "," + timeout);
    // `zerod join` gives up on node 0's rendezvous before this rank gives up
    // on the daemon, so that its reason (node 0 never answered, and where it
    // looked) is in the log this rank's error quotes.
    const std::string fetch_timeout = std::to_string(std::max<int64_t>(1, int64_t{timeout_ms} * 3 / 4000));
    if (own_server)  // node 0's daemon starts one; the others fetch its URI (daemon/cli/join_command.cpp)
      argv = {daemon_program(), "join", "--node", std::to_string(place.node), "--nnodes", std::to_string(place.nodes),
              "--rendezvous", rendezvous, "--name", "zerod-" + std::string(job_hash), "--uri-file", base + ".uri",
              "--timeout", fetch_timeout, "--"};
    for (const std::string& a : {mpirun_program(), std::string("-np"), std::string("1"),
                                 std::string("--ompi-server"),
                                 own_server ? "file:" + base + ".uri" : std::string(ompi_server)})
      argv.push_back(a);
  }
  for (const std::string& a : {daemon_program(), std::string("serve"), std::string("--until-done"),
                               std::string("--nproc"), std::to_string(r.local_world), std::string("--nnodes"),
                               std::to_string(place.nodes), std::string("--node-rank"), std::to_string(place.node),
                               std::string("--job"), job, std::string("--socket"), sock})
    argv.push_back(a);
  const pid_t pid = spawn_detached(argv, log, extra_env);
  lock.record_daemon(pid);
  while (!transport::detail::socket_is_live(sock)) {
    if (ended(pid))
      fail(ZD_ERR_CONFIG, "the node's zerod daemon (started by rank " + std::to_string(r.rank) + ": " + argv[0] +
                              (several ? " ... zerod" : "") + " serve --job " + job + ") exited before it served:\n" +
                              tail_of(log));
    if (Clock::now() > deadline) {
      stop_and_wait(pid, std::chrono::seconds(3));
      fail(ZD_ERR_TIMEOUT, "the node's zerod daemon did not serve " + sock + " in time; its output (" + log +
                               "):\n" + tail_of(log));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  prune_ended_launches(dir, base);
  // Its warnings (a snapshot skipped, a rank gone) go to its log, not to a
  // terminal: say where, once, from the rank that started it.
  std::fprintf(stderr, "zerod: rank %d started this node's daemon (pid %d) for %d ranks; its log: %s\n", r.rank,
               static_cast<int>(pid), r.local_world, log.c_str());
  return sock;
}

}  // namespace zerod::abi
