// Shared memory that crosses the socket: a memfd sealed against growing and
// shrinking. A receiver maps only such an fd, after fstat shows it holds at
// least the bytes the sender claims, so the sender can never pull pages out
// from under the mapping (which would raise SIGBUS in the receiver, and kill
// a daemon serving every rank). Both directions use it: the client's staging
// memfd going to the daemon, the daemon's arenas coming to the client.
#pragma once

#include "transport/unique_fd.h"

#include <zerod/zerod.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace zerod::transport {

// The seals a receiver requires (F_SEAL_SHRINK | F_SEAL_GROW).
extern const int kSharedMemorySeals;

// For the sender: a memfd of `size` bytes (close-on-exec), sealed against
// growing and shrinking. `name` shows in /proc/<pid>/fd. Throws
// ZD_ERR_OUT_OF_MEMORY when it cannot be made or sized.
UniqueFd create_sealed_memfd(const char* name, uint64_t size);

// For the receiver: refuses, before anything is mapped, an fd that is not a
// memfd carrying kSharedMemorySeals, one sealed against writing, a claimed
// size of 0 or over max_size, and a file smaller than the claimed size.
// Throws `code` with a message that begins with `what` ("the staging
// memfd") and says which check failed and the numbers.
void check_sealed_memfd(int fd, uint64_t claimed_size, uint64_t max_size, const std::string& what,
                        zd_status code = ZD_ERR_INVALID_ARGUMENT);

// A read-write shared mapping of a whole checked memfd; unmapped on
// destruction. Moves, never copies.
class SharedMapping {
 public:
  SharedMapping() noexcept = default;
  // check_sealed_memfd(fd, size, max_size, what, code), then mmap. A failing
  // mmap throws ZD_ERR_OUT_OF_MEMORY or ZD_ERR_IO naming `what`.
  SharedMapping(int fd, uint64_t size, uint64_t max_size, const std::string& what,
                zd_status code = ZD_ERR_INVALID_ARGUMENT);
  ~SharedMapping() { reset(); }
  SharedMapping(SharedMapping&& other) noexcept;
  SharedMapping& operator=(SharedMapping&& other) noexcept;
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;

  std::byte* data() const noexcept { return base_; }
  uint64_t size() const noexcept { return size_; }
  explicit operator bool() const noexcept { return base_ != nullptr; }
  void reset() noexcept;

 private:
  std::byte* base_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace zerod::transport
