// Internal: a filesystem path as a sockaddr_un, refusing what does not fit.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <cstddef>
#include <string>

namespace zerod::transport::detail {

// The longest path a sockaddr_un holds with its terminating NUL.
inline constexpr std::size_t kMaxSocketPath = sizeof(sockaddr_un{}.sun_path) - 1;

struct UnixAddress {
  sockaddr_un addr{};
  socklen_t length = 0;
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&addr); }
};

// Throws ZD_ERR_INVALID_ARGUMENT, naming `purpose` and the limit, for an
// empty path, one with a NUL in it, or one longer than kMaxSocketPath.
UnixAddress unix_address(const std::string& path, const std::string& purpose);

}  // namespace zerod::transport::detail
