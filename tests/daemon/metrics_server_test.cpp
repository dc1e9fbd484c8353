// The daemon's metrics endpoint against clients that do not behave. Each
// connection has its own deadline and the connections are served side by
// side: silent or trickling clients do not delay a scrape (one at a time,
// three silent ones held a scrape for 15 s, six for 30, past Prometheus'
// 10 s scrape timeout), a trickler is still dropped 5 s after it connected,
// more idle connections than the cap cost the oldest of them their place,
// not the fresh scrape, a server out of descriptors backs off instead of
// spinning, and destroying the server while a client holds it returns at
// once (the daemon's exit joins the server's thread).
#include "metrics_server.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using zerod::server::MetricsServer;

int port_of(const MetricsServer& s) {
  const std::string& w = s.where();  // http://127.0.0.1:PORT/metrics
  const auto colon = w.rfind(':');
  return std::stoi(w.substr(colon + 1));
}

// Gives up on the socket's send and receive (connect included) after
// `seconds`: a server that stops accepting or answering fails the test
// instead of hanging it.
void time_out_after(int fd, int seconds) {
  const timeval tv{seconds, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) time_out_after(fd, 3);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  return fd;
}

// The answer to `req` on a fresh connection ("" when it timed out), and
// how long it took.
std::string ask(int port, const std::string& req, double* seconds) {
  const auto t0 = Clock::now();
  const int fd = connect_to(port);
  if (fd < 0) return "";
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return "";
  }
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  *seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return out;
}

