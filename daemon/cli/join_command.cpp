// zerod join: one node's daemon of a job whose ranks another launcher
// started on several nodes, when nobody started an Open MPI name server for
// it. The daemons of such a job join through an ompi-server
// (plugins/comm/mpi/join.h); this command makes node 0's and hands it to the
// other nodes:
//
//   node 0: starts `ompi-server --report-uri URI_FILE`, then serves its URI
//           on the rendezvous port (rendezvous.h) until every other node has
//           it (the port is free again for the job's next attempt: a
//           torchrun restart starts new daemons at once) or COMMAND ends;
//   others: fetch the URI from node 0's rendezvous (waiting for it to come
//           up, within the timeout) and write it to URI_FILE;
//   all:    run COMMAND (libzerod's: `mpirun -np 1 --ompi-server
//           file:URI_FILE zerod serve ...`), pass SIGTERM, SIGINT and SIGHUP
//           (those not ignored at its start) on to it, and end with its
//           status; node 0 then stops its server.
//
// libzerod starts it (node_daemon.cpp) when a rank of several nodes finds no
// ZEROD_OMPI_SERVER: the rendezvous is ZEROD_RENDEZVOUS, else the launcher's
// MASTER_ADDR at MASTER_PORT + 1.
#include "commands.h"
#include "daemon_options.h"
#include "launcher/detail/spawn.h"
#include "rendezvous.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace zerod::cli {
namespace {

constexpr const char* kUsage =
    "usage: zerod join --node K --nnodes N --rendezvous HOST:PORT --name NAME --uri-file PATH [--timeout S]\n"
    "                  -- COMMAND...\n"
    "  One node's part of a job of several nodes whose ranks another launcher started: node 0 starts an\n"
    "  Open MPI name server (ompi-server) and serves its URI on PORT of this host; the other nodes fetch it\n"
    "  from HOST:PORT (waiting up to S s, default 120, for node 0). Each writes the URI to PATH and runs\n"
    "  COMMAND (the node's daemon under `mpirun --ompi-server file:PATH`), passing stop signals on to it,\n"
    "  and exits with its status. NAME must be the same on every node of the job. libzerod runs this by\n"
    "  itself (docs/daemon.md, \"Several nodes\").\n";

struct Options {
  int node = -1, nodes = 0;
  Endpoint rendezvous;
  std::string name, uri_file;
  double timeout_s = 120;
  std::vector<std::string> command;
};

int usage_error(const std::string& why) {
  std::fprintf(stderr, "zerod join: %s\n%s", why.c_str(), kUsage);
  return 2;
}

bool parse_int(const char* s, int* out) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (*s == 0 || *end != 0 || v < 0 || v > 1 << 20) return false;
  *out = static_cast<int>(v);
  return true;
}

// 0: parsed; else the exit status (2: bad usage; -1: --help, exit 0).
int parse(int argc, char** argv, Options* o) {
  int i = 0;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "-h" || a == "--help") return -1;
    if (i + 1 >= argc) return usage_error(a + " needs a value");
    const char* v = argv[++i];
    std::string why;
    if (a == "--node") {
      if (!parse_int(v, &o->node)) return usage_error("--node takes a node index, not '" + std::string(v) + "'");
    } else if (a == "--nnodes") {
      if (!parse_int(v, &o->nodes) || o->nodes < 2)
        return usage_error("--nnodes takes a node count of 2 or more, not '" + std::string(v) + "'");
    } else if (a == "--rendezvous") {
      if (!parse_endpoint(v, &o->rendezvous, &why)) return usage_error("--rendezvous: " + why);
    } else if (a == "--name") {
      o->name = v;
    } else if (a == "--uri-file") {
      o->uri_file = v;
    } else if (a == "--timeout") {
      char* end = nullptr;
      o->timeout_s = std::strtod(v, &end);
      if (*end != 0 || !(o->timeout_s > 0)) return usage_error("--timeout takes seconds, not '" + std::string(v) + "'");
    } else {
      return usage_error("unknown option " + a);
    }
  }
  for (; i < argc; ++i) o->command.emplace_back(argv[i]);
  if (o->node < 0 || o->nodes == 0 || o->rendezvous.port == 0 || o->name.empty() || o->uri_file.empty())
    return usage_error("--node, --nnodes, --rendezvous, --name and --uri-file are all needed");
  if (o->node >= o->nodes) return usage_error("--node must be below --nnodes");
  if (o->name.find_first_of(" \n") != std::string::npos) return usage_error("--name must be one word");
  if (o->command.empty()) return usage_error("no command after --");
  return 0;
}

launch::detail::Spawned start(const std::vector<std::string>& argv) {
  const launch::detail::ExecPlan plan = launch::detail::make_exec_plan(argv, {}, {});
  return launch::detail::spawn_process(plan, plan.env, {0, 1, 2});
}

// A stop signal (of `stops`, which are blocked) that has arrived, taken; 0
// if none. The waits before the command starts ask it at least every 100
// ms, during a connect to node 0 too: they used to ignore SIGTERM and Ctrl-C
// for up to their whole timeout (a connect to a host that drops packets,
// about two minutes whatever --timeout said).
int take_stop(const sigset_t& stops) {
  const timespec now{0, 0};
  const int sig = ::sigtimedwait(&stops, nullptr, &now);
  return sig > 0 ? sig : 0;
}

