// What receive does with broken, hostile and vanishing peers, and what the
// connection is good for afterwards.
#include "test_support.h"
#include "transport/connection.h"
#include "transport/errors.h"

#include <gtest/gtest.h>

#include <sys/ioctl.h>
#include <sys/resource.h>

#include <chrono>
#include <thread>

namespace zerod::transport {
namespace {

using test::thrown;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

long max_rss_kib() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

int unread_bytes(int fd) {
  int n = -1;
  ::ioctl(fd, FIONREAD, &n);
  return n;
}

TEST(Malformed, OversizeIsRejectedBeforeAllocationAndTheStreamResyncs) {
  auto [a, b] = connection_pair();
  constexpr uint32_t kAnnounced = 1U << 30;  // 1 GiB
  constexpr uint32_t kMax = 1024;
  FrameHeader h;
  h.length = kAnnounced;
  h.request_id = 99;
  test::write_header(a.fd(), h);
  const auto start = test::pattern(100, 7);
  test::write_raw(a.fd(), start.data(), start.size());

  const long rss_before = max_rss_kib();
  auto e = thrown<ProtocolError>([&b = b] { b.receive(kMax, 5000); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ProtocolError::Kind::oversize);
  EXPECT_EQ(e->code(), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(e->recoverable());
  ASSERT_TRUE(e->header());
  EXPECT_EQ(e->header()->request_id, 99U);  // for the error reply
  EXPECT_EQ(e->header()->length, kAnnounced);
  EXPECT_TRUE(contains(e->what(), "exceeds the limit of 1024 body bytes")) << e->what();
  // Nothing but the header was consumed, and no 1 GiB buffer was touched.
  EXPECT_EQ(unread_bytes(b.fd()), 100);
  EXPECT_LT(max_rss_kib() - rss_before, 256 * 1024);
  EXPECT_EQ(b.rejected_body_left(), kAnnounced);
  EXPECT_FALSE(b.receive_out_of_step());

  // receive refuses to read body bytes as a header.
  auto s = thrown<Error>([&b = b] { b.receive(kMax, 0); });
  ASSERT_TRUE(s);
  EXPECT_EQ(s->code(), ZD_ERR_INVALID_STATE);

  // The peer goes on to send the whole gigabyte, then a good frame; the
  // server discards the body in bounded chunks and carries on.
  std::thread peer([&a = a] {
    std::vector<std::byte> zeros(1 << 20);
    uint64_t left = kAnnounced - 100;
    while (left > 0) {
      const std::size_t n = static_cast<std::size_t>(std::min<uint64_t>(left, zeros.size()));
      test::write_raw(a.fd(), zeros.data(), n);
      left -= n;
    }
    FrameHeader next;
    next.request_id = 100;
    a.send(next, test::bytes_of("after"));
  });
  b.discard_rejected_body(120000);
  EXPECT_EQ(b.rejected_body_left(), 0U);
  const Frame f = b.receive(kMax, 120000);
  peer.join();
  EXPECT_EQ(f.header.request_id, 100U);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f.body.data()), f.body.size()), "after");
}

TEST(Malformed, OversizeFrameWithFdsClosesThemAndTheNextFrameWorks) {
  UniqueFd m = test::make_memfd();
  auto [a, b] = connection_pair();
  const int fds[] = {m.get(), m.get(), m.get()};
  const int before = test::open_fd_count();
  FrameHeader big;
  big.request_id = 1;
  a.send(big, test::pattern(4096, 1), fds);
  FrameHeader small;
  small.request_id = 2;
  a.send(small, test::pattern(10, 2), fds);

  auto e = thrown<ProtocolError>([&b = b] { b.receive(1024, 1000); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ProtocolError::Kind::oversize);
  EXPECT_EQ(test::open_fd_count(), before);  // the three that came with it are closed
  b.discard_rejected_body(1000);
  // The server answers on the same connection (its error frame).
  b.send(FrameHeader{0, 0, e->header()->request_id, 0xFFFF, 0}, test::bytes_of("too big"));
  Frame f = b.receive(1024, 1000);
  EXPECT_EQ(f.header.request_id, 2U);
  EXPECT_TRUE(f.body == test::pattern(10, 2));
  EXPECT_EQ(f.fds.size(), 3U);
  EXPECT_EQ(a.receive(1024, 1000).header.request_id, 1U);
}

TEST(Malformed, DiscardTimesOutAndResumes) {
  auto [a, b] = connection_pair();
  FrameHeader h;
  h.length = 4096;
  test::write_header(a.fd(), h);
  const auto part = test::pattern(1000, 3);
  test::write_raw(a.fd(), part.data(), part.size());
  ASSERT_TRUE(thrown<ProtocolError>([&b = b] { b.receive(1024, 1000); }));
  auto t = thrown<Error>([&b = b] { b.discard_rejected_body(50); });
  ASSERT_TRUE(t);
  EXPECT_EQ(t->code(), ZD_ERR_TIMEOUT);
  EXPECT_EQ(b.rejected_body_left(), 4096U - 1000U);
  const auto rest = test::pattern(3096, 4);
  test::write_raw(a.fd(), rest.data(), rest.size());
  a.send(FrameHeader{}, test::bytes_of("next"));
  b.discard_rejected_body(1000);
  EXPECT_EQ(b.receive(1024, 1000).body.size(), 4U);
}

TEST(Malformed, BadMagicIsFatalForTheConnection) {
  auto [a, b] = connection_pair();
  const std::string http = "GET / HTTP/1.1\r\n";
  test::write_raw(a.fd(), http.data(), http.size());
  auto e = thrown<ProtocolError>([&b = b] { b.receive(1024, 1000); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ProtocolError::Kind::bad_magic);
  EXPECT_EQ(e->code(), ZD_ERR_VERSION);
  EXPECT_FALSE(e->recoverable());
  EXPECT_TRUE(contains(e->what(), "not a zerod frame")) << e->what();
  EXPECT_TRUE(contains(e->what(), "'GET '")) << e->what();
  // The stream is out of step; receive says so instead of reading garbage.
  EXPECT_TRUE(b.receive_out_of_step());
  a.send(FrameHeader{}, {});
  auto again = thrown<Error>([&b = b] { b.receive(1024, 1000); });
  ASSERT_TRUE(again);
  EXPECT_EQ(again->code(), ZD_ERR_INVALID_STATE);
  // It can still send its error frame before closing.
  b.send(FrameHeader{}, test::bytes_of("bad magic"));
  EXPECT_EQ(a.receive(1024, 1000).body.size(), 9U);
}

TEST(Malformed, AnotherFrameVersionIsNamed) {
  auto [a, b] = connection_pair();
  FrameHeader h;
  h.magic = 0x3246445A;  // 'ZDF2'
  test::write_header(a.fd(), h);
  auto e = thrown<ProtocolError>([&b = b] { b.receive(1024, 1000); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), ZD_ERR_VERSION);
  EXPECT_TRUE(contains(e->what(), "frame format version '2', this zerod speaks '1'")) << e->what();
}

TEST(Malformed, PeerClosingMidBodyIsAProtocolError) {
  auto [a, b] = connection_pair();
  FrameHeader h;
  h.length = 100;
  test::write_header(a.fd(), h);
  const auto part = test::pattern(10, 1);
  test::write_raw(a.fd(), part.data(), part.size());
  { Connection gone = std::move(a); }  // closes the writing end
  auto e = thrown<ProtocolError>([&b = b] { b.receive(1024, 1000); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ProtocolError::Kind::truncated);
  EXPECT_EQ(e->code(), ZD_ERR_PEER_LOST);
  EXPECT_TRUE(contains(e->what(), "after 10 of 100 body bytes")) << e->what();
}

TEST(Malformed, PeerClosingMidHeaderIsAProtocolError) {
  auto [a, b] = connection_pair();
  test::write_raw(a.fd(), "ZDF1x", 5);
  { Connection gone = std::move(a); }
  auto e = thrown<ProtocolError>([&b = b] { b.receive(1024, 1000); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ProtocolError::Kind::truncated);
  EXPECT_TRUE(contains(e->what(), "after 5 of 16 header bytes")) << e->what();
}

TEST(Malformed, CleanEndOfStreamIsPeerLost) {
  auto [a, b] = connection_pair();
  a.send(FrameHeader{}, test::bytes_of("last words"));
  { Connection gone = std::move(a); }
  EXPECT_EQ(b.receive(1024, 1000).body.size(), 10U);
  try {
    b.receive(1024, 1000);
    ADD_FAILURE() << "no exception";
  } catch (const ProtocolError& e) {
    ADD_FAILURE() << "a clean close is not a protocol error: " << e.what();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ZD_ERR_PEER_LOST);
    EXPECT_TRUE(contains(e.what(), "peer closed the connection")) << e.what();
  }
}

TEST(Malformed, SendingToAClosedPeerIsPeerLostNotSigpipe) {
  auto [a, b] = connection_pair();
  { Connection gone = std::move(b); }
  // With SIGPIPE at its default this would kill the test binary.
  auto e = thrown<Error>([&a = a] { a.send(FrameHeader{}, test::pattern(100, 1)); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), ZD_ERR_PEER_LOST);
  EXPECT_TRUE(contains(e->what(), "peer closed the connection")) << e->what();
}

TEST(Malformed, ReceiveTimeoutLeavesTheConnectionUsable) {
  auto [a, b] = connection_pair();
  const auto t0 = std::chrono::steady_clock::now();
  auto e = thrown<Error>([&b = b] { b.receive(1024, 50); });
  const auto waited = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), ZD_ERR_TIMEOUT);
  EXPECT_GE(waited, std::chrono::milliseconds(50));
  a.send(FrameHeader{}, test::bytes_of("late"));
  EXPECT_EQ(b.receive(1024, 1000).body.size(), 4U);
}

TEST(Malformed, APeerStallingMidFrameTimesOutAndBreaksTheConnection) {
  auto [a, b] = connection_pair();
  FrameHeader h;
  h.length = 10;
  const auto raw = encode_header(h);
  test::write_raw(a.fd(), raw.data(), 8);
  auto e = thrown<ProtocolError>([&b = b] { b.receive(1024, 50); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ProtocolError::Kind::stalled);
  EXPECT_EQ(e->code(), ZD_ERR_TIMEOUT);
  EXPECT_FALSE(e->recoverable());
  auto again = thrown<Error>([&b = b] { b.receive(1024, 50); });
  ASSERT_TRUE(again);
  EXPECT_EQ(again->code(), ZD_ERR_INVALID_STATE);
}

TEST(Malformed, ASendTimingOutMidFrameRefusesFurtherSends) {
  auto [a, b] = connection_pair();
  // Nobody reads b: 4 MiB cannot fit the socket buffers.
  auto e = thrown<Error>([&a = a] { a.send(FrameHeader{}, test::pattern(4 << 20, 1), {}, 50); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), ZD_ERR_TIMEOUT);
  EXPECT_TRUE(contains(e->what(), "is the peer reading?")) << e->what();
  auto again = thrown<Error>([&a = a] { a.send(FrameHeader{}, {}, {}, 50); });
  ASSERT_TRUE(again);
  EXPECT_EQ(again->code(), ZD_ERR_INVALID_STATE);
}

// The kernel drops fds it cannot install (here: our open-file limit) and
// says so with MSG_CTRUNC. The frame is consumed, the fds that did arrive
// are closed, and the connection goes on.
TEST(Malformed, FdsDroppedByTheKernelAreReportedAndNoneLeak) {
  auto [a, b] = connection_pair();
  UniqueFd m = test::make_memfd();
  std::vector<int> fds(100, m.get());
  FrameHeader h;
  h.request_id = 5;
  a.send(h, test::pattern(64, 1), fds);
  a.send(FrameHeader{}, test::bytes_of("next"));

  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  // New fds take the lowest free numbers, and the limit caps the number:
  // this leaves room for about 3, not 100.
  const int lowest_free = ::dup(0);
  ASSERT_GE(lowest_free, 0);
  ::close(lowest_free);
  const int before = test::open_fd_count();
  rlimit tight = old;
  tight.rlim_cur = static_cast<rlim_t>(lowest_free + 3);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &tight), 0);
  std::optional<ProtocolError> e;
  try {
    b.receive(1024, 1000);
  } catch (const ProtocolError& pe) {
    e = pe;
  }
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);
  ASSERT_TRUE(e) << "the frame arrived with its fds despite the limit";
  EXPECT_EQ(e->kind(), ProtocolError::Kind::fds_rejected);
  EXPECT_TRUE(e->recoverable());
  EXPECT_EQ(e->header()->request_id, 5U);
  EXPECT_TRUE(contains(e->what(), "RLIMIT_NOFILE")) << e->what();
  EXPECT_EQ(test::open_fd_count(), before);
  EXPECT_EQ(b.receive(1024, 1000).body.size(), 4U);
}

}  // namespace
}  // namespace zerod::transport
