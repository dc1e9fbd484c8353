// The mpi plugin's Link (plugins/comm/mpi/link.h) in one MPI process of its
// own (a singleton, no mpirun): a transfer MPI refuses to post (here, to a
// node the communicator does not have) ends the wait with MPI's error
// instead of leaving nothing to wait for, which the wait took for a
// transfer still under way until its deadline (or for ever without one);
// and open()'s checks of the daemons' hellos (versions, refusals).
#include "link.h"
#include "mpi_env.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

using namespace zerod::comm::mpi;

namespace {

struct NeverInterrupted final : Link::Watch {
  bool interrupted() noexcept override { return false; }
};

std::unique_ptr<Link> open_link() {
  Process p;
  char err[512] = "";
  if (init(&p, err, sizeof err) != ZD_OK) {
    ADD_FAILURE() << err;
    return nullptr;
  }
  std::unique_ptr<Link> link;
  std::vector<Link::Hello> all;
  Link::Hello mine;
  if (Link::open(p, mine, nullptr, 10.0, 0.0, 1 << 20, &link, &all, err, sizeof err) != ZD_OK) ADD_FAILURE() << err;
  return link;
}

TEST(Link, ARefusedPostEndsTheWaitWithMpisError) {
  static char data[64];
  NeverInterrupted watch;
  for (const bool send : {true, false}) {
    SCOPED_TRACE(send ? "a send" : "a receive");
    std::unique_ptr<Link> link = open_link();
    ASSERT_TRUE(link);
    ASSERT_EQ(link->nodes(), 1) << "run alone, without mpirun";
    if (send)
      link->post_send(5, data, sizeof data, kTagData);
    else
      link->post_recv(5, data, sizeof data, kTagData);
    std::string error;
    const auto t0 = std::chrono::steady_clock::now();
    const Link::Outcome out =
        link->wait(t0 + std::chrono::seconds(2), std::chrono::steady_clock::duration::zero(), watch, &error);
    EXPECT_EQ(out, Link::Outcome::error) << "the wait ran to its deadline";
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
    EXPECT_NE(error.find(send ? "MPI_Isend" : "MPI_Irecv"), std::string::npos) << error;
    EXPECT_NE(error.find("node 5"), std::string::npos) << error;
    // The transfer is broken for good: a later wait says so too.
    std::string again;
    EXPECT_EQ(link->wait(std::chrono::steady_clock::now() + std::chrono::seconds(2),
                         std::chrono::steady_clock::duration::zero(), watch, &again),
              Link::Outcome::error);
    EXPECT_EQ(again, error);
  }
}

// Link::open's own checks, seen from one process (its Hello is every
// daemon's): a daemon of another Hello version is named, and a refusing
// daemon gets its own words back after the exchange.
zd_status open_with(const Link::Hello& mine, const char* refusal, std::string* error) {
  Process p;
  char err[1024] = "";
  if (init(&p, err, sizeof err) != ZD_OK) {
    *error = err;
    return ZD_ERR_INTERNAL;
  }
  std::unique_ptr<Link> link;
  std::vector<Link::Hello> all;
  const zd_status st = Link::open(p, mine, refusal, 10.0, 0.0, 1 << 20, &link, &all, err, sizeof err);
  *error = err;
  return st;
}

TEST(Link, ADaemonOfAnotherHelloVersionIsNamed) {
  Link::Hello mine;
  mine.version = 0;  // what a build from before versions sends
  std::string error;
  EXPECT_EQ(open_with(mine, nullptr, &error), ZD_ERR_VERSION) << error;
  EXPECT_NE(error.find("node 0 (host "), std::string::npos) << error;
  EXPECT_NE(error.find("speaks the mpi plugin's hello v0 (a build from before versions were sent), this daemon v1: "
                       "run the same zerod build on every node"),
            std::string::npos)
      << error;
}

TEST(Link, ARefusingDaemonTakesPartAndGetsItsOwnWords) {
  Link::Hello mine;
  mine.refused = ZD_ERR_CONFIG;
  std::string error;
  EXPECT_EQ(open_with(mine, "this daemon's layout is wrong", &error), ZD_ERR_CONFIG);
  EXPECT_EQ(error, "this daemon's layout is wrong");
}

}  // namespace
