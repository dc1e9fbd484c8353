// For the fuzz targets that load plugins: opens every plugin of this build
// once, for good (RTLD_NODELETE), before the first input. The engine
// dlcloses a plugin when the last model using it goes; libFuzzer keeps the
// coverage counters of every module it has seen and clears them before each
// input, which would write into an unmapped plugin. Kept loaded, a plugin is
// never unmapped, and its coverage still counts.
#pragma once

#include <dirent.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string>

inline void zerod_fuzz_keep_plugins_loaded(const char* dir) {
  DIR* d = opendir(dir);
  if (!d) {
    std::fprintf(stderr, "fuzz: no plugin folder %s\n", dir);
    std::abort();
  }
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind("zd_", 0) != 0 || name.size() < 4 || name.substr(name.size() - 3) != ".so") continue;
    const std::string path = std::string(dir) + "/" + name;
    if (!dlopen(path.c_str(), RTLD_NOW | RTLD_NODELETE)) {
      std::fprintf(stderr, "fuzz: cannot load %s: %s\n", path.c_str(), dlerror());
      std::abort();
    }
  }
  closedir(d);
}
