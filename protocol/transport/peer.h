// Who is at the other end of a unix socket, as the kernel saw it at connect
// time (SO_PEERCRED): it cannot be forged by the peer.
#pragma once

#include <sys/types.h>

#include <string>

namespace zerod::transport {

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// Throws zerod::Error (ZD_ERR_IO) if the fd is not a connected unix socket.
PeerCredentials peer_credentials(int socket_fd);

// "pid 123 uid 1000 gid 1000"
std::string describe(const PeerCredentials& peer);

}  // namespace zerod::transport
