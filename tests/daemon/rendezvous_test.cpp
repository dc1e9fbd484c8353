// The rendezvous that hands node 0's name server to the other nodes
// (daemon/cli/rendezvous.h): the value reaches a client that asks by the
// job's name, another job's name is refused in words, a hostile or silent
// client does not stop it serving the next one, and a client with no
// server, or one whose connect nobody answers, ends within its timeout
// (or at once when told to stop) saying where it looked.
#include "rendezvous.h"

#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

namespace zerod::cli {
namespace {

// A port nothing listens on right now (bound to 0, read back, closed).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// A raw client: sends `bytes`, returns what came back before the close.
std::string raw_exchange(int port, const std::string& bytes, bool then_close_write = true) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return "<no connection>";
  }
  if (!bytes.empty()) (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  if (then_close_write) ::shutdown(fd, SHUT_WR);
  std::string got;
  char buf[256];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) got.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return got;
}

class Served : public ::testing::Test {
 protected:
  void SetUp() override {
    port_ = free_port();
    thread_ = std::thread([this] { ok_ = serve_rendezvous(port_, "job-a", "1234.0;tcp://10.0.0.1:5", stop_, &listening_, &why_); });
    for (int i = 0; i < 500 && !listening_.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_TRUE(listening_.load()) << why_;
  }
  void TearDown() override {
    stop_.store(true);
    thread_.join();
    EXPECT_TRUE(ok_) << why_;
  }
  Endpoint here() const { return Endpoint{"127.0.0.1", port_}; }

  int port_ = 0;
  std::atomic<bool> stop_{false}, listening_{false};
  bool ok_ = false;
  std::string why_;
  std::thread thread_;
};

TEST_F(Served, TheJobsNameGetsTheValue) {
  std::string value, why;
  ASSERT_TRUE(fetch_rendezvous(here(), "job-a", 10, &value, &why)) << why;
  EXPECT_EQ(value, "1234.0;tcp://10.0.0.1:5");
  // Again: it serves every node, not only the first.
  ASSERT_TRUE(fetch_rendezvous(Endpoint{"localhost", port_}, "job-a", 10, &value, &why)) << why;
  EXPECT_EQ(value, "1234.0;tcp://10.0.0.1:5");
}

TEST_F(Served, AnotherJobsNameIsRefusedInWords) {
  std::string value, why;
  EXPECT_FALSE(fetch_rendezvous(here(), "job-b", 10, &value, &why));
  EXPECT_NE(why.find("serves job 'job-a', not 'job-b'"), std::string::npos) << why;
  EXPECT_TRUE(value.empty());
}

TEST_F(Served, HostileClientsAreAnsweredOrDroppedAndServingGoesOn) {
  EXPECT_EQ(raw_exchange(port_, "GET / HTTP/1.0\r\n\r\n").rfind("no this is a zerod rendezvous", 0), 0u);
  EXPECT_EQ(raw_exchange(port_, std::string(10000, 'x')), "");       // too long: dropped, no answer
  EXPECT_EQ(raw_exchange(port_, std::string("\0\xff\n", 3)).rfind("no ", 0), 0u);
  EXPECT_EQ(raw_exchange(port_, ""), "");                             // closed at once
  // One that connects and says nothing holds the server for at most a few
  // seconds; a node asking meanwhile still gets its answer.
  std::thread silent([this] { raw_exchange(port_, "", false); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::string value, why;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(fetch_rendezvous(here(), "job-a", 20, &value, &why)) << why;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15));
  EXPECT_EQ(value, "1234.0;tcp://10.0.0.1:5");
  silent.join();
}

TEST_F(Served, ASecondServerOnThePortIsRefusedNamingTheWayOut) {
  std::atomic<bool> stop{true}, listening{false};
  std::string why;
  EXPECT_FALSE(serve_rendezvous(port_, "job-c", "x", stop, &listening, &why));
  EXPECT_FALSE(listening.load());
  EXPECT_NE(why.find("cannot listen on port " + std::to_string(port_)), std::string::npos) << why;
  EXPECT_NE(why.find("ZEROD_RENDEZVOUS"), std::string::npos) << why;
}

TEST(Rendezvous, NoServerEndsWithinTheTimeoutSayingWhere) {
  const int port = free_port();
  std::string value, why;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(fetch_rendezvous(Endpoint{"127.0.0.1", port}, "job-a", 1.0, &value, &why));
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, std::chrono::milliseconds(900));
  EXPECT_LT(took, std::chrono::seconds(5));
  EXPECT_NE(why.find("127.0.0.1:" + std::to_string(port) + " did not answer within 1 s"), std::string::npos) << why;
}

