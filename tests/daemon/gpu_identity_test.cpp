// A rank whose trainer computes on another GPU than its daemon serves it on
// is refused at zd_model_create, naming both GPUs by UUID and the fix
// (gpu_identity.h); the real check runs where there is a GPU, and
// python.cuda_daemon's ranks pass it.
#include "gpu_identity.h"

#include <gtest/gtest.h>

namespace zerod::server {
namespace {

std::string uuid(unsigned char first) {
  std::string u(16, '\0');
  for (int i = 0; i < 16; ++i) u[static_cast<size_t>(i)] = static_cast<char>(first + i);
  return u;
}

TEST(GpuIdentity, UuidsPrintAsNvidiaSmiDoes) {
  EXPECT_EQ(format_gpu_uuid(uuid(0xf0)), "GPU-f0f1f2f3-f4f5-f6f7-f8f9-fafbfcfdfeff");
}

TEST(GpuIdentity, TheSameGpuOrNoneNamedIsServed) {
  EXPECT_EQ(gpu_mismatch(1, uuid(1), uuid(1), 3), "");
  EXPECT_EQ(gpu_mismatch(1, "", uuid(1), 3), "") << "an older libzerod names no GPU";
  EXPECT_EQ(gpu_mismatch(1, uuid(1), "", -1), "") << "the daemon's device is not a GPU";
}

TEST(GpuIdentity, AnotherGpuIsRefusedNamingBothAndTheFix) {
  const std::string why = gpu_mismatch(1, uuid(0x10), uuid(0x20), 1);
  EXPECT_NE(why.find("rank 1 computes on GPU-10111213-1415-1617-1819-1a1b1c1d1e1f (its current GPU), but its "
                     "daemon serves rank 1 on GPU-20212223-2425-2627-2829-2a2b2c2d2e2f (GPU 1 as the daemon "
                     "numbers them)"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("torch.cuda.set_device(local_rank)"), std::string::npos) << why;
  EXPECT_NE(why.find("CUDA_VISIBLE_DEVICES"), std::string::npos) << why;
}

}  // namespace
}  // namespace zerod::server
