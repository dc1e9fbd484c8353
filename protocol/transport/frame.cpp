#include "transport/frame.h"

#include <cctype>
#include <cstdio>

namespace zerod::transport {

namespace {

// Explicit byte order, so the format does not depend on the host's.
void put_le(std::byte* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<std::byte>(value >> (8 * i));
}

uint64_t get_le(const std::byte* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= static_cast<uint64_t>(in[i]) << (8 * i);
  return value;
}

}  // namespace

std::array<std::byte, kFrameHeaderSize> encode_header(const FrameHeader& header) {
  std::array<std::byte, kFrameHeaderSize> out{};
  put_le(out.data() + 0, header.magic, 4);
  put_le(out.data() + 4, header.length, 4);
  put_le(out.data() + 8, header.request_id, 4);
  put_le(out.data() + 12, header.type, 2);
  put_le(out.data() + 14, header.flags, 2);
  return out;
}

FrameHeader decode_header(const std::array<std::byte, kFrameHeaderSize>& bytes) {
  FrameHeader header;
  header.magic = static_cast<uint32_t>(get_le(bytes.data() + 0, 4));
  header.length = static_cast<uint32_t>(get_le(bytes.data() + 4, 4));
  header.request_id = static_cast<uint32_t>(get_le(bytes.data() + 8, 4));
  header.type = static_cast<uint16_t>(get_le(bytes.data() + 12, 2));
  header.flags = static_cast<uint16_t>(get_le(bytes.data() + 14, 2));
  return header;
}

std::string describe(const FrameHeader& header) {
  char text[160];
  std::snprintf(text, sizeof text, "type %u request %u flags 0x%04x body %u bytes",
                static_cast<unsigned>(header.type), static_cast<unsigned>(header.request_id),
                static_cast<unsigned>(header.flags), static_cast<unsigned>(header.length));
  std::string out = text;
  if (header.magic != kFrameMagic) {
    // Show the magic as the four characters a human would recognise
    // ("GET ", "ZDF2") where they are printable.
    std::string chars;
    for (int i = 0; i < 4; ++i) {
      const int c = static_cast<int>((header.magic >> (8 * i)) & 0xFF);
      chars += std::isprint(c) ? static_cast<char>(c) : '.';
    }
    std::snprintf(text, sizeof text, " magic 0x%08x '%s' (expected 'ZDF1')",
                  static_cast<unsigned>(header.magic), chars.c_str());
    out += text;
  }
  return out;
}

}  // namespace zerod::transport
