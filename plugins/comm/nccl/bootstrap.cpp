#include "bootstrap.h"

#include <zerod/kit/text.h>

#include <arpa/inet.h>
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
#include <cinttypes>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace zerod::comm::nccl {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kHelloMagic = 0x5a444e31;    // "ZDN1"
constexpr uint32_t kWelcomeMagic = 0x5a444e57;  // "ZDNW"
constexpr uint32_t kNoticeMagic = 0x5a444e4e;   // "ZDNN"
constexpr uint32_t kVersion = 1;
constexpr size_t kReasonMax = 1024;  // a message, e.g. the layout refusal, whole
// More nodes than this in a hello is garbage, not a job (the welcome's
// size follows from it).
constexpr int kMaxNodes = 1 << 16;
// A connection gets this long to say hello, so that a client that connects
// and says nothing holds the root up for no longer.
constexpr auto kHelloWait = std::chrono::seconds(2);

struct Hello {
  uint32_t magic;
  uint32_t version;
  int32_t node, nodes, world, local;
  uint64_t generation;
  int64_t pid;
  char host[kHostMax];
};

// The head of every version's welcome. A root answers a hello of another
// version with a refusal in this layout (status ZD_ERR_VERSION), which a
// node of any version reads: it must never change.
struct WelcomeHead {
  uint32_t magic;
  int32_t status;
  char message[kReasonMax];
  uint8_t id[kIdBytes];
};
static_assert(sizeof(WelcomeHead) == 1160, "the welcome's head is every version's");

struct WelcomePeer {
  int64_t pid;
  char host[kHostMax];
};

struct NoticeWire {
  uint32_t magic;
  uint32_t kind;
  int32_t node;
  int32_t status;
  char reason[kReasonMax];
};

void copy_cut(char* dst, size_t size, const std::string& s) {
  const size_t n = std::min(size - 1, s.size());
  std::memcpy(dst, s.data(), n);
  std::memset(dst + n, 0, size - n);
}

std::string terminated(const char* s, size_t size) { return std::string(s, strnlen(s, size)); }

// Milliseconds left before the deadline, for poll (-1: no limit).
int ms_left(Clock::time_point deadline) {
  if (deadline == Clock::time_point::max()) return -1;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

// 1: all n bytes read; 0: the connection closed or failed; -1: the deadline passed.
int read_full(int fd, void* buf, size_t n, Clock::time_point deadline) {
  auto* p = static_cast<uint8_t*>(buf);
  size_t got = 0;
  while (got < n) {
    pollfd pfd{fd, POLLIN, 0};
    const int pr = poll(&pfd, 1, ms_left(deadline));
    if (pr < 0 && errno == EINTR) continue;
    if (pr < 0) return 0;
    if (pr == 0) return -1;
    const ssize_t r = recv(fd, p + got, n - got, 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r <= 0) return 0;
    got += static_cast<size_t>(r);
  }
  return 1;
}

bool write_full(int fd, const void* buf, size_t n) {
  const auto* p = static_cast<const uint8_t*>(buf);
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

Clock::time_point deadline_of(double timeout_s) {
  if (timeout_s <= 0) return Clock::time_point::max();
  return Clock::now() + std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6));
}

