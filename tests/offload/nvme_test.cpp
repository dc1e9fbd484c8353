// The nvme tier moving bytes: round trips through the store, striping over
// paths, many transfers in flight, preallocation.
#include <sys/stat.h>

#include <algorithm>
#include <thread>

#include "nvme_fixture.h"

namespace zerod::offload::test {
namespace {

using ::testing::HasSubstr;

TEST_F(NvmeTier, DescriptorIsABlockTier) {
  const zd_tier_v1* d = plugin_.desc();
  EXPECT_STREQ(d->header.name, "nvme");
  EXPECT_EQ(d->header.struct_size, sizeof(zd_tier_v1));
  EXPECT_EQ(d->allocate, nullptr);
  EXPECT_EQ(d->release, nullptr);
  ScratchDir dir;
  auto t = open({dir.path()});
  ASSERT_EQ(t->status(), ZD_OK) << t->error();
  EXPECT_EQ(d->capabilities(t->get()), static_cast<uint32_t>(ZD_TIER_CAP_BLOCK));
  const uint64_t a = d->alignment(t->get());
  EXPECT_GE(a, 4096u);
  EXPECT_EQ(a & (a - 1), 0u);
  EXPECT_EQ(t->cpus().size(), 0u);
  EXPECT_THAT(t->describe(), HasSubstr("nvme: 1 path: " + dir.path()));
  // The defaults are DeepSpeed's aio config.
  const std::vector<double> v = plugin_.defaults();
  EXPECT_EQ(v[plugin_.offset_of("block_size")], 1048576.0);
  EXPECT_EQ(v[plugin_.offset_of("queue_depth")], 8.0);
  EXPECT_EQ(v[plugin_.offset_of("stripe_size")], 1048576.0);
}

TEST_F(NvmeTier, ReservationsAreAppendedAndRoundedToTheAlignment) {
  ScratchDir dir;
  auto t = open({dir.path()});
  ASSERT_EQ(t->status(), ZD_OK) << t->error();
  const uint64_t a = t->desc()->alignment(t->get());
  EXPECT_EQ(reserve(*t, 1, "a"), 0u);
  EXPECT_EQ(reserve(*t, a + 1, "b"), a);
  EXPECT_EQ(reserve(*t, 0, "empty"), 3 * a);
  EXPECT_EQ(reserve(*t, a, "c"), 3 * a);
  EXPECT_THAT(t->describe(), HasSubstr(std::to_string(4 * a / 1024) + " KiB reserved"));
}

// Sizes: one block, many blocks, a multiple of the alignment that is not
// one of block_size; offsets that start and end inside stripes.
TEST_F(NvmeTier, RoundTripsOfEverySize) {
  ScratchDir dir;
  const NvmeOptions o{64 * kKiB, 4, 64 * kKiB};
  auto t = open({dir.path()}, o);
  ASSERT_EQ(t->status(), ZD_OK) << t->error();
  const uint64_t a = t->desc()->alignment(t->get());
  const uint64_t store = reserve(*t, 4 * kMiB, "store");
  struct Case {
    uint64_t offset, bytes;
  };
  const Case cases[] = {
      {0, o.block_size},                    // one block
      {kMiB, 20 * o.block_size},            // many blocks
      {3 * a, 5 * o.block_size + 7 * a},    // not a multiple of block_size, starts mid-block
      {o.stripe_size - a, 2 * a},           // across a stripe boundary
      {4 * kMiB - a, a},                    // the last page
  };
  uint64_t seed = 0;
  for (const Case& c : cases) {
    auto out = aligned_buffer(c.bytes, a);
    auto in = aligned_buffer(c.bytes, a);
    fill_pattern(out.get(), c.bytes, ++seed);
    ASSERT_EQ(transfer(*t, store + c.offset, out.get(), c.bytes, true), "") << c.offset << "+" << c.bytes;
    ASSERT_EQ(transfer(*t, store + c.offset, in.get(), c.bytes, false), "") << c.offset << "+" << c.bytes;
    EXPECT_EQ(check_pattern(in.get(), c.bytes, seed), c.bytes) << c.offset << "+" << c.bytes;
  }
}

// Stripe k of the store is on path k % 2 at file offset (k / 2) * stripe.
TEST_F(NvmeTier, StripesAlternateBetweenTwoPaths) {
  ScratchDir a, b;
  const NvmeOptions o{128 * kKiB, 4, 64 * kKiB};  // blocks span stripes: split at stripes
  auto t = open({a.path(), b.path()}, o);
  ASSERT_EQ(t->status(), ZD_OK) << t->error();
  EXPECT_THAT(t->describe(), HasSubstr("nvme: 2 paths: " + a.path()));
  const uint64_t stripes = 6, bytes = stripes * o.stripe_size;
  const uint64_t offset = reserve(*t, bytes, "striped");
  auto out = aligned_buffer(bytes);
  fill_pattern(out.get(), bytes, 7);
  ASSERT_EQ(transfer(*t, offset, out.get(), bytes, true), "");

  const std::vector<int> fa = store_fds(a.path()), fb = store_fds(b.path());
  ASSERT_EQ(fa.size(), 1u);
  ASSERT_EQ(fb.size(), 1u);
  const int files[2] = {fa[0], fb[0]};
  for (int p = 0; p < 2; ++p) {
    struct stat st {};
    ASSERT_EQ(fstat(files[p], &st), 0);
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), bytes / 2) << "path " << p;
  }
  // Read the files behind the plugin's back (the store fds are O_DIRECT:
  // read through an aligned buffer).
  auto got = aligned_buffer(o.stripe_size);
  for (uint64_t k = 0; k < stripes; ++k) {
    const int fd = files[k % 2];
    ASSERT_EQ(pread(fd, got.get(), o.stripe_size, static_cast<off_t>((k / 2) * o.stripe_size)),
              static_cast<ssize_t>(o.stripe_size));
    EXPECT_EQ(std::memcmp(got.get(), out.get() + k * o.stripe_size, o.stripe_size), 0) << "stripe " << k;
  }
  auto in = aligned_buffer(bytes);
  ASSERT_EQ(transfer(*t, offset, in.get(), bytes, false), "");
  EXPECT_EQ(check_pattern(in.get(), bytes, 7), bytes);
}

