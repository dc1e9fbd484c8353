// The nvme tier when things go wrong: bad paths and values at create, a
// full disk at reserve, a store file cut short under a read. Each message
// names the path and the cause.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nvme_fixture.h"

namespace zerod::offload::test {
namespace {

using ::testing::HasSubstr;

TEST_F(NvmeTier, AMissingPathIsNamed) {
  ScratchDir dir;
  const std::string missing = dir.path() + "/not-there";
  auto t = open({dir.path(), missing});
  EXPECT_EQ(t->status(), ZD_ERR_IO);
  EXPECT_EQ(t->error(), "nvme path " + missing + ": does not exist");
}

TEST_F(NvmeTier, APathThatIsAFileIsNamed) {
  ScratchDir dir;
  const std::string file = dir.path() + "/file";
  const int fd = ::open(file.c_str(), O_CREAT | O_WRONLY, 0600);
  ASSERT_GE(fd, 0);
  ::close(fd);
  auto t = open({file});
  EXPECT_EQ(t->status(), ZD_ERR_IO);
  EXPECT_EQ(t->error(), "nvme path " + file + ": is not a directory");
}

TEST_F(NvmeTier, RefusesBadValues) {
  ScratchDir dir;
  {
    auto t = open({dir.path()}, {96 * kKiB, 4, 64 * kKiB});
    EXPECT_EQ(t->status(), ZD_ERR_CONFIG);
    EXPECT_THAT(t->error(), HasSubstr("block_size = 98304: must be a power of two"));
  }
  {
    auto t = open({dir.path()}, {64 * kKiB, 4, 2048});
    EXPECT_EQ(t->status(), ZD_ERR_CONFIG);
    EXPECT_THAT(t->error(), HasSubstr("stripe_size = 2048"));
  }
  {
    auto t = open({dir.path()}, {64 * kKiB, 0, 64 * kKiB});
    EXPECT_EQ(t->status(), ZD_ERR_CONFIG);
    EXPECT_THAT(t->error(), HasSubstr("queue_depth = 0"));
  }
  {
    auto t = open({});
    EXPECT_EQ(t->status(), ZD_ERR_CONFIG);
    EXPECT_THAT(t->error(), HasSubstr("no paths"));
  }
}

TEST_F(NvmeTier, AReadOnlyMountIsNamed) {
  ZD_SCRATCH_MOUNT(ro, "tmpfs", "ro,size=1m");
  auto t = open({ro.path()});
  EXPECT_EQ(t->status(), ZD_ERR_IO);
  EXPECT_EQ(t->error(), "nvme path " + ro.path() + ": not writable: Read-only file system");
}

TEST_F(NvmeTier, AFileSystemWithoutDirectIoIsNamed) {
  ZD_SCRATCH_MOUNT(ram, "ramfs", "mode=0700");
  auto t = open({ram.path()});
  EXPECT_EQ(t->status(), ZD_ERR_IO);
  EXPECT_EQ(t->error(), "nvme path " + ram.path() +
                            ": the file system does not support O_DIRECT (ramfs); use a path on a disk file system");
  EXPECT_TRUE(store_fds(ram.path()).empty());
}

// A 4 MiB tmpfs: 8 MiB cannot be reserved, and the message says where and
// how much is free; 2 MiB can, after which 4 MiB cannot, and the message
// counts the 2 MiB apart from the free space; the 2 MiB stay writable when
// another file has taken every other byte.
TEST_F(NvmeTier, AFullDiskFailsAtReserveNotAtWrite) {
  ZD_SCRATCH_MOUNT(small, "tmpfs", "size=4m");
  auto t = open({small.path()}, {64 * kKiB, 4, 64 * kKiB}, 3);
  if (t->status() != ZD_OK && t->error().find("does not support O_DIRECT") != std::string::npos) {
    GTEST_SKIP() << "this kernel's tmpfs has no O_DIRECT (Linux < 6.6): " << t->error();
  }
  ASSERT_EQ(t->status(), ZD_OK) << t->error();

  uint64_t offset = 0;
  char err[512] = "";
  EXPECT_EQ(t->desc()->reserve(t->get(), 8 * kMiB, "layer3.exp_avg", &offset, err, sizeof err), ZD_ERR_IO);
  EXPECT_THAT(err, HasSubstr("nvme path " + small.path() +
                             ": reserving 8 MiB for layer3.exp_avg on rank 3 failed: No space left on device ("));
  EXPECT_THAT(err, HasSubstr(" free)"));

  offset = reserve(*t, 2 * kMiB, "layer3.exp_avg_sq");
  // The 2 MiB the store holds are not free, but closing it would free
  // them: the message names both.
  uint64_t unused = 0;
  EXPECT_EQ(t->desc()->reserve(t->get(), 4 * kMiB, "layer4.exp_avg", &unused, err, sizeof err), ZD_ERR_IO);
  EXPECT_THAT(err, HasSubstr("reserving 4 MiB for layer4.exp_avg on rank 3 failed: No space left on device ("));
  EXPECT_THAT(err, HasSubstr(" free, besides 2 MiB held by this rank's earlier reservations)"));
  // Fill the rest of the file system.
  const std::string filler = small.path() + "/filler";
  const int fd = ::open(filler.c_str(), O_CREAT | O_WRONLY, 0600);
  ASSERT_GE(fd, 0);
  std::vector<char> chunk(64 * kKiB, 'x');
  ssize_t n;
  uint64_t filled = 0;
  while ((n = ::write(fd, chunk.data(), chunk.size())) > 0) filled += static_cast<uint64_t>(n);
  const int e = errno;
  ::close(fd);
  EXPECT_EQ(e, ENOSPC);
  EXPECT_GT(filled, 0u);

  auto out = aligned_buffer(2 * kMiB), in = aligned_buffer(2 * kMiB);
  fill_pattern(out.get(), 2 * kMiB, 42);
  EXPECT_EQ(transfer(*t, offset, out.get(), 2 * kMiB, true), "");
  EXPECT_EQ(transfer(*t, offset, in.get(), 2 * kMiB, false), "");
  EXPECT_EQ(check_pattern(in.get(), 2 * kMiB, 42), 2 * kMiB);
}

// A store file cut short under the plugin: the read comes back short, and
// the error names the path, the file offset, the bytes and the tensor.
TEST_F(NvmeTier, AShortReadIsReportedWithPathAndOffset) {
  ScratchDir dir;
  auto t = open({dir.path()}, {256 * kKiB, 4, 256 * kKiB});
  ASSERT_EQ(t->status(), ZD_OK) << t->error();
  reserve(*t, 256 * kKiB, "layer0.weight");
  const uint64_t offset = reserve(*t, kMiB, "layer1.weight");
  auto buf = aligned_buffer(kMiB);
  fill_pattern(buf.get(), kMiB, 1);
  ASSERT_EQ(transfer(*t, offset, buf.get(), kMiB, true), "");

  const std::vector<int> fds = store_fds(dir.path());
  ASSERT_EQ(fds.size(), 1u);
  ASSERT_EQ(ftruncate(fds[0], static_cast<off_t>(offset + 384 * kKiB)), 0);

  // Two pieces: the first whole, the second half there.
  const std::string error = transfer(*t, offset, buf.get(), 512 * kKiB, false);
  EXPECT_EQ(error, "nvme path " + dir.path() + ": short read of 256 KiB at file offset 524288 (store offset 524288 on rank 0, in " +
                       "layer1.weight): expected 262144 bytes, got 131072");
}

// With one slot, a submit whose first piece fails drops the rest of its
// pieces; a submit queued behind it is not affected.
TEST_F(NvmeTier, AFailedSubmitDropsItsRestAndOthersGoOn) {
  ScratchDir dir;
  auto t = open({dir.path()}, {64 * kKiB, 1, 64 * kKiB});
  ASSERT_EQ(t->status(), ZD_OK) << t->error();
  const uint64_t lost = reserve(*t, kMiB, "lost");
  const uint64_t kept = reserve(*t, kMiB, "kept");
  auto out = aligned_buffer(kMiB), in = aligned_buffer(kMiB), other = aligned_buffer(kMiB);
  fill_pattern(out.get(), kMiB, 9);
  ASSERT_EQ(transfer(*t, kept, out.get(), kMiB, true), "");
  const std::vector<int> fds = store_fds(dir.path());
  ASSERT_EQ(fds.size(), 1u);
  // Truncated to nothing: every read of "lost" is past the end.
  ASSERT_EQ(ftruncate(fds[0], 0), 0);
  zd_tier_io a{lost, kMiB, in.get(), 0, 0};
  uint64_t ta = 0, tb = 0;
  char err[512] = "";
  ASSERT_EQ(t->desc()->submit(t->get(), &a, 1, &ta, err, sizeof err), ZD_OK) << err;
  // Rewrite "kept" behind it (a write extends the file again).
  zd_tier_io b{kept, kMiB, out.get(), 1, 0};
  ASSERT_EQ(t->desc()->submit(t->get(), &b, 1, &tb, err, sizeof err), ZD_OK) << err;
  EXPECT_EQ(t->desc()->wait(t->get(), tb, err, sizeof err), ZD_OK) << err;
  EXPECT_EQ(t->desc()->wait(t->get(), ta, err, sizeof err), ZD_ERR_IO);
  EXPECT_THAT(err, HasSubstr("short read of 64 KiB at file offset 0 (store offset 0 on rank 0, in lost): expected 65536 bytes, got 0"));
  EXPECT_EQ(transfer(*t, kept, other.get(), kMiB, false), "");
  EXPECT_EQ(check_pattern(other.get(), kMiB, 9), kMiB);
}

}  // namespace
}  // namespace zerod::offload::test
