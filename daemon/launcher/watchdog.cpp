#include "launcher/watchdog.h"

#include "error.h"
#include "log.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>

#ifndef SYS_close_range
#define SYS_close_range 436
#endif

namespace zerod::launch {

namespace {

// --- what zerod and the ranks tell the watchdog ------------------------------

enum Kind : std::uint32_t {
  kGroup = 1,      // a rank's process group: pid
  kRemoveDir,      // dir, when zerod dies
  kRemoveEntries,  // dir's entries whose names begin with prefix, when zerod dies
  kDone,           // zerod ends normally: exit, touch nothing
};

struct Header {
  std::uint32_t kind;
  std::int32_t pid;
};

constexpr size_t kMaxDir = 4096;
constexpr size_t kMaxPrefix = 256;

struct Message {
  Header h;
  char dir[kMaxDir];
  char prefix[kMaxPrefix];
};

// A send that waits longer than this for a watchdog that does not read is
// given up (a rank registering itself must not hang its spawn).
constexpr int kSendTimeoutMs = 2000;
// The watchdog kills the groups this many times, this far apart, or until
// they are gone. Once would do (since Linux 4.19 a fork that a group-wide
// signal meets is undone), but an older kernel may let a process forking at
// that moment leave a child the first kill did not see. A group whose
// processes have died stays "alive" to kill(2) until their zombies are
// reaped, which is not ours to do: hence a count, not "until empty".
constexpr int kKillPasses = 5;
constexpr int kKillEveryMs = 20;
// A rank per group; with restarts of a supervised job, N per restart.
constexpr int kMaxGroups = 8192;
constexpr int kMaxRemovals = 16;
// Directories below the one removed, as deep as the watchdog goes.
constexpr int kMaxDepth = 8;

// --- the watchdog process: system calls only ----------------------------------
//
// Everything below up to the class runs in the forked child, which may be a
// copy of a multithreaded process: no allocation, no locks, no stdio.

struct Group {
  pid_t pgid;
  unsigned long long start;  // the leader's start time at registration; 0: it was gone
};

struct Removal {
  bool whole;
  char dir[kMaxDir];
  char prefix[kMaxPrefix];
};

Group g_groups[kMaxGroups];
int g_group_count = 0;
Removal g_removals[kMaxRemovals];
int g_removal_count = 0;

bool starts_with(const char* s, const char* prefix) {
  for (; *prefix; ++s, ++prefix)
    if (*s != *prefix) return false;
  return true;
}

// A bounded text buffer for the one line the watchdog writes.
struct Line {
  char buf[kMaxDir + 512];
  size_t n = 0;
  void add(const char* s) {
    for (; *s && n + 1 < sizeof buf; ++s) buf[n++] = *s;
  }
  void add(unsigned long long v) {
    char digits[24];
    int k = 0;
    do {
      digits[k++] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v);
    while (k && n + 1 < sizeof buf) buf[n++] = digits[--k];
  }
  void write_to(int fd) {
    size_t done = 0;
    while (done < n) {
      const ssize_t w = ::write(fd, buf + done, n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return;
      done += static_cast<size_t>(w);
    }
  }
};

// Field 22 of /proc/<pid>/stat, the process's start time in clock ticks
// since boot; false when there is no such process.
bool start_time(pid_t pid, unsigned long long* out) {
  Line path;
  path.add("/proc/");
  path.add(static_cast<unsigned long long>(pid));
  path.add("/stat");
  path.buf[path.n] = '\0';
  const int fd = ::open(path.buf, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[1024];
  size_t have = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf + have, sizeof buf - 1 - have);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    have += static_cast<size_t>(n);
    if (have == sizeof buf - 1) break;
  }
  ::close(fd);
  buf[have] = '\0';
  // The name (field 2) is in parentheses and may hold anything: count the
  // fields from the last ')'.
  char* at = nullptr;
  for (char* c = buf; *c; ++c)
    if (*c == ')') at = c;
  if (!at) return false;
  int field = 2;
  for (char* c = at + 1; *c; ++c) {
    if (*c != ' ') continue;
    ++field;
    if (field == 22) {
      unsigned long long v = 0;
      for (++c; *c >= '0' && *c <= '9'; ++c) v = v * 10 + static_cast<unsigned>(*c - '0');
      *out = v;
      return true;
    }
  }
  return false;
}

// Whether signalling -pgid reaches our rank's group: the leader is gone (a
// member of ours then holds the id, or the group is empty and the kill
// finds nobody), or it is the very process that registered.
bool still_ours(const Group& g) {
  unsigned long long now = 0;
  if (!start_time(g.pgid, &now)) return true;
  return g.start != 0 && now == g.start;
}

bool group_alive(pid_t pgid) { return ::kill(-pgid, 0) == 0 || errno == EPERM; }

void add_group(pid_t pid) {
  if (pid <= 0) return;
  for (int i = 0; i < g_group_count; ++i)
    if (g_groups[i].pgid == pid) return;
  if (g_group_count == kMaxGroups) {
    // Forget the groups that have ended (restarts of a long supervised job).
    int kept = 0;
    for (int i = 0; i < g_group_count; ++i)
      if (group_alive(g_groups[i].pgid)) g_groups[kept++] = g_groups[i];
    g_group_count = kept;
    if (g_group_count == kMaxGroups) return;
  }
  Group& g = g_groups[g_group_count++];
  g.pgid = pid;
  g.start = 0;
  if (!start_time(pid, &g.start)) g.start = 0;
}

void add_removal(const Message& m, bool whole) {
  if (g_removal_count == kMaxRemovals || m.dir[0] != '/') return;
  Removal& r = g_removals[g_removal_count++];
  r.whole = whole;
  std::memcpy(r.dir, m.dir, kMaxDir);
  r.dir[kMaxDir - 1] = '\0';
  std::memcpy(r.prefix, m.prefix, kMaxPrefix);
  r.prefix[kMaxPrefix - 1] = '\0';
}

struct Dirent64 {
  std::uint64_t d_ino;
  std::int64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[1];
};

void clear_directory(int fd, const char* prefix, int depth);

// unlink, or for a directory, empty it and rmdir.
void remove_at(int parent, const char* name, int depth) {
  if (::unlinkat(parent, name, 0) == 0 || errno == ENOENT) return;
  if (errno != EISDIR && errno != EPERM) return;
  if (depth < kMaxDepth) {
    const int fd = ::openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
      clear_directory(fd, "", depth + 1);
      ::close(fd);
    }
  }
  ::unlinkat(parent, name, AT_REMOVEDIR);
}

// Removes the entries of the directory `fd` whose names begin with `prefix`.
// Entries removed while reading can make the reading skip others: read
// again until a pass removes nothing.
void clear_directory(int fd, const char* prefix, int depth) {
  alignas(8) char buf[4096];
  for (int pass = 0; pass < 8; ++pass) {
    if (::lseek(fd, 0, SEEK_SET) == -1) return;
    bool removed = false;
    for (;;) {
      const long n = ::syscall(SYS_getdents64, fd, buf, sizeof buf);
      if (n <= 0) break;
      for (long off = 0; off < n;) {
        const Dirent64* d = reinterpret_cast<const Dirent64*>(buf + off);
        off += d->d_reclen;
        const char* name = d->d_name;
        if (!std::strcmp(name, ".") || !std::strcmp(name, "..")) continue;
        if (!starts_with(name, prefix)) continue;
        remove_at(fd, name, depth);
        removed = true;
      }
    }
    if (!removed) return;
  }
}

void sleep_ms(int ms) {
  timespec t{ms / 1000, (ms % 1000) * 1000000L};
  while (::nanosleep(&t, &t) == -1 && errno == EINTR) {
  }
}

// zerod is gone without a goodbye: kill what its ranks left, remove its files.
[[noreturn]] void clean_up_after(pid_t zerod) {
  int reached = 0;  // groups that still had a process in them
  for (int i = 0; i < g_group_count; ++i)
    if (still_ours(g_groups[i]) && group_alive(g_groups[i].pgid)) ++reached;
  for (int pass = 0; pass < kKillPasses; ++pass) {
    if (pass > 0) sleep_ms(kKillEveryMs);
    bool any = false;
    for (int i = 0; i < g_group_count; ++i) {
      const Group& g = g_groups[i];
      if (!still_ours(g)) continue;
      if (::kill(-g.pgid, SIGKILL) == 0) any = true;
    }
    if (!any) break;
  }
  for (int i = 0; i < g_removal_count; ++i) {
    const Removal& r = g_removals[i];
    if (r.whole) {
      remove_at(AT_FDCWD, r.dir, 0);
    } else {
      const int fd = ::open(r.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (fd >= 0) {
        clear_directory(fd, r.prefix, 0);
        ::close(fd);
      }
    }
  }
  if (reached > 0 || g_removal_count > 0) {
    Line line;
    line.add("zerod: the launcher (pid ");
    line.add(static_cast<unsigned long long>(zerod));
    line.add(") ended without cleaning up; its watchdog");
    if (reached > 0) {
      line.add(" sent SIGKILL to what its ranks left running (");
      line.add(static_cast<unsigned long long>(reached));
      line.add(reached == 1 ? " process group)" : " process groups)");
    }
    for (int i = 0; i < g_removal_count; ++i) {
      const Removal& r = g_removals[i];
      line.add(i == 0 ? (reached > 0 ? " and removed " : " removed ") : ", ");
      line.add(r.dir);
      if (!r.whole) {
        line.add("/");
        line.add(r.prefix);
        line.add("*");
      }
    }
    line.add("\n");
    line.write_to(STDERR_FILENO);
  }
  ::_exit(0);
}

// Ignored in the watchdog: the ways zerod is stopped must not stop it first.
bool ignored_here(int sig) {
  return sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT || sig == SIGPIPE;
}

[[noreturn]] void watchdog_main(int sock, pid_t zerod) {
  // Its own group: a signal to zerod's group (a terminal's Ctrl-C,
  // `timeout -s KILL`) does not reach it.
  ::setpgid(0, 0);
  ::prctl(PR_SET_NAME, "zerod-watchdog", 0, 0, 0);

  // Its socket at 3, stdin and stdout /dev/null, stderr kept for its one
  // line, everything else of zerod's closed.
  int s = ::fcntl(sock, F_DUPFD_CLOEXEC, 3);
  if (s < 0) ::_exit(1);
  if (s != 3) {
    if (::dup3(s, 3, O_CLOEXEC) < 0) ::_exit(1);
    s = 3;
  }
  const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null >= 0) {
    if (null != 0) ::dup2(null, 0);
    if (null != 1) ::dup2(null, 1);
  }
  if (::syscall(SYS_close_range, 4U, ~0U, 0U) == -1) {
    rlimit lim{};
    const rlim_t top = ::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < 65536 ? lim.rlim_cur : 65536;
    for (rlim_t fd = 4; fd < top; ++fd) ::close(static_cast<int>(fd));
  }

  // No handler of zerod's may run here; then unblock (the forking thread
  // may have blocked everything, as the launcher's supervisor does).
  struct sigaction act;
  std::memset(&act, 0, sizeof act);
  sigemptyset(&act.sa_mask);
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    struct sigaction old;
    if (::sigaction(sig, nullptr, &old) == -1) continue;
    if (ignored_here(sig)) {
      act.sa_handler = SIG_IGN;
      ::sigaction(sig, &act, nullptr);
    } else if ((old.sa_flags & SA_SIGINFO) || (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN)) {
      act.sa_handler = SIG_DFL;
      ::sigaction(sig, &act, nullptr);
    }
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);

