// Text helpers that the engine, the Lua host and the plugins would each
// otherwise write for themselves: an error into a plugin ABI `err` buffer,
// byte sizes in messages, and the edit distance behind "did you mean ...?".
// Header-only and dependency-free (kit/, ARCHITECTURE.md §13).
#ifndef ZEROD_KIT_TEXT_H
#define ZEROD_KIT_TEXT_H

#include <algorithm>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace zerod {

// printf into an ABI error buffer of err_size bytes (truncated, always
// terminated); nothing when the caller passed no buffer.
inline void set_error(char* err, size_t err_size, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
inline void set_error(char* err, size_t err_size, const char* fmt, ...) {
  if (err == nullptr || err_size == 0) return;
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(err, err_size, fmt, ap);
  va_end(ap);
}

// How format_bytes writes a size of 1 KiB and more.
enum class BytesStyle {
  two_decimals,  // "256.00 KiB", "1.50 GiB"; below 1 KiB "512 B" (the engine's tables and messages)
  shortest,      // "8 MiB", "1.5 GiB", exact when whole; below 1 KiB "512 bytes" (the tier plugins)
};

// A byte count in the largest binary unit (up to TiB) that leaves at least 1.
inline std::string format_bytes(uint64_t bytes, BytesStyle style = BytesStyle::two_decimals) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  char buf[48];
  if (bytes < 1024) {
    std::snprintf(buf, sizeof buf, style == BytesStyle::two_decimals ? "%llu B" : "%llu bytes",
                  static_cast<unsigned long long>(bytes));
    return buf;
  }
  double v = static_cast<double>(bytes) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 3) {
    v /= 1024.0;
    ++u;
  }
  if (style == BytesStyle::two_decimals) {
    std::snprintf(buf, sizeof buf, "%.2f %s", v, kUnits[u]);
  } else if (v == static_cast<double>(static_cast<uint64_t>(v))) {
    std::snprintf(buf, sizeof buf, "%.0f %s", v, kUnits[u]);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
  }
  return buf;
}

// Levenshtein distance (insertions, deletions, substitutions, each 1).
inline size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace zerod

#endif  // ZEROD_KIT_TEXT_H
