#include "launcher/launcher.h"

#include "error.h"
#include "launcher/detail/line_buffer.h"
#include "launcher/detail/spawn.h"
#include "launcher/detail/unique_fd.h"
#include "launcher/watchdog.h"
#include "log.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <sstream>
#include <string_view>
#include <system_error>
#include <thread>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace zerod::launch {

namespace {

using Clock = std::chrono::steady_clock;
using detail::LineBuffer;
using detail::UniqueFd;

// One read from a rank's pipe; ranks take turns per poll() round.
constexpr size_t kReadChunk = 64 * 1024;
// Read from a rank's pipe after the rank has been reaped. What the rank wrote
// is in the pipe already; more can come only from a process it left behind
// holding the pipe, and that one is not waited for.
constexpr size_t kDrainLimit = size_t{4} << 20;
// Without pidfds (Linux < 5.3 or a seccomp filter): how often to look for ranks that ended.
constexpr int kReapPollMs = 20;

const char* const kRankVariables[] = {"ZEROD_RANK", "ZEROD_LOCAL_RANK", "ZEROD_WORLD_SIZE",
                                      "ZEROD_LOCAL_WORLD_SIZE"};

int pidfd_open(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

// A rank leads its own process group, so this reaches whatever it started too.
void signal_group(pid_t pid, int sig) {
  if (::kill(-pid, sig) == -1 && errno == ESRCH) ::kill(pid, sig);
}

// Our stdout or stderr, as the ranks' output goes to it.
struct Sink {
  int fd = -1;
  bool broken = false;

  void write_all(std::string_view data) {
    size_t done = 0;
    while (!broken && done < data.size()) {
      const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
      if (n >= 0) {
        done += static_cast<size_t>(n);
        continue;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {  // someone made our stdout non-blocking
        pollfd p{fd, POLLOUT, 0};
        ::poll(&p, 1, 100);
        continue;
      }
      const int err = errno;
      broken = true;
      if (err == EPIPE) {
        // SIGPIPE is blocked on this thread and now pending on it: take it.
        sigset_t pipe_only;
        sigemptyset(&pipe_only);
        sigaddset(&pipe_only, SIGPIPE);
        const timespec now{0, 0};
        ::sigtimedwait(&pipe_only, nullptr, &now);
      }
      log_warn("launcher: cannot write the ranks' output to fd " + std::to_string(fd) + ": " +
               errno_text(err) + "; it is dropped from now on, the ranks keep running");
    }
  }
};

// One rank, as the supervisor thread sees it. pid, reaped and stop_sent are
// written by the supervisor thread under State::mu and read by any thread
// under it; the rest belongs to the supervisor thread alone.
struct RankSlot {
  pid_t pid = 0;
  bool reaped = false;
  bool stop_sent = false;  // sent a signal that stops() it: no SIGTERM on top
  bool signal_sent = false;  // the launcher signalled it (a forwarded signal, a stop)

  UniqueFd pidfd;
  UniqueFd out, err;  // read ends of the rank's stdout and stderr pipes
  LineBuffer out_lines, err_lines;
  Clock::time_point started;
  std::string spawn_error;
  RankExit exit;
};

// A rank sent one of these is on its way out, maybe cleaning up: a failure
// elsewhere does not send it SIGTERM on top (only SIGKILL after the grace).
bool stops(int sig) {
  return sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT || sig == SIGKILL;
}

}  // namespace

struct Launcher::State {
  explicit State(LaunchOptions options) : opt(std::move(options)) {}

  const LaunchOptions opt;
  detail::ExecPlan plan;
  UniqueFd dev_null;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::vector<RankSlot> ranks;
  int pending_signal = 0;  // the last terminate(): sent to ranks spawned later too
  bool started = false;
  bool spawn_done = false;  // start() may return (or throw)
  bool running = false;     // start() succeeded: wait() may be called
  bool finished = false;    // every rank reaped, result set
  std::thread::id supervisor_id;
  std::exception_ptr spawn_failure;
  std::exception_ptr failure;
  LaunchResult result;

  std::thread thread;
  std::once_flag join_once;

  // The supervisor thread's alone.
  bool have_pidfds = true;
  int live = 0;
  std::optional<Clock::time_point> term_at;  // SIGTERM the rest, unless they exit by then
  std::optional<Clock::time_point> kill_at;
  std::optional<RankExit> first_failure;
  Sink out_sink, err_sink;
  std::vector<char> buf;
  std::string rendered;

  void run();
  void spawn_all();
  void supervise();
  void reap(const std::vector<int>& candidates);
  void stop_the_rest();  // SIGTERM every live rank; SIGKILL after the grace
  void rank_ended(int i, int status, int wait_errno, bool callbacks);
  void read_stream(UniqueFd& fd, LineBuffer& lines, Sink& sink);
  void drain(UniqueFd& fd, LineBuffer& lines, Sink& sink);
  void close_stream(UniqueFd& fd, LineBuffer& lines, Sink& sink);
  void signal_live(int sig, bool skip_stopped);
  void abandon();
  void join() {
    std::call_once(join_once, [this] {
      if (thread.joinable()) thread.join();
    });
  }
};

// --- the supervisor thread ----------------------------------------------------

void Launcher::State::run() {
  // Process-directed signals (Ctrl-C...) go to zerod's other threads, and
  // SIGPIPE from writing to a closed stdout becomes EPIPE here. The children
  // inherit this mask and reset it before exec.
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  {
    std::lock_guard<std::mutex> lock(mu);
    supervisor_id = std::this_thread::get_id();
  }

  buf.resize(kReadChunk);
  out_sink.fd = opt.stdout_fd;
  err_sink.fd = opt.stderr_fd;

  try {
    spawn_all();
  } catch (...) {
    std::exception_ptr e = std::current_exception();
    abandon();
    std::lock_guard<std::mutex> lock(mu);
    spawn_failure = e;
    spawn_done = true;
    finished = true;
    cv.notify_all();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    spawn_done = true;
  }
  cv.notify_all();

  std::exception_ptr broke;
  try {
    supervise();
  } catch (...) {
    broke = std::current_exception();
    abandon();
  }

  LaunchResult r;
  for (const RankSlot& slot : ranks) r.exits.push_back(slot.exit);
  r.first_failure = first_failure;
  r.exit_code = first_failure ? first_failure->status() : 0;
  std::lock_guard<std::mutex> lock(mu);
  result = std::move(r);
  failure = broke;
  finished = true;
  cv.notify_all();
}

void Launcher::State::spawn_all() {
  for (int i = 0; i < opt.nproc; ++i) {
    RankSlot& r = ranks[static_cast<size_t>(i)];
    const std::string rank = std::to_string(opt.first_rank + i);
    detail::StdioFds stdio{dev_null.get(), opt.stdout_fd, opt.stderr_fd};
    UniqueFd out_write, err_write;
    if (opt.prefix_output) {
      auto make_pipe = [&](UniqueFd& read_end, UniqueFd& write_end, const std::string& name) {
        const std::string what = "the " + name + " pipe of rank " + rank;
        int p[2];
        ZD_CHECK_SYS(::pipe2(p, O_CLOEXEC), "launcher: cannot create " + what);
        read_end.reset(p[0]);
        write_end.reset(p[1]);
        ZD_CHECK_SYS(::fcntl(p[0], F_SETFL, O_NONBLOCK),
                     "launcher: cannot make " + what + " non-blocking");
      };
      make_pipe(r.out, out_write, "stdout");
      make_pipe(r.err, err_write, "stderr");
      stdio.out = out_write.get();
      stdio.err = err_write.get();
      r.out_lines = LineBuffer("[rank " + rank + "] ");
      r.err_lines = LineBuffer("[rank " + rank + "] ");
    }

    std::vector<std::string> env = plan.env;
    const std::string world = std::to_string(opt.world_size > 0 ? opt.world_size : opt.nproc);
    env.push_back("ZEROD_RANK=" + rank);
    env.push_back("ZEROD_LOCAL_RANK=" + std::to_string(i));
    env.push_back("ZEROD_WORLD_SIZE=" + world);
    env.push_back("ZEROD_LOCAL_WORLD_SIZE=" + std::to_string(opt.nproc));

    r.started = Clock::now();
    detail::Spawned spawned =
        detail::spawn_process(plan, env, stdio, opt.watchdog ? opt.watchdog->rank_fd() : -1);
    // The write ends are the child's now; while we hold them, no end of file.
    out_write.reset();
    err_write.reset();
    r.spawn_error = std::move(spawned.error);
    if (have_pidfds) {
      const int fd = pidfd_open(spawned.pid);
      if (fd == -1) {
        have_pidfds = false;
        log_debug("launcher: no pidfd (" + errno_text(errno) + "); looking for ended ranks every " +
                  std::to_string(kReapPollMs) + " ms");
      }
      r.pidfd.reset(fd);
    }
    ++live;
    {
      std::lock_guard<std::mutex> lock(mu);
      r.pid = spawned.pid;
      if (pending_signal != 0) {
        signal_group(r.pid, pending_signal);
        if (stops(pending_signal)) r.stop_sent = true;
      }
    }
    log_debug("launcher: rank " + rank + " is pid " + std::to_string(spawned.pid));
  }
}

void Launcher::State::supervise() {
  enum Kind { kPid, kOut, kErr };
  std::vector<pollfd> fds;
  std::vector<std::pair<int, Kind>> what;
  while (live > 0) {
    fds.clear();
    what.clear();
    for (int i = 0; i < opt.nproc; ++i) {
      RankSlot& r = ranks[static_cast<size_t>(i)];
      if (r.reaped) continue;
      if (r.pidfd.valid()) {
        fds.push_back({r.pidfd.get(), POLLIN, 0});
        what.emplace_back(i, kPid);
      }
      if (r.out.valid()) {
        fds.push_back({r.out.get(), POLLIN, 0});
        what.emplace_back(i, kOut);
      }
      if (r.err.valid()) {
        fds.push_back({r.err.get(), POLLIN, 0});
        what.emplace_back(i, kErr);
      }
    }
    int timeout_ms = have_pidfds ? -1 : kReapPollMs;
    for (const auto& at : {term_at, kill_at}) {
      if (!at) continue;
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(*at - Clock::now());
      const int ms = static_cast<int>(std::clamp<long long>(left.count(), 0, 60'000));
      timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
    }

    if (::poll(fds.data(), fds.size(), timeout_ms) == -1) {
      if (errno == EINTR) continue;
      ZD_CHECK_SYS(-1, "launcher: poll on the ranks' pipes and pidfds");
    }
    std::vector<int> ended;
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      const auto [i, kind] = what[k];
      RankSlot& r = ranks[static_cast<size_t>(i)];
      switch (kind) {
        case kPid: ended.push_back(i); break;
        case kOut: read_stream(r.out, r.out_lines, out_sink); break;
        case kErr: read_stream(r.err, r.err_lines, err_sink); break;
      }
    }
    if (!have_pidfds) {
      for (int i = 0; i < opt.nproc; ++i) ended.push_back(i);
    }
    reap(ended);
    if (term_at && Clock::now() >= *term_at) {
      term_at.reset();
      if (live > 0) stop_the_rest();
    }
    if (kill_at && Clock::now() >= *kill_at) {
      kill_at.reset();
      if (live > 0) {
        std::ostringstream grace;
        grace << opt.grace_seconds;
        log_warn("launcher: " + std::to_string(live) + (live == 1 ? " rank" : " ranks") +
                 " still running " + grace.str() + " s after the first failure; sending SIGKILL");
        signal_live(SIGKILL, false);
      }
    }
  }
}

// Ranks found ended in one look are reported killed-by-a-signal first:
// when one rank is killed and another exits because zerod told it that its
// peer was lost, both often end before the launcher looks, and the killed
// one is the cause (the first failure) whatever their order in the table.
void Launcher::State::reap(const std::vector<int>& candidates) {
  struct Ended {
    int rank, status, wait_errno;
  };
  std::vector<Ended> ended;
  for (int i : candidates) {
    RankSlot& r = ranks[static_cast<size_t>(i)];
    if (r.reaped || r.pid <= 0) continue;
    int status = 0;
    pid_t got;
    do {
      got = ::waitpid(r.pid, &status, WNOHANG);
    } while (got == -1 && errno == EINTR);
    if (got == 0) continue;
    ended.push_back({i, status, got == -1 ? errno : 0});
  }
  std::stable_sort(ended.begin(), ended.end(), [](const Ended& a, const Ended& b) {
    const bool sa = a.wait_errno == 0 && WIFSIGNALED(a.status), sb = b.wait_errno == 0 && WIFSIGNALED(b.status);
    return sa && !sb;
  });
  for (const Ended& e : ended) rank_ended(e.rank, e.status, e.wait_errno, true);
}

void Launcher::State::rank_ended(int i, int status, int wait_errno, bool callbacks) {
  RankSlot& r = ranks[static_cast<size_t>(i)];
  {
    std::lock_guard<std::mutex> lock(mu);
    r.reaped = true;  // from here the pid may be reused: never signal it again
  }
  --live;
  r.pidfd.reset();
  // Its output first, so that it comes before anything said about its end.
  drain(r.out, r.out_lines, out_sink);
  drain(r.err, r.err_lines, err_sink);

  RankExit& e = r.exit;
  e.rank = opt.first_rank + i;
  e.pid = r.pid;
  e.seconds = std::chrono::duration<double>(Clock::now() - r.started).count();
  if (wait_errno != 0) {
    e.code = 255;
    e.error = "its exit status was lost: waitpid: " + errno_text(wait_errno) +
              " (did something else in zerod reap it?)";
    log_warn("launcher: rank " + std::to_string(i) + " (pid " + std::to_string(r.pid) +
             "): " + e.error);
  } else if (WIFSIGNALED(status)) {
    e.signaled = true;
    e.code = WTERMSIG(status);
    e.core_dumped = WCOREDUMP(status);
  } else {
    e.code = WEXITSTATUS(status);
  }
  if (!r.spawn_error.empty()) {
    // The command never ran: 127 whatever ended the child (a SIGTERM for
    // another rank's failure may reach it before its _exit(127) does).
    e.error = r.spawn_error;
    e.signaled = false;
    e.core_dumped = false;
    e.code = 127;
  }

  if (callbacks && opt.on_exit) {
    try {
      opt.on_exit(e);
    } catch (const std::exception& ex) {
      log_warn("launcher: the on_exit callback for rank " + std::to_string(i) +
               " threw: " + ex.what());
    } catch (...) {
      log_warn("launcher: the on_exit callback for rank " + std::to_string(i) + " threw");
    }
  }

  // A rank killed by a signal nobody here sent, found after a rank that
  // merely exited with an error: the killed one is the cause. The other
  // exited because zerod told it its peer was lost, and a killed process
  // can become reapable later than that (its files close before its
  // memory is torn down).
  if (first_failure && !first_failure->signaled && e.signaled && !r.signal_sent && e.error.empty())
    first_failure = e;
  if (!e.ok() && !first_failure) {
    first_failure = e;
    if (live > 0) {
      // The others usually end by themselves (zerod tells them their peer is
      // gone) and say why; they get that long before SIGTERM cuts them off.
      if (opt.peer_exit_seconds > 0) {
        const double wait = std::min(opt.peer_exit_seconds, 365.0 * 24 * 3600);
        term_at = Clock::now() +
                  std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait));
      } else {
        stop_the_rest();
      }
    }
  }
}

void Launcher::State::stop_the_rest() {
  signal_live(SIGTERM, true);
  // Capped at a year so that the time point cannot overflow.
  const double grace = std::min(opt.grace_seconds, 365.0 * 24 * 3600);
  kill_at = Clock::now() +
            std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace));
}

