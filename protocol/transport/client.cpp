#include "transport/client.h"

#include "error.h"
#include "transport/detail/deadline.h"
#include "transport/detail/unix_address.h"

#include <fcntl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>

namespace zerod::transport {

namespace {

const char* hint(int err) {
  switch (err) {
    case ENOENT: return " — is the daemon running?";
    case ECONNREFUSED: return " — nothing accepts on this socket (left by a zerod that exited?)";
    case EACCES: return " — the socket or its directory belongs to another user";
    case ENOTSOCK: return " — the path is not a socket";
    default: return "";
  }
}

}  // namespace

Connection connect_unix(const std::string& path, int timeout_ms) {
  const std::string purpose = "cannot connect to zerod at " + path;
  const detail::UnixAddress addr = detail::unix_address(path, purpose);
  const detail::Deadline deadline(timeout_ms);
  // Non-blocking so that a full accept queue is EAGAIN, which we retry until
  // the deadline, rather than a wait we could not bound.
  UniqueFd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  ZD_CHECK_SYS(s.get(), purpose + ": socket");
  int backoff_ms = 1;
  for (;;) {
    if (::connect(s.get(), addr.get(), addr.length) == 0) break;
    const int err = errno;
    if (err == EISCONN) break;  // an interrupted attempt completed
    if (err == EINTR) continue;
    if (err != EAGAIN) fail(ZD_ERR_IO, purpose + ": " + errno_text(err) + hint(err));
    if (deadline.expired()) {
      fail(ZD_ERR_TIMEOUT, purpose + ": its accept queue stayed full for " +
                               std::to_string(timeout_ms) +
                               " ms (is the daemon overloaded or stuck?)");
    }
    const int left = deadline.poll_timeout();
    const int nap = left < 0 ? backoff_ms : std::min(backoff_ms, left);
    std::this_thread::sleep_for(std::chrono::milliseconds(nap));
    backoff_ms = std::min(backoff_ms * 2, 50);
  }
  // Back to blocking, like an accepted socket; Connection's I/O does not
  // depend on it, but a caller handing the fd on may.
  const int flags = ::fcntl(s.get(), F_GETFL);
  ZD_CHECK_SYS(flags, purpose + ": fcntl");
  ZD_CHECK_SYS(::fcntl(s.get(), F_SETFL, flags & ~O_NONBLOCK), purpose + ": fcntl");
  return Connection(std::move(s), "zerod at " + path);
}

}  // namespace zerod::transport
