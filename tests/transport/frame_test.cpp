// The header format, and frames of several sizes going through a socket.
#include "test_support.h"
#include "transport/connection.h"

#include <gtest/gtest.h>

#include <thread>

namespace zerod::transport {
namespace {

using test::pattern;

TEST(Frame, HeaderIsLittleEndianWithMagicZDF1) {
  FrameHeader h;
  h.length = 0x01020304;
  h.request_id = 0x0A0B0C0D;
  h.type = 0x1122;
  h.flags = 0x3344;
  const auto raw = encode_header(h);
  const unsigned char expected[kFrameHeaderSize] = {'Z',  'D',  'F',  '1',  0x04, 0x03, 0x02, 0x01,
                                                    0x0D, 0x0C, 0x0B, 0x0A, 0x22, 0x11, 0x44, 0x33};
  for (std::size_t i = 0; i < kFrameHeaderSize; ++i) {
    EXPECT_EQ(static_cast<unsigned char>(raw[i]), expected[i]) << "byte " << i;
  }
  const FrameHeader back = decode_header(raw);
  EXPECT_EQ(back.magic, kFrameMagic);
  EXPECT_EQ(back.length, h.length);
  EXPECT_EQ(back.request_id, h.request_id);
  EXPECT_EQ(back.type, h.type);
  EXPECT_EQ(back.flags, h.flags);
}

TEST(Frame, DescribeNamesTheFieldsAndABadMagic) {
  FrameHeader h;
  h.length = 128;
  h.request_id = 42;
  h.type = 7;
  h.flags = 1;
  EXPECT_EQ(describe(h), "type 7 request 42 flags 0x0001 body 128 bytes");
  h.magic = 0x20544547;  // "GET "
  EXPECT_NE(describe(h).find("magic 0x20544547 'GET ' (expected 'ZDF1')"), std::string::npos)
      << describe(h);
}

class RoundTrip : public ::testing::TestWithParam<std::size_t> {};

TEST_P(RoundTrip, BodyAndHeaderArriveIntact) {
  auto [a, b] = connection_pair();
  const std::size_t size = GetParam();
  const auto body = pattern(size, static_cast<uint32_t>(size));
  FrameHeader h;
  h.request_id = 77;
  h.type = 3;
  h.flags = 0x8001;
  h.length = 12345;  // ignored: send fills in the real length
  // A sender thread: a 1 MiB frame does not fit the socket buffer.
  std::thread sender([&a = a, &h, &body] { a.send(h, body); });
  const Frame f = b.receive(2 * 1024 * 1024, 10000);
  sender.join();
  EXPECT_EQ(f.header.magic, kFrameMagic);
  EXPECT_EQ(f.header.length, size);
  EXPECT_EQ(f.header.request_id, 77U);
  EXPECT_EQ(f.header.type, 3);
  EXPECT_EQ(f.header.flags, 0x8001);
  EXPECT_TRUE(f.fds.empty());
  EXPECT_TRUE(f.body == body);
}

std::string size_name(const ::testing::TestParamInfo<std::size_t>& param) {
  return "bytes_" + std::to_string(param.param);
}

INSTANTIATE_TEST_SUITE_P(Sizes, RoundTrip, ::testing::Values(0, 1, 1024 * 1024), size_name);

TEST(Frame, FramesBackToBackStayApart) {
  auto [a, b] = connection_pair();
  for (uint32_t i = 0; i < 50; ++i) {
    FrameHeader h;
    h.request_id = i;
    a.send(h, pattern(i * 7, i));
  }
  for (uint32_t i = 0; i < 50; ++i) {
    const Frame f = b.receive(1024, 1000);
    EXPECT_EQ(f.header.request_id, i);
    EXPECT_TRUE(f.body == pattern(i * 7, i)) << "frame " << i;
  }
}

TEST(Frame, SendRefusesMoreFdsThanAFrameCarries) {
  auto [a, b] = connection_pair();
  std::vector<int> fds(kMaxFdsPerFrame + 1, 0);  // stdin, many times: never sent
  auto e = test::thrown<Error>([&] { a.send(FrameHeader{}, {}, fds); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(e->what()).find("at most 253"), std::string::npos) << e->what();
  // Nothing went out, so the connection is still good.
  auto t = test::thrown<Error>([&] { b.receive(1024, 0); });
  ASSERT_TRUE(t);
  EXPECT_EQ(t->code(), ZD_ERR_TIMEOUT);
  a.send(FrameHeader{}, {});
  EXPECT_EQ(b.receive(1024, 1000).header.length, 0U);
}

}  // namespace
}  // namespace zerod::transport
