// Helpers shared by the transport tests.
#pragma once

#include "error.h"
#include "transport/frame.h"
#include "transport/unique_fd.h"

#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <vector>

namespace zerod::transport::test {

// A deterministic byte pattern, so a misplaced or torn byte is noticed.
inline std::vector<std::byte> pattern(std::size_t n, uint32_t seed) {
  std::vector<std::byte> out(n);
  uint32_t x = seed * 2654435761U + 1;
  for (auto& b : out) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<std::byte>(x);
  }
  return out;
}

inline std::span<const std::byte> bytes_of(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

// Writes raw bytes on a socket, bypassing the framing: how a broken or
// hostile peer is played.
inline void write_raw(int fd, const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw std::system_error(errno, std::generic_category(), "write_raw");
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

inline void write_header(int fd, const FrameHeader& h) {
  const auto raw = encode_header(h);
  write_raw(fd, raw.data(), raw.size());
}

// Runs f and returns the E it throws; a test failure if it throws nothing.
// Another exception type propagates, so gtest shows what it was.
template <typename E, typename F>
std::optional<E> thrown(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e;
  }
  ADD_FAILURE() << "expected an exception, none was thrown";
  return std::nullopt;
}

// A close-on-exec memfd of `size` bytes: something real to pass.
inline UniqueFd make_memfd(off_t size = 0) {
  UniqueFd fd(::memfd_create("transport-test", MFD_CLOEXEC));
  if (!fd || ::ftruncate(fd.get(), size) != 0)
    throw std::system_error(errno, std::generic_category(), "memfd");
  return fd;
}

// The number of fds this process has open: for checking that error paths
// close everything they received.
inline int open_fd_count() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(d);
  return n - 1;  // the directory's own fd
}

// A fresh directory under /tmp, removed with everything in it at the end.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/zerod-transport-test-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr)
      throw std::system_error(errno, std::generic_category(), "mkdtemp");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace zerod::transport::test
