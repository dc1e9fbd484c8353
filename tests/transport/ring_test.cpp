// The call ring (transport/ring.h) between two threads of this process:
// requests and replies pass in order, a sleeper is woken, a wait times out,
// ends when alive() says the peer is gone or when aborted; the daemon side
// refuses a ring memfd that is not sealed, too short, or whose header lies.
#include "transport/ring.h"

#include "error.h"
#include "test_support.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>

#include <atomic>
#include <functional>
#include <cstring>
#include <thread>

using namespace zerod;
using namespace zerod::transport;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t kSize = 64 * 1024;

struct Pair {
  Ring client, daemon;
  Pair() {
    UniqueFd fd;
    client = Ring::create(kSize, 256, &fd);
    daemon = Ring::attach(fd.get(), kSize);
  }
};

RingWait quick(std::chrono::microseconds spin = 50us) {
  RingWait w;
  w.spin = spin;
  w.slice_ms = 5;
  return w;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Ring, RequestsAndRepliesPassInOrderThroughSpinAndSleep) {
  Pair p;
  constexpr uint32_t kCalls = 2000;
  std::thread daemon([&] {
    for (uint32_t i = 0; i < kCalls; ++i) {
      ASSERT_EQ(p.daemon.wait_request(quick()), RingWaitEnd::ready);
      uint32_t x;
      std::memcpy(&x, p.daemon.request_slot().data(), sizeof x);
      x += 1;
      std::memcpy(p.daemon.reply_slot().data(), &x, sizeof x);
      p.daemon.post_reply();
    }
  });
  for (uint32_t i = 0; i < kCalls; ++i) {
    std::memcpy(p.client.request_slot().data(), &i, sizeof i);
    // Every 100th call the client dawdles past the daemon's spin, so the
    // daemon is asleep in FUTEX_WAIT and must be woken.
    if (i % 100 == 99) std::this_thread::sleep_for(2ms);
    p.client.post_request();
    ASSERT_EQ(p.client.wait_reply(quick(i % 2 ? 0us : 50us)), RingWaitEnd::ready);
    uint32_t y;
    std::memcpy(&y, p.client.reply_slot().data(), sizeof y);
    ASSERT_EQ(y, i + 1);
  }
  daemon.join();
}

TEST(Ring, AWaitTimesOutEndsWhenThePeerIsGoneAndWhenAborted) {
  Pair p;
  RingWait w = quick(0us);
  w.deadline = std::chrono::steady_clock::now() + 30ms;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(p.daemon.wait_request(w), RingWaitEnd::timeout);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 25ms);

  int asked = 0;
  RingWait gone = quick(0us);
  gone.alive = [&] { return ++asked < 3; };
  EXPECT_EQ(p.daemon.wait_request(gone), RingWaitEnd::gone);
  EXPECT_EQ(asked, 3);

  std::atomic<bool> stop{false};
  RingWait abort = quick(0us);
  abort.slice_ms = 0;  // one sleep until woken: only the wake ends it
  abort.abort = &stop;
  std::thread stopper([&] {
    std::this_thread::sleep_for(20ms);
    stop.store(true);
    p.daemon.wake_daemon();
  });
  EXPECT_EQ(p.daemon.wait_request(abort), RingWaitEnd::aborted);
  stopper.join();
}

// A request whose wait timed out is still the daemon's to answer: the
// client's next wait must be for the next request's reply, not end at once
// because the reply word moved from where it was (the late reply of the
// one before, or no reply at all yet, would be read as the answer).
TEST(Ring, AWaitIsForTheReplyToTheLastRequestOnly) {
  Pair p;
  RingWait w = quick(0us);
  std::memcpy(p.client.request_slot().data(), "1", 1);
  p.client.post_request();
  w.deadline = std::chrono::steady_clock::now() + 20ms;
  ASSERT_EQ(p.client.wait_reply(w), RingWaitEnd::timeout);
  // The daemon takes request 1 and is still running it when request 2 comes.
  ASSERT_EQ(p.daemon.wait_request(quick()), RingWaitEnd::ready);
  p.client.post_request();
  w.deadline = std::chrono::steady_clock::now() + 20ms;
  EXPECT_EQ(p.client.wait_reply(w), RingWaitEnd::timeout) << "no reply was posted, yet the wait ended";
  // Request 1's late reply is not request 2's.
  p.daemon.post_reply();
  w.deadline = std::chrono::steady_clock::now() + 20ms;
  EXPECT_EQ(p.client.wait_reply(w), RingWaitEnd::timeout) << "the reply to request 1 ended the wait for request 2";
  ASSERT_EQ(p.daemon.wait_request(quick()), RingWaitEnd::ready);
  p.daemon.post_reply();
  w.deadline = std::chrono::steady_clock::now() + 1s;
  EXPECT_EQ(p.client.wait_reply(w), RingWaitEnd::ready);
}

TEST(Ring, TheDaemonRefusesUnsealedShortAndLyingRings) {
  // Not sealed against resizing: the client could shrink it under the daemon.
  UniqueFd plain(memfd_create("plain", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_TRUE(plain);
  ASSERT_EQ(ftruncate(plain.get(), kSize), 0);
  EXPECT_NE(error_of([&] { Ring::attach(plain.get(), kSize); }).find("is not sealed against resizing"),
            std::string::npos);
  // Sealed, but shorter than claimed.
  UniqueFd fd;
  Ring r = Ring::create(kSize, 256, &fd);
  EXPECT_NE(error_of([&] { Ring::attach(fd.get(), 2 * kSize); }).find("fewer than the"), std::string::npos);
  // A claim below the least ring.
  EXPECT_NE(error_of([&] { Ring::attach(fd.get(), 100); }).find("fewer than the least"), std::string::npos);
  // A header that is not a ring's, or that disagrees with the proven size.
  UniqueFd blank = create_sealed_memfd("blank", kSize);
  EXPECT_NE(error_of([&] { Ring::attach(blank.get(), kSize); }).find("does not begin with a version-1 ring header"),
            std::string::npos);
  UniqueFd big;
  Ring r2 = Ring::create(2 * kSize, 256, &big);
  EXPECT_NE(error_of([&] { Ring::attach(big.get(), kSize); }).find("its header says"), std::string::npos);
}
