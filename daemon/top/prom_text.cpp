#include "prom_text.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

namespace zerod::top {

namespace {

// Parses {a="x",b="y"} at s[i] (i at '{'); returns the index after '}' or npos.
size_t parse_labels(const std::string& s, size_t i, std::map<std::string, std::string>* out) {
  ++i;
  while (i < s.size() && s[i] != '}') {
    const size_t eq = s.find('=', i);
    if (eq == std::string::npos || eq + 1 >= s.size() || s[eq + 1] != '"') return std::string::npos;
    const std::string key = s.substr(i, eq - i);
    std::string value;
    size_t j = eq + 2;
    for (; j < s.size() && s[j] != '"'; ++j) {
      if (s[j] == '\\' && j + 1 < s.size()) {
        ++j;
        value += s[j] == 'n' ? '\n' : s[j];
      } else {
        value += s[j];
      }
    }
    if (j >= s.size()) return std::string::npos;
    (*out)[key] = value;
    i = j + 1;
    if (i < s.size() && s[i] == ',') ++i;
  }
  return i < s.size() ? i + 1 : std::string::npos;
}

}  // namespace

std::vector<Sample> parse_prometheus(const std::string& text) {
  std::vector<Sample> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    Sample s;
    size_t i = line.find_first_of("{ ");
    if (i == std::string::npos) continue;
    s.name = line.substr(0, i);
    if (line[i] == '{') {
      i = parse_labels(line, i, &s.labels);
      if (i == std::string::npos) continue;
    }
    while (i < line.size() && line[i] == ' ') ++i;
    const std::string v = line.substr(i, line.find(' ', i) - i);
    if (v == "NaN")
      s.value = std::nan("");
    else if (v == "+Inf")
      s.value = INFINITY;
    else if (v == "-Inf")
      s.value = -INFINITY;
    else {
      char* end = nullptr;
      s.value = std::strtod(v.c_str(), &end);
      if (end == v.c_str()) continue;
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace zerod::top