  static Message m;
  for (;;) {
    const ssize_t n = ::recv(s, &m, sizeof m, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) clean_up_after(zerod);  // end of file: zerod is gone
    if (static_cast<size_t>(n) < sizeof(Header)) continue;
    switch (m.h.kind) {
      case kGroup: add_group(m.h.pid); break;
      case kRemoveDir:
      case kRemoveEntries:
        if (static_cast<size_t>(n) == sizeof m) add_removal(m, m.h.kind == kRemoveDir);
        break;
      case kDone: ::_exit(0);
      default: break;
    }
  }
}

}  // namespace

// --- zerod's side ---------------------------------------------------------------

Watchdog::Watchdog() {
  int sv[2];
  ZD_CHECK_SYS(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv),
               "launcher: cannot create the watchdog's socket");
  detail::UniqueFd ours(sv[0]);
  detail::UniqueFd theirs(sv[1]);
  // Sends wait at most this long for a watchdog that does not read: the
  // ranks' children send on this very socket (the option is the socket's,
  // shared with them).
  const timeval limit{kSendTimeoutMs / 1000, (kSendTimeoutMs % 1000) * 1000};
  ::setsockopt(ours.get(), SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
  const pid_t zerod = ::getpid();
  const pid_t pid = ::fork();
  ZD_CHECK_SYS(pid, "launcher: cannot fork the watchdog");
  if (pid == 0) {
    ::close(ours.get());
    watchdog_main(theirs.get(), zerod);
  }
  pid_ = pid;
  socket_ = std::move(ours);
  log_debug("launcher: watchdog is pid " + std::to_string(pid));
}

