// What `zerod status` shows: the daemon, its models, and for every rank its
// state, step and bytes per tier.
#pragma once

#include "zerod_v1.pb.h"

#include <string>

namespace zerod::server {

class Server;

void fill_status(Server& server, v1::StatusReply* out);
// The text `zerod status` prints.
std::string format_status(const v1::StatusReply& s);

}  // namespace zerod::server
