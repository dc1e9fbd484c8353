// The daemon's live figures as Prometheus text (exposition format 0.0.4):
// what the metrics endpoint serves and `zerod top` reads through the status
// reply. Names and meanings: docs/observability.md.
#pragma once

#include <string>

namespace zerod::server {

class Server;

std::string render_metrics(Server& server);

}  // namespace zerod::server
