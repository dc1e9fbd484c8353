// One path of a block tier: the checks that the directory can hold a store
// (it exists, is a directory, is writable, supports O_DIRECT) and the
// rank's store file in it.
//
// The store file has no name: O_TMPFILE where the file system has it, else
// created and unlinked at once. Either way the kernel frees its blocks when
// the fd closes, so a zerod that dies leaves nothing behind.
#ifndef ZEROD_PLUGINS_OFFLOAD_NVME_STORE_FILE_H
#define ZEROD_PLUGINS_OFFLOAD_NVME_STORE_FILE_H

#include <cstdint>
#include <string>

namespace zerod::offload {

struct StoreFile {
  std::string dir;           // the configured path, as messages name it
  int fd = -1;               // O_RDWR | O_DIRECT | O_CLOEXEC
  uint64_t dio_align = 512;  // the file system's direct-I/O alignment
  std::string fs;            // "ext4", "tmpfs", ... for messages
  bool tmpfile = true;       // false: created and unlinked (no O_TMPFILE)
};

// Checks dir and opens the rank's store file there. On failure returns
// false and *error says "nvme path <dir>: <cause>".
bool open_store_file(const std::string& dir, int32_t rank, StoreFile* out, std::string* error);

// The name of the file system holding fd ("ext4", or "fs type 0x...").
std::string fs_name(int fd);

// Bytes an unprivileged writer could still put on fd's file system.
uint64_t free_bytes(int fd);

}  // namespace zerod::offload

#endif  // ZEROD_PLUGINS_OFFLOAD_NVME_STORE_FILE_H
