#include "size.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

namespace zerod::scripting {

std::optional<uint64_t> parse_size(const std::string& text) {
  const char* s = text.c_str();
  while (std::isspace(static_cast<unsigned char>(*s))) ++s;
  if (*s == '-' || *s == '+') return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(s, &end);
  if (end == s || !std::isfinite(value) || value < 0) return std::nullopt;
  while (std::isspace(static_cast<unsigned char>(*end))) ++end;
  std::string unit(end);
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.back()))) unit.pop_back();
  struct Unit {
    const char* name;
    double factor;
  };
  static const Unit units[] = {{"", 1},          {"B", 1},
                               {"KiB", 0x1p10},  {"MiB", 0x1p20},  {"GiB", 0x1p30},  {"TiB", 0x1p40},
                               {"KB", 1e3},      {"MB", 1e6},      {"GB", 1e9},      {"TB", 1e12}};
  for (const Unit& u : units) {
    if (unit != u.name) continue;
    const double bytes = value * u.factor;
    if (bytes >= 0x1p63 || bytes != std::floor(bytes)) return std::nullopt;
    return static_cast<uint64_t>(bytes);
  }
  return std::nullopt;
}

}  // namespace zerod::scripting
