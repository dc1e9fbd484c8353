// The nvme tier plugin as the engine loads it (dlopen from the plugin
// folder), timing a sequential write and read of its whole store.
#ifndef ZEROD_BENCH_NVME_TIER_RUN_H
#define ZEROD_BENCH_NVME_TIER_RUN_H

#include <zerod/zerod_plugin.h>

#include <cstdint>
#include <string>

namespace zerod::bench {

struct Settings {
  std::string dir = "/tmp";
  uint64_t size = uint64_t{1} << 30;
  uint64_t block_size = uint64_t{1} << 20;
  uint64_t queue_depth = 8;
};

class TierRun {
 public:
  // Loads the plugin, creates an instance on settings.dir and reserves the
  // store; on failure ok() is false and error() says why.
  TierRun(const std::string& plugin_dir, const Settings& settings);
  ~TierRun();
  TierRun(const TierRun&) = delete;
  TierRun& operator=(const TierRun&) = delete;

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  std::string describe() const;

  // Bytes per second of one transfer of the whole store, submitted at once
  // (the plugin keeps queue_depth blocks in flight); < 0 on error.
  double write();
  double read();
  // Whether what read() brought back is what write() sent.
  bool verify() const;

 private:
  double transfer(bool write);

  void* handle_ = nullptr;
  const zd_tier_v1* desc_ = nullptr;
  void* inst_ = nullptr;
  unsigned char* buffer_ = nullptr;
  uint64_t size_ = 0;
  uint64_t offset_ = 0;
  std::string error_;
};

}  // namespace zerod::bench

#endif  // ZEROD_BENCH_NVME_TIER_RUN_H
