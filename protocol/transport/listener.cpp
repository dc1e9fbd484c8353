#include "transport/listener.h"

#include "error.h"
#include "transport/detail/deadline.h"
#include "transport/detail/socket_path.h"
#include "transport/detail/unix_address.h"
#include "transport/errors.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <system_error>

namespace zerod::transport {

Listener::Listener(ListenerOptions options) : options_(std::move(options)) {}

Listener::~Listener() { release(); }

Listener::Listener(Listener&& other) noexcept
    : options_(std::move(other.options_)),
      socket_(std::move(other.socket_)),
      wake_(std::move(other.wake_)),
      path_(std::exchange(other.path_, {})),
      directory_(std::exchange(other.directory_, {})),
      owns_socket_file_(std::exchange(other.owns_socket_file_, false)),
      socket_dev_(other.socket_dev_),
      socket_ino_(other.socket_ino_) {}

Listener& Listener::operator=(Listener&& other) noexcept {
  if (this != &other) {
    release();
    options_ = std::move(other.options_);
    socket_ = std::move(other.socket_);
    wake_ = std::move(other.wake_);
    path_ = std::exchange(other.path_, {});
    directory_ = std::exchange(other.directory_, {});
    owns_socket_file_ = std::exchange(other.owns_socket_file_, false);
    socket_dev_ = other.socket_dev_;
    socket_ino_ = other.socket_ino_;
  }
  return *this;
}

void Listener::release() noexcept {
  socket_.reset();
  wake_.reset();
  if (owns_socket_file_) {
    // Only if the file is still the socket we bound: a successor may have
    // replaced it after finding ours stale.
    struct stat st {};
    if (::lstat(path_.c_str(), &st) == 0 && st.st_dev == socket_dev_ && st.st_ino == socket_ino_) {
      ::unlink(path_.c_str());
    }
    owns_socket_file_ = false;
  }
  if (!directory_.empty()) {
    ::rmdir(directory_.c_str());  // fails harmlessly if someone put files in it
    directory_.clear();
  }
}

Listener Listener::create_private(const std::string& socket_path_or_empty,
                                  ListenerOptions options) {
  // Built first so that its destructor cleans up whatever a failure below
  // leaves behind (the directory, the bound socket).
  Listener l(std::move(options));
  if (socket_path_or_empty.empty()) {
    l.directory_ = detail::make_private_directory();
    l.path_ = l.directory_ + "/" + detail::kPrivateSocketName;
  } else {
    std::error_code ec;  // absolute() needs the working directory, which can be gone
    const std::filesystem::path full = std::filesystem::absolute(socket_path_or_empty, ec);
    if (ec)
      fail(ZD_ERR_IO,
           "cannot create the zerod socket " + socket_path_or_empty + ": " + ec.message());
    l.path_ = full.lexically_normal().string();
  }
  const std::string purpose = "cannot create the zerod socket " + l.path_;
  const detail::UnixAddress addr = detail::unix_address(l.path_, purpose);
  if (l.directory_.empty()) detail::prepare_socket_path(l.path_);

  // Non-blocking so that accept() after poll never blocks on a peer that
  // gave up in between.
  l.socket_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  ZD_CHECK_SYS(l.socket_.get(), purpose + ": socket");
  if (::bind(l.socket_.get(), addr.get(), addr.length) == -1) {
    const int err = errno;
    fail(ZD_ERR_IO, purpose + ": " + errno_text(err) +
                        (err == EADDRINUSE ? " (another zerod starting at the same moment?)" : ""));
  }
  struct stat st {};
  ZD_CHECK_SYS(::lstat(l.path_.c_str(), &st), purpose + ": stat after bind");
  l.owns_socket_file_ = true;
  l.socket_dev_ = st.st_dev;
  l.socket_ino_ = st.st_ino;
  // Before listen(): until then a connect is refused, so nobody gets in
  // through the wider mode bind gave the file.
  ZD_CHECK_SYS(::chmod(l.path_.c_str(), 0600), purpose + ": chmod 0600");
  ZD_CHECK_SYS(::listen(l.socket_.get(), l.options_.backlog), purpose + ": listen");
  l.wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  ZD_CHECK_SYS(l.wake_.get(), purpose + ": eventfd");
  return l;
}

std::optional<Connection> Listener::accept(int timeout_ms) {
  if (!socket_) fail(ZD_ERR_INVALID_STATE, "accept on a listener that was moved from");
  const detail::Deadline deadline(timeout_ms);
  const std::string on = "accepting a connection on " + path_;
  for (;;) {
    pollfd p[2] = {{socket_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    const int n = ::poll(p, 2, deadline.poll_timeout());
    if (n == -1) {
      if (errno == EINTR) continue;
      ZD_CHECK_SYS(n, on + ": poll");
    }
    // Shutdown wins over a waiting peer: the server is going away.
    if (p[1].revents != 0) return std::nullopt;
    if (n == 0)
      fail(ZD_ERR_TIMEOUT, on + ": no connection within " + std::to_string(timeout_ms) + " ms");
    if (p[0].revents & POLLNVAL) fail(ZD_ERR_IO, on + ": the listening socket is closed");

    UniqueFd conn(::accept4(socket_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn) {
      const int err = errno;
      // The peer gave up between poll and accept, or a signal: not errors.
      if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED ||
          err == EPROTO)
        continue;
      const bool fd_limit = err == EMFILE || err == ENFILE;
      fail(err == ENOMEM || err == ENOBUFS ? ZD_ERR_OUT_OF_MEMORY : ZD_ERR_IO,
           on + ": " + errno_text(err) +
               (fd_limit ? " (at the open-file limit; back off and retry)" : ""));
    }
    const PeerCredentials peer = peer_credentials(conn.get());
    if (peer.uid != ::geteuid() && !options_.allow_uid.contains(peer.uid)) {
      conn.reset();  // the peer sees end of stream
      throw PeerRefused(peer, "refused a connection on " + path_ + " from " + describe(peer) +
                                  ": permission denied (only uid " + std::to_string(::geteuid()) +
                                  " and the uids in allow_uid may connect)");
    }
    return Connection(std::move(conn));
  }
}

void Listener::shutdown() noexcept {
  if (!wake_) return;
  const uint64_t one = 1;
  // Never read back: the eventfd stays readable, so every later accept
  // returns at once too.
  [[maybe_unused]] const ssize_t n = ::write(wake_.get(), &one, sizeof one);
}

}  // namespace zerod::transport