std::string peer_name(const sockaddr_storage& a) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (a.ss_family == AF_INET) {
    const auto* s = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &s->sin_addr, host, sizeof host);
    port = ntohs(s->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* s = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &s->sin6_addr, host, sizeof host);
    port = ntohs(s->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

// Whether a node's connection has been closed by its end (its daemon died
// or was restarted): a node says nothing between its hello and the
// welcome, so anything readable is the close (or a reset).
bool closed(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if ((p.revents & (POLLHUP | POLLERR | POLLRDHUP)) != 0) return true;
  char byte;
  const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void no_delay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// "node 2 (host b, pid 77)".
std::string describe(int node, const PeerInfo& p) {
  return "node " + std::to_string(node) + " (host " + p.host + ", pid " + std::to_string(p.pid) + ")";
}

std::string root_text(const RootAddress& r) {
  return r.host + ":" + std::to_string(r.port) + " (" + r.source + ")";
}

// The welcome for a node, or a refusal (status != ZD_OK, message).
bool send_welcome(int fd, zd_status status, const std::string& message, const BootstrapRequest& req,
                  const std::vector<PeerInfo>& peers) {
  WelcomeHead h{};
  h.magic = kWelcomeMagic;
  h.status = status;
  copy_cut(h.message, sizeof h.message, message);
  std::memcpy(h.id, req.id.data(), kIdBytes);
  if (!write_full(fd, &h, sizeof h)) return false;
  if (status != ZD_OK) return true;
  std::vector<WelcomePeer> all(peers.size());
  for (size_t i = 0; i < peers.size(); ++i) {
    all[i].pid = peers[i].pid;
    copy_cut(all[i].host, sizeof all[i].host, peers[i].host);
  }
  return write_full(fd, all.data(), all.size() * sizeof(WelcomePeer));
}

class Listener {
 public:
  ~Listener() {
    if (fd_ >= 0) close(fd_);
  }
  int fd() const { return fd_; }

  zd_status open(const RootAddress& root, char* err, size_t err_size) {
    // IPv6 with v4-mapped addresses takes both families; a host without
    // IPv6 gets IPv4.
    fd_ = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool v6 = fd_ >= 0;
    if (!v6) fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) {
      set_error(err, err_size, "nccl bootstrap: socket(): %s", std::strerror(errno));
      return ZD_ERR_IO;
    }
    const int one = 1, zero = 0;
    // A port in TIME_WAIT from the job's previous instance is free to bind;
    // a port another process listens on is not (Linux refuses both anyway
    // without SO_REUSEPORT).
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int rc;
    if (v6) {
      setsockopt(fd_, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_addr = in6addr_any;
      a.sin6_port = htons(static_cast<uint16_t>(root.port));
      rc = bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    } else {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      a.sin_port = htons(static_cast<uint16_t>(root.port));
      rc = bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    }
    if (rc != 0) {
      const int e = errno;
      if (e == EADDRINUSE) {
        set_error(err, err_size,
                  "nccl bootstrap: node 0 cannot listen on port %d (from %s): the port is taken on this host "
                  "(another job or process listens there); give this job another port with comm = { port = ... } "
                  "or ZEROD_NCCL_ROOT=host:port",
                  root.port, root.source.c_str());
        return ZD_ERR_CONFIG;
      }
      set_error(err, err_size, "nccl bootstrap: node 0 cannot listen on port %d (from %s): %s", root.port,
                root.source.c_str(), std::strerror(e));
      return e == EACCES ? ZD_ERR_CONFIG : ZD_ERR_IO;
    }
    if (listen(fd_, 64) != 0) {
      set_error(err, err_size, "nccl bootstrap: listen on port %d: %s", root.port, std::strerror(errno));
      return ZD_ERR_IO;
    }
    return ZD_OK;
  }

 private:
  int fd_ = -1;
};

zd_status run_root(const BootstrapRequest& req, BootstrapResult* out, char* err, size_t err_size) {
  Listener l;
  zd_status st = l.open(req.root, err, err_size);
  if (st != ZD_OK) return st;
  const auto deadline = deadline_of(req.timeout_s);
  std::vector<int> fds(static_cast<size_t>(req.nodes), -1);
  std::vector<PeerInfo> peers(static_cast<size_t>(req.nodes));
  peers[0] = PeerInfo{req.host, req.pid};
  int missing = req.nodes - 1;
  auto drop = [&](int fd, const std::string& who, const char* why) {
    if (req.log) req.log("nccl bootstrap: dropped a connection from " + who + " on port " +
                         std::to_string(req.root.port) + ": " + why);
    close(fd);
  };
  // A refusal of the job (a daemon with another layout): every node that
  // came hears it, so that none waits for the timeout.
  auto refuse = [&](zd_status s, const std::string& msg) {
    for (int& fd : fds) {
      if (fd < 0) continue;
      send_welcome(fd, s, msg, req, peers);
      close(fd);
      fd = -1;
    }
    set_error(err, err_size, "%s", msg.c_str());
    return s;
  };
  // A node whose connection closed after its hello: its daemon died, or was
  // restarted (its launcher started it again) and says hello anew. It is
  // waited for again, not failed at the welcome nor taken for a second
  // daemon with its --node-rank when the new one comes.
  std::vector<std::string> gone(fds.size());  // per node not back: who closed (for the timeout's message)
  auto forget_if_closed = [&](size_t n, const std::string& why) {
    if (fds[n] < 0 || !closed(fds[n])) return;
    const std::string who = describe(static_cast<int>(n), peers[n]);
    if (req.log) req.log("nccl bootstrap: " + who + " closed its connection before the exchange ended; " + why);
    gone[n] = who;
    close(fds[n]);
    fds[n] = -1;
    ++missing;
  };
  for (;;) {
    if (missing == 0) {
      // Everyone came: one last look before the welcome.
      for (size_t n = 1; n < fds.size(); ++n) forget_if_closed(n, "waiting for node " + std::to_string(n) + " again");
      if (missing == 0) break;
    }
    pollfd pfd{l.fd(), POLLIN, 0};
    const int pr = poll(&pfd, 1, ms_left(deadline));
    if (pr < 0 && errno == EINTR) continue;
    if (pr == 0) {
      std::string list, not_back;
      for (int n = 1; n < req.nodes; ++n) {
        const auto k = static_cast<size_t>(n);
        if (fds[k] >= 0) continue;
        list += (list.empty() ? "" : ", ") + std::to_string(n);
        if (!gone[k].empty()) not_back += (not_back.empty() ? "" : ", ") + gone[k];
      }
      return refuse(ZD_ERR_TIMEOUT,
                    "nccl bootstrap: node" + std::string(missing == 1 ? " " : "s ") + list + " of " +
                        std::to_string(req.nodes) + " never connected to node 0 at " + root_text(req.root) +
                        " within " + std::to_string(static_cast<int>(req.timeout_s)) +
                        " s (comm.timeout); are those daemons started, with the same root address?" +
                        (not_back.empty() ? "" : " (closed after its hello and not back: " + not_back + ")"));
    }
    if (pr < 0) return refuse(ZD_ERR_IO, std::string("nccl bootstrap: poll: ") + std::strerror(errno));
    sockaddr_storage from{};
    socklen_t len = sizeof from;
    const int c = accept4(l.fd(), reinterpret_cast<sockaddr*>(&from), &len, SOCK_CLOEXEC);
    if (c < 0) continue;  // the client left already, or a transient error
    const std::string who = peer_name(from);
    Hello h{};
    const auto hello_until = std::min(deadline, Clock::now() + kHelloWait);
    // The magic and version first: the rest is this version's layout only.
    int got = read_full(c, &h, offsetof(Hello, node), hello_until);
    if (got == 1 && h.magic == kHelloMagic && h.version == kVersion)
      got = read_full(c, reinterpret_cast<uint8_t*>(&h) + offsetof(Hello, node), sizeof h - offsetof(Hello, node),
                      hello_until);
    if (got != 1) {
      drop(c, who, got < 0 ? "it sent no complete hello within 2 s" : "it closed before a complete hello");
      continue;
    }
    if (h.magic != kHelloMagic) {
      drop(c, who, "not a zerod nccl daemon (wrong magic)");
      continue;
    }
    if (h.version != kVersion) {
      // A daemon of this job from another zerod build: dropped in silence,
      // it took that for a root not up yet and retried until its timeout,
      // and this root timed out saying it never connected. Both fail now,
      // saying why.
      char msg[512];
      std::snprintf(msg, sizeof msg,
                    "nccl bootstrap: the root daemon (node 0, host %s, pid %" PRId64
                    ") speaks bootstrap v%u, the daemon at %s sent v%u; run the same zerod build on every node",
                    req.host.c_str(), req.pid, kVersion, who.c_str(), h.version);
      send_welcome(c, ZD_ERR_VERSION, msg, req, peers);
      // The rest of its hello is unread: a close now would be a reset,
      // which can drop the refusal before the daemon reads it. Our side
      // ends first, then what it sent is read off briefly.
      shutdown(c, SHUT_WR);
      uint8_t rest[sizeof(Hello)];
      (void)read_full(c, rest, sizeof rest, std::min(deadline, Clock::now() + std::chrono::milliseconds(200)));
      close(c);
      return refuse(ZD_ERR_VERSION, msg);
    }
    const PeerInfo p{terminated(h.host, sizeof h.host), h.pid};
    if (h.nodes != req.nodes || h.world != req.world || h.local != req.local || h.node < 1 || h.node >= req.nodes) {
      char msg[512];
      std::snprintf(msg, sizeof msg,
                    "nccl bootstrap: the daemons disagree on the job's layout: node %d (host %s, pid %" PRId64
                    ") says it is node %d of %d with %d ranks each (world_size %d); node 0 (host %s, pid %" PRId64
                    ") has %d nodes of %d ranks (world_size %d). Start every daemon with the same --nproc and "
                    "--nnodes",
                    h.node, p.host.c_str(), p.pid, h.node, h.nodes, h.local, h.world, req.host.c_str(), req.pid,
                    req.nodes, req.local, req.world);
      send_welcome(c, ZD_ERR_CONFIG, msg, req, peers);
      close(c);
      return refuse(ZD_ERR_CONFIG, msg);
    }
    const auto n = static_cast<size_t>(h.node);
    forget_if_closed(n, "took the new one from host " + p.host + ", pid " + std::to_string(p.pid) + " (" + who +
                            ") as node " + std::to_string(h.node));
    if (fds[n] >= 0 || h.generation != req.generation) {
      char msg[512];
      if (fds[n] >= 0)
        std::snprintf(msg, sizeof msg,
                      "nccl bootstrap: two daemons say they are node %d: %s and host %s, pid %" PRId64
                      "; give each daemon its own --node-rank",
                      h.node, describe(h.node, peers[n]).c_str(), p.host.c_str(), p.pid);
      else
        std::snprintf(msg, sizeof msg,
                      "nccl bootstrap: node %d (host %s, pid %" PRId64 ") is creating its comm instance number %" PRIu64
                      " of the job, node 0 its number %" PRIu64
                      ": the daemons must create their instances in the same order (a daemon restarted alone "
                      "cannot rejoin; restart every node)",
                      h.node, p.host.c_str(), p.pid, h.generation + 1, req.generation + 1);
      send_welcome(c, ZD_ERR_CONFIG, msg, req, peers);
      close(c);
      return refuse(ZD_ERR_CONFIG, msg);
    }
    no_delay(c);
    fds[n] = c;
    peers[n] = p;
    gone[n].clear();
    --missing;
  }
  for (int n = 1; n < req.nodes; ++n) {
    if (!send_welcome(fds[static_cast<size_t>(n)], ZD_OK, "", req, peers)) {
      const std::string who = describe(n, peers[static_cast<size_t>(n)]);
      return refuse(ZD_ERR_IO, "nccl bootstrap: " + who + " left during the exchange");
    }
  }
  out->id = req.id;
  out->peers = std::move(peers);
  out->fds = std::move(fds);
  return ZD_OK;
}

// A non-blocking connect that gives up at the deadline (a host that drops
// packets would otherwise hold connect() for minutes).
int connect_until(const addrinfo* a, Clock::time_point deadline, int* error) {
  const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
  if (fd < 0) {
    *error = errno;
    return -1;
  }
  if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      *error = errno;
      close(fd);
      return -1;
    }
    pollfd pfd{fd, POLLOUT, 0};
    const int limit = std::min(ms_left(deadline) < 0 ? 1000 : ms_left(deadline), 1000);
    int pr;
    do pr = poll(&pfd, 1, limit);
    while (pr < 0 && errno == EINTR);
    int so = 0;
    socklen_t len = sizeof so;
    if (pr <= 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &len) != 0 || so != 0) {
      *error = pr == 0 ? ETIMEDOUT : so != 0 ? so : errno;
      close(fd);
      return -1;
    }
  }
  const int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  no_delay(fd);
  return fd;
}