// More transfers than the queue holds, in several submits, waited for in
// reverse order; one submit carries many transfers.
TEST_F(NvmeTier, ManySubmitsInFlightWaitedOutOfOrder) {
  ScratchDir a, b;
  const NvmeOptions o{16 * kKiB, 2, 32 * kKiB};
  auto t = open({a.path(), b.path()}, o);
  ASSERT_EQ(t->status(), ZD_OK) << t->error();
  constexpr int kSubmits = 12;
  constexpr uint64_t kEach = 96 * kKiB;
  const uint64_t base = reserve(*t, kSubmits * kEach, "many");
  std::vector<AlignedBuffer> bufs;
  std::vector<uint64_t> tickets(kSubmits);
  for (int i = 0; i < kSubmits; ++i) {
    bufs.push_back(aligned_buffer(kEach));
    fill_pattern(bufs.back().get(), kEach, 100 + static_cast<uint64_t>(i));
    zd_tier_io io{base + static_cast<uint64_t>(i) * kEach, kEach, bufs.back().get(), 1, 0};
    char err[512] = "";
    ASSERT_EQ(t->desc()->submit(t->get(), &io, 1, &tickets[static_cast<size_t>(i)], err, sizeof err), ZD_OK) << err;
  }
  for (int i = kSubmits - 1; i >= 0; --i) {
    char err[512] = "";
    ASSERT_EQ(t->desc()->wait(t->get(), tickets[static_cast<size_t>(i)], err, sizeof err), ZD_OK) << err;
  }
  // Read everything back in one submit of many transfers, in scrambled order.
  std::vector<AlignedBuffer> in;
  std::vector<zd_tier_io> ios;
  for (int i = 0; i < kSubmits; ++i) {
    in.push_back(aligned_buffer(kEach));
    ios.push_back({base + static_cast<uint64_t>((i * 5) % kSubmits) * kEach, kEach, in.back().get(), 0, 0});
  }
  uint64_t ticket = 0;
  char err[512] = "";
  ASSERT_EQ(t->desc()->submit(t->get(), ios.data(), static_cast<uint32_t>(ios.size()), &ticket, err, sizeof err),
            ZD_OK)
      << err;
  ASSERT_EQ(t->desc()->wait(t->get(), ticket, err, sizeof err), ZD_OK) << err;
  for (int i = 0; i < kSubmits; ++i) {
    const uint64_t seed = 100 + static_cast<uint64_t>((i * 5) % kSubmits);
    EXPECT_EQ(check_pattern(in[static_cast<size_t>(i)].get(), kEach, seed), kEach) << i;
  }
}

TEST_F(NvmeTier, ThreadsSubmitAndWaitAtOnce) {
  ScratchDir dir;
  auto t = open({dir.path()}, {16 * kKiB, 3, 64 * kKiB});
  ASSERT_EQ(t->status(), ZD_OK) << t->error();
  constexpr int kThreads = 4;
  constexpr uint64_t kEach = 256 * kKiB;
  const uint64_t base = reserve(*t, kThreads * kEach, "threads");
  std::vector<std::thread> threads;
  for (int k = 0; k < kThreads; ++k) {
    threads.emplace_back([&, k] {
      const uint64_t off = base + static_cast<uint64_t>(k) * kEach;
      auto out = aligned_buffer(kEach), in = aligned_buffer(kEach);
      for (int round = 0; round < 5; ++round) {
        const uint64_t seed = static_cast<uint64_t>(k * 10 + round);
        fill_pattern(out.get(), kEach, seed);
        EXPECT_EQ(transfer(*t, off, out.get(), kEach, true), "");
        EXPECT_EQ(transfer(*t, off, in.get(), kEach, false), "");
        EXPECT_EQ(check_pattern(in.get(), kEach, seed), kEach) << "thread " << k << " round " << round;
      }
    });
  }
  for (auto& th : threads) th.join();
}

