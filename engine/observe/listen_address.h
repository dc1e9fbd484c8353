// Where the daemon serves its metrics: a TCP address ("127.0.0.1:9400",
// "[::1]:9400", "localhost:9400"; port 0 = any free port) or a unix socket
// ("unix:/run/zerod/metrics.sock", or any path starting with "/" or ".").
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace zerod::observe {

struct ListenAddress {
  bool unix_socket = false;
  std::string host;  // tcp: a name or a numeric address, without brackets
  uint16_t port = 0;
  std::string path;  // unix
};

// nullopt with *why set when the text is none of the forms above.
std::optional<ListenAddress> parse_listen_address(const std::string& text, std::string* why);

}  // namespace zerod::observe
