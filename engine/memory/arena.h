// Shared-memory arenas and the device pool of a CPU rank.
//
// A CPU rank's "device" memory is a bounded pool of memfd arenas. They are
// shared mappings so that, in daemon mode, the daemon can pass their fds to a
// trainer once (SCM_RIGHTS) and a tensor view becomes (arena, offset, length):
// no tensor bytes travel through the socket. The pool's bound is the ledger's
// device budget, so a model that would not fit a GPU of that size does not fit
// here either.
#pragma once

#include "memory/ledger.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace zerod {

// A piece of memory in some tier. arena/offset locate it inside a shared
// arena (arena -1 when it is not in one).
struct Block {
  std::byte* ptr = nullptr;
  uint64_t bytes = 0;
  int32_t arena = -1;
  uint64_t offset = 0;

  explicit operator bool() const { return ptr != nullptr; }
  template <typename T>
  T* as() const { return reinterpret_cast<T*>(ptr); }
};

// One memfd mapping, sealed at its size.
class SharedArena {
 public:
  SharedArena(int32_t id, uint64_t bytes, const std::string& name);
  ~SharedArena();
  SharedArena(const SharedArena&) = delete;
  SharedArena& operator=(const SharedArena&) = delete;

  int32_t id() const { return id_; }
  int fd() const { return fd_; }
  std::byte* base() const { return base_; }
  uint64_t size() const { return size_; }

 private:
  int32_t id_;
  int fd_ = -1;
  std::byte* base_ = nullptr;
  uint64_t size_ = 0;
};

// First-fit allocation of aligned ranges inside one arena, coalescing frees.
class RangeHeap {
 public:
  explicit RangeHeap(uint64_t size);
  bool allocate(uint64_t bytes, uint64_t align, uint64_t* offset);
  void release(uint64_t offset, uint64_t bytes);
  bool empty() const;  // nothing allocated

 private:
  uint64_t size_;
  std::map<uint64_t, uint64_t> free_;  // offset -> length
};

class DevicePool {
 public:
  static constexpr uint64_t kAlign = 64;  // a cache line; AVX-512 vector width

  DevicePool(MemoryLedger& ledger, uint64_t chunk_bytes, std::string name);
  ~DevicePool();

  // Zero-filled (unless !zero_fill: the caller overwrites every byte),
  // kAlign-aligned. Throws ZD_ERR_BUDGET (naming `what`) past the device
  // budget, ZD_ERR_OUT_OF_MEMORY if the system refuses.
  Block allocate(uint64_t bytes, zd_mem_kind kind, const std::string& what, bool zero_fill = true);
  void release(const Block& block, zd_mem_kind kind);

  // Arenas in creation order (ids are indices). The daemon shares them.
  std::vector<const SharedArena*> arenas() const;

 private:
  struct Chunk {
    std::unique_ptr<SharedArena> arena;
    RangeHeap heap;
  };
  static uint64_t round_up(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

  MemoryLedger& ledger_;
  uint64_t chunk_bytes_;
  std::string name_;
  mutable std::mutex mu_;
  std::vector<Chunk> chunks_;
};

}  // namespace zerod