void Launcher::State::read_stream(UniqueFd& fd, LineBuffer& lines, Sink& sink) {
  if (!fd.valid()) return;
  const ssize_t n = ::read(fd.get(), buf.data(), buf.size());
  if (n > 0) {
    rendered.clear();
    lines.feed(std::string_view(buf.data(), static_cast<size_t>(n)), rendered);
    sink.write_all(rendered);
    return;
  }
  if (n == -1 && (errno == EINTR || errno == EAGAIN)) return;
  // End of file: the rank closed it, and may well run on. Or an error: give up on it.
  close_stream(fd, lines, sink);
}

void Launcher::State::drain(UniqueFd& fd, LineBuffer& lines, Sink& sink) {
  if (!fd.valid()) return;
  size_t total = 0;
  while (total < kDrainLimit) {
    const ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n == -1 && errno == EINTR) continue;
    if (n <= 0) break;  // end of file, or EAGAIN: a process left behind holds the pipe
    total += static_cast<size_t>(n);
    rendered.clear();
    lines.feed(std::string_view(buf.data(), static_cast<size_t>(n)), rendered);
    sink.write_all(rendered);
  }
  close_stream(fd, lines, sink);
}

void Launcher::State::close_stream(UniqueFd& fd, LineBuffer& lines, Sink& sink) {
  rendered.clear();
  lines.finish(rendered);
  sink.write_all(rendered);
  fd.reset();
}

