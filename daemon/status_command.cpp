// `zerod status`: asks a running daemon for its models, ranks, per-rank and
// per-tier bytes and step figures, as an observer (not a rank).
#include "commands.h"

#include "error.h"
#include "status.h"
#include "transport/client.h"
#include "wire.h"

#include <zerod/zerod.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace zerod::cli {

int status_command(int argc, char** argv) {
  std::string socket;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--socket" && i + 1 < argc) {
      socket = argv[++i];
    } else if (a == "-h" || a == "--help") {
      std::printf("usage: zerod status [--socket PATH]\n"
                  "  PATH defaults to ZEROD_ENDPOINT's (unix:PATH), as `zerod run` sets it\n");
      return 0;
    } else {
      std::fprintf(stderr, "zerod status: unexpected argument '%s'\n", a.c_str());
      return 2;
    }
  }
  if (socket.empty()) {
    const char* ep = std::getenv("ZEROD_ENDPOINT");
    if (ep && std::string(ep).rfind("unix:", 0) == 0) socket = std::string(ep).substr(5);
  }
  if (socket.empty()) {
    std::fprintf(stderr, "zerod status: which daemon? give --socket PATH (zerod serve prints it)\n");
    return 2;
  }
  try {
    transport::Connection c = transport::connect_unix(socket, 5000);
    auto rpc = [&](const v1::Request& req, uint32_t id) {
      wire::send(c, wire::kRequest, id, req);
      transport::Frame f = c.receive(wire::kMaxBody, 10000);
      v1::Reply r;
      wire::parse(f, &r, "reply");
      if (r.has_error()) fail(r.error().status(), r.error().message());
      return r;
    };
    v1::Request hello;
    hello.mutable_hello()->set_abi_version(ZD_ABI_VERSION);
    hello.mutable_hello()->set_role("observer");
    rpc(hello, 1);
    v1::Request q;
    q.mutable_status();
    const v1::Reply r = rpc(q, 2);
    std::fputs(server::format_status(r.status()).c_str(), stdout);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "zerod status: %s (%s)\n", e.what(), status_name(e.code()));
    return 1;
  }
}

}  // namespace zerod::cli
