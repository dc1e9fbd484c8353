// The nccl plugin's bootstrap (plugins/comm/nccl/bootstrap.h) on the CPU:
// the root's address from the environment, the id exchange between
// processes (the same id and peer table on every daemon), the timeouts of
// a root nobody reaches and of nodes that never come, a port already
// taken, daemons that disagree on the layout, input on the port that is
// not a daemon's (dropped, the exchange still completes), a node whose
// daemon restarted during the exchange, two daemons with one node index, a
// daemon of another bootstrap version (refused in words, both ways), and
// the failure notices over the kept connections.
#include <gmock/gmock.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap.h"

namespace zerod::comm::nccl {
namespace {

using ::testing::HasSubstr;

// A port nobody listens on now (the kernel's pick for port 0).
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

UniqueId random_id(uint64_t seed) {
  std::mt19937_64 rng(seed);
  UniqueId id;
  for (auto& b : id) b = static_cast<uint8_t>(rng());
  return id;
}

BootstrapRequest request(int node, int nodes, int port, double timeout_s = 20) {
  BootstrapRequest r;
  r.root = RootAddress{"127.0.0.1", port, "the test"};
  r.node = node;
  r.nodes = nodes;
  r.local = 2;
  r.world = 2 * nodes;
  r.timeout_s = timeout_s;
  r.host = "host" + std::to_string(node);
  r.pid = 1000 + node;
  return r;
}

struct Outcome {
  zd_status status = ZD_ERR_INTERNAL;
  std::string error;
  BootstrapResult result;
};

Outcome run(const BootstrapRequest& r) {
  Outcome o;
  char err[1024] = "";
  o.status = bootstrap(r, &o.result, err, sizeof err);
  o.error = err;
  return o;
}

// A root of a test that reads its log, run on a thread of its own from
// construction: every line goes to `logged`, under `mu` (the test reads it
// once join() returned). The request's id is random_id(seed).
struct LoggedRoot {
  std::vector<std::string> logged;
  std::mutex mu;
  Outcome outcome;
  std::thread thread;

