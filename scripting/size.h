// Size literals in job scripts: 4096, "512MiB", "1.5 GiB", "4GB".
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace zerod::scripting {

// A size read from text: the bytes, or why the text is not a size.
struct SizeReading {
  std::optional<uint64_t> bytes;
  // Empty when bytes holds the size. A literal, not a std::string, so that
  // zerod.size can raise it with luaL_error, whose longjmp skips destructors.
  const char* why_not = "";
};

// Binary units (KiB, MiB, GiB, TiB), decimal units (KB, MB, GB, TB) and B.
// A fraction of a KiB, KB or larger unit is rounded to the nearest byte
// ("1.3GiB" is 1395864371 bytes); a fraction of a byte ("1.5B", "1.5") is
// refused. Negative sizes, sizes of 2^63 bytes or more and bare "M" or "G",
// which could mean either, are refused too.
SizeReading read_size(const std::string& text);

// read_size's bytes alone, for callers with their own message.
std::optional<uint64_t> parse_size(const std::string& text);

}  // namespace zerod::scripting
