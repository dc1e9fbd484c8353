#include "listen_address.h"

#include <string>

namespace zerod::observe {

std::optional<ListenAddress> parse_listen_address(const std::string& text, std::string* why) {
  ListenAddress a;
  if (text.rfind("unix:", 0) == 0 || (!text.empty() && (text[0] == '/' || text[0] == '.'))) {
    a.unix_socket = true;
    a.path = text.rfind("unix:", 0) == 0 ? text.substr(5) : text;
    if (a.path.empty()) {
      *why = "a unix socket needs a path after \"unix:\"";
      return std::nullopt;
    }
    if (a.path.size() > 107) {
      *why = "the unix socket path is longer than the 107 bytes a socket address holds";
      return std::nullopt;
    }
    return a;
  }
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon + 1 == text.size()) {
    *why = "must be \"host:port\" (e.g. \"127.0.0.1:9400\") or a unix socket path (\"unix:/path\" or \"/path\")";
    return std::nullopt;
  }
  std::string host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  else if (host.find(':') != std::string::npos) {
    *why = "an IPv6 address goes in brackets: \"[::1]:9400\"";
    return std::nullopt;
  }
  if (host.empty()) {
    *why = "names no host; use \"127.0.0.1:PORT\" for this machine only, \"0.0.0.0:PORT\" for every interface";
    return std::nullopt;
  }
  // Digits only: strtol alone took " 9401", "+9401" and "-0".
  const std::string port = text.substr(colon + 1);
  long p = port.empty() ? -1 : 0;
  for (char c : port) {
    if (c < '0' || c > '9' || p > 65535) {
      p = -1;
      break;
    }
    p = p * 10 + (c - '0');
  }
  if (p < 0 || p > 65535) {
    *why = "the port must be a number from 0 to 65535 (0: any free port), got '" + port + "'";
    return std::nullopt;
  }
  a.host = host;
  a.port = static_cast<uint16_t>(p);
  return a;
}

}  // namespace zerod::observe