TEST_F(NvmeTier, ReservePreallocatesOnEveryPath) {
  ScratchDir a, b;
  auto t = open({a.path(), b.path()}, {64 * kKiB, 4, 256 * kKiB});
  ASSERT_EQ(t->status(), ZD_OK) << t->error();
  reserve(*t, 4 * kMiB, "preallocated");
  for (const ScratchDir* d : {&a, &b}) {
    const std::vector<int> fds = store_fds(d->path());
    ASSERT_EQ(fds.size(), 1u) << d->path();
    struct stat st {};
    ASSERT_EQ(fstat(fds[0], &st), 0);
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), 2 * kMiB) << d->path();
    EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, 2 * kMiB) << d->path() << ": not allocated";
  }
}

TEST_F(NvmeTier, ReserveLogsWhatEachPathGot) {
  ScratchDir a, b;
  LogCapture log;
  auto t = open({a.path(), b.path()}, {64 * kKiB, 4, 64 * kKiB}, 5, log.services());
  ASSERT_EQ(t->status(), ZD_OK) << t->error();
  reserve(*t, 64 * kKiB, "first");
  reserve(*t, 192 * kKiB, "second");
  ASSERT_EQ(log.lines().size(), 2u);
  EXPECT_EQ(log.lines()[1], "nvme: reserved 192 KiB for second at store offset 65536 on rank 5: " + a.path() +
                                " +64 KiB, " + b.path() + " +128 KiB");
}

TEST_F(NvmeTier, StoreFilesLeaveNothingBehind) {
  ScratchDir dir;
  {
    auto t = open({dir.path()});
    ASSERT_EQ(t->status(), ZD_OK) << t->error();
    reserve(*t, kMiB, "x");
    DIR* d = opendir(dir.c_str());
    ASSERT_NE(d, nullptr);
    int entries = 0;
    while (dirent* e = readdir(d)) entries += e->d_name[0] != '.' || std::strlen(e->d_name) > 2;
    closedir(d);
    EXPECT_EQ(entries, 0) << "the store file has a name in " << dir.path();
  }
  EXPECT_TRUE(store_fds(dir.path()).empty()) << "destroy left the store file open";
}

TEST_F(NvmeTier, DestroyWaitsForTransfersInFlight) {
  ScratchDir dir;
  auto t = open({dir.path()}, {16 * kKiB, 2, 64 * kKiB});
  ASSERT_EQ(t->status(), ZD_OK) << t->error();
  const uint64_t off = reserve(*t, kMiB, "x");
  auto buf = aligned_buffer(kMiB);
  zd_tier_io io{off, kMiB, buf.get(), 1, 0};
  uint64_t ticket = 0;
  char err[512] = "";
  ASSERT_EQ(t->desc()->submit(t->get(), &io, 1, &ticket, err, sizeof err), ZD_OK) << err;
  t->reset();  // buf outlives it: the kernel is done with it when destroy returns
}

TEST_F(NvmeTier, RefusesTransfersItCannotDo) {
  ScratchDir dir;
  auto t = open({dir.path()});
  ASSERT_EQ(t->status(), ZD_OK) << t->error();
  const uint64_t a = t->desc()->alignment(t->get());
  const uint64_t off = reserve(*t, 64 * kKiB, "small");
  auto buf = aligned_buffer(128 * kKiB);
  uint64_t ticket = 0;
  char err[512] = "";
  const zd_tier_v1* d = t->desc();

  zd_tier_io past{off + 32 * kKiB, 64 * kKiB, buf.get(), 1, 0};
  EXPECT_EQ(d->submit(t->get(), &past, 1, &ticket, err, sizeof err), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(err, HasSubstr("past the reserved store"));

  zd_tier_io odd{off + 512, a, buf.get(), 1, 0};
  EXPECT_EQ(d->submit(t->get(), &odd, 1, &ticket, err, sizeof err), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(err, HasSubstr("not aligned"));

  zd_tier_io misaligned_buffer{off, a, buf.get() + 64, 1, 0};
  EXPECT_EQ(d->submit(t->get(), &misaligned_buffer, 1, &ticket, err, sizeof err), ZD_ERR_INVALID_ARGUMENT);

  EXPECT_EQ(d->wait(t->get(), 12345, err, sizeof err), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(err, HasSubstr("unknown ticket 12345"));

  zd_tier_io ok{off, a, buf.get(), 1, 0};
  ASSERT_EQ(d->submit(t->get(), &ok, 1, &ticket, err, sizeof err), ZD_OK) << err;
  ASSERT_EQ(d->wait(t->get(), ticket, err, sizeof err), ZD_OK) << err;
  EXPECT_EQ(d->wait(t->get(), ticket, err, sizeof err), ZD_ERR_INVALID_ARGUMENT);  // waited once

  ASSERT_EQ(d->submit(t->get(), nullptr, 0, &ticket, err, sizeof err), ZD_OK) << err;  // nothing to do
  EXPECT_EQ(d->wait(t->get(), ticket, err, sizeof err), ZD_OK) << err;
}

}  // namespace
}  // namespace zerod::offload::test
