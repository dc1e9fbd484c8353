#include "node_daemon.h"

#include "error.h"
#include "transport/detail/serve_log_lines.h"
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
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
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

  // The daemon this lock's holder started and where its pid means
  // something, for a later launch to tell whether it still runs
  // (prune_launch).
  void record_daemon(const std::string& record) const {
    if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, record.data(), record.size(), 0);
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
// keeps a log that does not say its daemon started and stopped and nothing
// more (a rank gone, a warning, an error, a daemon killed before its stop
// line) for a week, for the user to read. Launches that share a key (a fixed
// MASTER_PORT, ZEROD_JOB_KEY) share a log name too: such a log is set aside
// as job-<hash>.<when>.log before the next daemon starts on it.
//
// A pid tells whether a daemon runs only in the pid namespace of the kernel
// that started it; the launch directory may be shared with another host
// (XDG_RUNTIME_DIR on NFS, a /tmp bind-mounted into containers on two hosts),
// whose live daemons this host cannot see. So the lock records the kernel's
// boot id and the pid namespace with the pid, and only a launch of this boot
// and namespace is pruned; of any other, at most a log older than a week.

constexpr auto kKeepTelling = std::chrono::hours(24 * 7);
constexpr size_t kStem = 4 + 16;  // "job-" and 16 hex digits

// Where a pid means something: this boot of this kernel, this pid namespace.
struct PidPlace {
  std::string boot_id;
  uint64_t pid_ns = 0;
  bool known() const { return !boot_id.empty() && pid_ns != 0; }
  bool operator==(const PidPlace&) const = default;
};

bool looks_like_boot_id(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || c == '-';
  });
}

PidPlace this_pid_place() {
  PidPlace here;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  if (std::getline(in, here.boot_id) && !looks_like_boot_id(here.boot_id)) here.boot_id.clear();
  struct stat ns {};
  if (::stat("/proc/self/ns/pid", &ns) == 0) here.pid_ns = ns.st_ino;
  return here;
}

// What FileLock::record_daemon writes: "<pid> <boot id> <pid namespace>".
// A starter that cannot tell where it runs records its pid alone, which no
// pruner takes for its own.
std::string daemon_record(pid_t pid, const PidPlace& here) {
  std::string text = std::to_string(pid);
  if (here.known()) text += " " + here.boot_id + " " + std::to_string(here.pid_ns);
  return text + "\n";
}

struct DaemonRecord {
  pid_t pid = 0;
  PidPlace place;
};

// The lock's record; nullopt when it holds none that parses (empty: its
// starter failed before its daemon ran, or is starting it now).
std::optional<DaemonRecord> recorded_daemon(int lock_fd) {
  char text[128] = {};
  const ssize_t n = ::pread(lock_fd, text, sizeof text - 1, 0);
  if (n <= 0) return std::nullopt;
  std::istringstream in(std::string(text, static_cast<size_t>(n)));
  long long pid = 0;
  DaemonRecord r;
  std::string more;
  if (!(in >> pid >> r.place.boot_id >> r.place.pid_ns) || (in >> more) || pid <= 0 ||
      pid > std::numeric_limits<pid_t>::max() || !r.place.known() || !looks_like_boot_id(r.place.boot_id))
    return std::nullopt;
  r.pid = static_cast<pid_t>(pid);
  return r;
}

