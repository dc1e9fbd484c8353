// Internal: choosing and clearing the place where a listener's socket goes.
#pragma once

#include <string>

namespace zerod::transport::detail {

// Makes a fresh private directory (mode 0700) for the socket:
// $XDG_RUNTIME_DIR/zerod-XXXXXX when that is set, is a directory we can
// write and leaves room for the socket name within sun_path, else
// /tmp/zerod-XXXXXX. Returns the directory; the socket in it is
// kPrivateSocketName.
std::string make_private_directory();
inline constexpr const char* kPrivateSocketName = "zerod.sock";

// For a socket path the caller chose: the parent must be a directory;
// nothing there is fine; a stale socket (nobody accepts on it) is unlinked;
// a live one ("another zerod is serving ...") or anything that is not a
// socket is refused with ZD_ERR_IO.
//
// Not atomic: two daemons started at the same instant on the same path can
// both find it stale. The private-directory default has no such race.
void prepare_socket_path(const std::string& path);

// Whether something accepts connections on the socket at `path`. Throws
// ZD_ERR_IO when that cannot be told (no permission to connect).
bool socket_is_live(const std::string& path);

}  // namespace zerod::transport::detail
