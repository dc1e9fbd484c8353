// The nvme tier test fixture: an instance over scratch directories, and
// transfers that submit and wait.
#ifndef ZEROD_TESTS_OFFLOAD_NVME_FIXTURE_H
#define ZEROD_TESTS_OFFLOAD_NVME_FIXTURE_H

#include <memory>
#include <string>
#include <vector>

#include "nvme_util.h"
#include "tier_plugin.h"

namespace zerod::offload::test {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * 1024;

struct NvmeOptions {
  uint64_t block_size = 64 * kKiB;
  uint64_t queue_depth = 4;
  uint64_t stripe_size = 64 * kKiB;
};

class NvmeTier : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NE(plugin_.desc(), nullptr) << plugin_.error(); }

  std::vector<double> values(const NvmeOptions& o) const {
    std::vector<double> v = plugin_.defaults();
    v[plugin_.offset_of("block_size")] = static_cast<double>(o.block_size);
    v[plugin_.offset_of("queue_depth")] = static_cast<double>(o.queue_depth);
    v[plugin_.offset_of("stripe_size")] = static_cast<double>(o.stripe_size);
    return v;
  }

  std::unique_ptr<Tier> open(const std::vector<std::string>& dirs, const NvmeOptions& o = {}, int32_t rank = 0,
                             const zd_host_services* host = nullptr) {
    paths_.clear();
    for (const auto& d : dirs) paths_.push_back(d.c_str());
    const zd_tier_config c = make_config(rank, rank, paths_);
    return std::make_unique<Tier>(plugin_, values(o), c, host);
  }

  static uint64_t reserve(const Tier& t, uint64_t bytes, const char* what) {
    uint64_t offset = ~uint64_t{0};
    char err[512] = "";
    const zd_status st = t.desc()->reserve(t.get(), bytes, what, &offset, err, sizeof err);
    EXPECT_EQ(st, ZD_OK) << err;
    return offset;
  }

  // One transfer, submitted and waited for; "" or the error.
  static std::string transfer(const Tier& t, uint64_t offset, void* buf, uint64_t bytes, bool write) {
    zd_tier_io io{offset, bytes, buf, write ? 1 : 0, 0};
    uint64_t ticket = 0;
    char err[512] = "";
    if (t.desc()->submit(t.get(), &io, 1, &ticket, err, sizeof err) != ZD_OK) return err;
    if (t.desc()->wait(t.get(), ticket, err, sizeof err) != ZD_OK) return err;
    return "";
  }

  TierPlugin plugin_{"nvme"};
  std::vector<const char*> paths_;
};

}  // namespace zerod::offload::test

#endif  // ZEROD_TESTS_OFFLOAD_NVME_FIXTURE_H
