#include "size.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string_view>

namespace zerod::scripting {

namespace {

struct Unit {
  std::string_view name;
  double factor;
};

constexpr Unit kUnits[] = {{"", 1},          {"B", 1},
                           {"KiB", 0x1p10},  {"MiB", 0x1p20},  {"GiB", 0x1p30},  {"TiB", 0x1p40},
                           {"KB", 1e3},      {"MB", 1e6},      {"GB", 1e9},      {"TB", 1e12}};

const Unit* find_unit(std::string_view name) {
  for (const Unit& u : kUnits)
    if (u.name == name) return &u;
  return nullptr;
}

std::string_view trim_space(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

SizeReading refused(const char* why) { return {std::nullopt, why}; }

}  // namespace

SizeReading read_size(const std::string& text) {
  const std::string_view trimmed = trim_space(text);
  if (trimmed.starts_with('-')) return refused("a size cannot be negative");
  // strtod would take "+1"; a size has no sign.
  if (trimmed.starts_with('+')) return refused("a size has no sign");
  const std::string number_and_unit(trimmed);
  const char* start = number_and_unit.c_str();
  char* end = nullptr;
  const double value = std::strtod(start, &end);
  const Unit* unit = find_unit(trim_space(end));
  if (end == start || !std::isfinite(value) || !unit)
    return refused("expected a number and a unit such as \"512MiB\", \"1.5GiB\" or \"4GB\"");
  const double exact = value * unit->factor;
  // A KiB or larger unit says the number is not a byte count, so "1.3GiB"
  // (1395864371.2 bytes) means the nearest byte; a fraction of a plain byte
  // is a mistake in the number.
  if (unit->factor == 1 && exact != std::floor(exact))
    return refused("not a whole number of bytes (only KiB, KB and larger units take a fraction)");
  const double bytes = std::round(exact);
  // "0.0001KiB" is 0.1 bytes: rounding it to 0 would turn a size the user
  // meant to be something into "nothing" without a word.
  if (bytes == 0 && exact != 0) return refused("a nonzero size below half a byte rounds to 0 bytes");
  if (bytes >= 0x1p63) return refused("a size must be below 2^63 bytes");
  return {static_cast<uint64_t>(bytes), ""};
}

std::optional<uint64_t> parse_size(const std::string& text) { return read_size(text).bytes; }

}  // namespace zerod::scripting
