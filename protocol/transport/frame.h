// The frame: a fixed 16-byte header, then `length` opaque body bytes (the
// daemon puts a protobuf message there; this layer does not look inside).
// File descriptors travel with a frame as SCM_RIGHTS attached to the first
// byte of its header.
//
// Header layout, little-endian, no padding:
//   offset 0  uint32 magic       'Z','D','F','1' in stream order
//   offset 4  uint32 length      body bytes
//   offset 8  uint32 request_id  chosen by the requester, echoed in the reply
//   offset 12 uint16 type        meaning is the protocol's, not the transport's
//   offset 14 uint16 flags       meaning is the protocol's, not the transport's
#pragma once

#include "transport/unique_fd.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace zerod::transport {

// 'Z','D','F','1' read as a little-endian uint32. The last byte is the frame
// format version: a peer speaking 'ZDF2' is told so rather than "garbage".
inline constexpr uint32_t kFrameMagic = 0x3146445AU;
inline constexpr std::size_t kFrameHeaderSize = 16;
// The most fds one frame may carry: the kernel's SCM_MAX_FD, which is the
// most a single sendmsg can pass.
inline constexpr std::size_t kMaxFdsPerFrame = 253;

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint32_t length = 0;  // body bytes
  uint32_t request_id = 0;
  uint16_t type = 0;
  uint16_t flags = 0;
};

struct Frame {
  FrameHeader header;
  std::vector<std::byte> body;
  std::vector<UniqueFd> fds;  // close-on-exec, in the order they were sent
};

// The 16 header bytes as they go on the wire, and back. decode_header does
// not validate: Connection::receive does, with the limits of its caller.
std::array<std::byte, kFrameHeaderSize> encode_header(const FrameHeader& header);
FrameHeader decode_header(const std::array<std::byte, kFrameHeaderSize>& bytes);

// "type 7 request 42 flags 0x0001 body 128 bytes", with the magic added when
// it is not kFrameMagic: for logs and error messages.
std::string describe(const FrameHeader& header);

}  // namespace zerod::transport
