#include "trainer_exit.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace zerod::server {

namespace {

using Clock = std::chrono::steady_clock;

// Exited, or a zombie waiting for its parent (which may be a launcher that
// has not looked yet): either way its files, the GPU's among them, are closed.
bool exited(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // gone between the two looks
  const auto close = line.rfind(')');          // the name may hold spaces and parentheses
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
}

}  // namespace

bool wait_for_exit(pid_t pid, int timeout_ms) {
  if (pid <= 0) return false;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd >= 0) {
    // Readable once the process has exited.
    pollfd p{fd, POLLIN, 0};
    int left = timeout_ms;
    int r = 0;
    while ((r = ::poll(&p, 1, left)) < 0 && errno == EINTR)
      left = static_cast<int>(std::max<int64_t>(
          0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count()));
    ::close(fd);
    return r > 0;
  }
  if (errno == ESRCH) return true;
  // No pidfds (an old kernel, a seccomp filter): look.
  for (;;) {
    if (exited(pid)) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::string release_trainer_waits(pid_t pid, int timeout_ms, const std::function<bool()>& pending,
                                  const std::function<void()>& release) {
  if (!pending()) return "";
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  // A short look at a time, so that a record that runs is seen soon.
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    const int look = static_cast<int>(std::clamp<int64_t>(left, 0, 50));
    bool gone = false;
    if (pid > 0)
      gone = wait_for_exit(pid, look);
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(look));
    if (!pending()) return "";
    if (gone) {
      release();
      return "its last record on its GPU stream never ran; zerod's stream no longer waits for it";
    }
    if (left <= 0) break;
  }
  if (pid <= 0) {
    // Not visible from here (another pid namespace): after this long with
    // its connection closed it is taken for dead, since a stream that waits
    // forever stops every rank of the job on this GPU.
    release();
    return "its process is not visible from the daemon (another pid namespace) and its last record on its GPU "
           "stream had not run " + std::to_string(timeout_ms) +
           " ms after its connection closed; taken for dead, zerod's stream no longer waits for it";
  }
  return "its process " + std::to_string(pid) + " is still alive " + std::to_string(timeout_ms) +
         " ms after its connection closed, with its last record on its GPU stream not run: zerod's stream waits "
         "for it still";
}

}  // namespace zerod::server