// A listener that never accepts, its queue full: the host answers no SYN,
// as a firewall that drops packets does, and a blocking connect() waited
// about two minutes whatever the timeout.
class FullQueue : public ::testing::Test {
 protected:
  void SetUp() override {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ASSERT_EQ(::listen(listener_, 0), 0);
    socklen_t len = sizeof a;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    for (int i = 0; i < 4; ++i) {  // fill its queue
      const int c = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
      (void)::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a);
      fillers_.push_back(c);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  void TearDown() override {
    for (const int c : fillers_) ::close(c);
    ::close(listener_);
  }
  Endpoint here() const { return Endpoint{"127.0.0.1", port_}; }

  int listener_ = -1, port_ = 0;
  std::vector<int> fillers_;
};

TEST_F(FullQueue, AConnectNobodyAnswersEndsWithinTheTimeout) {
  std::string value, why;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(fetch_rendezvous(here(), "job-a", 1.0, &value, &why));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2)) << "the connect ignored the timeout";
  EXPECT_NE(why.find("did not answer within 1 s (connect: timed out"), std::string::npos) << why;
}

TEST_F(FullQueue, AStopDuringAConnectEndsItAtOnce) {
  std::string value, why;
  const auto t0 = std::chrono::steady_clock::now();
  auto stop_after = [&] { return std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(300); };
  EXPECT_FALSE(fetch_rendezvous(here(), "job-a", 30, &value, &why, stop_after));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1)) << "the stop waited for the connect";
  EXPECT_NE(why.find("stopped while waiting for node 0's rendezvous at 127.0.0.1:" + std::to_string(port_)),
            std::string::npos)
      << why;
}

TEST(Rendezvous, ServerThatComesLaterIsWaitedFor) {
  const int port = free_port();
  std::atomic<bool> stop{false}, listening{false};
  std::string why_served;
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
    serve_rendezvous(port, "job-a", "late", stop, &listening, &why_served);
  });
  std::string value, why;
  EXPECT_TRUE(fetch_rendezvous(Endpoint{"127.0.0.1", port}, "job-a", 10, &value, &why)) << why;
  EXPECT_EQ(value, "late");
  stop.store(true);
  late.join();
}

TEST(Rendezvous, EndsOnceEveryNodeHasTheValueFreeingThePort) {
  const int port = free_port();
  std::atomic<bool> stop{false}, listening{false};
  std::string why_served;
  bool served = false;
  std::thread server([&] { served = serve_rendezvous(port, "job-a", "v", stop, &listening, &why_served, 2); });
  std::string value, why;
  EXPECT_FALSE(fetch_rendezvous(Endpoint{"127.0.0.1", port}, "job-b", 10, &value, &why));  // not counted
  EXPECT_TRUE(fetch_rendezvous(Endpoint{"127.0.0.1", port}, "job-a", 10, &value, &why)) << why;
  EXPECT_TRUE(fetch_rendezvous(Endpoint{"127.0.0.1", port}, "job-a", 10, &value, &why)) << why;
  server.join();  // ends by itself after the second answer
  EXPECT_TRUE(served) << why_served;
  // The job's next attempt (a restart) can serve on the same port at once.
  std::atomic<bool> again{false};
  std::thread next([&] { serve_rendezvous(port, "job-a2", "w", stop, &again, &why_served); });
  for (int i = 0; i < 500 && !again.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(again.load()) << why_served;
  stop.store(true);
  next.join();
}

TEST(Rendezvous, EndpointsParse) {
  Endpoint e;
  std::string why;
  ASSERT_TRUE(parse_endpoint("node0.cluster:29501", &e, &why));
  EXPECT_EQ(e.host, "node0.cluster");
  EXPECT_EQ(e.port, 29501);
  ASSERT_TRUE(parse_endpoint("[fe80::1]:80", &e, &why));
  EXPECT_EQ(e.host, "fe80::1");
  EXPECT_EQ(e.port, 80);
  for (const char* bad : {"node0", ":80", "node0:", "node0:0", "node0:65536", "node0:80x", "[::1]80"}) {
    EXPECT_FALSE(parse_endpoint(bad, &e, &why)) << bad;
    EXPECT_NE(why.find(bad), std::string::npos) << why;
  }
}

}  // namespace
}  // namespace zerod::cli
