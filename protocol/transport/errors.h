// The transport's own error types. Both are zerod::Error, so code that only
// wants a status and a message needs nothing from here; a server catches them
// by type to decide what to do with the connection.
#pragma once

#include "error.h"
#include "transport/frame.h"
#include "transport/peer.h"

#include <optional>
#include <string>

namespace zerod::transport {

// The peer broke the frame protocol. What the connection is good for
// afterwards depends on kind(); see "Malformed input" in connection.h.
class ProtocolError : public Error {
 public:
  enum class Kind {
    // Not a zerod frame, or another frame format version (ZD_ERR_VERSION).
    // Frame boundaries are lost: close the connection.
    bad_magic,
    // length > max_body (ZD_ERR_INVALID_ARGUMENT). Only the header was
    // consumed; Connection::discard_rejected_body() skips the body without
    // storing it, after which the connection is in step again.
    oversize,
    // The frame arrived whole but its fds did not all arrive (MSG_CTRUNC: our
    // fd limit) or there were more than kMaxFdsPerFrame (ZD_ERR_IO or
    // ZD_ERR_INVALID_ARGUMENT). The frame was consumed and the fds that did
    // arrive are closed: the connection is in step.
    fds_rejected,
    // The peer closed the connection inside a frame (ZD_ERR_PEER_LOST).
    truncated,
    // The receive timeout expired inside a frame (ZD_ERR_TIMEOUT). Part of
    // the frame was consumed: close the connection.
    stalled,
  };

  ProtocolError(Kind kind, zd_status code, const std::string& message,
                std::optional<FrameHeader> header);

  Kind kind() const noexcept { return kind_; }
  // True when the connection can carry the next frame (after
  // discard_rejected_body() for an oversize frame).
  bool recoverable() const noexcept {
    return kind_ == Kind::oversize || kind_ == Kind::fds_rejected;
  }
  // The header, when all 16 bytes of it arrived: its request_id is what an
  // error reply should echo.
  const std::optional<FrameHeader>& header() const noexcept { return header_; }

 private:
  Kind kind_;
  std::optional<FrameHeader> header_;
};

// "bad_magic", "oversize", ...
const char* kind_name(ProtocolError::Kind kind);

// Listener::accept refused a peer whose uid is neither ours nor allowed
// (ZD_ERR_IO, "permission denied"). Its connection is already closed; the
// server logs this and keeps accepting.
class PeerRefused : public Error {
 public:
  PeerRefused(const PeerCredentials& peer, const std::string& message);
  const PeerCredentials& peer() const noexcept { return peer_; }

 private:
  PeerCredentials peer_;
};

}  // namespace zerod::transport