Watchdog::~Watchdog() {
  const Header done{kDone, 0};
  ::send(socket_.get(), &done, sizeof done, MSG_NOSIGNAL);
  socket_.reset();
  int status = 0;
  while (::waitpid(pid_, &status, 0) == -1 && errno == EINTR) {
  }
}

void Watchdog::send_path(int kind, const std::string& dir, const std::string& prefix) {
  if (dir.empty() || dir[0] != '/' || dir.size() >= kMaxDir || prefix.size() >= kMaxPrefix) {
    log_warn("launcher: the watchdog cannot be told of '" + dir + "'; it is left behind if zerod dies");
    return;
  }
  auto m = std::make_unique<Message>();  // zeroed
  m->h.kind = static_cast<std::uint32_t>(kind);
  std::memcpy(m->dir, dir.data(), dir.size());
  std::memcpy(m->prefix, prefix.data(), prefix.size());
  if (::send(socket_.get(), m.get(), sizeof *m, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof *m))
    log_warn("launcher: cannot tell the watchdog of " + dir + ": " + errno_text(errno));
}

void Watchdog::remove_directory_on_death(const std::string& dir) { send_path(kRemoveDir, dir, ""); }

void Watchdog::remove_entries_on_death(const std::string& dir, const std::string& prefix) {
  if (prefix.empty()) return;  // never everything in a directory of the user's
  send_path(kRemoveEntries, dir, prefix);
}

