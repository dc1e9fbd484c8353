#include "transport/errors.h"

namespace zerod::transport {

ProtocolError::ProtocolError(Kind kind, zd_status code, const std::string& message,
                             std::optional<FrameHeader> header)
    : Error(code, message), kind_(kind), header_(header) {}

const char* kind_name(ProtocolError::Kind kind) {
  switch (kind) {
    case ProtocolError::Kind::bad_magic: return "bad_magic";
    case ProtocolError::Kind::oversize: return "oversize";
    case ProtocolError::Kind::fds_rejected: return "fds_rejected";
    case ProtocolError::Kind::truncated: return "truncated";
    case ProtocolError::Kind::stalled: return "stalled";
  }
  return "unknown";
}

PeerRefused::PeerRefused(const PeerCredentials& peer, const std::string& message)
    : Error(ZD_ERR_IO, message), peer_(peer) {}

}  // namespace zerod::transport
