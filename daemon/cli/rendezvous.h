// Handing one line of text from node 0 to the other nodes of a job over TCP,
// before any MPI exists between them: how the daemons that ranks of another
// launcher start on several nodes learn the Open MPI name server (its URI)
// that node 0 started (`zerod join`, join_command.cpp). The launcher already
// told every rank where node 0 is (MASTER_ADDR); nothing else reaches all
// nodes at that point.
//
// The exchange: the client sends "zerod-join <name>\n"; the server answers
// "ok <value>\n" when <name> is the job's, else "no <why>\n". One line each
// way, at most kMaxLine bytes, read within a few seconds: a client that
// sends garbage, too much or nothing is answered or dropped, never waited
// on, and the server goes on serving the others.
#pragma once

#include <atomic>
#include <functional>
#include <string>

namespace zerod::cli {

constexpr size_t kMaxRendezvousLine = 4096;

struct Endpoint {
  std::string host;
  int port = 0;
};

// "host:port" (a DNS name, an IPv4 address, or [IPv6]:port). false with the
// reason in *why when it is not one.
bool parse_endpoint(const std::string& text, Endpoint* out, std::string* why);

// Serves `value` under `name` on `port` (every address of this host) until
// `stop` is set (polled every 100 ms) or it has given the value `answers`
// times (0: no limit). Returns false with the reason (the port is taken,
// ...) when it cannot listen; `listening` is set once it does.
bool serve_rendezvous(int port, const std::string& name, const std::string& value, const std::atomic<bool>& stop,
                      std::atomic<bool>* listening, std::string* why, int answers = 0);

// Asks `at` for `name`'s value, connecting again every 200 ms until
// `timeout_s` (0: 120 s) has passed (node 0 may start later); a try's
// connect gets at most a second, its answer at most 5 s, both within the
// timeout. false with the reason in *why: refused by the server (its
// words), or no answer in time, or `cancelled` said to stop (it is asked
// at least every 100 ms, during a connect and a wait for the answer too).
bool fetch_rendezvous(const Endpoint& at, const std::string& name, double timeout_s, std::string* value,
                      std::string* why, const std::function<bool()>& cancelled = {});

}  // namespace zerod::cli