void Launcher::State::signal_live(int sig, bool skip_stopped) {
  std::lock_guard<std::mutex> lock(mu);
  for (RankSlot& r : ranks) {
    if (r.pid <= 0 || r.reaped || (skip_stopped && r.stop_sent)) continue;
    signal_group(r.pid, sig);
    r.signal_sent = true;
    if (stops(sig)) r.stop_sent = true;
  }
}

// Something broke (a spawn, poll): kill every rank and reap it, blocking.
void Launcher::State::abandon() {
  signal_live(SIGKILL, false);
  for (int i = 0; i < opt.nproc; ++i) {
    RankSlot& r = ranks[static_cast<size_t>(i)];
    if (r.pid <= 0 || r.reaped) continue;
    int status = 0;
    pid_t got;
    do {
      got = ::waitpid(r.pid, &status, 0);
    } while (got == -1 && errno == EINTR);
    rank_ended(i, status, got == -1 ? errno : 0, false);
  }
  for (RankSlot& r : ranks) {
    r.out.reset();
    r.err.reset();
    r.pidfd.reset();
  }
}

// --- the public side ----------------------------------------------------------

Launcher::Launcher(LaunchOptions options) {
  if (options.nproc < 1) {
    fail(ZD_ERR_INVALID_ARGUMENT,
         "launcher: nproc must be at least 1, got " + std::to_string(options.nproc));
  }
  if (options.first_rank < 0 ||
      (options.world_size != 0 && options.first_rank + options.nproc > options.world_size)) {
    fail(ZD_ERR_INVALID_ARGUMENT, "launcher: ranks " + std::to_string(options.first_rank) + ".." +
                                      std::to_string(options.first_rank + options.nproc - 1) +
                                      " do not fit a world of " + std::to_string(options.world_size));
  }
  if (options.argv.empty() || options.argv[0].empty()) {
    fail(ZD_ERR_INVALID_ARGUMENT, "launcher: no trainer command given");
  }
  if (!(options.peer_exit_seconds >= 0) || !std::isfinite(options.peer_exit_seconds)) {
    fail(ZD_ERR_INVALID_ARGUMENT, "launcher: peer_exit_seconds must be a finite number >= 0, got " +
                                      std::to_string(options.peer_exit_seconds));
  }
  if (!(options.grace_seconds >= 0) || !std::isfinite(options.grace_seconds)) {
    fail(ZD_ERR_INVALID_ARGUMENT, "launcher: grace_seconds must be a finite number >= 0, got " +
                                      std::to_string(options.grace_seconds));
  }
  for (const auto& [name, value] : options.env) {
    if (name.empty() || name.find('=') != std::string::npos ||
        name.find('\0') != std::string::npos || value.find('\0') != std::string::npos) {
      fail(ZD_ERR_INVALID_ARGUMENT, "launcher: bad environment variable '" + name + "'");
    }
  }
  for (const std::string& arg : options.argv) {
    if (arg.find('\0') != std::string::npos) {
      fail(ZD_ERR_INVALID_ARGUMENT, "launcher: a trainer argument holds a NUL byte");
    }
  }
  s_ = std::make_unique<State>(std::move(options));
  s_->ranks.resize(static_cast<size_t>(s_->opt.nproc));
}

