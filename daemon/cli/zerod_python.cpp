#include "zerod_python.h"

#include <cstdlib>
#include <filesystem>

#ifndef ZEROD_BINDIR_TO_LIBDIR
#error "ZEROD_BINDIR_TO_LIBDIR comes from cmake/InstallLayout.cmake (daemon/CMakeLists.txt)"
#endif

namespace zerod::cli {

std::string libzerod_in(const std::string& lib_dir) {
  std::error_code ec;
  for (const char* name : {"libzerod.so.1", "libzerod.so"}) {
    const std::filesystem::path p = std::filesystem::path(lib_dir) / name;
    if (std::filesystem::exists(p, ec)) return p.lexically_normal().string();
  }
  return "";
}

std::string libzerod_beside_this_zerod() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec || self.empty()) return "";
  return libzerod_in((self.parent_path() / ZEROD_BINDIR_TO_LIBDIR).string());
}

void point_zerod_lib_at_this_install() {
  if (const char* chosen = std::getenv("ZEROD_LIB"); chosen && *chosen) return;
  if (const std::string lib = libzerod_beside_this_zerod(); !lib.empty()) ::setenv("ZEROD_LIB", lib.c_str(), 1);
}

}  // namespace zerod::cli
