// A stand-in for `zerod run` in the launcher's tests: launches the ranks,
// forwards Ctrl-C, reports the first failure and exits with the ranks' code.
//
//   zerod_launch_driver [--nproc N] [--grace SECONDS] [--no-prefix]
//                       [--forward-signals] [--env NAME=VALUE]... [--die-with PID]
//                       [--watchdog] [--watchdog-dir DIR] [--watchdog-entries DIR PREFIX]
//                       -- COMMAND [ARG]...
//
// --die-with PID: PID is the test that started us; when it dies, so do we
// (and with us our ranks), so a test killed by a timeout leaves nothing.
// --watchdog: a watchdog (launcher/watchdog.h) kills what the ranks started
// if we die; --watchdog-dir and --watchdog-entries (which imply it) name
// what it removes then.
#include "error.h"
#include "launcher/launcher.h"
#include "launcher/signal_forwarder.h"
#include "launcher/watchdog.h"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: zerod_launch_driver [--nproc N] [--grace SECONDS] [--no-prefix] "
               "[--forward-signals] [--env NAME=VALUE]... [--die-with PID] [--watchdog] "
               "[--watchdog-dir DIR] [--watchdog-entries DIR PREFIX] -- COMMAND [ARG]...\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  namespace launch = zerod::launch;
  launch::LaunchOptions options;
  bool forward = false;
  bool watchdog = false;
  std::vector<std::string> watch_dirs;
  std::vector<std::pair<std::string, std::string>> watch_entries;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "--nproc" && i + 1 < argc) {
      options.nproc = std::atoi(argv[++i]);
    } else if (arg == "--grace" && i + 1 < argc) {
      options.grace_seconds = std::atof(argv[++i]);
    } else if (arg == "--no-prefix") {
      options.prefix_output = false;
    } else if (arg == "--forward-signals") {
      forward = true;
    } else if (arg == "--die-with" && i + 1 < argc) {
      const pid_t parent = static_cast<pid_t>(std::atoi(argv[++i]));
      if (prctl(PR_SET_PDEATHSIG, SIGKILL) == -1 || getppid() != parent) return 1;
    } else if (arg == "--watchdog") {
      watchdog = true;
    } else if (arg == "--watchdog-dir" && i + 1 < argc) {
      watchdog = true;
      watch_dirs.emplace_back(argv[++i]);
    } else if (arg == "--watchdog-entries" && i + 2 < argc) {
      watchdog = true;
      watch_entries.emplace_back(argv[i + 1], argv[i + 2]);
      i += 2;
    } else if (arg == "--env" && i + 1 < argc) {
      const std::string kv = argv[++i];
      const size_t eq = kv.find('=');
      if (eq == std::string::npos) return usage();
      options.env[kv.substr(0, eq)] = kv.substr(eq + 1);
    } else {
      return usage();
    }
  }
  for (; i < argc; ++i) options.argv.emplace_back(argv[i]);
  if (options.argv.empty()) return usage();

  bool reported = false;  // on_exit runs on the supervisor thread only
  options.on_exit = [&reported](const launch::RankExit& exit) {
    if (exit.ok() || reported) return;
    reported = true;
    std::fprintf(stderr, "zerod: %s; stopping the other ranks\n", exit.describe().c_str());
  };
  try {
    std::unique_ptr<launch::Watchdog> dog;
    if (watchdog) {
      dog = std::make_unique<launch::Watchdog>();
      for (const std::string& d : watch_dirs) dog->remove_directory_on_death(d);
      for (const auto& [d, prefix] : watch_entries) dog->remove_entries_on_death(d, prefix);
      options.watchdog = dog.get();
    }
    launch::Launcher launcher(std::move(options));
    std::optional<launch::SignalForwarder> forwarder;
    if (forward) {
      forwarder.emplace(launcher, [](int received, int sent) {
        if (received == sent) {
          std::fprintf(stderr, "zerod: %s; stopping the ranks (again to kill them)\n",
                       launch::signal_description(received).c_str());
        } else {
          std::fprintf(stderr, "zerod: %s again; killing the ranks\n",
                       launch::signal_description(received).c_str());
        }
      });
    }
    launcher.start();
    const launch::LaunchResult result = launcher.wait();
    return result.exit_code;
  } catch (const zerod::Error& e) {
    std::fprintf(stderr, "zerod: %s\n", e.what());
    return 1;
  }
}
