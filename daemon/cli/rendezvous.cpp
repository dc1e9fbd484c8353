#include "rendezvous.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

namespace zerod::cli {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kLineTimeoutMs = 5000;  // a peer's one line, each way

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Waits for `events` on fd until `until`, asking `cancelled` (may be
// empty) every 100 ms. 1: ready; 0: `until` passed; -1: cancelled.
int wait_for(int fd, short events, Clock::time_point until, const std::function<bool()>& cancelled) {
  for (;;) {
    if (cancelled && cancelled()) return -1;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0) return 0;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 100)));
    if (r < 0 && errno != EINTR) return 1;  // the call that follows says what is wrong
    if (r > 0) return 1;
  }
}

// One line (without its '\n') before `until`; false on a timeout, a closed
// peer, a line longer than kMaxRendezvousLine or `cancelled`.
bool read_line(int fd, std::string* line, Clock::time_point until, const std::function<bool()>& cancelled = {}) {
  line->clear();
  char buf[512];
  for (;;) {
    if (wait_for(fd, POLLIN, until, cancelled) != 1) return false;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    line->append(buf, static_cast<size_t>(n));
    if (const size_t nl = line->find('\n'); nl != std::string::npos) {
      line->resize(nl);
      return true;
    }
    if (line->size() > kMaxRendezvousLine) return false;
  }
}

bool write_all(int fd, const std::string& s) {
  size_t at = 0;
  while (at < s.size()) {
    const ssize_t n = ::send(fd, s.data() + at, s.size() - at, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    at += static_cast<size_t>(n);
  }
  return true;
}

// true when the value was given.
bool answer(int fd, const std::string& name, const std::string& value) {
  // Bounded both ways: a client that never reads cannot hold the server.
  timeval tv{kLineTimeoutMs / 1000, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  std::string line;
  if (!read_line(fd, &line, Clock::now() + std::chrono::milliseconds(kLineTimeoutMs)))
    return false;  // silent, closed or too long: dropped
  const std::string prefix = "zerod-join ";
  if (line.compare(0, prefix.size(), prefix) != 0) {
    write_all(fd, "no this is a zerod rendezvous; expected 'zerod-join <name>'\n");
    return false;
  }
  const std::string asked = line.substr(prefix.size());
  if (asked != name) {
    write_all(fd, "no this rendezvous serves job '" + name + "', not '" + asked +
                      "' (two jobs on one MASTER_ADDR and port?)\n");
    return false;
  }
  return write_all(fd, "ok " + value + "\n");
}

std::string errno_text(int e) { return std::strerror(e); }

}  // namespace

bool parse_endpoint(const std::string& text, Endpoint* out, std::string* why) {
  std::string host, port;
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find("]:");
    if (close == std::string::npos) {
      *why = "'" + text + "' is not [IPv6]:port";
      return false;
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      *why = "'" + text + "' is not host:port";
      return false;
    }
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  char* end = nullptr;
  const long p = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != 0 || p < 1 || p > 65535 || host.empty()) {
    *why = "'" + text + "' is not host:port with a port in 1..65535";
    return false;
  }
  out->host = host;
  out->port = static_cast<int>(p);
  return true;
}

// A listening socket on `port` of every address (IPv6 with IPv4 mapped
// where the host has IPv6, else IPv4): MASTER_ADDR names this host as the
// other nodes reach it, which may not be an address a bind() here would take
// by that name (NAT, aliases). -1 with the reason in *why.
static int listen_on(int port, std::string* why) {
  const int one = 1, zero = 0;
  for (const int family : {AF_INET6, AF_INET}) {
    const int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_storage st{};
    socklen_t len;
    if (family == AF_INET6) {
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      auto* a = reinterpret_cast<sockaddr_in6*>(&st);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_any;
      a->sin6_port = htons(static_cast<uint16_t>(port));
      len = sizeof *a;
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&st);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_ANY);
      a->sin_port = htons(static_cast<uint16_t>(port));
      len = sizeof *a;
    }
    if (::bind(fd, reinterpret_cast<sockaddr*>(&st), len) == 0 && ::listen(fd, 64) == 0) return fd;
    const int e = errno;
    ::close(fd);
    if (e == EAFNOSUPPORT) continue;  // no IPv6 here: IPv4 alone
    *why = "cannot listen on port " + std::to_string(port) + ": " + errno_text(e) +
           (e == EADDRINUSE ? " (another program has it: set ZEROD_RENDEZVOUS=<node 0's host>:<a free port> in "
                              "every rank)"
                            : "");
    return -1;
  }
  *why = "cannot open a TCP socket: " + errno_text(errno);
  return -1;
}