// Whether `name` has 16 lowercase hex digits (a launch's hash) at `from`.
bool is_hex16(const std::string& name, size_t from) {
  if (name.size() < from + 16) return false;
  const std::string_view digits = std::string_view(name).substr(from, 16);
  return std::all_of(digits.begin(), digits.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// "job-<hash>" when `name` is a launch's lock or log, as node_daemon_socket
// names them (a log outlives its lock when it is kept); "" otherwise.
std::string launch_of(const std::string& name) {
  const std::string suffix = name.size() > kStem ? name.substr(kStem) : "";
  if (name.rfind("job-", 0) != 0 || (suffix != ".lock" && suffix != ".log") || !is_hex16(name, 4)) return "";
  return name.substr(0, kStem);
}

// Whether `name` is a log set aside by set_aside_last_log:
// "job-<hash>.<when>.log", <when> of digits and dashes.
bool is_set_aside_log(const std::string& name) {
  constexpr std::string_view kLog = ".log";
  if (name.rfind("job-", 0) != 0 || !is_hex16(name, 4) || name.size() <= kStem + 1 + kLog.size() ||
      name[kStem] != '.' || !name.ends_with(kLog))
    return false;
  const std::string when = name.substr(kStem + 1, name.size() - kStem - 1 - kLog.size());
  return std::all_of(when.begin(), when.end(), [](char c) { return (c >= '0' && c <= '9') || c == '-'; });
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

// Whether a daemon's log says that it started and stopped and nothing more:
// its start lines, then its stop line (transport/detail/serve_log_lines.h) last. A
// daemon killed (the OOM killer, kill -9, a crash) writes no stop line, and
// an empty log says nothing of how its daemon ended: neither is clean.
bool log_tells_a_clean_end(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const bool started = line.starts_with(serve_log::kListening) || line.starts_with(serve_log::kRanksConnect);
    if (!started && line != serve_log::kStopping) return false;
    last = line;
  }
  return last == serve_log::kStopping;
}

bool older_than(const std::string& path, std::chrono::seconds age) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && std::time(nullptr) - st.st_mtime > age.count();
}

void unlink_if_older_than_a_week(const std::string& path) {
  if (older_than(path, kKeepTelling)) ::unlink(path.c_str());
}

// A launch's files, from base ".../job-<hash>".
struct LaunchFiles {
  explicit LaunchFiles(const std::string& base)
      : lock(base + ".lock"), sock(base + ".sock"), log(base + ".log"), uri(base + ".uri") {}
  std::string lock, sock, log, uri;
};

// A launch of this boot and pid namespace: all of it once its daemon has
// ended, but a log that says more, which stays a week.
void prune_if_ended_here(const LaunchFiles& f, pid_t pid) {
  if (daemon_runs(pid, f.sock) || socket_serves(f.sock)) return;
  if (log_tells_a_clean_end(f.log) || older_than(f.log, kKeepTelling)) ::unlink(f.log.c_str());
  ::unlink(f.sock.c_str());  // a daemon that died without removing it
  ::unlink(f.uri.c_str());   // `zerod join`'s, likewise
  ::unlink(f.lock.c_str());  // last, while held (FileLock opens it again)
}

// A lock that has recorded no daemon for a week: its start failed (no
// daemon ran), or what wrote it was not this code.
void forget_a_week_old_unknown(const LaunchFiles& f) {
  unlink_if_older_than_a_week(f.log);
  if (!socket_serves(f.sock)) {
    ::unlink(f.sock.c_str());
    ::unlink(f.uri.c_str());
  }
  ::unlink(f.lock.c_str());
}

// The launch's lock, opened to be held while its files are judged. One that
// is not there is made (`made` says so): a log kept alone then, whose lock
// went when its launch was pruned; made, so that no rank of a launch
// starting on that key at once finds its new log removed.
int open_lock_to_prune(const std::string& lock, bool& made) {
  int fd = ::open(lock.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  made = fd == -1 && errno == ENOENT;
  if (made) fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  return fd;
}

// base: ".../job-<hash>". Under its lock, taken only if free (a rank of that
// launch starting its daemon holds it).
void prune_launch(const std::string& base, const PidPlace& here) {
  const LaunchFiles f(base);
  bool made = false;
  const int fd = open_lock_to_prune(f.lock, made);
  if (fd == -1) return;
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && is_file_at(fd, f.lock)) {
    if (made) {
      unlink_if_older_than_a_week(f.log);
      ::unlink(f.lock.c_str());
    } else if (const std::optional<DaemonRecord> record = recorded_daemon(fd);
               record && here.known() && record->place == here) {
      prune_if_ended_here(f, record->pid);
    } else if (!record && older_than(f.lock, kKeepTelling)) {
      forget_a_week_old_unknown(f);
    } else {  // another host's, or another pid namespace's: its daemon may run
      unlink_if_older_than_a_week(f.log);
    }
  }
  ::close(fd);
}

// Every other launch's files in `dir` whose daemon has ended, and the logs
// set aside a week ago. Best effort: what cannot be read or removed stays,
// and the launch goes on.
void prune_ended_launches(const std::string& dir, const std::string& own_base, const PidPlace& here) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  std::set<std::string> bases;
  std::vector<std::string> set_aside;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (const std::string launch = launch_of(name); !launch.empty()) bases.insert(dir + "/" + launch);
    if (is_set_aside_log(name)) set_aside.push_back(dir + "/" + name);
  }
  ::closedir(d);
  bases.erase(own_base);
  for (const std::string& base : bases) prune_launch(base, here);
  // Written no more once set aside (only the holder of its launch's lock
  // renames one), so no lock is needed to remove it.
  for (const std::string& log : set_aside) unlink_if_older_than_a_week(log);
}

// "20261129-115802": when, in UTC, for the name of a log set aside.
std::string utc_stamp(time_t when) {
  std::tm t{};
  char text[32] = {};
  if (!::gmtime_r(&when, &t) || std::strftime(text, sizeof text, "%Y%m%d-%H%M%S", &t) == 0) return "0";
  return text;
}

// A launch that reuses the key of one before (torchrun's static rendezvous
// on a fixed --master-port, DeepSpeed's launcher on MASTER_PORT 29500, a
// fixed ZEROD_JOB_KEY) starts its daemon on the same log, which spawn_detached
// truncates: what the one before said (a rank gone) would be lost at once,
// not kept a week. Under the launch's lock, such a log is renamed
// job-<hash>.<when its daemon last wrote>.log first; prune_ended_launches
// removes it a week after. An empty log says nothing to keep.
void set_aside_last_log(const std::string& base) {
  const std::string log = base + ".log";
  struct stat st {};
  if (::lstat(log.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0 || log_tells_a_clean_end(log))
    return;
  const std::string stamp = utc_stamp(st.st_mtime);
  for (int n = 1; n <= 100; ++n) {
    const std::string kept = base + "." + stamp + (n == 1 ? "" : "-" + std::to_string(n)) + ".log";
    struct stat taken {};
    if (::lstat(kept.c_str(), &taken) == 0) continue;  // two daemons' last words in one second
    ::rename(log.c_str(), kept.c_str());
    return;
  }
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
  set_aside_last_log(base);
  const pid_t pid = spawn_detached(argv, log, extra_env);
  const PidPlace here = this_pid_place();
  lock.record_daemon(daemon_record(pid, here));
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
  prune_ended_launches(dir, base, here);
  // Its warnings (a snapshot skipped, a rank gone) go to its log, not to a
  // terminal: say where, once, from the rank that started it.
  std::fprintf(stderr, "zerod: rank %d started this node's daemon (pid %d) for %d ranks; its log: %s\n", r.rank,
               static_cast<int>(pid), r.local_world, log.c_str());
  return sock;
}

}  // namespace zerod::abi
