// A rank's store: one virtual byte range striped over the store files of
// its paths, grown by reserve().
//
// Striping: virtual offset v lies in stripe s = v / stripe, which lives on
// path s % P at file offset (s / P) * stripe + v % stripe. Consecutive
// stripes go to consecutive paths, so one large transfer keeps every device
// busy. Reservations are appended in order, each rounded up to the
// alignment, and their bytes are allocated on the devices at once.
//
// Threads: reserve() and the lookups may run concurrently (one mutex); the
// mapping functions read only what the constructor set.
#ifndef ZEROD_PLUGINS_OFFLOAD_NVME_STORE_H
#define ZEROD_PLUGINS_OFFLOAD_NVME_STORE_H

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "store_file.h"

namespace zerod::offload {

class Store {
 public:
  // Takes ownership of the files' fds. stripe: a power of two, a multiple
  // of alignment.
  Store(std::vector<StoreFile> files, uint64_t stripe, uint64_t alignment, int32_t rank);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  uint64_t alignment() const { return alignment_; }
  int32_t rank() const { return rank_; }
  uint64_t stripe() const { return stripe_; }
  uint32_t path_count() const { return static_cast<uint32_t>(files_.size()); }
  const StoreFile& file(uint32_t path) const { return files_[path]; }

  // Where virtual offset v is: its path and offset in that path's file.
  struct Location {
    uint32_t path;
    uint64_t file_offset;
  };
  Location locate(uint64_t v) const;
  // How many bytes of the path's file a store of virtual size v covers.
  uint64_t file_bytes(uint32_t path, uint64_t v) const;

  // Appends bytes (rounded up to the alignment) for `what`; allocates them
  // on every path with fallocate. *report lists what each path got. On
  // failure nothing of this reservation is kept and *error names the path,
  // the size, what, the rank, the cause and the free space, and what the
  // earlier reservations hold on the path. Those stay until the store is
  // closed: it only grows.
  bool reserve(uint64_t bytes, const char* what, uint64_t* offset, std::string* report, std::string* error);

  uint64_t size() const;
  // The `what` of the reservation holding v ("" outside every one).
  std::string what_at(uint64_t v) const;

 private:
  struct Reservation {
    uint64_t begin, end;
    std::string what;
  };

  std::vector<StoreFile> files_;
  uint64_t stripe_;
  uint64_t alignment_;
  int32_t rank_;

  mutable std::mutex mutex_;
  uint64_t size_ = 0;
  std::vector<Reservation> reservations_;  // sorted by begin, contiguous
};

}  // namespace zerod::offload

#endif  // ZEROD_PLUGINS_OFFLOAD_NVME_STORE_H
