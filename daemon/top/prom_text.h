// Reads Prometheus text (what the daemon's metrics endpoint serves): each
// sample line as its name, labels and value. Comments and malformed lines
// are skipped; this reads the daemon's own output, not arbitrary exporters.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace zerod::top {

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

std::vector<Sample> parse_prometheus(const std::string& text);

}  // namespace zerod::top
