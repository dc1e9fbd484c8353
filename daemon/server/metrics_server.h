// Serves the daemon's metrics over HTTP on a TCP port or a unix socket,
// for Prometheus (or curl): GET /metrics answers the Prometheus text, GET /
// a line saying where they are. One request per connection. A client whose
// request has not arrived 5 seconds after it connected (silent, or
// trickling bytes), or that does not read the answer within 5 more, is
// dropped, and the daemon's exit waits for neither.
//
// One thread serves every connection at once: it polls the listening socket
// and each connection (non-blocking, each with its own request buffer,
// answer progress and deadline), so silent clients do not hold a scrape
// behind them. Not a thread per connection (unbounded) nor a pool (a pool
// of N is held by N silent clients as one thread was by one). At most
// kMaxConnections are open; each connection past them drops the oldest one
// whose request has not arrived whole (the oldest of all when every one is
// being answered). A scrape sends its request at once, so a flood of idle
// connections costs the oldest idle one its place, not the fresh scrape;
// refusing new connections instead would let kMaxConnections silent ones,
// renewed every 5 s, keep the endpoint dark. A process out of descriptors
// pauses accepting for 20 ms rather than spinning on the waiting connection.
#pragma once

#include "observe/listen_address.h"

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace zerod::server {

class MetricsServer {
 public:
  // Binds and starts serving; throws Error (ZD_ERR_CONFIG for an address it
  // cannot parse, ZD_ERR_IO when it cannot listen) naming the address.
  MetricsServer(const std::string& listen, std::function<std::string()> render);
  ~MetricsServer();  // stops and joins; removes a unix socket it made
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Connections served at once; one more drops the oldest idle one (above).
  static constexpr size_t kMaxConnections = 64;

  // "http://127.0.0.1:9400/metrics", or "unix:/path (GET /metrics)".
  const std::string& where() const { return where_; }

 private:
  struct Connection;
  void loop();
  int poll_timeout_ms(std::chrono::steady_clock::time_point now) const;
  void accept_waiting();
  void make_room();
  void advance(Connection& c);
  std::string answer_to(const std::string& request);

  std::function<std::string()> render_;
  observe::ListenAddress addr_;
  std::string where_;
  int listen_fd_ = -1;
  int stop_[2] = {-1, -1};
  // The server thread's alone (loop() and what it calls):
  std::vector<Connection> open_;  // in the order accepted, the oldest first
  std::chrono::steady_clock::time_point accept_again_{};  // accepting paused until then
  bool warned_full_ = false;
  bool warned_out_of_descriptors_ = false;
  std::thread thread_;
};

}  // namespace zerod::server
