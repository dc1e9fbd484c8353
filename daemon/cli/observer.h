// A connection to a running daemon as an observer (not a rank): what
// `zerod status` and `zerod top` ask it through.
#pragma once

#include "transport/client.h"
#include "zerod_v1.pb.h"

#include <string>

namespace zerod::cli {

// The socket to observe: `explicit_path`, else ZEROD_ENDPOINT's (unix:PATH);
// "" when neither names one.
std::string observed_socket(const std::string& explicit_path);

class Observer {
 public:
  // Connects and says hello; throws Error.
  explicit Observer(const std::string& socket);
  v1::StatusReply status();

 private:
  v1::Reply rpc(const v1::Request& req);
  transport::Connection c_;
  uint32_t next_id_ = 1;
};

}  // namespace zerod::cli
