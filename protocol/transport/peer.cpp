#include "transport/peer.h"

#include "error.h"

#include <sys/socket.h>

#include <cerrno>

namespace zerod::transport {

PeerCredentials peer_credentials(int socket_fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  ZD_CHECK_SYS(getsockopt(socket_fd, SOL_SOCKET, SO_PEERCRED, &cred, &len),
               "reading the peer's credentials (SO_PEERCRED) of fd " + std::to_string(socket_fd));
  return PeerCredentials{cred.pid, cred.uid, cred.gid};
}

std::string describe(const PeerCredentials& peer) {
  return "pid " + std::to_string(peer.pid) + " uid " + std::to_string(peer.uid) + " gid " +
         std::to_string(peer.gid);
}

}  // namespace zerod::transport
