#include "transport/detail/unix_address.h"

#include "error.h"

#include <cstring>

namespace zerod::transport::detail {

UnixAddress unix_address(const std::string& path, const std::string& purpose) {
  if (path.empty()) fail(ZD_ERR_INVALID_ARGUMENT, purpose + ": the socket path is empty");
  if (path.find('\0') != std::string::npos) {
    fail(ZD_ERR_INVALID_ARGUMENT, purpose + ": the socket path contains a NUL byte");
  }
  if (path.size() > kMaxSocketPath) {
    fail(ZD_ERR_INVALID_ARGUMENT,
         purpose + ": the socket path " + path + " is " + std::to_string(path.size()) +
             " bytes; a unix socket path is limited to " + std::to_string(kMaxSocketPath) +
             " bytes (sockaddr_un.sun_path); choose a shorter one");
  }
  UnixAddress a;
  a.addr.sun_family = AF_UNIX;
  std::memcpy(a.addr.sun_path, path.data(), path.size());
  a.length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  return a;
}

}  // namespace zerod::transport::detail
