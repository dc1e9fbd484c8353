#include "metrics_server.h"

#include "error.h"
#include "log.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <fcntl.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace zerod::server {

namespace {

std::string errno_now() { return errno_text(errno); }

int listen_unix(const std::string& path) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  // A socket file left by a daemon that died is replaced; one that answers
  // belongs to a running daemon and is not.
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) fail(ZD_ERR_IO, "metrics.listen: " + path + " exists and is not a socket");
    const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool alive = probe >= 0 && ::connect(probe, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
    if (probe >= 0) ::close(probe);
    if (alive) fail(ZD_ERR_IO, "metrics.listen: " + path + " is in use by another process");
    ::unlink(path.c_str());
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fail(ZD_ERR_IO, "metrics.listen: socket: " + errno_now());
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(fd, 16) != 0) {
    const std::string why = errno_now();
    ::close(fd);
    fail(ZD_ERR_IO, "metrics.listen: cannot listen on unix socket " + path + ": " + why);
  }
  return fd;
}

int listen_tcp(const observe::ListenAddress& a, std::string* where) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(a.port);
  const int rc = ::getaddrinfo(a.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) fail(ZD_ERR_CONFIG, "metrics.listen: cannot resolve '" + a.host + "': " + gai_strerror(rc));
  std::string why = "no address";
  int fd = -1;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 16) == 0) break;
    why = errno_now();
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(res);
  if (fd < 0) fail(ZD_ERR_IO, "metrics.listen: cannot listen on " + a.host + ":" + port + ": " + why);
  // The port actually bound (port 0 = any free one).
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  char host[INET6_ADDRSTRLEN] = "?";
  int bound = 0;
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    bound = ntohs(in->sin_port);
    *where = "http://" + std::string(host) + ":" + std::to_string(bound) + "/metrics";
  } else {
    const auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    bound = ntohs(in6->sin6_port);
    *where = "http://[" + std::string(host) + "]:" + std::to_string(bound) + "/metrics";
  }
  return fd;
}

using Clock = std::chrono::steady_clock;

// Waits until fd is ready for `events`; false when the deadline passes
// first, the server is stopping (stop_fd readable) or poll fails.
bool ready(int fd, short events, int stop_fd, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p[2] = {{fd, events, 0}, {stop_fd, POLLIN, 0}};
    const int rc = ::poll(p, 2, static_cast<int>(left));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0 || p[1].revents) return false;
    if (p[0].revents) return true;
  }
}

void send_all(int fd, const std::string& s, int stop_fd, Clock::time_point deadline) {
  size_t off = 0;
  while (off < s.size()) {
    if (!ready(fd, POLLOUT, stop_fd, deadline)) return;  // a scraper that stopped reading
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) return;  // the scraper went away
    off += static_cast<size_t>(n);
  }
}

std::string response(int code, const char* reason, const std::string& type, const std::string& body, bool head) {
  std::string r = "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + type +
                  "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
  if (!head) r += body;
  return r;
}

}  // namespace

MetricsServer::MetricsServer(const std::string& listen, std::function<std::string()> render)
    : render_(std::move(render)) {
  std::string why;
  auto a = observe::parse_listen_address(listen, &why);
  if (!a) fail(ZD_ERR_CONFIG, "metrics.listen = \"" + listen + "\": " + why);
  addr_ = *a;
  if (addr_.unix_socket) {
    listen_fd_ = listen_unix(addr_.path);
    where_ = "unix:" + addr_.path + " (GET /metrics)";
  } else {
    listen_fd_ = listen_tcp(addr_, &where_);
  }
  if (::pipe2(stop_, O_CLOEXEC) != 0) {
    ::close(listen_fd_);
    fail(ZD_ERR_IO, "metrics: pipe: " + errno_now());
  }
  thread_ = std::thread([this] { loop(); });
}

MetricsServer::~MetricsServer() {
  const char x = 1;
  if (::write(stop_[1], &x, 1) < 0) {
    // The pipe cannot be full or closed here; nothing else to do.
  }
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
  ::close(stop_[0]);
  ::close(stop_[1]);
  if (addr_.unix_socket) ::unlink(addr_.path.c_str());
}

void MetricsServer::loop() {
  for (;;) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {stop_[0], POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      log_warn("metrics: poll failed (" + errno_now() + "); the metrics endpoint stops");
      return;
    }
    if (p[1].revents) return;
    if (!(p[0].revents & POLLIN)) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    serve(fd);
    ::close(fd);
  }
}

void MetricsServer::serve(int fd) {
  // The whole request within 5 s of the accept: a client that trickles
  // bytes is dropped like a silent one. The server's stop ends this wait
  // and the answer's (the daemon's exit joins this thread).
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(5);
  const int stop = stop_[0];
  // The answer's 5 s start once it is built (rendering the metrics of a
  // busy daemon takes a while, and is not the client's time).
  const auto answer = [&](const std::string& r) {
    send_all(fd, r, stop, Clock::now() + std::chrono::seconds(5));
  };
  std::string req;
  char buf[2048];
  while (req.find("\r\n\r\n") == std::string::npos && req.find("\n\n") == std::string::npos) {
    if (!ready(fd, POLLIN, stop, deadline)) return;
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) return;
    req.append(buf, static_cast<size_t>(n));
    if (req.size() > 16384) {
      answer(response(431, "Request Header Fields Too Large", "text/plain", "request too large\n", false));
      return;
    }
  }
  const auto eol = req.find_first_of("\r\n");
  const std::string line = req.substr(0, eol);
  const auto sp1 = line.find(' ');
  const auto sp2 = line.find(' ', sp1 == std::string::npos ? 0 : sp1 + 1);
  if (sp1 == std::string::npos || sp2 == std::string::npos) {
    answer(response(400, "Bad Request", "text/plain", "bad request line\n", false));
    return;
  }
  const std::string method = line.substr(0, sp1);
  std::string target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  if (const auto q = target.find('?'); q != std::string::npos) target.resize(q);
  const bool head = method == "HEAD";
  if (method != "GET" && !head) {
    answer(response(405, "Method Not Allowed", "text/plain", "only GET and HEAD\n", false));
    return;
  }
  if (target == "/metrics") {
    answer(response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", render_(), head));
  } else if (target == "/") {
    answer(response(200, "OK", "text/plain; charset=utf-8", "zerod daemon: metrics at /metrics\n", head));
  } else {
    answer(response(404, "Not Found", "text/plain", "no such page: " + target + " (try /metrics)\n", head));
  }
}

}  // namespace zerod::server
