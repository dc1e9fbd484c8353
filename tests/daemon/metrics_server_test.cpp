// The daemon's metrics endpoint against clients that do not behave: one
// that trickles its request a byte at a time is dropped 5 s after it
// connected (it was kept as long as each byte came within 5 s, holding
// every other scrape), and destroying the server while a client holds it
// returns at once (the daemon's exit joins the server's thread).
#include "metrics_server.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

namespace {

using Clock = std::chrono::steady_clock;
using zerod::server::MetricsServer;

int port_of(const MetricsServer& s) {
  const std::string& w = s.where();  // http://127.0.0.1:PORT/metrics
  const auto colon = w.rfind(':');
  return std::stoi(w.substr(colon + 1));
}

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
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

// The answer to a GET of /metrics on a fresh connection, and how long it took.
std::string scrape(int port, double* seconds) {
  const auto t0 = Clock::now();
  const int fd = connect_to(port);
  if (fd < 0) return "";
  const std::string req = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
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

TEST(MetricsServer, AClientTricklingItsRequestIsDroppedFiveSecondsAfterItConnected) {
  MetricsServer server("127.0.0.1:0", [] { return std::string("zerod_test_metric 1\n"); });
  const int port = port_of(server);
  const int slow = connect_to(port);
  ASSERT_GE(slow, 0);
  // One byte a second, never a whole request, for up to 9 s.
  std::atomic<bool> dropped{false};
  std::thread trickle([&] {
    for (int i = 0; i < 9 && !dropped; ++i) {
      if (::send(slow, "G", 1, MSG_NOSIGNAL) != 1) dropped = true;
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // Behind it, a scrape is answered once the trickler is dropped: within
  // about 5 s of its connect, not after 9.
  double seconds = 0;
  const std::string answer = scrape(port, &seconds);
  EXPECT_NE(answer.find("HTTP/1.1 200 OK"), std::string::npos) << answer;
  EXPECT_NE(answer.find("zerod_test_metric 1"), std::string::npos) << answer;
  EXPECT_LT(seconds, 7.0) << "the scrape waited behind the trickling client";
  dropped = true;
  trickle.join();
  ::close(slow);
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
