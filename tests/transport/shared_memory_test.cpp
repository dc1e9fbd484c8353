// Sealed memfds (transport/shared_memory.h): what a receiver refuses before
// it maps, and that a sender's memfd passes and cannot be resized.
#include "transport/shared_memory.h"

#include "error.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>

namespace zerod::transport {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

// The status and message of what check_sealed_memfd throws ("" if nothing).
std::string refusal(int fd, uint64_t claimed, uint64_t max = kMiB * 16, zd_status* code = nullptr) {
  try {
    check_sealed_memfd(fd, claimed, max, "the test memfd");
  } catch (const Error& e) {
    if (code) *code = e.code();
    return e.what();
  }
  return "";
}

UniqueFd memfd(uint64_t size, unsigned flags, int seals) {
  UniqueFd fd(memfd_create("shared-memory-test", MFD_CLOEXEC | flags));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(ftruncate(fd.get(), static_cast<off_t>(size)), 0);
  if (seals) {
    EXPECT_EQ(fcntl(fd.get(), F_ADD_SEALS, seals), 0);
  }
  return fd;
}

TEST(SharedMemory, ASenderMemfdPassesAndCannotBeResized) {
  UniqueFd fd = create_sealed_memfd("sender", kMiB);
  EXPECT_EQ(refusal(fd.get(), kMiB), "");
  EXPECT_EQ(refusal(fd.get(), 1), "") << "a claim smaller than the file is fine";
  EXPECT_NE(ftruncate(fd.get(), 4096), 0) << "shrinking must be sealed";
  EXPECT_NE(ftruncate(fd.get(), 2 * kMiB), 0) << "growing must be sealed";
  SharedMapping m(fd.get(), kMiB, kMiB, "the test memfd");
  ASSERT_TRUE(m);
  m.data()[kMiB - 1] = std::byte{7};  // the last byte is there
  EXPECT_EQ(m.size(), kMiB);
}

TEST(SharedMemory, ShortUnsealedAndForeignFdsAreRefusedWithTheReason) {
  zd_status code = ZD_OK;
  UniqueFd short_fd = memfd(4096, MFD_ALLOW_SEALING, F_SEAL_SHRINK | F_SEAL_GROW);
  EXPECT_NE(refusal(short_fd.get(), kMiB, kMiB * 16, &code).find("holds 4096 bytes, fewer than the 1048576 claimed"),
            std::string::npos);
  EXPECT_EQ(code, ZD_ERR_INVALID_ARGUMENT);

  UniqueFd loose = memfd(kMiB, MFD_ALLOW_SEALING, 0);
  EXPECT_NE(refusal(loose.get(), kMiB).find("not sealed against resizing (its seals: none)"), std::string::npos);
  UniqueFd shrink_only = memfd(kMiB, MFD_ALLOW_SEALING, F_SEAL_SHRINK);
  EXPECT_NE(refusal(shrink_only.get(), kMiB).find("its seals: F_SEAL_SHRINK)"), std::string::npos);
  // Without MFD_ALLOW_SEALING a memfd carries F_SEAL_SEAL and nothing else.
  UniqueFd unsealable = memfd(kMiB, 0, 0);
  EXPECT_NE(refusal(unsealable.get(), kMiB).find("F_SEAL_SEAL"), std::string::npos);
  UniqueFd write_sealed = memfd(kMiB, MFD_ALLOW_SEALING, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE);
  EXPECT_NE(refusal(write_sealed.get(), kMiB).find("sealed against writing"), std::string::npos);

  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  UniqueFd r(p[0]), w(p[1]);
  EXPECT_NE(refusal(r.get(), kMiB).find("is not a memfd"), std::string::npos);
  EXPECT_NE(refusal(-1, kMiB).find("is not a memfd"), std::string::npos);
}

TEST(SharedMemory, AbsurdClaimsAreRefusedBeforeTheFdIsLookedAt) {
  UniqueFd fd = create_sealed_memfd("sender", kMiB);
  EXPECT_NE(refusal(fd.get(), 0).find("a size of 0 bytes"), std::string::npos);
  EXPECT_NE(refusal(fd.get(), kMiB * 16 + 1).find("more than the limit of 16777216"), std::string::npos);
  EXPECT_NE(refusal(fd.get(), UINT64_MAX).find("more than the limit"), std::string::npos);
  EXPECT_THROW(create_sealed_memfd("zero", 0), Error);
  EXPECT_THROW(create_sealed_memfd("huge", UINT64_MAX), Error);
}

TEST(SharedMemory, AMappingMovesAndUnmapsOnce) {
  UniqueFd fd = create_sealed_memfd("sender", kMiB);
  SharedMapping a(fd.get(), kMiB, kMiB, "a");
  std::byte* base = a.data();
  SharedMapping b(std::move(a));
  EXPECT_FALSE(a);
  EXPECT_EQ(b.data(), base);
  SharedMapping c;
  c = std::move(b);
  EXPECT_EQ(c.data(), base);
  c.reset();
  EXPECT_FALSE(c);
}

}  // namespace
}  // namespace zerod::transport
