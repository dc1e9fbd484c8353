// Serves the daemon's metrics over HTTP on a TCP port or a unix socket,
// for Prometheus (or curl): GET /metrics answers the Prometheus text, GET /
// a line saying where they are. One request per connection, served in
// turn on a thread of its own; a client whose request has not arrived 5
// seconds after it connected (silent, or trickling bytes), or that does not
// read the answer within 5 more, is dropped, so one stuck scraper cannot
// hold the endpoint or the daemon's exit.
#pragma once

#include "observe/listen_address.h"

#include <functional>
#include <string>
#include <thread>

namespace zerod::server {

class MetricsServer {
 public:
  // Binds and starts serving; throws Error (ZD_ERR_CONFIG for an address it
  // cannot parse, ZD_ERR_IO when it cannot listen) naming the address.
  MetricsServer(const std::string& listen, std::function<std::string()> render);
  ~MetricsServer();  // stops and joins; removes a unix socket it made
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // "http://127.0.0.1:9400/metrics", or "unix:/path (GET /metrics)".
  const std::string& where() const { return where_; }

 private:
  void loop();
  void serve(int fd);

  std::function<std::string()> render_;
  observe::ListenAddress addr_;
  std::string where_;
  int listen_fd_ = -1;
  int stop_[2] = {-1, -1};
  std::thread thread_;
};

}  // namespace zerod::server