zd_status run_node(const BootstrapRequest& req, BootstrapResult* out, char* err, size_t err_size) {
  const auto deadline = deadline_of(req.timeout_s);
  const std::string where = root_text(req.root);
  const std::string port = std::to_string(req.root.port);
  std::string last = "no answer";
  auto timed_out = [&] {
    set_error(err, err_size,
              "nccl bootstrap: node %d: the root daemon (node 0) at %s never answered within %g s "
              "(comm.timeout; last try: %s); is node 0 started, and listening there?",
              req.node, where.c_str(), req.timeout_s, last.c_str());
    return ZD_ERR_TIMEOUT;
  };
  auto backoff = std::chrono::milliseconds(50);
  while (true) {
    if (deadline != Clock::time_point::max() && Clock::now() >= deadline) return timed_out();
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* list = nullptr;
    const int gai = getaddrinfo(req.root.host.c_str(), port.c_str(), &hints, &list);
    int fd = -1;
    if (gai != 0) {
      last = std::string("cannot resolve host '") + req.root.host + "': " + gai_strerror(gai);
      if (gai != EAI_AGAIN) {
        set_error(err, err_size, "nccl bootstrap: node %d: the root daemon's address %s: %s", req.node, where.c_str(),
                  last.c_str());
        return ZD_ERR_CONFIG;
      }
    } else {
      for (const addrinfo* a = list; a != nullptr && fd < 0; a = a->ai_next) {
        int e = 0;
        fd = connect_until(a, deadline, &e);
        if (fd < 0) last = std::string("connect: ") + std::strerror(e);
      }
      freeaddrinfo(list);
    }
    if (fd >= 0) {
      Hello h{};
      h.magic = kHelloMagic;
      h.version = kVersion;
      h.node = req.node;
      h.nodes = req.nodes;
      h.world = req.world;
      h.local = req.local;
      h.generation = req.generation;
      h.pid = req.pid;
      copy_cut(h.host, sizeof h.host, req.host);
      WelcomeHead w{};
      if (!write_full(fd, &h, sizeof h)) {
        last = "the connection closed before the hello was sent";
        close(fd);
      } else {
        // The root answers once every node has come: this waits up to the
        // whole timeout.
        // The magic first: a stranger that answers less than a welcome is
        // told apart at once, not at the timeout.
        int got = read_full(fd, &w.magic, sizeof w.magic, deadline);
        if (got == 1 && w.magic == kWelcomeMagic)
          got = read_full(fd, reinterpret_cast<uint8_t*>(&w) + sizeof w.magic, sizeof w - sizeof w.magic, deadline);
        if (got < 0) {
          last = "connected, but no answer to the hello";
          close(fd);
          return timed_out();
        }
        if (got == 0) {
          // A root that is not up yet does not accept; one that accepted
          // and closed without a word dropped us (not a zerod root, or the
          // previous instance's listener closing): try again.
          last = "the process there closed the connection without answering (a root of an older zerod build "
                 "drops a hello of another bootstrap version so)";
          close(fd);
        } else if (w.magic != kWelcomeMagic) {
          close(fd);
          set_error(err, err_size,
                    "nccl bootstrap: node %d: the process at %s is not a zerod nccl root (it answered something "
                    "else); is the port right?",
                    req.node, where.c_str());
          return ZD_ERR_CONFIG;
        } else if (w.status != ZD_OK) {
          close(fd);
          set_error(err, err_size, "%s", terminated(w.message, sizeof w.message).c_str());
          return static_cast<zd_status>(w.status);
        } else {
          std::vector<WelcomePeer> all(static_cast<size_t>(req.nodes));
          if (read_full(fd, all.data(), all.size() * sizeof(WelcomePeer), deadline) != 1) {
            close(fd);
            set_error(err, err_size, "nccl bootstrap: node %d: the root at %s closed during its answer", req.node,
                      where.c_str());
            return ZD_ERR_IO;
          }
          std::memcpy(out->id.data(), w.id, kIdBytes);
          out->peers.clear();
          for (const WelcomePeer& p : all) out->peers.push_back(PeerInfo{terminated(p.host, sizeof p.host), p.pid});
          out->fds.assign(1, fd);
          return ZD_OK;
        }
      }
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}

bool parse_port(const char* s, int* out) {
  if (s == nullptr || *s == '\0') return false;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s, &end, 10);
  if (errno != 0 || *end != '\0' || v < 1 || v > 65535) return false;
  *out = static_cast<int>(v);
  return true;
}

}  // namespace

