#include "transport/hangup_watch.h"

#include "error.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

namespace zerod::transport {

HangupWatch::HangupWatch(int socket_fd) : socket_fd_(socket_fd), owner_(::getpid()) {
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) fail(ZD_ERR_IO, std::string("watching a socket for its hangup: eventfd: ") + std::strerror(errno));
  thread_ = std::thread([this] { run(); });
}

HangupWatch::~HangupWatch() {
  if (::getpid() != owner_) {
    // A forked child: the thread is the parent's (joining it here would
    // wait on a thread this process does not have, and destroying it
    // joinable would abort). Let go of it.
    new std::thread(std::move(thread_));  // never destroyed, on purpose
    ::close(wake_fd_);
    return;
  }
  const uint64_t one = 1;
  if (::write(wake_fd_, &one, sizeof one) < 0) {
    // An eventfd write fails only on overflow, which one write cannot cause.
  }
  thread_.join();
  ::close(wake_fd_);
}

int HangupWatch::add(std::function<void()> on_hangup) {
  std::unique_lock<std::mutex> lock(mu_);
  if (hung_up_) {
    lock.unlock();
    on_hangup();
    return -1;
  }
  const int id = next_id_++;
  callbacks_.emplace(id, std::move(on_hangup));
  return id;
}

void HangupWatch::remove(int id) {
  // The thread runs the callbacks with mu_ held: once this has the lock,
  // that one is either done or will never run.
  std::lock_guard<std::mutex> lock(mu_);
  callbacks_.erase(id);
}

bool HangupWatch::hung_up() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hung_up_;
}

void HangupWatch::run() {
  pollfd p[2] = {{socket_fd_, POLLRDHUP, 0}, {wake_fd_, POLLIN, 0}};
  for (;;) {
    p[0].revents = p[1].revents = 0;
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;  // nothing to watch with: the calls themselves still see the hangup
    }
    if (p[1].revents) return;
    if (p[0].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) break;
  }
  std::lock_guard<std::mutex> lock(mu_);
  hung_up_ = true;
  for (auto& [id, f] : callbacks_) {
    try {
      f();
    } catch (...) {
      // Best effort: the others still run.
    }
  }
  callbacks_.clear();
}

}  // namespace zerod::transport
