// The line splitter on its own: no processes.
#include "launcher/detail/line_buffer.h"

#include <gtest/gtest.h>

#include <string>

using zerod::launch::detail::LineBuffer;

namespace {

std::string feed_all(LineBuffer& lines, std::initializer_list<std::string> chunks) {
  std::string out;
  for (const std::string& chunk : chunks) lines.feed(chunk, out);
  return out;
}

}  // namespace

TEST(LineBuffer, PrefixesWholeLinesOnly) {
  LineBuffer lines("[rank 2] ");
  EXPECT_EQ(feed_all(lines, {"one\ntw", "o\n", "", "\nthr"}),
            "[rank 2] one\n[rank 2] two\n[rank 2] \n");
  EXPECT_EQ(lines.pending(), 3u);
  std::string out;
  lines.finish(out);
  EXPECT_EQ(out, "[rank 2] thr\n");
  out.clear();
  lines.finish(out);  // nothing left
  EXPECT_EQ(out, "");
}

TEST(LineBuffer, CutsLinesLongerThanTheCap) {
  LineBuffer lines("> ", 4);
  EXPECT_EQ(feed_all(lines, {"abcd\n"}), "> abcd\n");  // exactly the cap: one line
  EXPECT_EQ(feed_all(lines, {"abcdefghij\n"}), "> abcd\n> efgh\n> ij\n");
  EXPECT_EQ(feed_all(lines, {"ab", "cd", "e"}), "> abcd\n");
  EXPECT_EQ(lines.pending(), 1u);
  EXPECT_EQ(feed_all(lines, {"\n"}), "> e\n");
  EXPECT_EQ(feed_all(lines, {"abcd", "\n"}), "> abcd\n");  // held at the cap, then ended
}

TEST(LineBuffer, PassesBinaryUnchanged) {
  LineBuffer lines("p ");
  const std::string data("a\0b\r\n\xff\xfe\n", 8);
  EXPECT_EQ(feed_all(lines, {data}), std::string("p a\0b\r\np \xff\xfe\n", 12));
}