zd_status resolve_root(int port, const std::function<const char*(const char*)>& getenv, RootAddress* out, char* err,
                       size_t err_size) {
  if (const char* r = getenv("ZEROD_NCCL_ROOT"); r != nullptr && *r != '\0') {
    const std::string v = r;
    const auto colon = v.rfind(':');
    int p = 0;
    // [v6::addr]:port or host:port.
    std::string host = colon == std::string::npos ? "" : v.substr(0, colon);
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    if (colon == std::string::npos || host.empty() || !parse_port(v.c_str() + colon + 1, &p)) {
      set_error(err, err_size, "ZEROD_NCCL_ROOT=%s is not host:port (the nccl backend's root daemon, node 0)", r);
      return ZD_ERR_CONFIG;
    }
    *out = RootAddress{host, p, std::string("ZEROD_NCCL_ROOT=") + v};
    return ZD_OK;
  }
  const char* addr = getenv("MASTER_ADDR");
  const char* mport = getenv("MASTER_PORT");
  if (addr == nullptr || *addr == '\0') {
    set_error(err, err_size,
              "the nccl backend needs the address of its root daemon (node 0), and nothing gives it: set "
              "ZEROD_NCCL_ROOT=host:port, or MASTER_ADDR with comm = { port = ... } in the job script or "
              "MASTER_PORT (the root then listens on MASTER_PORT + 2)");
    return ZD_ERR_CONFIG;
  }
  if (port > 0) {
    *out = RootAddress{addr, port, std::string("MASTER_ADDR=") + addr + ", comm.port=" + std::to_string(port)};
    return ZD_OK;
  }
  int mp = 0;
  if (mport == nullptr || *mport == '\0') {
    set_error(err, err_size,
              "the nccl backend has MASTER_ADDR=%s but no port for its root daemon (node 0): set comm = { port = ... } "
              "in the job script, MASTER_PORT (the root listens on MASTER_PORT + 2), or ZEROD_NCCL_ROOT=host:port",
              addr);
    return ZD_ERR_CONFIG;
  }
  if (!parse_port(mport, &mp) || mp + 2 > 65535) {
    set_error(err, err_size, "MASTER_PORT=%s is not a port below 65534 (the nccl root listens on MASTER_PORT + 2)",
              mport);
    return ZD_ERR_CONFIG;
  }
  *out = RootAddress{addr, mp + 2, std::string("MASTER_ADDR=") + addr + ", MASTER_PORT=" + mport + " + 2"};
  return ZD_OK;
}