Launcher::~Launcher() {
  if (!s_) return;
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (!s_->finished) {
      s_->pending_signal = SIGKILL;
      for (RankSlot& r : s_->ranks) {
        if (r.pid > 0 && !r.reaped) signal_group(r.pid, SIGKILL);
      }
    }
  }
  s_->join();
}

void Launcher::start() {
  State& s = *s_;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.started) fail(ZD_ERR_INVALID_STATE, "launcher: start() called twice");
    s.started = true;
  }
  for (const auto& [name, fd] : {std::pair<const char*, int>{"stdout_fd", s.opt.stdout_fd},
                                 std::pair<const char*, int>{"stderr_fd", s.opt.stderr_fd}}) {
    if (::fcntl(fd, F_GETFD) == -1) {
      fail(ZD_ERR_INVALID_ARGUMENT, std::string("launcher: ") + name + " " + std::to_string(fd) +
                                        " is not an open file descriptor");
    }
  }
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ZD_CHECK_SYS(null_fd, "launcher: cannot open /dev/null for the ranks' stdin");
  s.dev_null.reset(null_fd);
  s.plan = detail::make_exec_plan(
      s.opt.argv, s.opt.env,
      std::vector<std::string>(std::begin(kRankVariables), std::end(kRankVariables)));

  try {
    s.thread = std::thread([&s] { s.run(); });
  } catch (const std::system_error& e) {
    fail(ZD_ERR_OUT_OF_MEMORY,
         std::string("launcher: cannot start the supervisor thread: ") + e.what());
  }
  std::unique_lock<std::mutex> lock(s.mu);
  s.cv.wait(lock, [&s] { return s.spawn_done; });
  if (s.spawn_failure) {
    std::exception_ptr e = s.spawn_failure;
    lock.unlock();
    s.join();
    std::rethrow_exception(e);
  }
  s.running = true;
}

