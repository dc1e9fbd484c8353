// What a subcommand says of an argument it did not take.
#pragma once

#include <initializer_list>
#include <string>

namespace zerod::cli {

// A flag that takes a value, given as the last argument, is named as
// missing its value (it would otherwise read as an unknown argument).
inline std::string unexpected_argument(const std::string& a, std::initializer_list<const char*> valued) {
  for (const char* v : valued)
    if (a == v) return a + " needs a value";
  return "unexpected argument '" + a + "'";
}

}  // namespace zerod::cli
