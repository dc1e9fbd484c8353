#include "transport/process_exit.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <thread>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace zerod::transport {

namespace {

using Clock = std::chrono::steady_clock;

// Without a pidfd: gone, or a zombie waiting for its parent (which may be a
// launcher that has not looked yet).
bool looks_exited(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  // Alive, or another user's (EPERM): its state says.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // gone between the two looks
  const auto close = line.rfind(')');          // the name may hold spaces and parentheses
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
}

int ms_until(Clock::time_point t) {
  return static_cast<int>(
      std::clamp<int64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count(), 0,
                          INT32_MAX));
}

}  // namespace

ProcessExit::ProcessExit(pid_t pid) : pid_(pid) {
  if (pid_ <= 0) return;
  fd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  if (fd_ < 0 && errno == ESRCH) gone_ = true;
}

ProcessExit::~ProcessExit() {
  if (fd_ >= 0) ::close(fd_);
}

bool ProcessExit::wait(int timeout_ms) {
  if (gone_) return true;
  if (pid_ <= 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
    return false;
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  if (fd_ >= 0) {
    // Readable once the process has exited.
    pollfd p{fd_, POLLIN, 0};
    int r = 0;
    while ((r = ::poll(&p, 1, ms_until(deadline))) < 0 && errno == EINTR) {
    }
    gone_ = r > 0;
    return gone_;
  }
  // No pidfds (an old kernel, a seccomp filter): look.
  for (;;) {
    if (looks_exited(pid_)) return gone_ = true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::string release_when_gone(pid_t pid, int timeout_ms, int slow_ms, const std::function<bool()>& pending,
                              const std::function<void()>& release,
                              const std::function<void(const std::string&)>& slow) {
  if (!pending()) return "";
  ProcessExit process(pid);
  const auto start = Clock::now();
  const auto slow_at = start + std::chrono::milliseconds(slow_ms);
  const auto deadline = timeout_ms < 0 ? Clock::time_point::max() : start + std::chrono::milliseconds(timeout_ms);
  bool told = false;
  // A short look at a time, so that a record that runs is seen soon.
  for (;;) {
    const bool gone = process.wait(std::min(50, ms_until(std::min(deadline, pid > 0 ? deadline : slow_at))));
    if (!pending()) return "";
    if (gone) {
      release();
      return "its last record on its GPU stream never ran; the stream that waited for it no longer does";
    }
    const auto now = Clock::now();
    if (pid <= 0 && now >= slow_at) {
      release();
      return "its process is not visible here (another pid namespace) and its last record on its GPU stream had "
             "not run " + std::to_string(slow_ms) +
             " ms after its connection closed; taken for dead, the stream that waited for it no longer does";
    }
    if (!told && now >= slow_at && slow) {
      told = true;
      slow("its process " + std::to_string(pid) + " is alive " + std::to_string(slow_ms) +
           " ms after its connection closed, with its last record on its GPU stream not run; waiting for it to "
           "exit or for the record to run");
    }
    if (now >= deadline)
      return "its process " + std::to_string(pid) + " was still alive " + std::to_string(timeout_ms) +
             " ms after its connection closed, with its last record on its GPU stream not run: the stream that "
             "waits for it waits still";
  }
}

}  // namespace zerod::transport