zd_status bootstrap(const BootstrapRequest& req, BootstrapResult* out, char* err, size_t err_size) {
  if (req.nodes < 1 || req.nodes > kMaxNodes || req.node < 0 || req.node >= req.nodes) {
    set_error(err, err_size, "nccl bootstrap: node %d of %d is not a node of the job", req.node, req.nodes);
    return ZD_ERR_INVALID_ARGUMENT;
  }
  if (req.nodes == 1) {
    out->id = req.id;
    out->peers.assign(1, PeerInfo{req.host, req.pid});
    out->fds.assign(1, -1);
    return ZD_OK;
  }
  try {
    return req.node == 0 ? run_root(req, out, err, err_size) : run_node(req, out, err, err_size);
  } catch (const std::bad_alloc&) {
    set_error(err, err_size, "nccl bootstrap: out of memory");
    return ZD_ERR_OUT_OF_MEMORY;
  }
}

bool send_notice(int fd, const Notice& n) {
  NoticeWire w{};
  w.magic = kNoticeMagic;
  w.kind = n.kind;
  w.node = n.node;
  w.status = n.status;
  copy_cut(w.reason, sizeof w.reason, n.reason);
  return fd >= 0 && write_full(fd, &w, sizeof w);
}

int read_notice(int fd, Notice* out) {
  NoticeWire w{};
  // Called when the connection is readable: a whole notice follows at once
  // from a daemon; one that stops halfway is not a daemon's.
  const int got = read_full(fd, &w, sizeof w, Clock::now() + std::chrono::seconds(5));
  if (got < 0) return -1;
  if (got == 0) return 0;
  if (w.magic != kNoticeMagic || (w.kind != Notice::kBye && w.kind != Notice::kAbort)) return -1;
  out->kind = static_cast<Notice::Kind>(w.kind);
  out->node = w.node;
  out->status = w.status;
  out->reason = terminated(w.reason, sizeof w.reason);
  return 1;
}

std::string setup_news(const std::vector<int>& fds, const std::vector<PeerInfo>& peers, int node) {
  for (size_t i = 0; i < fds.size(); ++i) {
    if (fds[i] < 0) continue;
    pollfd p{fds[i], POLLIN, 0};
    if (poll(&p, 1, 0) <= 0 || p.revents == 0) continue;
    const size_t who = node == 0 ? i : 0;
    char name[256];
    std::snprintf(name, sizeof name, "node %zu (host %s, pid %" PRId64 ")", who,
                  who < peers.size() ? peers[who].host.c_str() : "?", who < peers.size() ? peers[who].pid : int64_t{0});
    Notice n;
    const int got = read_notice(fds[i], &n);
    if (got == 1 && n.kind == Notice::kAbort) return n.reason;
    if (got == 1) return std::string(name) + " left before NCCL's setup ended";
    if (got == 0)
      return std::string(name) + " closed its connection during NCCL's setup (its daemon died or gave up)";
    return std::string(name) + " sent garbage on its connection (not a zerod nccl daemon's notice)";
  }
  return "";
}

void close_fds(std::vector<int>& fds) {
  for (int& fd : fds) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
}

}  // namespace zerod::comm::nccl
