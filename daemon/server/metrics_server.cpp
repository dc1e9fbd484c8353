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

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

namespace zerod::server {

namespace {

std::string errno_now() { return errno_text(errno); }

using Clock = std::chrono::steady_clock;

// A request must arrive whole within this of its accept (a client that
// trickles bytes is dropped like a silent one), and its answer be taken
// within this of being built (rendering a busy daemon's metrics takes a
// while, and is not the client's time).
constexpr auto kRequestTime = std::chrono::seconds(5);
constexpr auto kAnswerTime = std::chrono::seconds(5);
constexpr size_t kMaxRequest = 16384;  // answered 431 past this
// Connections the kernel holds until the thread accepts them (while it
// renders, say): the most it allows, so a burst of connects, a flood of idle
// ones included, costs a scraper no SYN retry (1 s); each is accepted in
// turn and the cap applies to those accepted.
constexpr int kBacklog = SOMAXCONN;
// Accepting pauses this long when the process (or system) is out of
// descriptors: the connection left waiting keeps the listening socket
// readable, so accepting again at once would spin; meanwhile the
// connections being served end and free theirs.
constexpr auto kAcceptBackoff = std::chrono::milliseconds(20);

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
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) fail(ZD_ERR_IO, "metrics.listen: socket: " + errno_now());
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(fd, kBacklog) != 0) {
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
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, kBacklog) == 0) break;
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

std::string response(int code, const char* reason, const std::string& type, const std::string& body, bool head) {
  std::string r = "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + type +
                  "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
  if (!head) r += body;
  return r;
}

bool request_complete(const std::string& r) {
  return r.find("\r\n\r\n") != std::string::npos || r.find("\n\n") != std::string::npos;
}

}  // namespace

// One client's connection: what it sent, then its answer and how much of
// it the client has taken. fd -1 once closed.
struct MetricsServer::Connection {
  int fd = -1;
  Clock::time_point deadline;  // for the request, then for the answer
  std::string request;
  std::string answer;  // empty until the request is whole (an answer never is)
  size_t sent = 0;

  bool answering() const { return !answer.empty(); }
  void close() {
    ::close(fd);
    fd = -1;
  }
};

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
  std::vector<pollfd> p;
  for (;;) {
    const auto now = Clock::now();
    std::erase_if(open_, [&](Connection& c) {
      if (c.deadline > now) return false;
      c.close();
      return true;
    });
    const bool accepting = now >= accept_again_;
    p.clear();
    p.push_back({stop_[0], POLLIN, 0});
    p.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});  // -1: not polled
    for (const Connection& c : open_) {
      p.push_back({c.fd, static_cast<short>(c.answering() ? POLLOUT : POLLIN), 0});
    }
    if (::poll(p.data(), p.size(), poll_timeout_ms(now)) < 0) {
      if (errno == EINTR) continue;
      log_warn("metrics: poll failed (" + errno_now() + "); the metrics endpoint stops");
      break;
    }
    if (p[0].revents) break;  // stopping: the daemon's exit waits for no client
    for (size_t i = 0; i < open_.size(); ++i) {
      if (p[i + 2].revents) advance(open_[i]);
    }
    std::erase_if(open_, [](const Connection& c) { return c.fd < 0; });
    if (p[1].revents) accept_waiting();
  }
  for (Connection& c : open_) c.close();
  open_.clear();
}

