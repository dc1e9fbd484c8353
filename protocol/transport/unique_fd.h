// An owned file descriptor. Everything the transport opens or receives is
// held in one from the first moment, so every error path closes it.
#pragma once

#include <unistd.h>

#include <utility>

namespace zerod::transport {

class UniqueFd {
 public:
  UniqueFd() noexcept = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  explicit operator bool() const noexcept { return valid(); }

  // Gives up ownership; the caller closes the fd.
  int release() noexcept { return std::exchange(fd_, -1); }

  // Closes the fd held (if any) and holds `fd`. close() is not retried on
  // EINTR: Linux releases the descriptor even then, and a retry could close
  // one that another thread has just been given.
  void reset(int fd = -1) noexcept {
    const int old = std::exchange(fd_, fd);
    if (old >= 0) ::close(old);
  }

 private:
  int fd_ = -1;
};

}  // namespace zerod::transport