// The first line of `path` once something has written one, or "" when
// `server` ended, `seconds` passed or a stop signal came first (*stopped).
std::string wait_for_line(const std::string& path, pid_t server, double seconds, const sigset_t& stops,
                          int* stopped) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if ((*stopped = take_stop(stops)) != 0) return "";
    std::ifstream in(path);
    std::string line;
    if (std::getline(in, line) && !line.empty() && in) return line;
    if (::waitpid(server, nullptr, WNOHANG) == server) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return "";
}

bool write_file(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  const std::string line = text + "\n";
  const bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  return ::close(fd) == 0 && ok;
}

void stop_process(pid_t pid) {
  if (pid <= 0) return;
  ::kill(pid, SIGTERM);
  for (int i = 0; i < 40; ++i) {
    if (::waitpid(pid, nullptr, WNOHANG) == pid) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

// Runs the command until it ends, passing stop signals on; its status as a
// shell gives it.
int run_command_until_done(const std::vector<std::string>& command, const sigset_t& stops) {
  const launch::detail::Spawned child = start(command);
  if (!child.error.empty()) {
    ::waitpid(child.pid, nullptr, 0);
    std::fprintf(stderr, "zerod join: %s\n", child.error.c_str());
    return 127;
  }
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(child.pid, &status, WNOHANG);
    if (r == child.pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    const timespec tick{0, 100 * 1000 * 1000};
    const int sig = ::sigtimedwait(&stops, nullptr, &tick);
    if (sig > 0) ::kill(child.pid, sig);
  }
}

}  // namespace

int join_command(int argc, char** argv) {
  Options o;
  if (const int rc = parse(argc, argv, &o); rc != 0) {
    if (rc == -1) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    return rc;
  }
  // The stop signals wait for sigtimedwait (threads started below inherit
  // the mask; the children get theirs reset by spawn_process). An ignored
  // SIGHUP or SIGINT is left out, as `zerod serve` leaves it
  // (block_stop_signals): under nohup a hangup neither stops this command
  // nor reaches its daemon.
  const sigset_t stops = block_stop_signals();

  if (o.node != 0) {
    std::string uri, why;
    int stopped = 0;
    if (!fetch_rendezvous(o.rendezvous, o.name, o.timeout_s, &uri, &why,
                          [&] { return (stopped = take_stop(stops)) != 0; })) {
      std::fprintf(stderr, "zerod join: node %d of %d: %s\n", o.node, o.nodes, why.c_str());
      return stopped ? 128 + stopped : 1;
    }
    if (!write_file(o.uri_file, uri)) {
      std::fprintf(stderr, "zerod join: cannot write %s: %s\n", o.uri_file.c_str(), std::strerror(errno));
      return 1;
    }
    std::fprintf(stderr, "zerod join: node %d of %d: node 0's name server is %s\n", o.node, o.nodes, uri.c_str());
    const int rc = run_command_until_done(o.command, stops);
    ::unlink(o.uri_file.c_str());
    return rc;
  }

  ::unlink(o.uri_file.c_str());
  const launch::detail::Spawned server =
      start({"ompi-server", "--no-daemonize", "--report-uri", o.uri_file});
  if (!server.error.empty()) {
    ::waitpid(server.pid, nullptr, 0);
    std::fprintf(stderr, "zerod join: cannot start Open MPI's name server: %s (is Open MPI installed?)\n",
                 server.error.c_str());
    return 1;
  }
  int stopped = 0;
  const std::string uri = wait_for_line(o.uri_file, server.pid, 30, stops, &stopped);
  if (stopped) {
    std::fprintf(stderr, "zerod join: stopped (signal %d) while Open MPI's name server started\n", stopped);
    stop_process(server.pid);
    return 128 + stopped;
  }
  if (uri.empty()) {
    std::fprintf(stderr, "zerod join: ompi-server (pid %d) wrote no URI to %s within 30 s\n",
                 static_cast<int>(server.pid), o.uri_file.c_str());
    stop_process(server.pid);
    return 1;
  }
  std::atomic<bool> stop{false}, listening{false}, failed{false};
  std::string why;
  std::thread serving([&] {
    if (!serve_rendezvous(o.rendezvous.port, o.name, uri, stop, &listening, &why, o.nodes - 1)) failed.store(true);
  });
  while (!listening.load() && !failed.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  int rc = 1;
  if (failed.load()) {
    std::fprintf(stderr, "zerod join: node 0 cannot serve the rendezvous: %s\n", why.c_str());
  } else {
    std::fprintf(stderr, "zerod join: node 0 of %d: name server %s, served on port %d\n", o.nodes, uri.c_str(),
                 o.rendezvous.port);
    rc = run_command_until_done(o.command, stops);
  }
  stop.store(true);
  serving.join();
  stop_process(server.pid);
  ::unlink(o.uri_file.c_str());
  return rc;
}

}  // namespace zerod::cli
