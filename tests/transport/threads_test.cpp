// Partial writes through tiny socket buffers, and shutdown() waking threads
// blocked in receive, send and accept.
#include "test_support.h"
#include "transport/connection.h"
#include "transport/listener.h"

#include <gtest/gtest.h>

#include <sys/socket.h>

#include <chrono>
#include <future>
#include <thread>

namespace zerod::transport {
namespace {

using namespace std::chrono_literals;

TEST(Threads, FramesSurvivePartialWritesThroughTinyBuffers) {
  auto [a, b] = connection_pair();
  const int small = 4096;  // the kernel rounds this up to its minimum
  ASSERT_EQ(::setsockopt(a.fd(), SOL_SOCKET, SO_SNDBUF, &small, sizeof small), 0);
  ASSERT_EQ(::setsockopt(b.fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small), 0);
  UniqueFd m = test::make_memfd();
  constexpr int kFrames = 4;
  constexpr std::size_t kBody = 256 * 1024;
  std::thread sender([&a = a, &m] {
    const int fds[] = {m.get()};
    for (int i = 0; i < kFrames; ++i) {
      FrameHeader h;
      h.request_id = static_cast<uint32_t>(i);
      a.send(h, test::pattern(kBody, static_cast<uint32_t>(i)), fds, 30000);
    }
  });
  std::this_thread::sleep_for(50ms);  // let the sender fill the buffer and block mid-frame
  for (int i = 0; i < kFrames; ++i) {
    const Frame f = b.receive(kBody, 30000);
    EXPECT_EQ(f.header.request_id, static_cast<uint32_t>(i));
    EXPECT_EQ(f.fds.size(), 1U);
    EXPECT_TRUE(f.body == test::pattern(kBody, static_cast<uint32_t>(i))) << "frame " << i;
  }
  sender.join();
}

TEST(Threads, ShutdownWakesABlockedReceive) {
  auto [a, b] = connection_pair();
  auto blocked = std::async(std::launch::async, [&b = b]() -> std::optional<Error> {
    try {
      b.receive(1024);  // no timeout: only shutdown can end this
    } catch (const Error& e) {
      return e;
    }
    return std::nullopt;
  });
  EXPECT_EQ(blocked.wait_for(100ms), std::future_status::timeout);
  b.shutdown();
  ASSERT_EQ(blocked.wait_for(10s), std::future_status::ready);
  const auto e = blocked.get();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), ZD_ERR_PEER_LOST);
  EXPECT_NE(std::string(e->what()).find("shut down by this process"), std::string::npos)
      << e->what();
  EXPECT_TRUE(b.is_shut_down());
  // The peer sees end of stream.
  auto peer = test::thrown<Error>([&a = a] { a.receive(1024, 1000); });
  ASSERT_TRUE(peer);
  EXPECT_EQ(peer->code(), ZD_ERR_PEER_LOST);
}

TEST(Threads, ShutdownWakesABlockedSend) {
  auto [a, b] = connection_pair();
  auto blocked = std::async(std::launch::async, [&a = a]() -> std::optional<Error> {
    try {
      a.send(FrameHeader{}, test::pattern(8 << 20, 1));  // nobody reads: blocks
    } catch (const Error& e) {
      return e;
    }
    return std::nullopt;
  });
  EXPECT_EQ(blocked.wait_for(100ms), std::future_status::timeout);
  a.shutdown();
  ASSERT_EQ(blocked.wait_for(10s), std::future_status::ready);
  const auto e = blocked.get();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), ZD_ERR_PEER_LOST);
}

TEST(Threads, ShutdownWakesABlockedAccept) {
  Listener listener = Listener::create_private("");
  auto blocked = std::async(std::launch::async, [&listener] { return listener.accept(); });
  EXPECT_EQ(blocked.wait_for(100ms), std::future_status::timeout);
  listener.shutdown();
  ASSERT_EQ(blocked.wait_for(10s), std::future_status::ready);
  EXPECT_FALSE(blocked.get().has_value());
  // And every later accept returns at once.
  EXPECT_FALSE(listener.accept(10000).has_value());
}

TEST(Threads, OneThreadSendsWhileAnotherReceives) {
  auto [a, b] = connection_pair();
  constexpr int kFrames = 200;
  // Each side echoes: a's sender and a's receiver run at the same time.
  std::thread echo([&b = b] {
    for (int i = 0; i < kFrames; ++i) {
      Frame f = b.receive(1 << 20, 30000);
      b.send(f.header, f.body);
    }
  });
  std::thread sender([&a = a] {
    for (int i = 0; i < kFrames; ++i) {
      FrameHeader h;
      h.request_id = static_cast<uint32_t>(i);
      a.send(h, test::pattern(static_cast<std::size_t>(i) * 1000, static_cast<uint32_t>(i)), {},
             30000);
    }
  });
  for (int i = 0; i < kFrames; ++i) {
    const Frame f = a.receive(1 << 20, 30000);
    ASSERT_EQ(f.header.request_id, static_cast<uint32_t>(i));
    ASSERT_TRUE(f.body ==
                test::pattern(static_cast<std::size_t>(i) * 1000, static_cast<uint32_t>(i)));
  }
  sender.join();
  echo.join();
}

}  // namespace
}  // namespace zerod::transport
