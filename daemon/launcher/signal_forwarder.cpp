#include "launcher/signal_forwarder.h"

#include "error.h"
#include "launcher/detail/unique_fd.h"
#include "log.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <iterator>
#include <cerrno>
#include <system_error>
#include <thread>

namespace zerod::launch {

namespace {

constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP};
constexpr unsigned char kStop = 0;  // not a signal: tells the thread to end

std::atomic<bool> g_active{false};
std::atomic<int> g_write_fd{-1};
static_assert(std::atomic<int>::is_always_lock_free, "the handler needs a lock-free atomic");

extern "C" void forward_handler(int sig) {
  const int saved = errno;
  const int fd = g_write_fd.load(std::memory_order_relaxed);
  if (fd >= 0) {
    const unsigned char byte = static_cast<unsigned char>(sig);
    const ssize_t n = ::write(fd, &byte, 1);  // non-blocking: a full pipe drops it
    (void)n;
  }
  errno = saved;
}

}  // namespace

struct SignalForwarder::State {
  Launcher& launcher;
  Notify notify;
  detail::UniqueFd read_end, write_end;
  struct sigaction previous[std::size(kForwarded)] = {};
  bool installed[std::size(kForwarded)] = {};
  std::atomic<int> count{0};
  std::thread thread;

  State(Launcher& l, Notify n) : launcher(l), notify(std::move(n)) {}

  void loop() {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr);
    for (;;) {
      unsigned char byte = kStop;
      const ssize_t n = ::read(read_end.get(), &byte, 1);
      if (n == -1 && errno == EINTR) continue;
      if (n != 1 || byte == kStop) return;
      const int received = byte;
      const int sent = count.fetch_add(1) == 0 ? received : SIGKILL;
      try {
        launcher.terminate(sent);
        if (notify) notify(received, sent);
      } catch (const std::exception& e) {
        log_warn(std::string("launcher: forwarding a signal to the ranks: ") + e.what());
      } catch (...) {
        log_warn("launcher: forwarding a signal to the ranks failed");
      }
    }
  }
};

SignalForwarder::SignalForwarder(Launcher& launcher, Notify notify) {
  if (g_active.exchange(true)) {
    fail(ZD_ERR_INVALID_STATE, "launcher: a signal forwarder is installed already");
  }
  try {
    auto s = std::make_unique<State>(launcher, std::move(notify));
    int p[2];
    ZD_CHECK_SYS(::pipe2(p, O_CLOEXEC), "launcher: cannot create the signal forwarder's pipe");
    s->read_end.reset(p[0]);
    s->write_end.reset(p[1]);
    ZD_CHECK_SYS(::fcntl(p[1], F_SETFL, O_NONBLOCK),
                 "launcher: cannot make the signal forwarder's pipe non-blocking");
    try {
      s->thread = std::thread([state = s.get()] { state->loop(); });
    } catch (const std::system_error& e) {
      fail(ZD_ERR_OUT_OF_MEMORY,
           std::string("launcher: cannot start the signal forwarder: ") + e.what());
    }
    g_write_fd.store(p[1]);

    struct sigaction action {};
    action.sa_handler = forward_handler;
    action.sa_flags = SA_RESTART;
    sigemptyset(&action.sa_mask);
    for (int sig : kForwarded) sigaddset(&action.sa_mask, sig);
    for (size_t i = 0; i < std::size(kForwarded); ++i) {
      if (::sigaction(kForwarded[i], nullptr, &s->previous[i]) == -1) continue;
      if (!(s->previous[i].sa_flags & SA_SIGINFO) && s->previous[i].sa_handler == SIG_IGN) continue;
      if (::sigaction(kForwarded[i], &action, nullptr) == 0) s->installed[i] = true;
    }
    s_ = std::move(s);
  } catch (...) {
    g_write_fd.store(-1);
    g_active.store(false);
    throw;
  }
}

SignalForwarder::~SignalForwarder() {
  for (size_t i = 0; i < std::size(kForwarded); ++i) {
    if (s_->installed[i]) ::sigaction(kForwarded[i], &s_->previous[i], nullptr);
  }
  // A handler already running on another thread may still write to the
  // pipe; the byte then lands before the stop byte or is lost with the pipe.
  g_write_fd.store(-1);
  const unsigned char stop = kStop;
  while (::write(s_->write_end.get(), &stop, 1) == -1 && errno == EINTR) {
  }
  s_->thread.join();
  s_.reset();
  g_active.store(false);
}

int SignalForwarder::received() const { return s_->count.load(); }

}  // namespace zerod::launch
