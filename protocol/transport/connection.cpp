#include "transport/connection.h"

#include "transport/detail/wire.h"
#include "transport/errors.h"

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <limits>

namespace zerod::transport {

using detail::Deadline;
using detail::IoEnd;
using detail::IoResult;

namespace {

// Bounded scratch for discarding a rejected body: whatever length a peer
// announces, discarding it costs this much memory.
constexpr std::size_t kDiscardChunk = 64 * 1024;

std::string default_label(int fd) {
  try {
    return "peer pid " + std::to_string(peer_credentials(fd).pid);
  } catch (const Error&) {
    return "peer on fd " + std::to_string(fd);  // not a unix socket; still usable for messages
  }
}

std::string timeout_text(int timeout_ms) { return std::to_string(timeout_ms) + " ms"; }

}  // namespace

Connection::Connection(UniqueFd socket, std::string label)
    : socket_(std::move(socket)), label_(std::move(label)) {
  if (!socket_) fail(ZD_ERR_INVALID_ARGUMENT, "zerod transport: a Connection needs an open socket");
  if (label_.empty()) label_ = default_label(socket_.get());
}

Connection::Connection(Connection&& other) noexcept
    : socket_(std::move(other.socket_)),
      label_(std::move(other.label_)),
      shut_down_(other.shut_down_.load()),
      send_broken_(std::move(other.send_broken_)),
      receive_broken_(std::move(other.receive_broken_)),
      rejected_body_left_(std::exchange(other.rejected_body_left_, 0)) {}

Connection& Connection::operator=(Connection&& other) noexcept {
  if (this != &other) {
    socket_ = std::move(other.socket_);
    label_ = std::move(other.label_);
    shut_down_.store(other.shut_down_.load());
    send_broken_ = std::move(other.send_broken_);
    receive_broken_ = std::move(other.receive_broken_);
    rejected_body_left_ = std::exchange(other.rejected_body_left_, 0);
  }
  return *this;
}

void Connection::throw_io(const std::string& doing, int err, bool shut_down) const {
  const std::string prefix = doing + ": ";
  if (shut_down) fail(ZD_ERR_PEER_LOST, prefix + "connection was shut down by this process");
  if (err == EPIPE || err == ECONNRESET || err == ENOTCONN) {
    fail(ZD_ERR_PEER_LOST, prefix + "peer closed the connection (" + errno_text(err) + ")");
  }
  fail(err == ENOMEM || err == ENOBUFS ? ZD_ERR_OUT_OF_MEMORY : ZD_ERR_IO,
       prefix + errno_text(err));
}

void Connection::send(const FrameHeader& header, std::span<const std::byte> body,
                      std::span<const int> fds, int timeout_ms) {
  FrameHeader h = header;
  h.magic = kFrameMagic;
  h.length = static_cast<uint32_t>(std::min<std::size_t>(body.size(), UINT32_MAX));
  // Built only on an error path: a send that works allocates nothing here.
  const auto what = [&] { return "sending " + describe(h) + " to " + label_; };
  if (!send_broken_.empty()) {
    fail(ZD_ERR_INVALID_STATE,
         what() + ": this connection can no longer send (" + send_broken_ + ")");
  }
  if (body.size() > std::numeric_limits<uint32_t>::max()) {
    fail(ZD_ERR_INVALID_ARGUMENT, what() + ": a body of " + std::to_string(body.size()) +
                                      " bytes does not fit the frame's 32-bit length");
  }
  if (fds.size() > kMaxFdsPerFrame) {
    fail(ZD_ERR_INVALID_ARGUMENT, what() + ": " + std::to_string(fds.size()) +
                                      " fds, but a frame carries at most " +
                                      std::to_string(kMaxFdsPerFrame));
  }
  const auto head = encode_header(h);
  const IoResult r = detail::send_all(socket_.get(), head, body, fds, Deadline(timeout_ms));
  if (r.end == IoEnd::complete) return;

  const std::size_t total = head.size() + body.size();
  const bool torn = r.bytes > 0;
  if (r.end == IoEnd::timeout) {
    const std::string message = what() + ": timed out after " + timeout_text(timeout_ms) +
                                " with " + std::to_string(r.bytes) + " of " +
                                std::to_string(total) + " bytes sent (is the peer reading?)";
    // The peer holds part of a frame; anything sent now would be read as
    // the rest of it.
    if (torn) send_broken_ = "an earlier send timed out mid-frame";
    fail(ZD_ERR_TIMEOUT, message);
  }
  if (torn) send_broken_ = "an earlier send failed mid-frame";
  throw_io(what(), r.err, is_shut_down());
}

void Connection::check_can_receive() const {
  if (!receive_broken_.empty()) {
    fail(ZD_ERR_INVALID_STATE, "receiving from " + label_ +
                                   ": the connection is out of step after an earlier error (" +
                                   receive_broken_ + "); close it");
  }
  if (rejected_body_left_ > 0) {
    fail(ZD_ERR_INVALID_STATE, "receiving from " + label_ + ": " +
                                   std::to_string(rejected_body_left_) +
                                   " bytes of a rejected frame are still unread; call "
                                   "discard_rejected_body() first");
  }
}

Frame Connection::receive(uint32_t max_body, int timeout_ms) {
  check_can_receive();
  const Deadline deadline(timeout_ms);
  Frame frame;  // owns every fd received from here on, on every path
  bool fds_truncated = false;
  const auto from = [this] { return "receiving from " + label_; };  // for error paths only

  std::array<std::byte, kFrameHeaderSize> raw{};
  IoResult r = detail::receive_exact(socket_.get(), raw, deadline, frame.fds, fds_truncated);
  if (r.end != IoEnd::complete) {
    if (is_shut_down()) {
      if (r.bytes > 0) receive_broken_ = "shut down mid-frame";
      fail(ZD_ERR_PEER_LOST, from() + ": connection was shut down by this process");
    }
    if (r.bytes == 0) {
      // Nothing of a frame was consumed: the stream is still in step.
      if (r.end == IoEnd::eof) fail(ZD_ERR_PEER_LOST, from() + ": peer closed the connection");
      if (r.end == IoEnd::timeout)
        fail(ZD_ERR_TIMEOUT, from() + ": no frame within " + timeout_text(timeout_ms));
      throw_io(from(), r.err, false);
    }
    const std::string got =
        std::to_string(r.bytes) + " of " + std::to_string(kFrameHeaderSize) + " header bytes";
    receive_broken_ = "torn frame header";
    if (r.end == IoEnd::eof) {
      throw ProtocolError(ProtocolError::Kind::truncated, ZD_ERR_PEER_LOST,
                          from() + ": peer closed the connection after " + got, std::nullopt);
    }
    if (r.end == IoEnd::timeout) {
      throw ProtocolError(
          ProtocolError::Kind::stalled, ZD_ERR_TIMEOUT,
          from() + ": peer sent " + got + " then nothing more within " + timeout_text(timeout_ms),
          std::nullopt);
    }
    throw_io(from(), r.err, false);
  }

  frame.header = decode_header(raw);
  const FrameHeader& h = frame.header;
  if (h.magic != kFrameMagic) {
    receive_broken_ = "bad magic";
    // 'Z','D','F' then another version byte: a client of another zerod.
    const bool other_version = (h.magic & 0x00FFFFFFU) == (kFrameMagic & 0x00FFFFFFU);
    const char version = static_cast<char>(h.magic >> 24);
    const std::string why =
        other_version && std::isprint(static_cast<unsigned char>(version))
            ? "frame format version '" + std::string(1, version) +
                  "', this zerod speaks '1' (mismatched client and daemon builds?)"
            : "not a zerod frame";
    throw ProtocolError(ProtocolError::Kind::bad_magic, ZD_ERR_VERSION,
                        from() + ": " + why + " (" + describe(h) + "); frame boundaries are lost",
                        h);
  }
  if (h.length > max_body) {
    // Checked before anything is allocated: the length is the peer's claim.
    rejected_body_left_ = h.length;
    throw ProtocolError(ProtocolError::Kind::oversize, ZD_ERR_INVALID_ARGUMENT,
                        from() + ": " + describe(h) + " exceeds the limit of " +
                            std::to_string(max_body) + " body bytes",
                        h);
  }

  frame.body.resize(h.length);
  r = detail::receive_exact(socket_.get(), frame.body, deadline, frame.fds, fds_truncated);
  if (r.end != IoEnd::complete) {
    receive_broken_ = "torn frame body";
    if (is_shut_down())
      fail(ZD_ERR_PEER_LOST, from() + ": connection was shut down by this process");
    const std::string got = std::to_string(r.bytes) + " of " + std::to_string(h.length) +
                            " body bytes of " + describe(h);
    if (r.end == IoEnd::eof) {
      throw ProtocolError(ProtocolError::Kind::truncated, ZD_ERR_PEER_LOST,
                          from() + ": peer closed the connection after " + got, h);
    }
    if (r.end == IoEnd::timeout) {
      throw ProtocolError(
          ProtocolError::Kind::stalled, ZD_ERR_TIMEOUT,
          from() + ": peer sent " + got + " then nothing more within " + timeout_text(timeout_ms),
          h);
    }
    throw_io(from(), r.err, false);
  }

  // The frame is consumed whole, so these leave the stream in step.
  if (fds_truncated) {
    const std::size_t arrived = frame.fds.size();
    frame.fds.clear();
    throw ProtocolError(
        ProtocolError::Kind::fds_rejected, ZD_ERR_IO,
        from() + ": the kernel dropped fds sent with " + describe(h) +
            " (MSG_CTRUNC; is this process at its open-file limit, RLIMIT_NOFILE?); the " +
            std::to_string(arrived) + " that arrived were closed",
        h);
  }
  if (frame.fds.size() > kMaxFdsPerFrame) {
    const std::size_t arrived = frame.fds.size();
    frame.fds.clear();
    throw ProtocolError(ProtocolError::Kind::fds_rejected, ZD_ERR_INVALID_ARGUMENT,
                        from() + ": " + std::to_string(arrived) + " fds came with " + describe(h) +
                            ", at most " + std::to_string(kMaxFdsPerFrame) +
                            " are allowed; all were closed",
                        h);
  }
  return frame;
}

void Connection::discard_rejected_body(int timeout_ms) {
  if (rejected_body_left_ == 0) return;
  if (!receive_broken_.empty()) check_can_receive();
  const Deadline deadline(timeout_ms);
  const std::string from = "discarding a rejected frame body from " + label_;
  std::array<std::byte, kDiscardChunk> chunk;
  while (rejected_body_left_ > 0) {
    const std::size_t n =
        static_cast<std::size_t>(std::min<uint64_t>(rejected_body_left_, chunk.size()));
    std::vector<UniqueFd> stray_fds;  // a frame's fds belong on its first byte; these are closed
    bool fds_truncated = false;
    const IoResult r = detail::receive_exact(socket_.get(), std::span(chunk.data(), n), deadline,
                                             stray_fds, fds_truncated);
    rejected_body_left_ -= r.bytes;
    if (r.end == IoEnd::complete) continue;
    const std::string left = std::to_string(rejected_body_left_) + " bytes left";
    if (r.end == IoEnd::timeout) {
      // Resumable: the count of bytes still to drop is exact.
      fail(ZD_ERR_TIMEOUT,
           from + ": timed out after " + timeout_text(timeout_ms) + " with " + left);
    }
    receive_broken_ = "torn rejected body";
    if (is_shut_down()) fail(ZD_ERR_PEER_LOST, from + ": connection was shut down by this process");
    if (r.end == IoEnd::eof) {
      throw ProtocolError(ProtocolError::Kind::truncated, ZD_ERR_PEER_LOST,
                          from + ": peer closed the connection with " + left, std::nullopt);
    }
    throw_io(from, r.err, false);
  }
}

void Connection::shutdown() noexcept {
  shut_down_.store(true, std::memory_order_relaxed);
  // Not close(): a thread blocked on this fd would be left with a number
  // that may be reused. shutdown wakes it and keeps the fd valid.
  if (socket_) ::shutdown(socket_.get(), SHUT_RDWR);
}

PeerCredentials Connection::peer() const { return peer_credentials(socket_.get()); }

std::pair<Connection, Connection> connection_pair() {
  int sv[2];
  ZD_CHECK_SYS(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv),
               "socketpair for a zerod connection");
  UniqueFd a(sv[0]);
  UniqueFd b(sv[1]);
  return {Connection(std::move(a)), Connection(std::move(b))};
}

}  // namespace zerod::transport