void register_rank_group(int watchdog_fd) {
  if (watchdog_fd < 0) return;
  const Header h{kGroup, static_cast<std::int32_t>(::getpid())};
  const ssize_t n = ::send(watchdog_fd, &h, sizeof h, MSG_NOSIGNAL);
  (void)n;
}

std::string new_run_id() {
  unsigned char bytes[8] = {};
  size_t have = 0;
  while (have < sizeof bytes) {
    const ssize_t n = ::getrandom(bytes + have, sizeof bytes - have, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    have += static_cast<size_t>(n);
  }
  std::uint64_t v = 0;
  for (unsigned char b : bytes) v = (v << 8) | b;
  if (have < sizeof bytes) {  // no getrandom: the pid and the clock
    v ^= static_cast<std::uint64_t>(::getpid()) << 40;
    v ^= static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }
  static const char hex[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) out[static_cast<size_t>(i)] = hex[v & 15];
  return out;
}

std::string run_file_prefix(const std::string& run_id) { return "zerod-run-" + run_id + "-"; }

void remove_entries(const std::string& dir, const std::string& prefix) {
  if (dir.empty() || prefix.empty()) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    std::error_code rm;
    fs::remove_all(it->path(), rm);
    if (rm) log_warn("zerod run: cannot remove " + it->path().string() + ": " + rm.message());
  }
}

}  // namespace zerod::launch
