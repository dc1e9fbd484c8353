// The mpi plugin's Link (plugins/comm/mpi/link.h) in one MPI process of its
// own (a singleton, no mpirun): a transfer MPI refuses to post (here, to a
// node the communicator does not have) ends the wait with MPI's error
// instead of leaving nothing to wait for, which the wait took for a
// transfer still under way until its deadline (or for ever without one).
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
  if (Link::open(p, mine, 10.0, 0.0, 1 << 20, &link, &all, err, sizeof err) != ZD_OK) ADD_FAILURE() << err;
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

}  // namespace
