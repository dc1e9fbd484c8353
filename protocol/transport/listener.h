// The server side: a listening unix socket in a place only its owner can
// reach, and accept() with a peer check.
//
// Threads. accept() is for one thread at a time. shutdown() may be called
// from any thread, and from a signal handler: a blocked accept() returns
// std::nullopt at once, and so does every later one. The destructor removes
// the socket and the directory create_private made; it must run after the
// accepting thread has returned. Connections already accepted are
// independent of the listener and outlive it.
#pragma once

#include "transport/connection.h"

#include <sys/socket.h>
#include <sys/types.h>

#include <optional>
#include <set>
#include <string>

namespace zerod::transport {

struct ListenerOptions {
  // Peers with these uids are accepted besides our own effective uid. Root
  // is not special: list 0 here to let root in to a user's daemon.
  std::set<uid_t> allow_uid;
  int backlog = SOMAXCONN;
};

class Listener {
 public:
  // With an empty path: a fresh directory zerod-XXXXXX (mode 0700) under
  // $XDG_RUNTIME_DIR if it is set and usable, else under /tmp, holding the
  // socket zerod.sock (mode 0600).
  // With a path: its directory must exist; a stale socket there (nobody
  // accepts on it) is replaced; a live one is refused ("another zerod is
  // serving /path"), and so is anything that is not a socket. The socket
  // gets mode 0600 before it listens, so no one connects through a wider
  // mode first. A relative path is made absolute.
  // Errors: zerod::Error, ZD_ERR_IO (ZD_ERR_INVALID_ARGUMENT for a path too
  // long for sun_path).
  static Listener create_private(const std::string& socket_path_or_empty,
                                 ListenerOptions options = {});

  ~Listener();
  Listener(Listener&& other) noexcept;
  Listener& operator=(Listener&& other) noexcept;
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // Waits for the next peer. Returns std::nullopt once shutdown() was
  // called. Throws PeerRefused for a peer whose uid is neither ours nor in
  // allow_uid (its connection is already closed: log it and call accept
  // again), ZD_ERR_TIMEOUT when timeout_ms passes, and zerod::Error
  // (ZD_ERR_IO) when accept itself fails, e.g. at the open-file limit (log
  // it, back off, call again). The connection is close-on-exec.
  std::optional<Connection> accept(int timeout_ms = kWaitForever);

  // Wakes a blocked accept(); idempotent; async-signal-safe.
  void shutdown() noexcept;

  const std::string& path() const noexcept { return path_; }
  // The directory create_private made, or empty when the caller chose the path.
  const std::string& directory() const noexcept { return directory_; }
  // The listening socket, for a server that polls it itself. Non-blocking.
  int fd() const noexcept { return socket_.get(); }

 private:
  explicit Listener(ListenerOptions options);
  // Closes the sockets, unlinks the socket file if it is still ours and
  // removes the directory we made.
  void release() noexcept;

  ListenerOptions options_;
  UniqueFd socket_;
  UniqueFd wake_;  // an eventfd: shutdown() makes it readable for good
  std::string path_;
  std::string directory_;
  // The socket file we bound, so that we never unlink a successor's.
  bool owns_socket_file_ = false;
  dev_t socket_dev_ = 0;
  ino_t socket_ino_ = 0;
};

}  // namespace zerod::transport
