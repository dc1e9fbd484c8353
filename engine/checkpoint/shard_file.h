// One rank's shard of a checkpoint: a file of records, each a run of fp32
// values of one buffer (the master copy, or an optimizer state slot) of one
// parameter, covering elements [first, first + count) of that parameter,
// with a CRC-32C per record; an index and a footer at the end. Records are
// written as they are produced (streaming: no rank holds its whole shard in
// memory) and read record by record, each checked against its checksum.
//
//   header  "ZDSHARD\0", u32 version, u32 rank, u32 world_size, u32 0, u64 0   (32 bytes)
//   records raw little-endian fp32 values
//   index   per record: u32 param, u32 buffer, u64 first, u64 count, u64 offset, u32 crc32c, u32 0 (40 bytes)
//   footer  "ZDSHIDX\0", u64 index offset, u64 records, u32 crc32c of the index, u32 0   (32 bytes)
#pragma once

#include "file_access.h"

#include <cstdint>
#include <string>
#include <vector>

namespace zerod::ckpt {

// Which buffer of a parameter a record holds: the master, or state slot k as k + 1.
constexpr uint32_t kMasterBuffer = 0;
inline uint32_t slot_buffer(int slot) { return static_cast<uint32_t>(slot) + 1; }

// Records of what one rank alone holds (manifest format 5), from buffer
// kRankBuffers on: only the shard of that rank holds them, and only that
// rank reads them (Source keeps them apart from the records every rank's
// part is assembled from). Their elements are the parameter's, as above.
constexpr uint32_t kRankBuffers = 0x10000;
// At ZeRO stage 0, where local steps (0/1 Adam's) made every rank's copy its
// own: the rank's master (kRankCopy) and state slot k (kRankCopy + k + 1).
// Rank 0's copy is the plain records.
constexpr uint32_t kRankCopy = kRankBuffers;
// A compressing optimizer's error feedback on the rank: the worker error of
// each whole tensor; the server error of the chunk of each tensor the rank
// serves (elements [r c, r c + n_r)), or, where a fused exchange packs a
// group as one buffer, of the group's chunk cut at the tensors' bounds.
constexpr uint32_t kWorkerError = 0x20000;
constexpr uint32_t kServerError = 0x20001;
constexpr uint32_t kServerErrorFused = 0x20002;
inline bool rank_buffer(uint32_t buffer) { return buffer >= kRankBuffers; }

struct Record {
  uint32_t param = 0;
  uint32_t buffer = 0;
  uint64_t first = 0;   // element of the parameter
  uint64_t count = 0;   // fp32 elements
  uint64_t offset = 0;  // bytes into the file
  uint32_t crc = 0;
};

class ShardWriter {
 public:
  // Creates (truncates) the file: OwnerOnly in a snapshot.
  ShardWriter(const std::string& path, int rank, int world_size, FileAccess access = FileAccess::Umask);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // A record of `count` values, given in one or more append() calls.
  void begin(uint32_t param, uint32_t buffer, uint64_t first, uint64_t count);
  void append(const float* values, uint64_t n);
  void end();
  // Writes the index and footer and flushes the file to disk.
  void finish();
  // finish() in two parts: the index and footer (the file is whole in the
  // page cache: nothing is read from the caller any more), then the flush to
  // disk, which a snapshot does after it let the trainer go on.
  void write_index();
  void sync();

 private:
  void write_all(const void* p, size_t n);
  std::string path_;
  int fd_ = -1;
  uint64_t at_ = 0;
  std::vector<Record> index_;
  uint64_t pending_ = 0;  // values the open record still needs
  bool open_ = false;
};

// What a file was when it was read: a later open of its path that finds
// another file there (the shard written again, or replaced) tells them apart.
struct FileIdentity {
  uint64_t device = 0, inode = 0, size = 0;
  int64_t modified_ns = 0;
  bool operator==(const FileIdentity&) const = default;
};

class ShardReader {
 public:
  // Reads and checks the file's header, footer and index (magic, version,
  // index checksum), then closes it: a checkpoint may have more shards than
  // a process may hold open, so readers open a shard again to read its
  // records (Source keeps a few of those descriptors, ShardFiles).
  explicit ShardReader(const std::string& path);

  const std::string& path() const { return path_; }
  int rank() const { return rank_; }
  int world_size() const { return world_; }
  const std::vector<Record>& records() const { return index_; }
  // A descriptor (the caller's to close) of the file whose index was read.
  // ZD_ERR_IO naming the file when it is gone or another file is at its
  // path: the index read no longer describes it.
  int reopen() const;
  // The record's values, read through `fd` (one reopen() gave) and checked
  // against its checksum (ZD_ERR_IO naming the file and the record when
  // they differ).
  std::vector<float> read(const Record& r, int fd) const;

 private:
  std::string path_;
  FileIdentity identity_;
  int rank_ = 0, world_ = 0;
  std::vector<Record> index_;
};

}  // namespace zerod::ckpt
