// Who may read what zerod writes. A snapshot path is the engine's own
// working state (one user's weights and optimizer state, and the lock that
// guards the path), so what zerod makes there is its owner's alone: folders
// 0700, files 0600, whatever the umask. A checkpoint the user asks for
// (zd_model_save, zerod ckpt) is the user's to share, into a directory the
// user chose, and follows the umask (docs/checkpoints.md says why).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <system_error>

namespace zerod::ckpt {

enum class FileAccess {
  Umask,      // files 0644, folders 0777, less the umask
  OwnerOnly,  // files 0600, folders 0700
};

// Opens `path` for writing, created (flags: O_WRONLY or O_RDWR, and any of
// O_TRUNC, O_EXCL, O_NOFOLLOW), close-on-exec. An OwnerOnly file that was
// there already is made 0600 too (O_CREAT's mode is only a new file's): one
// written by an older zerod, or left by a crash, would keep its 0644.
inline int open_to_write(const std::string& path, int flags, FileAccess access) {
  const bool owner_only = access == FileAccess::OwnerOnly;
  const int fd = ::open(path.c_str(), flags | O_CREAT | O_CLOEXEC, owner_only ? 0600 : 0644);
  if (fd >= 0 && owner_only) {
    struct stat st {};
    // Root may open another user's file: that one is left as its owner made it.
    if (::fstat(fd, &st) == 0 && st.st_uid == ::geteuid() && (st.st_mode & 07777) != 0600)
      static_cast<void>(::fchmod(fd, 0600));  // best effort: the file is written all the same
  }
  return fd;
}

// Creates `dir` and the folders above it that are missing. OwnerOnly makes
// `dir` itself 0700, as `mkdir -p -m 0700` does: the folders above it follow
// the umask (they may hold other things than snapshots), and a `dir` that
// is there already is left as it is (a folder the user made, and chose who
// sees). Sets `ec` where it cannot be made.
inline void create_dirs(const std::string& dir, FileAccess access, std::error_code& ec) {
  namespace fs = std::filesystem;
  ec.clear();
  if (access == FileAccess::Umask) {
    fs::create_directories(dir, ec);
    return;
  }
  fs::path p(dir);
  if (!p.has_filename()) p = p.parent_path();  // "snaps/"
  if (p.has_parent_path()) {
    fs::create_directories(p.parent_path(), ec);
    if (ec) return;
  }
  if (::mkdir(p.c_str(), 0700) == 0) return;
  const int err = errno;
  if (err == EEXIST && fs::is_directory(p, ec)) return;
  ec = std::error_code(err == EEXIST ? ENOTDIR : err, std::generic_category());
}

}  // namespace zerod::ckpt