// Until the first deadline of a connection, or the end of a pause in
// accepting; -1 (no limit) with neither.
int MetricsServer::poll_timeout_ms(Clock::time_point now) const {
  Clock::time_point wake = Clock::time_point::max();
  for (const Connection& c : open_) wake = std::min(wake, c.deadline);
  if (now < accept_again_) wake = std::min(wake, accept_again_);
  if (wake == Clock::time_point::max()) return -1;
  // Rounded up: waking a little early would only poll again at once.
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(wake - now).count();
  return static_cast<int>(std::clamp<decltype(ms)>(ms, 0, 60'000));
}

// Takes the connections waiting in the backlog (at most the cap's worth a
// round, so a flood of connects does not starve those being served).
void MetricsServer::accept_waiting() {
  for (size_t taken = 0; taken < kMaxConnections; ++taken) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      // That client is gone already; the next may be waiting.
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
      // Out of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM).
      if (!warned_out_of_descriptors_) {
        log_warn("metrics: cannot accept a connection (" + errno_now() + "); retrying every 20 ms");
        warned_out_of_descriptors_ = true;
      }
      accept_again_ = Clock::now() + kAcceptBackoff;
      return;
    }
    warned_out_of_descriptors_ = false;
    if (open_.size() >= kMaxConnections) make_room();
    Connection& c = open_.emplace_back();
    c.fd = fd;
    c.deadline = Clock::now() + kRequestTime;
    // A scraper's request is usually there by now: read (and answer) it at
    // once, so that the connections accepted after it in this round do not
    // take it for an idle one and drop it to make room.
    advance(c);
    if (c.fd < 0) open_.pop_back();
  }
}

// Drops the oldest connection whose request has not arrived whole (the
// oldest of all when every one is being answered): see the header.
void MetricsServer::make_room() {
  auto victim = std::find_if(open_.begin(), open_.end(), [](const Connection& c) { return !c.answering(); });
  if (victim == open_.end()) victim = open_.begin();
  victim->close();
  open_.erase(victim);
  if (!warned_full_) {
    log_warn("metrics: " + std::to_string(kMaxConnections) +
             " connections open at once; each new one drops the oldest idle one");
    warned_full_ = true;
  }
}

// Reads what the client sent or sends what it has not taken of the answer,
// as far as the socket allows without waiting; closes the connection when
// it is answered or the client went away.
void MetricsServer::advance(Connection& c) {
  if (!c.answering()) {
    char buf[2048];
    for (;;) {
      const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n <= 0) return c.close();  // the client went away
      c.request.append(buf, static_cast<size_t>(n));
      if (c.request.size() > kMaxRequest || request_complete(c.request)) break;
    }
    c.answer = answer_to(c.request);
    c.request = {};
    c.deadline = Clock::now() + kAnswerTime;
  }
  while (c.sent < c.answer.size()) {
    const ssize_t n = ::send(c.fd, c.answer.data() + c.sent, c.answer.size() - c.sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) break;  // the client went away
    c.sent += static_cast<size_t>(n);
  }
  c.close();
}

// The answer to a whole request, or to one past kMaxRequest.
std::string MetricsServer::answer_to(const std::string& req) {
  if (req.size() > kMaxRequest) {
    return response(431, "Request Header Fields Too Large", "text/plain", "request too large\n", false);
  }
  const auto eol = req.find_first_of("\r\n");
  const std::string line = req.substr(0, eol);
  const auto sp1 = line.find(' ');
  const auto sp2 = line.find(' ', sp1 == std::string::npos ? 0 : sp1 + 1);
  if (sp1 == std::string::npos || sp2 == std::string::npos) {
    return response(400, "Bad Request", "text/plain", "bad request line\n", false);
  }
  const std::string method = line.substr(0, sp1);
  std::string target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  if (const auto q = target.find('?'); q != std::string::npos) target.resize(q);
  const bool head = method == "HEAD";
  if (method != "GET" && !head) {
    return response(405, "Method Not Allowed", "text/plain", "only GET and HEAD\n", false);
  }
  if (target == "/metrics") {
    return response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", render_(), head);
  }
  if (target == "/") {
    return response(200, "OK", "text/plain; charset=utf-8", "zerod daemon: metrics at /metrics\n", head);
  }
  return response(404, "Not Found", "text/plain", "no such page: " + target + " (try /metrics)\n", head);
}

}  // namespace zerod::server
