// Reading a subcommand's arguments: a whole-number value, and what to say
// of an argument it did not take.
#pragma once

#include <cerrno>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string>

namespace zerod::cli {

// A flag that takes a value, given as the last argument, is named as
// missing its value (it would otherwise read as an unknown argument).
inline std::string unexpected_argument(const std::string& a, std::initializer_list<const char*> valued) {
  for (const char* v : valued)
    if (a == v) return a + " needs a value";
  return "unexpected argument '" + a + "'";
}

// A whole number, digits with an optional '-', nothing before or after
// them; nullopt otherwise (also for none, and for one beyond a long, which
// strtol would clamp to LONG_MAX: the caller names the value as typed).
inline std::optional<long> parse_whole(const char* v) {
  if (!v || !(*v == '-' || (*v >= '0' && *v <= '9'))) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || errno == ERANGE) return std::nullopt;
  return x;
}

}  // namespace zerod::cli
