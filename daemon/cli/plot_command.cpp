// `zerod plot trace.json [--out DIR]`: the PNGs of a trace (memory per tier
// over time, each step's time by what it waited on, the loss) drawn by the
// zerod.plot Python module with matplotlib. This command finds that module
// (this checkout's bindings, else the installed package) and runs it.
#include "commands.h"
#include "zerod_python.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace zerod::cli {

namespace {

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

int plot_command(int argc, char** argv) {
#ifdef ZEROD_SOURCE_PYTHON_DIR
  const std::string source = ZEROD_SOURCE_PYTHON_DIR;
  if (exists(source + "/zerod/plot.py")) {
    const char* old = std::getenv("PYTHONPATH");
    const std::string path = source + (old && *old ? ":" + std::string(old) : "");
    ::setenv("PYTHONPATH", path.c_str(), 1);
  }
#endif
  // `import zerod` loads libzerod: the one beside this zerod.
  point_zerod_lib_at_this_install();
  // Debian's Python is the one scripts/common.sh gives numpy and matplotlib;
  // ZEROD_PYTHON chooses another.
  const char* py = std::getenv("ZEROD_PYTHON");
  const std::string python = py && *py ? py : exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  std::vector<char*> args;
  args.push_back(const_cast<char*>(python.c_str()));
  args.push_back(const_cast<char*>("-m"));
  args.push_back(const_cast<char*>("zerod.plot"));
  for (int i = 0; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execvp(python.c_str(), args.data());
  std::fprintf(stderr, "zerod plot: cannot run %s: %s (set ZEROD_PYTHON to a Python 3 with matplotlib)\n",
               python.c_str(), std::strerror(errno));
  return 1;
}

}  // namespace zerod::cli
