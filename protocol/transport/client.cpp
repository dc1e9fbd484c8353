#include "transport/client.h"

#include "error.h"
#include "transport/detail/deadline.h"
#include "transport/detail/unix_address.h"
#include "transport/peer.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
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

// "uid 1000 (alice)", or "uid 1000" when the name cannot be found.
std::string name_uid(uid_t uid) {
  passwd pw{};
  passwd* found = nullptr;
  char buf[1024];
  if (::getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found)
    return "uid " + std::to_string(uid) + " (" + found->pw_name + ")";
  return "uid " + std::to_string(uid);
}

// The daemon checks its clients' uid (SO_PEERCRED); the client checks the
// daemon's the same way before it sends anything: a client sends its job
// script, which names plugins to load, and memfds of its tensors. A
// socket where another user's process listens (a path in a shared
// directory, a ZEROD_ENDPOINT that someone else set) is refused. Root's
// daemon is trusted, as root can read the trainer's memory anyway. A
// daemon of another uid that lets this one in on purpose (a program
// embedding the server with ServerOptions::allow_uid) is trusted where
// ZEROD_TRUST_DAEMON_UID names its uid: the two sides' consents match.
void check_daemon_uid(int fd, const std::string& purpose) {
  const PeerCredentials daemon = peer_credentials(fd);
  const uid_t me = ::geteuid();
  if (daemon.uid == me || daemon.uid == 0) return;
  if (const char* trusted = std::getenv("ZEROD_TRUST_DAEMON_UID"); trusted && *trusted) {
    char* end = nullptr;
    errno = 0;
    const unsigned long uid = std::strtoul(trusted, &end, 10);
    if (errno != 0 || *end != '\0' || trusted[0] == '-')
      fail(ZD_ERR_INVALID_ARGUMENT, purpose + ": ZEROD_TRUST_DAEMON_UID='" + std::string(trusted) +
                                        "' is not a uid (a number)");
    if (uid == daemon.uid) return;
  }
  fail(ZD_ERR_IO, purpose + ": the process listening there (pid " + std::to_string(daemon.pid) + ") runs as " +
                      name_uid(daemon.uid) + ", but this process is " + name_uid(me) +
                      ": a client sends its job script and tensors only to a daemon of its own uid or of root "
                      "(or of the uid ZEROD_TRUST_DAEMON_UID names). Point ZEROD_ENDPOINT at a daemon of your own");
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
  check_daemon_uid(s.get(), purpose);
  // Back to blocking, like an accepted socket; Connection's I/O does not
  // depend on it, but a caller handing the fd on may.
  const int flags = ::fcntl(s.get(), F_GETFL);
  ZD_CHECK_SYS(flags, purpose + ": fcntl");
  ZD_CHECK_SYS(::fcntl(s.get(), F_SETFL, flags & ~O_NONBLOCK), purpose + ": fcntl");
  return Connection(std::move(s), "zerod at " + path);
}

}  // namespace zerod::transport
