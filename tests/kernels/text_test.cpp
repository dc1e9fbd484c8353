// The kit's text helpers (zerod/kit/text.h), which the engine, the Lua host
// and the plugins share: the messages they write depend on these answers.
#include <gtest/gtest.h>
#include <zerod/kit/text.h>

#include <cstring>

namespace zerod {
namespace {

TEST(KitText, SetErrorTruncatesTerminatesAndAllowsNoBuffer) {
  char err[8];
  std::memset(err, 'x', sizeof err);
  set_error(err, sizeof err, "%s %d", "abcdef", 42);
  EXPECT_STREQ(err, "abcdef ") << "cut to the buffer and terminated";
  set_error(nullptr, 0, "nothing to write into");
  char one = 'x';
  set_error(&one, 0, "a size of 0 writes nothing");
  EXPECT_EQ(one, 'x');
}

TEST(KitText, FormatBytesInBothStyles) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(format_bytes(256 * 1024), "256.00 KiB");
  EXPECT_EQ(format_bytes(uint64_t{3} << 29), "1.50 GiB");
  EXPECT_EQ(format_bytes(uint64_t{5} << 50), "5120.00 TiB") << "TiB is the largest unit";
  EXPECT_EQ(format_bytes(4096 - 1, BytesStyle::shortest), "4.0 KiB") << "3.999 KiB is not whole: one decimal";
  EXPECT_EQ(format_bytes(512, BytesStyle::shortest), "512 bytes");
  EXPECT_EQ(format_bytes(8 << 20, BytesStyle::shortest), "8 MiB");
  EXPECT_EQ(format_bytes(uint64_t{3} << 29, BytesStyle::shortest), "1.5 GiB");
}

TEST(KitText, EditDistance) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("lr", ""), 2u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("betas", "beta"), 1u);
  EXPECT_EQ(edit_distance("weight_decay", "wieght_decay"), 2u) << "a swap is two edits";
}

}  // namespace
}  // namespace zerod
