#include "observer.h"

#include "error.h"
#include "wire.h"

#include <zerod/zerod.h>

#include <cstdlib>

namespace zerod::cli {

std::string observed_socket(const std::string& explicit_path) {
  if (!explicit_path.empty()) return explicit_path;
  const char* ep = std::getenv("ZEROD_ENDPOINT");
  if (ep && std::string(ep).rfind("unix:", 0) == 0) return std::string(ep).substr(5);
  return "";
}

Observer::Observer(const std::string& socket) : c_(transport::connect_unix(socket, 5000)) {
  v1::Request hello;
  hello.mutable_hello()->set_abi_version(ZD_ABI_VERSION);
  hello.mutable_hello()->set_role("observer");
  rpc(hello);
}

v1::Reply Observer::rpc(const v1::Request& req) {
  wire::send(c_, wire::kRequest, next_id_++, req);
  transport::Frame f = c_.receive(wire::kMaxBody, 10000);
  v1::Reply r;
  wire::parse(f, &r, "reply");
  if (r.has_error()) fail(r.error().status(), r.error().message());
  return r;
}

v1::StatusReply Observer::status() {
  v1::Request q;
  q.mutable_status();
  return rpc(q).status();
}

}  // namespace zerod::cli
