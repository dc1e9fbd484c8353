// 1-bit compressed averaging with error feedback (1-bit Adam's momentum
// all-reduce), written once over two byte collectives so that every comm
// plugin (local, mpi) implements zd_comm_v2::compressed_all_reduce alike.
// The algorithm and the chunking are specified in zerod_plugin.h above
// zd_comm_v2; this is its only implementation.
#ifndef ZEROD_PLUGINS_COMM_COMMON_ONEBIT_H
#define ZEROD_PLUGINS_COMM_COMMON_ONEBIT_H

#include <zerod/zerod_plugin.h>

#include <cstdint>
#include <functional>
#include <memory>

namespace zerod::comm::onebit {

// Elements per chunk: count / world rounded up to a multiple of 8.
uint64_t chunk_elems(uint64_t count, int32_t world);

// Bytes of one rank's block in either exchange: the packed signs of one
// chunk, then its fp32 scale (kept 4-byte aligned).
uint64_t block_bytes(uint64_t count, int32_t world);

// The plugin's byte collectives for the calling rank: `send` holds world
// blocks of `bytes` (all_to_all: block k goes to rank k) or one block
// (all_gather); `recv` receives world blocks, block k from rank k.
struct Exchange {
  std::function<zd_status(const void* send, void* recv, uint64_t bytes)> all_to_all;
  std::function<zd_status(const void* send, void* recv, uint64_t bytes)> all_gather;
};

// Runs the compressed average for one rank (see zd_comm_v2). Scratch memory
// is allocated here; a failed exchange returns its status with buf,
// worker_error and server_error as they were before the call.
zd_status compressed_all_reduce(int32_t rank, int32_t world, float* buf, uint64_t count, float* worker_error,
                                float* server_error, const Exchange& exchange);

// Scratch memory a caller may keep between calls (one per rank, used by one
// call at a time): the blocks of both exchanges, (3 world + 1) *
// block_bytes(count, world) bytes, 3/8 to 1/2 byte per element. Fresh memory
// on every call costs its page faults each time (a fifth of a call's time on
// a 256 MiB buffer, measured on a VM); a kept one only grows.
class Scratch {
 public:
  // At least `bytes` bytes, kept for later calls; NULL, with the memory held
  // before kept, when they cannot be had.
  uint8_t* reserve(uint64_t bytes);
  uint64_t bytes() const { return size_; }
  void release() {
    data_.reset();
    size_ = 0;
  }

 private:
  std::unique_ptr<uint8_t[]> data_;
  uint64_t size_ = 0;
};

// The same with kept scratch (NULL: allocate for this call only). On
// ZD_ERR_OUT_OF_MEMORY the scratch is as it was.
zd_status compressed_all_reduce(int32_t rank, int32_t world, float* buf, uint64_t count, float* worker_error,
                                float* server_error, const Exchange& exchange, Scratch* scratch);

}  // namespace zerod::comm::onebit

#endif  // ZEROD_PLUGINS_COMM_COMMON_ONEBIT_H
