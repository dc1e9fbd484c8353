// Helpers for the nvme tier tests: scratch directories, mounts, finding the
// plugin's unnamed store files through /proc/self/fd, byte patterns.
#ifndef ZEROD_TESTS_OFFLOAD_NVME_UTIL_H
#define ZEROD_TESTS_OFFLOAD_NVME_UTIL_H

#include <dirent.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "tier_plugin.h"

namespace zerod::offload::test {

// A directory under $TMPDIR (or /tmp), removed with what is left in it.
class ScratchDir {
 public:
  ScratchDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/zerod-nvme-XXXXXX";
    if (mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~ScratchDir() {
    if (path_.empty()) return;
    if (DIR* d = opendir(path_.c_str())) {
      while (dirent* e = readdir(d)) {
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
          unlink((path_ + "/" + e->d_name).c_str());
        }
      }
      closedir(d);
    }
    rmdir(path_.c_str());
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }
  const char* c_str() const { return path_.c_str(); }

 private:
  std::string path_;
};

// A file system mounted on a scratch directory for one test, unmounted
// (and the directory removed) however the test ends.
class ScratchMount {
 public:
  ScratchMount(const char* type, const char* options) {
    if (dir_.path().empty()) {
      error_ = "mkdtemp failed";
      return;
    }
    if (mount(type, dir_.c_str(), type, 0, options) != 0) {
      errno_ = errno;
      error_ = std::string("mount -t ") + type + " -o " + options + ": " + std::strerror(errno_);
      return;
    }
    mounted_ = true;
  }
  ~ScratchMount() {
    if (mounted_) umount2(dir_.c_str(), MNT_DETACH);
  }
  ScratchMount(const ScratchMount&) = delete;
  ScratchMount& operator=(const ScratchMount&) = delete;

  bool mounted() const { return mounted_; }
  bool not_permitted() const { return errno_ == EPERM || errno_ == EACCES; }
  const std::string& error() const { return error_; }
  const std::string& path() const { return dir_.path(); }
  const char* c_str() const { return dir_.c_str(); }

 private:
  ScratchDir dir_;  // outlives the mount: removed after umount
  bool mounted_ = false;
  int errno_ = 0;
  std::string error_;
};

// Mounts or skips the test (no privilege) or fails it (anything else).
#define ZD_SCRATCH_MOUNT(var, type, options)                                                              \
  ScratchMount var(type, options);                                                                        \
  if (!var.mounted() && var.not_permitted())                                                              \
    GTEST_SKIP() << "needs CAP_SYS_ADMIN to mount a " type " (mount(2) failed with EPERM: " << var.error() \
                 << "); run as root, outside a container that drops the capability";                      \
  ASSERT_TRUE(var.mounted()) << var.error()

// The fds of this process open on unnamed files in dir: the plugin's store
// files show in /proc/self/fd as "<dir>/#<inode> (deleted)" (O_TMPFILE) or
// "<dir>/.zerod-store-... (deleted)".
inline std::vector<int> store_fds(const std::string& dir) {
  std::vector<int> fds;
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return fds;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char target[4096];
    const std::string link = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t n = readlink(link.c_str(), target, sizeof target - 1);
    if (n <= 0) continue;
    target[n] = '\0';
    const std::string t = target;
    if (t.rfind(dir + "/", 0) == 0 && t.size() > 10 && t.compare(t.size() - 10, 10, " (deleted)") == 0 &&
        t.find('/', dir.size() + 1) == std::string::npos) {
      fds.push_back(std::atoi(e->d_name));
    }
  }
  closedir(d);
  return fds;
}

// Byte i of a pattern seeded by seed: different per transfer and position.
inline unsigned char pattern_byte(uint64_t seed, uint64_t i) {
  uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull + i / 8;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<unsigned char>(x >> (8 * (i % 8)));
}

inline void fill_pattern(unsigned char* p, uint64_t bytes, uint64_t seed) {
  for (uint64_t i = 0; i < bytes; ++i) p[i] = pattern_byte(seed, i);
}

// The first byte where p differs from the pattern, or bytes.
inline uint64_t check_pattern(const unsigned char* p, uint64_t bytes, uint64_t seed) {
  for (uint64_t i = 0; i < bytes; ++i) {
    if (p[i] != pattern_byte(seed, i)) return i;
  }
  return bytes;
}

}  // namespace zerod::offload::test

#endif  // ZEROD_TESTS_OFFLOAD_NVME_UTIL_H