  LoggedRoot(BootstrapRequest r, int seed) {
    r.id = random_id(seed);
    r.log = [this](const std::string& m) {
      std::lock_guard<std::mutex> g(mu);
      logged.push_back(m);
    };
    thread = std::thread([this, r] { outcome = run(r); });
  }
  ~LoggedRoot() {
    if (thread.joinable()) thread.join();
  }
  void join() { thread.join(); }
};

std::function<const char*(const char*)> env(std::map<std::string, std::string> m) {
  auto vars = std::make_shared<std::map<std::string, std::string>>(std::move(m));
  return [vars](const char* k) -> const char* {
    auto it = vars->find(k);
    return it == vars->end() ? nullptr : it->second.c_str();
  };
}

TEST(ResolveRoot, TakesZerodNcclRootFirst) {
  RootAddress a;
  char err[512] = "";
  ASSERT_EQ(resolve_root(7, env({{"ZEROD_NCCL_ROOT", "nodeA:1234"}, {"MASTER_ADDR", "b"}, {"MASTER_PORT", "9"}}), &a,
                         err, sizeof err),
            ZD_OK)
      << err;
  EXPECT_EQ(a.host, "nodeA");
  EXPECT_EQ(a.port, 1234);
  ASSERT_EQ(resolve_root(0, env({{"ZEROD_NCCL_ROOT", "[::1]:80"}}), &a, err, sizeof err), ZD_OK) << err;
  EXPECT_EQ(a.host, "::1");
  EXPECT_EQ(a.port, 80);
}

TEST(ResolveRoot, MasterAddrWithTheJobsPortOrMasterPortPlusTwo) {
  RootAddress a;
  char err[512] = "";
  ASSERT_EQ(resolve_root(29510, env({{"MASTER_ADDR", "head"}, {"MASTER_PORT", "29500"}}), &a, err, sizeof err), ZD_OK);
  EXPECT_EQ(a.host, "head");
  EXPECT_EQ(a.port, 29510);
  EXPECT_THAT(a.source, HasSubstr("comm.port=29510"));
  ASSERT_EQ(resolve_root(0, env({{"MASTER_ADDR", "head"}, {"MASTER_PORT", "29500"}}), &a, err, sizeof err), ZD_OK);
  EXPECT_EQ(a.port, 29502);
  EXPECT_THAT(a.source, HasSubstr("MASTER_PORT=29500 + 2"));
}

TEST(ResolveRoot, NamesEveryKeyWhenNothingIsSet) {
  RootAddress a;
  char err[512] = "";
  EXPECT_EQ(resolve_root(0, env({}), &a, err, sizeof err), ZD_ERR_CONFIG);
  for (const char* key : {"ZEROD_NCCL_ROOT", "MASTER_ADDR", "port", "MASTER_PORT"})
    EXPECT_THAT(std::string(err), HasSubstr(key));
  EXPECT_EQ(resolve_root(0, env({{"MASTER_ADDR", "head"}}), &a, err, sizeof err), ZD_ERR_CONFIG);
  EXPECT_THAT(std::string(err), HasSubstr("no port"));
  EXPECT_EQ(resolve_root(0, env({{"ZEROD_NCCL_ROOT", "head"}}), &a, err, sizeof err), ZD_ERR_CONFIG);
  EXPECT_THAT(std::string(err), HasSubstr("ZEROD_NCCL_ROOT=head is not host:port"));
  EXPECT_EQ(resolve_root(0, env({{"ZEROD_NCCL_ROOT", "head:99999"}}), &a, err, sizeof err), ZD_ERR_CONFIG);
  EXPECT_EQ(resolve_root(0, env({{"MASTER_ADDR", "h"}, {"MASTER_PORT", "x1"}}), &a, err, sizeof err), ZD_ERR_CONFIG);
  EXPECT_THAT(std::string(err), HasSubstr("MASTER_PORT=x1"));
}

// Nodes 1..3 in processes of their own (as daemons are): each writes the
// id and peer table it got to a pipe; every one must equal the root's.
TEST(Bootstrap, EveryProcessGetsTheRootsIdAndThePeers) {
  const int nodes = 4, port = free_port();
  const UniqueId id = random_id(42);
  std::vector<pid_t> kids;
  std::vector<int> pipes;
  for (int n = 1; n < nodes; ++n) {
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(p[0]);
      Outcome o = run(request(n, nodes, port));
      std::string report = o.status == ZD_OK ? "ok " : "failed " + o.error;
      if (o.status == ZD_OK) {
        report.append(reinterpret_cast<const char*>(o.result.id.data()), kIdBytes);
        for (const PeerInfo& peer : o.result.peers) report += " " + peer.host + "/" + std::to_string(peer.pid);
      }
      if (write(p[1], report.data(), report.size()) < 0) _exit(3);
      _exit(0);
    }
    close(p[1]);
    kids.push_back(pid);
    pipes.push_back(p[0]);
  }
  BootstrapRequest root = request(0, nodes, port);
  root.id = id;
  Outcome o = run(root);
  ASSERT_EQ(o.status, ZD_OK) << o.error;
  ASSERT_EQ(o.result.peers.size(), 4u);
  const std::string table = " host0/1000 host1/1001 host2/1002 host3/1003";
  for (int n = 0; n < nodes; ++n)
    EXPECT_EQ(o.result.peers[static_cast<size_t>(n)].host, "host" + std::to_string(n));
  for (size_t k = 0; k < kids.size(); ++k) {
    std::string got;
    char buf[512];
    ssize_t r;
    while ((r = read(pipes[k], buf, sizeof buf)) > 0) got.append(buf, static_cast<size_t>(r));
    close(pipes[k]);
    int status = 0;
    waitpid(kids[k], &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ASSERT_EQ(got.rfind("ok ", 0), 0u) << "node " << k + 1 << ": " << got;
    EXPECT_EQ(got.substr(3, kIdBytes), std::string(reinterpret_cast<const char*>(id.data()), kIdBytes))
        << "node " << k + 1 << " got another id";
    EXPECT_EQ(got.substr(3 + kIdBytes), table);
  }
  close_fds(o.result.fds);
}

TEST(Bootstrap, ANodeWhoseRootNeverAnswersTimesOutNamingTheAddress) {
  const int port = free_port();
  const auto t0 = std::chrono::steady_clock::now();
  Outcome o = run(request(1, 2, port, 1.0));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(o.status, ZD_ERR_TIMEOUT);
  EXPECT_THAT(o.error, HasSubstr("the root daemon (node 0) at 127.0.0.1:" + std::to_string(port)));
  EXPECT_THAT(o.error, HasSubstr("never answered within 1 s"));
  EXPECT_THAT(o.error, HasSubstr("Connection refused"));
  EXPECT_LT(s, 5.0);
}

TEST(Bootstrap, ARootWhoseNodesNeverComeTimesOutNamingThem) {
  Outcome o = run(request(0, 3, free_port(), 1.0));
  EXPECT_EQ(o.status, ZD_ERR_TIMEOUT);
  EXPECT_THAT(o.error, HasSubstr("nodes 1, 2 of 3 never connected to node 0"));
}

TEST(Bootstrap, APortTakenIsAConfigErrorNamingIt) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(fd, 4), 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  Outcome o = run(request(0, 2, port, 5));
  EXPECT_EQ(o.status, ZD_ERR_CONFIG);
  EXPECT_THAT(o.error, HasSubstr("cannot listen on port " + std::to_string(port)));
  EXPECT_THAT(o.error, HasSubstr("taken"));
  EXPECT_THAT(o.error, HasSubstr("comm = { port = ... }"));
  close(fd);
}

TEST(Bootstrap, DaemonsThatDisagreeOnTheLayoutBothFail) {
  const int port = free_port();
  Outcome node;
  std::thread t([&] {
    BootstrapRequest r = request(1, 2, port);
    r.world = 6;
    r.local = 3;
    node = run(r);
  });
  Outcome root = run(request(0, 2, port));
  t.join();
  EXPECT_EQ(root.status, ZD_ERR_CONFIG);
  EXPECT_EQ(node.status, ZD_ERR_CONFIG);
  EXPECT_THAT(root.error, HasSubstr("disagree"));
  EXPECT_THAT(root.error, HasSubstr("--nproc"));
  EXPECT_EQ(node.error, root.error) << "the node hears the root's verdict";
}

// Raw connections to the root's port, then the real node: the root drops
// each and completes the exchange.
TEST(Bootstrap, HostileInputOnThePortIsDroppedAndTheExchangeCompletes) {
  const int port = free_port();
  LoggedRoot lr(request(0, 2, port), 7);
  Outcome& root = lr.outcome;
  auto connect_raw = [&] {
    for (int tries = 0; tries < 200; ++tries) {
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
      close(fd);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  };
  auto drain = [](int fd) {
    // The root closes a dropped connection: read to the end, so that we
    // know it has been handled before the next one.
    char b[64];
    while (read(fd, b, sizeof b) > 0) {
    }
    close(fd);
  };
  // Garbage as long as a hello.
  int fd = connect_raw();
  ASSERT_GE(fd, 0);
  std::string junk(104, 'x');
  ASSERT_EQ(write(fd, junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
  drain(fd);
  // A short hello, then the connection closed.
  fd = connect_raw();
  ASSERT_EQ(write(fd, "ZDN", 3), 3);
  shutdown(fd, SHUT_WR);
  drain(fd);
  // An HTTP request.
  fd = connect_raw();
  const std::string http = "GET / HTTP/1.0\r\nHost: x\r\n\r\n" + std::string(100, ' ');
  ASSERT_GT(write(fd, http.data(), http.size()), 0);
  drain(fd);
  // Silence: dropped after its 2 s.
  fd = connect_raw();
  drain(fd);
  Outcome node = run(request(1, 2, port));
  lr.join();
  ASSERT_EQ(root.status, ZD_OK) << root.error;
  ASSERT_EQ(node.status, ZD_OK) << node.error;
  EXPECT_EQ(node.result.id, random_id(7));
  std::lock_guard<std::mutex> g(lr.mu);
  ASSERT_EQ(lr.logged.size(), 4u);
  EXPECT_THAT(lr.logged[0], HasSubstr("wrong magic"));
  EXPECT_THAT(lr.logged[1], HasSubstr("closed before a complete hello"));
  EXPECT_THAT(lr.logged[2], HasSubstr("wrong magic"));
  EXPECT_THAT(lr.logged[3], HasSubstr("no complete hello within 2 s"));
  close_fds(root.result.fds);
  close_fds(node.result.fds);
}

// A listener on a free loopback port, standing in for a root: its fd, and
// its address in *a; -1 on failure.
int loopback_listener(sockaddr_in* a) {
  const int lfd = socket(AF_INET, SOCK_STREAM, 0);
  *a = sockaddr_in{};
  a->sin_family = AF_INET;
  a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (lfd < 0 || bind(lfd, reinterpret_cast<sockaddr*>(a), sizeof *a) != 0 || listen(lfd, 4) != 0) return -1;
  socklen_t len = sizeof *a;
  getsockname(lfd, reinterpret_cast<sockaddr*>(a), &len);
  return lfd;
}

// A node that is told the port holds something else fails at once.
TEST(Bootstrap, ANodeAnsweredByAStrangerSaysItIsNotARoot) {
  sockaddr_in a{};
  const int lfd = loopback_listener(&a);
  ASSERT_GE(lfd, 0);
  std::thread stranger([&] {
    const int c = accept(lfd, nullptr, nullptr);
    char hello[104];
    if (read(c, hello, sizeof hello) > 0) {
      const std::string reply(400, 'H');
      if (write(c, reply.data(), reply.size()) < 0) {
      }
    }
    close(c);
  });
  Outcome o = run(request(1, 2, ntohs(a.sin_port), 10));
  stranger.join();
  close(lfd);
  EXPECT_EQ(o.status, ZD_ERR_CONFIG);
  EXPECT_THAT(o.error, HasSubstr("is not a zerod nccl root"));
}

// The wire's hello and the welcome's head, as bootstrap.cpp sends them:
// the tests below speak for daemons that are not this build's run_node
// (one that died after its hello, one of another version).
struct RawHello {
  uint32_t magic = 0x5a444e31;  // "ZDN1"
  uint32_t version = 1;
  int32_t node = 0, nodes = 0, world = 0, local = 0;
  uint64_t generation = 0;
  int64_t pid = 0;
  char host[kHostMax] = "";
};
static_assert(sizeof(RawHello) == 104, "the bootstrap's hello");
struct RawWelcomeHead {
  uint32_t magic;
  int32_t status;
  char message[1024];
  uint8_t id[kIdBytes];
};
constexpr uint32_t kWelcomeMagic = 0x5a444e57;  // "ZDNW"

// A connection to the root at `port` that has sent `h` (the root may still
// be starting: tried for a few seconds); -1 if none.
int send_raw_hello(int port, const RawHello& h) {
  for (int tries = 0; tries < 200; ++tries) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      if (write(fd, &h, sizeof h) == static_cast<ssize_t>(sizeof h)) return fd;
      close(fd);
      return -1;
    }
    close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

RawHello hello_of(int node, int nodes, int64_t pid) {
  RawHello h;
  h.node = node;
  h.nodes = nodes;
  h.local = 2;
  h.world = 2 * nodes;
  h.pid = pid;
  std::snprintf(h.host, sizeof h.host, "host%d", node);
  return h;
}

// Node 1's daemon says hello and dies; its launcher starts it again, and
// the new one says hello, before or after node 2 comes. The root waits for
// it and takes the new connection (it used to take it for a second daemon
// with node 1's --node-rank, or fail the welcome to the dead one, and fail
// the job), and says so in its log.
TEST(Bootstrap, ANodeRestartedDuringTheExchangeTakesItsPlace) {
  const int port = free_port();
  LoggedRoot lr(request(0, 3, port), 9);
  Outcome& root = lr.outcome;
  const int first = send_raw_hello(port, hello_of(1, 3, 111));
  ASSERT_GE(first, 0);
  close(first);  // the daemon died
  Outcome again, other;
  std::thread restarted([&] { again = run(request(1, 3, port)); });
  std::thread node2([&] { other = run(request(2, 3, port)); });
  restarted.join();
  node2.join();
  lr.join();
  ASSERT_EQ(root.status, ZD_OK) << root.error;
  ASSERT_EQ(again.status, ZD_OK) << again.error;
  ASSERT_EQ(other.status, ZD_OK) << other.error;
  EXPECT_EQ(again.result.id, random_id(9));
  EXPECT_EQ(root.result.peers[1].pid, 1001) << "the restarted daemon is node 1";
  EXPECT_EQ(again.result.peers[1].pid, 1001);
  std::lock_guard<std::mutex> g(lr.mu);
  ASSERT_EQ(lr.logged.size(), 1u);
  // Which words depends on whether node 2 came first.
  EXPECT_THAT(lr.logged[0], HasSubstr("node 1 (host host1, pid 111) closed its connection before the exchange ended; "));
  close_fds(root.result.fds);
  close_fds(again.result.fds);
  close_fds(other.result.fds);
}

// A node that said hello and died, and is not started again: when the
// others have come, the root waits for it until its timeout, which names
// it (it used to send the welcome to the dead connection and fail the job
// at once, so that a restarted daemon could not take its place).
TEST(Bootstrap, ANodeThatDiedAfterItsHelloIsWaitedForAndNamed) {
  const int port = free_port();
  Outcome root, node2;
  std::thread t([&] { root = run(request(0, 3, port, 5)); });
  const int first = send_raw_hello(port, hello_of(1, 3, 111));
  ASSERT_GE(first, 0);
  close(first);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  node2 = run(request(2, 3, port, 20));
  t.join();
  EXPECT_EQ(root.status, ZD_ERR_TIMEOUT);
  EXPECT_THAT(root.error, HasSubstr("node 1 of 3 never connected to node 0"));
  EXPECT_THAT(root.error, HasSubstr("(closed after its hello and not back: node 1 (host host1, pid 111))"));
  EXPECT_EQ(node2.status, ZD_ERR_TIMEOUT);
  EXPECT_EQ(node2.error, root.error) << "node 2 hears the root's verdict";
}

// Two live daemons with one --node-rank: the job fails on both, naming them.
TEST(Bootstrap, TwoLiveDaemonsThatSayTheyAreOneNodeFailTheJob) {
  const int port = free_port();
  Outcome root;
  std::thread t([&] { root = run(request(0, 3, port)); });
  const int first = send_raw_hello(port, hello_of(1, 3, 111));
  ASSERT_GE(first, 0);
  const Outcome second = run(request(1, 3, port));
  t.join();
  close(first);
  EXPECT_EQ(root.status, ZD_ERR_CONFIG);
  EXPECT_THAT(root.error, HasSubstr("two daemons say they are node 1: node 1 (host host1, pid 111) and host host1, "
                                    "pid 1001; give each daemon its own --node-rank"));
  EXPECT_EQ(second.status, ZD_ERR_CONFIG);
  EXPECT_EQ(second.error, root.error);
}

// A daemon of another bootstrap version (another zerod build) is answered
// with a refusal in the welcome's head, which every version reads, and the
// root fails too: it used to drop the hello without a word, the daemon
// retried until its timeout, and the root said the node never connected.
TEST(Bootstrap, ADaemonOfAnotherVersionIsRefusedInWordsAndTheJobFails) {
  const int port = free_port();
  Outcome root;
  std::thread t([&] { root = run(request(0, 2, port)); });
  RawHello h = hello_of(1, 2, 222);
  h.version = 2;
  const auto t0 = std::chrono::steady_clock::now();
  const int fd = send_raw_hello(port, h);
  ASSERT_GE(fd, 0);
  RawWelcomeHead w{};
  size_t got = 0;
  while (got < sizeof w) {
    const ssize_t n = read(fd, reinterpret_cast<char*>(&w) + got, sizeof w - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  t.join();
  ASSERT_EQ(got, sizeof w) << "the root closed without a word";
  EXPECT_EQ(w.magic, kWelcomeMagic);
  EXPECT_EQ(w.status, ZD_ERR_VERSION);
  const std::string told(w.message, strnlen(w.message, sizeof w.message));
  EXPECT_THAT(told, HasSubstr("the root daemon (node 0, host host0, pid 1000) speaks bootstrap v1, the daemon at "));
  EXPECT_THAT(told, HasSubstr("127.0.0.1:"));  // its address (IPv4-mapped where the root listens on IPv6)
  EXPECT_THAT(told, HasSubstr(" sent v2; run the same zerod build on every node"));
  EXPECT_EQ(root.status, ZD_ERR_VERSION);
  EXPECT_EQ(root.error, told);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5)) << "the root waited for its timeout";
}

// A node told by its root that they speak other versions stops at once,
// with the root's words (a root of a later version answers so).
TEST(Bootstrap, ANodeRefusedForItsVersionStopsAtOnce) {
  sockaddr_in a{};
  const int lfd = loopback_listener(&a);
  ASSERT_GE(lfd, 0);
  std::thread later_root([&] {
    const int c = accept(lfd, nullptr, nullptr);
    RawHello h;
    if (read(c, &h, sizeof h) > 0) {
      RawWelcomeHead w{};
      w.magic = kWelcomeMagic;
      w.status = ZD_ERR_VERSION;
      std::snprintf(w.message, sizeof w.message, "nccl bootstrap: the root speaks bootstrap v2, the node sent v%u",
                    h.version);
      if (write(c, &w, sizeof w) < 0) {
      }
    }
    close(c);
  });
  const auto t0 = std::chrono::steady_clock::now();
  Outcome o = run(request(1, 2, ntohs(a.sin_port), 20));
  later_root.join();
  close(lfd);
  EXPECT_EQ(o.status, ZD_ERR_VERSION);
  EXPECT_EQ(o.error, "nccl bootstrap: the root speaks bootstrap v2, the node sent v1");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

// A root and one node through the exchange: (root, node).
std::pair<Outcome, Outcome> exchange_of_two() {
  const int port = free_port();
  Outcome node;
  std::thread t([&] { node = run(request(1, 2, port)); });
  Outcome root = run(request(0, 2, port));
  t.join();
  return {std::move(root), std::move(node)};
}

TEST(Notices, TravelOverTheKeptConnectionsAndACloseReadsAsGone) {
  auto [root, node] = exchange_of_two();
  ASSERT_EQ(root.status, ZD_OK) << root.error;
  ASSERT_EQ(node.status, ZD_OK) << node.error;
  ASSERT_EQ(root.result.fds.size(), 2u);
  EXPECT_EQ(root.result.fds[0], -1);
  ASSERT_EQ(node.result.fds.size(), 1u);
  Notice n;
  n.kind = Notice::kAbort;
  n.node = 1;
  n.status = ZD_ERR_TIMEOUT;
  n.reason = "node 1 (host host1, pid 1001): rank 3's all_reduce did not complete";
  ASSERT_TRUE(send_notice(node.result.fds[0], n));
  Notice got;
  ASSERT_EQ(read_notice(root.result.fds[1], &got), 1);
  EXPECT_EQ(got.kind, Notice::kAbort);
  EXPECT_EQ(got.node, 1);
  EXPECT_EQ(got.status, ZD_ERR_TIMEOUT);
  EXPECT_EQ(got.reason, n.reason);
  // Garbage on the connection reads as such, a close as gone.
  const std::string junk(16 + 1024, 'j');  // a notice's size
  ASSERT_EQ(write(node.result.fds[0], junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
  EXPECT_EQ(read_notice(root.result.fds[1], &got), -1);
  close_fds(node.result.fds);
  EXPECT_EQ(read_notice(root.result.fds[1], &got), 0);
  close_fds(root.result.fds);
}

// What a daemon waiting in NCCL's setup hears from the others before its
// notice thread runs (setup_news): nothing, a peer's failure in its words,
// a close named, garbage named.
// Waits (up to 5 s) until `fd` has something to read: loopback delivery
// may lag on a busy machine, and setup_news only looks.
bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, 5000) == 1;
}

TEST(Notices, SetupNewsIsNothingAPeersWordsOrItsCloseNamed) {
  auto [root, node] = exchange_of_two();
  ASSERT_EQ(root.status, ZD_OK) << root.error;
  ASSERT_EQ(node.status, ZD_OK) << node.error;
  const std::vector<PeerInfo>& peers = root.result.peers;
  ASSERT_EQ(peers.size(), 2u);
  EXPECT_EQ(setup_news(root.result.fds, peers, 0), "") << "nothing said yet";
  EXPECT_EQ(setup_news(node.result.fds, node.result.peers, 1), "");

  Notice n;
  n.kind = Notice::kAbort;
  n.node = 1;
  n.status = ZD_ERR_IO;
  n.reason = "node 1 (host host1): NCCL could not set up the communicator of ranks 2-3: unhandled system error";
  ASSERT_TRUE(send_notice(node.result.fds[0], n));
  ASSERT_TRUE(readable(root.result.fds[1]));
  EXPECT_EQ(setup_news(root.result.fds, peers, 0), n.reason);

  const std::string junk(16 + 1024, 'j');
  ASSERT_EQ(write(root.result.fds[1], junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
  ASSERT_TRUE(readable(node.result.fds[0]));
  EXPECT_THAT(setup_news(node.result.fds, node.result.peers, 1), HasSubstr("node 0 (host " + peers[0].host));

  close_fds(node.result.fds);
  ASSERT_TRUE(readable(root.result.fds[1]));
  const std::string closed = setup_news(root.result.fds, peers, 0);
  EXPECT_THAT(closed, HasSubstr("node 1 (host " + peers[1].host));
  EXPECT_THAT(closed, HasSubstr("pid " + std::to_string(peers[1].pid)));
  EXPECT_THAT(closed, HasSubstr("closed its connection during NCCL's setup"));
  close_fds(root.result.fds);
}

}  // namespace
}  // namespace zerod::comm::nccl
