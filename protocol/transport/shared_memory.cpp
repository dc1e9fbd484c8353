#include "transport/shared_memory.h"

#include "error.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <limits>
#include <utility>

namespace zerod::transport {

const int kSharedMemorySeals = F_SEAL_SHRINK | F_SEAL_GROW;

namespace {

std::string seal_names(int seals) {
  std::string out;
  const auto add = [&](int bit, const char* name) {
    if (seals & bit) out += (out.empty() ? "" : "|") + std::string(name);
  };
  add(F_SEAL_SEAL, "F_SEAL_SEAL");
  add(F_SEAL_SHRINK, "F_SEAL_SHRINK");
  add(F_SEAL_GROW, "F_SEAL_GROW");
  add(F_SEAL_WRITE, "F_SEAL_WRITE");
#ifdef F_SEAL_FUTURE_WRITE
  add(F_SEAL_FUTURE_WRITE, "F_SEAL_FUTURE_WRITE");
#endif
  return out.empty() ? "none" : out;
}

}  // namespace

UniqueFd create_sealed_memfd(const char* name, uint64_t size) {
  if (size == 0 || size > static_cast<uint64_t>(std::numeric_limits<off_t>::max()))
    fail(ZD_ERR_INVALID_ARGUMENT, std::string("memfd '") + name + "': cannot be " + std::to_string(size) +
                                      " bytes long");
  UniqueFd fd(memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) fail(ZD_ERR_OUT_OF_MEMORY, std::string("memfd_create for '") + name + "': " + errno_text(errno));
  if (ftruncate(fd.get(), static_cast<off_t>(size)) != 0)
    fail(ZD_ERR_OUT_OF_MEMORY, std::string("sizing memfd '") + name + "' to " + std::to_string(size) +
                                   " bytes: " + errno_text(errno));
  if (fcntl(fd.get(), F_ADD_SEALS, kSharedMemorySeals) != 0)
    fail(ZD_ERR_IO, std::string("sealing memfd '") + name + "' against resizing: " + errno_text(errno));
  return fd;
}

void check_sealed_memfd(int fd, uint64_t claimed_size, uint64_t max_size, const std::string& what,
                        zd_status code) {
  if (claimed_size == 0) fail(code, what + ": a size of 0 bytes was claimed; it must be at least 1");
  if (claimed_size > max_size)
    fail(code, what + ": " + std::to_string(claimed_size) + " bytes were claimed, more than the limit of " +
                   std::to_string(max_size));
  // Seals first: once shrinking is sealed, the size fstat reports below can
  // no longer change under us.
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0)
    fail(code, what + " is not a memfd (F_GET_SEALS: " + errno_text(errno) +
                   "); shared memory must be a memfd made with MFD_ALLOW_SEALING");
  if ((seals & kSharedMemorySeals) != kSharedMemorySeals)
    fail(code, what + " is not sealed against resizing (its seals: " + seal_names(seals) +
                   "); add F_SEAL_SHRINK|F_SEAL_GROW before sending it");
#ifdef F_SEAL_FUTURE_WRITE
  const int write_seals = F_SEAL_WRITE | F_SEAL_FUTURE_WRITE;
#else
  const int write_seals = F_SEAL_WRITE;
#endif
  if (seals & write_seals)
    fail(code, what + " is sealed against writing (its seals: " + seal_names(seals) +
                   "); it must be writable by both sides");
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_ACCMODE) != O_RDWR)
    fail(code, what + " is not open for reading and writing; send the memfd itself, not a read-only reopening");
  struct stat st{};
  if (fstat(fd, &st) != 0) fail(code, what + ": fstat failed: " + errno_text(errno));
  if (!S_ISREG(st.st_mode)) fail(code, what + " is not a regular file (a memfd)");
  if (static_cast<uint64_t>(st.st_size) < claimed_size)
    fail(code, what + " holds " + std::to_string(st.st_size) + " bytes, fewer than the " +
                   std::to_string(claimed_size) + " claimed");
}

SharedMapping::SharedMapping(int fd, uint64_t size, uint64_t max_size, const std::string& what,
                             zd_status code) {
  check_sealed_memfd(fd, size, max_size, what, code);
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    fail(err == ENOMEM ? ZD_ERR_OUT_OF_MEMORY : ZD_ERR_IO,
         "cannot map " + what + " (" + std::to_string(size) + " bytes): " + errno_text(err));
  }
  base_ = static_cast<std::byte*>(p);
  size_ = size;
}

SharedMapping::SharedMapping(SharedMapping&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)), size_(std::exchange(other.size_, 0)) {}

SharedMapping& SharedMapping::operator=(SharedMapping&& other) noexcept {
  if (this != &other) {
    reset();
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void SharedMapping::reset() noexcept {
  if (base_) munmap(base_, size_);
  base_ = nullptr;
  size_ = 0;
}

}  // namespace zerod::transport
