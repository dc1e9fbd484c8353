#include "store_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "../common/text.h"

namespace zerod::offload {
namespace {

struct FsMagic {
  unsigned long magic;
  const char* name;
};

// statfs f_type values (linux/magic.h) of the file systems a store is
// likely to be pointed at.
constexpr FsMagic kFileSystems[] = {
    {0xEF53, "ext4"},        {0x58465342, "xfs"},      {0x9123683E, "btrfs"},   {0xF2F52010, "f2fs"},
    {0x2FC12FC1, "zfs"},     {0x01021994, "tmpfs"},    {0x858458F6, "ramfs"},   {0x6969, "nfs"},
    {0x794C7630, "overlay"}, {0x65735546, "fuse"},     {0x01021997, "9p"},      {0xFF534D42, "cifs"},
    {0x73717368, "squashfs"}, {0x4D44, "vfat"},        {0x5346544E, "ntfs"},    {0xCA451A4E, "bcachefs"},
};

std::string name_of(unsigned long magic) {
  for (const auto& fs : kFileSystems) {
    if (fs.magic == magic) return fs.name;
  }
  return format("fs type 0x%lx", magic);
}

int open_tmpfile(const std::string& dir, bool direct) {
  return ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC | (direct ? O_DIRECT : 0), 0600);
}

// For file systems without O_TMPFILE: a name no other rank or process
// uses, unlinked as soon as it is open.
int open_named(const std::string& dir, int32_t rank, bool direct) {
  static std::atomic<unsigned> counter{0};
  const std::string name = format("%s/.zerod-store-rank%d-pid%d-%u", dir.c_str(), rank, static_cast<int>(getpid()),
                                  counter.fetch_add(1));
  const int fd = ::open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC | (direct ? O_DIRECT : 0), 0600);
  if (fd >= 0) ::unlink(name.c_str());
  return fd;
}

std::string no_direct_io(const std::string& dir, int fd) {
  return format("nvme path %s: the file system does not support O_DIRECT (%s); use a path on a disk file system",
                dir.c_str(), fs_name(fd).c_str());
}

// What the file system asks of direct I/O: statx's DIO alignment where the
// kernel reports it (6.1+), else the block device's logical block size.
uint64_t direct_io_alignment(int fd) {
  struct statx sx {};
  if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN) != 0 &&
      sx.stx_dio_offset_align != 0) {
    return std::max<uint64_t>(sx.stx_dio_offset_align, sx.stx_dio_mem_align);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || major(st.st_dev) == 0) return 512;
  for (const char* rel : {"queue/logical_block_size", "../queue/logical_block_size"}) {
    const std::string path = format("/sys/dev/block/%u:%u/%s", major(st.st_dev), minor(st.st_dev), rel);
    if (FILE* f = std::fopen(path.c_str(), "r")) {
      unsigned long long v = 0;
      const bool ok = std::fscanf(f, "%llu", &v) == 1 && v >= 512;
      std::fclose(f);
      if (ok) return v;
    }
  }
  return 512;
}

// Some file systems take O_DIRECT at open and refuse it at the first I/O
// (FUSE without direct_io support, for one): one aligned write and read
// find out now, not in the middle of a step.
bool probe_direct_io(const StoreFile& f, std::string* error) {
  const size_t n = std::max<size_t>(4096, f.dio_align);
  void* buf = nullptr;
  if (posix_memalign(&buf, n, n) != 0) {
    *error = format("nvme path %s: out of memory for the O_DIRECT probe", f.dir.c_str());
    return false;
  }
  std::memset(buf, 0x5a, n);
  const ssize_t w = ::pwrite(f.fd, buf, n, 0);
  const int we = errno;
  const ssize_t r = w == static_cast<ssize_t>(n) ? ::pread(f.fd, buf, n, 0) : 0;
  const int re = errno;
  std::free(buf);
  const bool write_failed = w != static_cast<ssize_t>(n);
  const ssize_t got = write_failed ? w : r;
  if (write_failed || r != static_cast<ssize_t>(n)) {
    const char* op = write_failed ? "write" : "read";
    if (got < 0 && (write_failed ? we : re) == EINVAL) {
      *error = no_direct_io(f.dir, f.fd);
    } else if (got < 0) {
      *error = format("nvme path %s: a %zu-byte O_DIRECT %s failed: %s", f.dir.c_str(), n, op,
                      std::strerror(write_failed ? we : re));
    } else {
      *error = format("nvme path %s: a %zu-byte O_DIRECT %s moved %zd bytes", f.dir.c_str(), n, op, got);
    }
    return false;
  }
  if (::ftruncate(f.fd, 0) != 0) {
    *error = format("nvme path %s: cannot truncate the store file: %s", f.dir.c_str(), std::strerror(errno));
    return false;
  }
  return true;
}

}  // namespace

std::string fs_name(int fd) {
  struct statfs sf {};
  if (fstatfs(fd, &sf) != 0) return "unknown file system";
  return name_of(static_cast<unsigned long>(sf.f_type));
}

uint64_t free_bytes(int fd) {
  struct statvfs sv {};
  if (fstatvfs(fd, &sv) != 0) return 0;
  return static_cast<uint64_t>(sv.f_bavail) * sv.f_frsize;
}

bool open_store_file(const std::string& dir, int32_t rank, StoreFile* out, std::string* error) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    const int e = errno;
    *error = e == ENOENT ? format("nvme path %s: does not exist", dir.c_str())
                         : format("nvme path %s: cannot stat: %s", dir.c_str(), std::strerror(e));
    return false;
  }
  if (!S_ISDIR(st.st_mode)) {
    *error = format("nvme path %s: is not a directory", dir.c_str());
    return false;
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    *error = format("nvme path %s: not writable: %s", dir.c_str(), std::strerror(errno));
    return false;
  }
  out->dir = dir;
  out->tmpfile = true;
  int fd = open_tmpfile(dir, true);
  int e = errno;
  // EISDIR: a kernel that predates O_TMPFILE sees only O_DIRECTORY.
  if (fd < 0 && (e == EOPNOTSUPP || e == EISDIR)) {
    out->tmpfile = false;
    fd = open_named(dir, rank, true);
    e = errno;
  }
  if (fd < 0 && e == EINVAL) {
    // O_DIRECT refused at open: tell that apart from other EINVALs.
    const int plain = out->tmpfile ? open_tmpfile(dir, false) : open_named(dir, rank, false);
    if (plain >= 0) {
      *error = no_direct_io(dir, plain);
      ::close(plain);
      return false;
    }
  }
  if (fd < 0) {
    *error = format("nvme path %s: cannot create the store file: %s", dir.c_str(), std::strerror(e));
    return false;
  }
  out->fd = fd;
  out->fs = fs_name(fd);
  out->dio_align = direct_io_alignment(fd);
  if (!probe_direct_io(*out, error)) {
    ::close(fd);
    out->fd = -1;
    return false;
  }
  return true;
}

}  // namespace zerod::offload
