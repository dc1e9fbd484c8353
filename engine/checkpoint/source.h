// A checkpoint directory opened for reading: the manifest and every shard's
// index, so any range of any buffer of any parameter can be read, wherever
// (in whichever rank's shard, in how many records) it was written. That is
// what lets a checkpoint written by N ranks at one stage load into M ranks
// at another: each rank reads the ranges it owns now. The shards are not
// held open (a checkpoint may have more of them than a process may open):
// a read opens its shard again, unless the process keeps it open from a
// recent read.
#pragma once

#include "manifest.h"
#include "shard_file.h"

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace zerod::ckpt {

class Source {
 public:
  // Reads and checks the manifest and the index of every shard it names
  // (ZD_ERR_IO or ZD_ERR_INVALID_ARGUMENT naming the file otherwise).
  explicit Source(const std::string& dir);
  // Only the shards of `ranks`, with a manifest read elsewhere: a node's
  // part of a snapshot across nodes on node-local disks (the other parts
  // are on the other nodes). Reading values the other shards hold fails.
  Source(const std::string& dir, Manifest manifest, const std::vector<int>& ranks);
  ~Source();
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;

  const Manifest& manifest() const { return manifest_; }
  const std::string& dir() const { return dir_; }

  // Values [first, first + count) of a buffer of a parameter, as fp32.
  // Throws ZD_ERR_INVALID_ARGUMENT when the checkpoint does not hold them
  // all, ZD_ERR_IO when a record fails its checksum or its shard is gone or
  // is another file than the one whose index was read. Each record touched is
  // read whole (and checked), so memory is bounded by the largest record.
  // Thread-safe.
  void read(uint32_t param, uint32_t buffer, uint64_t first, uint64_t count, float* out) const;
  // Whether the checkpoint holds any value of a buffer (e.g. an optimizer
  // state slot).
  bool has(uint32_t param, uint32_t buffer) const;
  // Checks, without keeping them, that the values read() would give are all
  // there and pass their checksums: a load checks everything it will read
  // before it changes anything.
  void verify(uint32_t param, uint32_t buffer, uint64_t first, uint64_t count) const;

  // The records of what rank `rank` alone holds (shard_file.h: buffers
  // kRankBuffers and up), in its own shard only: as read() above (with
  // `out` null it checks them, as verify() does). Reading a rank whose
  // shard is not open here fails.
  void read_rank(int rank, uint32_t param, uint32_t buffer, uint64_t first, uint64_t count, float* out) const;
  // Every such record of the rank read and checked; how many there are.
  uint64_t verify_rank(int rank) const;
  // Every such record of the rank (its param, buffer and elements), in
  // order of param, buffer and first element.
  std::vector<Record> rank_records(int rank) const;

 private:
  struct Where {
    size_t shard;
    const Record* record;
  };
  using Index = std::map<std::pair<uint32_t, uint32_t>, std::vector<Where>>;  // by (param, buffer), sorted by first
  void visit(const Index& index, uint32_t param, uint32_t buffer, uint64_t first, uint64_t count, float* out) const;
  const Index& rank_index(int rank) const;
  // The values of a record, read and checked; the last one read on the
  // calling thread is kept, so that reading a record's range in chunks
  // reads the record once.
  const std::vector<float>& record_values(const Where& w) const;
  // A record's values from its shard (opened again unless the process
  // keeps it open: source.cpp's ShardFiles), checked.
  std::vector<float> read_record(const Where& w) const;
  void open_shard(int rank);
  void sort_index();
  uint64_t id_;  // tells this Source from one later made at the same address
  std::string dir_;
  Manifest manifest_;
  std::vector<std::unique_ptr<ShardReader>> shards_;
  Index index_;
  std::map<int, Index> rank_index_;  // by rank: the records it alone holds
};

}  // namespace zerod::ckpt