bool serve_rendezvous(int port, const std::string& name, const std::string& value, const std::atomic<bool>& stop,
                      std::atomic<bool>* listening, std::string* why, int answers) {
  const Fd listener(listen_on(port, why));
  const int fd = listener.get();
  if (fd < 0) return false;
  if (listening != nullptr) listening->store(true);
  int given = 0;
  while (!stop.load() && (answers == 0 || given < answers)) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    Fd c(::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC));
    if (c.get() >= 0 && answer(c.get(), name, value)) ++given;
  }
  return true;
}

// A non-blocking connect given until `until` (a host that drops SYNs, or
// a listener whose queue is full, would hold a blocking connect() for about
// two minutes), asking `stop` meanwhile. The socket, blocking again, or -1
// with the reason in *why.
static int connect_until(const addrinfo* a, Clock::time_point until, const std::function<bool()>& stop,
                         std::string* why) {
  const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
  if (fd < 0) {
    *why = "socket: " + errno_text(errno);
    return -1;
  }
  if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      *why = "connect: " + errno_text(errno);
      ::close(fd);
      return -1;
    }
    const int ready = wait_for(fd, POLLOUT, until, stop);
    int so = 0;
    socklen_t len = sizeof so;
    if (ready != 1 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &len) != 0 || so != 0) {
      if (ready >= 0)
        *why = ready == 0 ? "connect: timed out (the host drops packets, or the listener's queue is full)"
                          : "connect: " + errno_text(so != 0 ? so : errno);
      ::close(fd);
      return -1;
    }
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

bool fetch_rendezvous(const Endpoint& at, const std::string& name, double timeout_s, std::string* value,
                      std::string* why, const std::function<bool()>& cancelled) {
  const double limit_s = timeout_s > 0 ? timeout_s : 120;
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit_s));
  const std::string where = at.host + ":" + std::to_string(at.port);
  // Once `cancelled` has said stop, it stays said (it may take the signal
  // that said so).
  bool stopped = false;
  const std::function<bool()> stop = [&] {
    if (!stopped && cancelled) stopped = cancelled();
    return stopped;
  };
  std::string last = "nothing listened there";
  while (!stop() && Clock::now() < deadline) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const std::string port = std::to_string(at.port);
    if (const int g = ::getaddrinfo(at.host.c_str(), port.c_str(), &hints, &found); g != 0) {
      last = "cannot resolve '" + at.host + "': " + ::gai_strerror(g);
    } else {
      for (addrinfo* a = found; a != nullptr && !stopped; a = a->ai_next) {
        // At most a second per try: node 0 may come up meanwhile.
        const auto try_until = std::min(deadline, Clock::now() + std::chrono::seconds(1));
        Fd c(connect_until(a, try_until, stop, &last));
        if (c.get() < 0) continue;
        std::string line;
        const auto answer_until = std::min(deadline, Clock::now() + std::chrono::milliseconds(kLineTimeoutMs));
        if (!write_all(c.get(), "zerod-join " + name + "\n") || !read_line(c.get(), &line, answer_until, stop)) {
          last = "no answer from it";
          continue;
        }
        ::freeaddrinfo(found);
        if (line.compare(0, 3, "ok ") == 0) {
          *value = line.substr(3);
          return true;
        }
        *why = "the rendezvous at " + where + " refused: " +
               (line.compare(0, 3, "no ") == 0 ? line.substr(3) : "'" + line + "'");
        return false;
      }
      ::freeaddrinfo(found);
    }
    // 200 ms between tries, a stop still heard.
    const auto next = std::min(deadline, Clock::now() + std::chrono::milliseconds(200));
    while (!stop() && Clock::now() < next) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (stopped) {
    *why = "stopped while waiting for node 0's rendezvous at " + where;
    return false;
  }
  char limit[32];
  std::snprintf(limit, sizeof limit, "%g", limit_s);
  *why = "node 0's rendezvous at " + where + " did not answer within " + limit + " s (" + last +
         "); is node 0's first rank started, and is that port open between the nodes?";
  return false;
}

}  // namespace zerod::cli
