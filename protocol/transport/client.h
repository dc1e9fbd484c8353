// The client side: connecting to a zerod's socket.
#pragma once

#include "transport/connection.h"

#include <string>

namespace zerod::transport {

// Connects to the zerod listening at `path` and returns a connection
// labelled "zerod at <path>". timeout_ms (< 0: forever) bounds the wait
// while the daemon's accept queue is full (ZD_ERR_TIMEOUT); nothing else
// waits. Errors name the path and say what to check:
//   no such socket      ZD_ERR_IO "cannot connect to zerod at /p: No such
//                       file or directory — is the daemon running?"
//   nobody listening    ZD_ERR_IO "...: Connection refused — nothing accepts
//                       on this socket (left by a zerod that exited?)"
//   path too long       ZD_ERR_INVALID_ARGUMENT naming the sun_path limit
//   another user's      ZD_ERR_IO "...: the process listening there (pid 7)
//   daemon              runs as uid 1001 (bob), but this process is uid
//                       1000 (alice): ...": the daemon's uid (SO_PEERCRED)
//                       must be this process's effective uid or root's,
//                       checked before anything is sent
Connection connect_unix(const std::string& path, int timeout_ms);

}  // namespace zerod::transport
