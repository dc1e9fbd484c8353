// fds passed with frames: close-on-exec on arrival, the same open file as
// the sender's, in order, many at once.
#include "memory/arena.h"
#include "test_support.h"
#include "transport/connection.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cstring>

namespace zerod::transport {
namespace {

TEST(FdPassing, ArenaFdArrivesCloexecAndMapsTheSameMemory) {
  SharedArena arena(0, 64 * 1024, "transport-test-arena");
  auto [a, b] = connection_pair();
  const int fds[] = {arena.fd()};
  FrameHeader h;
  h.type = 9;
  a.send(h, test::bytes_of("arena 0"), fds);
  Frame f = b.receive(1024, 1000);
  ASSERT_EQ(f.fds.size(), 1U);
  const int got = f.fds[0].get();
  EXPECT_NE(got, arena.fd());
  EXPECT_TRUE(::fcntl(got, F_GETFD) & FD_CLOEXEC);

  struct stat mine {
  }, theirs{};
  ASSERT_EQ(::fstat(arena.fd(), &mine), 0);
  ASSERT_EQ(::fstat(got, &theirs), 0);
  EXPECT_EQ(mine.st_ino, theirs.st_ino);
  EXPECT_EQ(static_cast<uint64_t>(theirs.st_size), arena.size());
  // The seals travel with the file: the receiver can trust the size.
  EXPECT_TRUE(::fcntl(got, F_GET_SEALS) & F_SEAL_SHRINK);

  void* p = ::mmap(nullptr, arena.size(), PROT_READ | PROT_WRITE, MAP_SHARED, got, 0);
  ASSERT_NE(p, MAP_FAILED);
  auto* view = static_cast<std::byte*>(p);
  const auto data = test::pattern(4096, 5);
  std::memcpy(arena.base() + 1000, data.data(), data.size());  // write through the sender's mapping
  EXPECT_EQ(std::memcmp(view + 1000, data.data(), data.size()), 0);
  view[arena.size() - 1] = std::byte{0x5A};  // and back through the receiver's
  EXPECT_EQ(arena.base()[arena.size() - 1], std::byte{0x5A});
  ::munmap(p, arena.size());
}

TEST(FdPassing, TheMostFdsAFrameCarriesArriveInOrder) {
  // Distinct memfds whose sizes are their index, so order can be checked.
  std::vector<UniqueFd> owned;
  std::vector<int> fds;
  for (std::size_t i = 0; i < kMaxFdsPerFrame; ++i) {
    owned.push_back(test::make_memfd(static_cast<off_t>(i + 1)));
    fds.push_back(owned.back().get());
  }
  auto [a, b] = connection_pair();
  const int before = test::open_fd_count();
  a.send(FrameHeader{}, {}, fds);  // an empty body: the fds ride on the header
  {
    Frame f = b.receive(1024, 1000);
    ASSERT_EQ(f.fds.size(), kMaxFdsPerFrame);
    EXPECT_EQ(test::open_fd_count(), before + static_cast<int>(kMaxFdsPerFrame));
    for (std::size_t i = 0; i < f.fds.size(); ++i) {
      struct stat st {};
      ASSERT_EQ(::fstat(f.fds[i].get(), &st), 0);
      EXPECT_EQ(st.st_size, static_cast<off_t>(i + 1)) << "fd " << i;
      EXPECT_TRUE(::fcntl(f.fds[i].get(), F_GETFD) & FD_CLOEXEC) << "fd " << i;
    }
  }
  EXPECT_EQ(test::open_fd_count(), before);  // the frame closed them all
}

TEST(FdPassing, FdsBelongToTheirOwnFrame) {
  UniqueFd m = test::make_memfd();
  auto [a, b] = connection_pair();
  const int one[] = {m.get()};
  a.send(FrameHeader{}, test::pattern(100, 1));
  a.send(FrameHeader{}, test::pattern(100, 2), one);
  a.send(FrameHeader{}, test::pattern(100, 3));
  EXPECT_EQ(b.receive(1024, 1000).fds.size(), 0U);
  EXPECT_EQ(b.receive(1024, 1000).fds.size(), 1U);
  EXPECT_EQ(b.receive(1024, 1000).fds.size(), 0U);
}

}  // namespace
}  // namespace zerod::transport