LaunchResult Launcher::wait() {
  std::optional<LaunchResult> r = wait_for(std::chrono::milliseconds::max());
  return std::move(*r);
}

std::optional<LaunchResult> Launcher::wait_for(std::chrono::milliseconds timeout) {
  State& s = *s_;
  std::unique_lock<std::mutex> lock(s.mu);
  if (!s.running) fail(ZD_ERR_INVALID_STATE, "launcher: wait() without a successful start()");
  if (std::this_thread::get_id() == s.supervisor_id) {
    fail(ZD_ERR_INVALID_STATE, "launcher: wait() called on the supervisor thread (from on_exit?)");
  }
  auto done = [&s] { return s.finished; };
  if (timeout == std::chrono::milliseconds::max()) {
    s.cv.wait(lock, done);
  } else if (!s.cv.wait_for(lock, timeout, done)) {
    return std::nullopt;
  }
  std::exception_ptr failure = s.failure;
  LaunchResult result = s.result;
  lock.unlock();
  s.join();
  if (failure) std::rethrow_exception(failure);
  return result;
}

void Launcher::terminate(int signal) {
  if (signal <= 0 || signal >= NSIG) {
    fail(ZD_ERR_INVALID_ARGUMENT,
         "launcher: terminate(): " + std::to_string(signal) + " is not a signal");
  }
  State& s = *s_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.finished) return;
  s.pending_signal = signal;
  for (RankSlot& r : s.ranks) {
    if (r.pid <= 0 || r.reaped) continue;
    signal_group(r.pid, signal);
    if (stops(signal)) r.stop_sent = true;
  }
}

std::vector<pid_t> Launcher::pids() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  std::vector<pid_t> out;
  for (const RankSlot& r : s_->ranks) out.push_back(r.pid);
  return out;
}

// --- RankExit -----------------------------------------------------------------

std::string signal_description(int signal) {
  const char* abbrev = ::sigabbrev_np(signal);
  if (!abbrev) return "signal " + std::to_string(signal);
  std::string out = std::string("SIG") + abbrev;
  if (const char* text = ::sigdescr_np(signal)) out += std::string(": ") + text;
  return out;
}

std::string RankExit::describe() const {
  const std::string who = "rank " + std::to_string(rank);
  if (!error.empty()) return who + ": " + error;
  const std::string whom = who + " (pid " + std::to_string(pid) + ")";
  if (!signaled) return whom + " exited with status " + std::to_string(code);
  std::string out = whom + " was killed by signal " + std::to_string(code);
  if (::sigabbrev_np(code)) out += " (" + signal_description(code) + ")";
  if (core_dumped) out += " (core dumped)";
  return out;
}

}  // namespace zerod::launch
