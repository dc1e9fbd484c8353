// One end of a connected unix stream socket, speaking frames (frame.h).
//
// Timeouts. Every send and receive takes timeout_ms (< 0: wait forever). It
// bounds the whole frame, not each read, so a peer trickling bytes cannot
// stretch it. Running out before the first byte moved throws zerod::Error
// (ZD_ERR_TIMEOUT) and the connection is intact: call again. Running out in
// the middle of a frame tears it: receive throws ProtocolError(stalled), send
// throws ZD_ERR_TIMEOUT, and that direction refuses further use.
//
// Malformed input (what receive throws, and what the connection is good for):
//   clean end of stream at a frame boundary   Error ZD_ERR_PEER_LOST
//     ("peer closed the connection"): the peer has gone; close.
//   end of stream inside a frame              ProtocolError truncated
//     (ZD_ERR_PEER_LOST): the peer has gone mid-message; close.
//   bad magic                                 ProtocolError bad_magic
//     (ZD_ERR_VERSION): frame boundaries are lost and cannot be found again.
//     Send an error frame (the peer may still read it) and close.
//   length > max_body, good magic             ProtocolError oversize
//     (ZD_ERR_INVALID_ARGUMENT): thrown before the body is allocated or
//     read; only the 16 header bytes were consumed. Reply with an error
//     frame echoing header()->request_id, call discard_rejected_body() (it
//     reads and drops exactly `length` bytes in bounded chunks), and go on
//     serving. Or close, if the announced length is more than you care to
//     read; receive() refuses to run until the body has been discarded.
//   fds dropped (MSG_CTRUNC) or too many      ProtocolError fds_rejected:
//     the whole frame was consumed and every fd that did arrive is closed;
//     reply with an error frame and go on.
//   system error (ECONNRESET...)              Error ZD_ERR_PEER_LOST or ZD_ERR_IO.
// After a non-recoverable error the receiving side refuses further use
// (ZD_ERR_INVALID_STATE) rather than read a stream that is out of step.
//
// Threads. One thread may send while another receives. Concurrent sends, or
// concurrent receives, are not allowed: frames would interleave (serialise
// them with your own mutex). shutdown() may be called from any thread, and
// from a signal handler: it wakes both directions and closes nothing, so no
// other thread can find its fd reused under it. The destructor closes the
// fd; it must run after every thread using the connection has returned.
#pragma once

#include "transport/frame.h"
#include "transport/peer.h"
#include "transport/unique_fd.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

namespace zerod::transport {

inline constexpr int kWaitForever = -1;

class Connection {
 public:
  // Takes a connected SOCK_STREAM unix socket. `label` names the peer in
  // error messages ("rank 3", "zerod at /run/user/1000/zerod-x/zerod.sock");
  // by default it is the peer's pid from SO_PEERCRED.
  explicit Connection(UniqueFd socket, std::string label = {});
  ~Connection() = default;
  Connection(Connection&& other) noexcept;
  Connection& operator=(Connection&& other) noexcept;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Sends one frame. magic and length are filled in here; the caller's
  // values for them are ignored. fds (at most kMaxFdsPerFrame) are passed
  // with SCM_RIGHTS and stay owned by the caller. A peer that has gone
  // throws ZD_ERR_PEER_LOST ("peer closed the connection"); never SIGPIPE.
  void send(const FrameHeader& header, std::span<const std::byte> body,
            std::span<const int> fds = {}, int timeout_ms = kWaitForever);

  // Receives one frame whose body is at most max_body bytes; see
  // "Malformed input" above for what it throws.
  Frame receive(uint32_t max_body, int timeout_ms = kWaitForever);

  // After ProtocolError(oversize): reads and drops the rejected body in
  // bounded chunks without storing it (fds arriving with it are closed). A
  // timeout leaves the rest pending, so it can be called again. A no-op when
  // nothing is pending.
  void discard_rejected_body(int timeout_ms = kWaitForever);
  // Body bytes of a rejected frame still unread.
  uint64_t rejected_body_left() const noexcept { return rejected_body_left_; }
  // True once the receiving side is out of step for good (a torn or
  // unframeable frame, a system error mid-frame): every later receive throws
  // ZD_ERR_INVALID_STATE, so a server loop should close the connection.
  bool receive_out_of_step() const noexcept { return !receive_broken_.empty(); }

  // shutdown(SHUT_RDWR): a thread blocked in receive or send returns at once
  // (receive with ZD_ERR_PEER_LOST, "connection was shut down"), and the
  // peer sees end of stream. Idempotent; async-signal-safe.
  void shutdown() noexcept;
  bool is_shut_down() const noexcept { return shut_down_.load(std::memory_order_relaxed); }

  // The peer's credentials (SO_PEERCRED), as of when it connected.
  PeerCredentials peer() const;

  int fd() const noexcept { return socket_.get(); }
  const std::string& label() const noexcept { return label_; }
  void set_label(std::string label) { label_ = std::move(label); }

 private:
  // `doing` is "receiving from <label>" and the like.
  [[noreturn]] void throw_io(const std::string& doing, int err, bool shut_down) const;
  void check_can_receive() const;

  UniqueFd socket_;
  std::string label_;
  std::atomic<bool> shut_down_{false};
  // Each member below is touched by one direction only, so a sending and a
  // receiving thread never share one.
  std::string send_broken_;     // why sending is refused, once a frame was torn
  std::string receive_broken_;  // why receiving is refused, once out of step
  uint64_t rejected_body_left_ = 0;
};

// Two connected ends (socketpair, close-on-exec): for tests, and for a
// parent and the child it forks.
std::pair<Connection, Connection> connection_pair();

}  // namespace zerod::transport