std::string scrape(int port, double* seconds) {
  return ask(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", seconds);
}

// A client that connects and sends a request line, never the blank line
// that ends the request (-1 when it could not connect).
int silent_client(int port) {
  const int fd = connect_to(port);
  const std::string line = "GET /metrics HTTP/1.1\r\n";
  if (fd >= 0 && ::send(fd, line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size())) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Whether the server closed fd within `wait_ms` (it never answers a
// request it has not had whole, so anything readable is the close).
bool closed_by_server(int fd, int wait_ms) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, wait_ms) <= 0) return false;
  char c;
  return ::recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

TEST(MetricsServer, AClientTricklingItsRequestIsDroppedFiveSecondsAfterItConnected) {
  MetricsServer server("127.0.0.1:0", [] { return std::string("zerod_test_metric 1\n"); });
  const int port = port_of(server);
  const auto connected = Clock::now();
  const int slow = connect_to(port);
  ASSERT_GE(slow, 0);
  // One byte a second, never a whole request, for up to 9 s, until the
  // server closes the connection.
  std::atomic<double> dropped_after{-1.0};
  std::thread trickle([&] {
    for (int i = 0; i < 9; ++i) {
      if (::send(slow, "G", 1, MSG_NOSIGNAL) != 1 || closed_by_server(slow, 1000)) {
        dropped_after = std::chrono::duration<double>(Clock::now() - connected).count();
        return;
      }
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // Beside it, a scrape is answered at once: it does not wait for the
  // trickler to be dropped.
  double seconds = 0;
  const std::string answer = scrape(port, &seconds);
  EXPECT_NE(answer.find("HTTP/1.1 200 OK"), std::string::npos) << answer;
  EXPECT_NE(answer.find("zerod_test_metric 1"), std::string::npos) << answer;
  EXPECT_LT(seconds, 1.0) << "the scrape waited behind the trickling client";
  trickle.join();
  // Dropped about 5 s after it connected, though each byte came within 5 s
  // of the one before (a loaded CI machine has slack here).
  EXPECT_GE(dropped_after.load(), 4.5);
  EXPECT_LT(dropped_after.load(), 7.0);
  ::close(slow);
}

TEST(MetricsServer, SilentClientsDoNotDelayAScrape) {
  MetricsServer server("127.0.0.1:0", [] { return std::string("zerod_test_metric 1\n"); });
  const int port = port_of(server);
  std::vector<int> silent;
  for (int i = 0; i < 3; ++i) {
    silent.push_back(silent_client(port));
    ASSERT_GE(silent.back(), 0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  double seconds = 0;
  const std::string answer = scrape(port, &seconds);
  EXPECT_NE(answer.find("HTTP/1.1 200 OK"), std::string::npos) << answer;
  EXPECT_LT(seconds, 1.0) << "the scrape waited behind the silent clients";
  for (const int fd : silent) {
    EXPECT_FALSE(closed_by_server(fd, 0)) << "a silent client was dropped before its 5 s";
    ::close(fd);
  }
}

TEST(MetricsServer, IdleClientsPastTheCapCostTheOldestTheirPlaceNotANewScrape) {
  MetricsServer server("127.0.0.1:0", [] { return std::string("zerod_test_metric 1\n"); });
  const int port = port_of(server);
  constexpr size_t extra = 16;
  std::vector<int> idle;
  for (size_t i = 0; i < MetricsServer::kMaxConnections + extra; ++i) {
    idle.push_back(silent_client(port));
    ASSERT_GE(idle.back(), 0) << "connection " << i << " was not accepted";
  }
  double seconds = 0;
  const std::string answer = scrape(port, &seconds);
  EXPECT_NE(answer.find("HTTP/1.1 200 OK"), std::string::npos) << answer;
  EXPECT_LT(seconds, 1.0) << "the scrape waited behind the idle clients";
  // The scrape made room for itself by dropping the oldest idle client, as
  // each of the `extra` did before it; the newest stay.
  const size_t dropped = extra + 1;
  for (size_t i = 0; i < idle.size(); ++i) {
    if (i < dropped) {
      EXPECT_TRUE(closed_by_server(idle[i], 2000)) << "idle client " << i << " was kept past the cap";
    } else {
      EXPECT_FALSE(closed_by_server(idle[i], 0)) << "idle client " << i << " was dropped, not an older one";
    }
    ::close(idle[i]);
  }
}

TEST(MetricsServer, AnswersEachKindOfRequest) {
  MetricsServer server("127.0.0.1:0", [] { return std::string("zerod_test_metric 1\n"); });
  const int port = port_of(server);
  double s = 0;
  const std::string head = ask(port, "HEAD /metrics?x=1 HTTP/1.1\r\n\r\n", &s);
  EXPECT_EQ(head.find("HTTP/1.1 200 OK"), 0u) << head;
  EXPECT_NE(head.find("Content-Length: 20\r\n"), std::string::npos) << head;
  EXPECT_EQ(head.find("zerod_test_metric"), std::string::npos) << "HEAD answered with a body: " << head;
  EXPECT_NE(ask(port, "GET / HTTP/1.0\n\n", &s).find("metrics at /metrics"), std::string::npos);
  EXPECT_EQ(ask(port, "GET /nope HTTP/1.1\r\n\r\n", &s).find("HTTP/1.1 404 Not Found"), 0u);
  EXPECT_EQ(ask(port, "POST /metrics HTTP/1.1\r\n\r\n", &s).find("HTTP/1.1 405 Method Not Allowed"), 0u);
  EXPECT_EQ(ask(port, "GARBAGE\r\n\r\n", &s).find("HTTP/1.1 400 Bad Request"), 0u);
  const std::string huge = "GET /metrics HTTP/1.1\r\nX: " + std::string(20000, 'a') + "\r\n\r\n";
  EXPECT_EQ(ask(port, huge, &s).find("HTTP/1.1 431 Request Header Fields Too Large"), 0u);
}

// The process's CPU time, in seconds (the server's thread is the only one
// that works while the test sleeps).
double cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

TEST(MetricsServer, OutOfDescriptorsItBacksOffAndServesWhenSomeAreFree) {
  MetricsServer server("127.0.0.1:0", [] { return std::string("zerod_test_metric 1\n"); });
  const int port = port_of(server);
  // Every descriptor under a lowered limit taken but one, which the client
  // takes: its connection waits in the backlog and the server's accept
  // fails with EMFILE, the listening socket staying readable.
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit low = old;
  low.rlim_cur = std::min<rlim_t>(old.rlim_cur, 128);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> fillers;
  for (int fd; (fd = ::fcntl(0, F_DUPFD_CLOEXEC, 0)) >= 0;) fillers.push_back(fd);
  ASSERT_EQ(errno, EMFILE);
  ASSERT_FALSE(fillers.empty());
  ::close(fillers.back());
  fillers.pop_back();
  const int client = connect_to(port);
  ASSERT_GE(client, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const double cpu0 = cpu_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  const double busy = cpu_seconds() - cpu0;
  EXPECT_LT(busy, 0.1) << "the server spun on the accept it could not make";
  for (const int fd : fillers) ::close(fd);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);
  // With descriptors free again, the waiting connection is served.
  const std::string req = "GET /metrics HTTP/1.1\r\n\r\n";
  ASSERT_EQ(::send(client, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(client, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(client);
  EXPECT_NE(out.find("HTTP/1.1 200 OK"), std::string::npos) << out;
}

TEST(MetricsServer, StoppingDoesNotWaitForAClientThatHoldsIt) {
  auto server = std::make_unique<MetricsServer>("127.0.0.1:0", [] { return std::string("x 1\n"); });
  const int held = connect_to(port_of(*server));
  ASSERT_GE(held, 0);
  ASSERT_EQ(::send(held, "GET /me", 7, MSG_NOSIGNAL), 7);  // a request never finished
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = Clock::now();
  server.reset();
  // Well under the 5 s a held request may take (a loaded CI machine has
  // slack here).
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 3.0);
  ::close(held);
}

}  // namespace
