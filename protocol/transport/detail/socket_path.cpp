#include "transport/detail/socket_path.h"

#include "error.h"
#include "transport/detail/unix_address.h"
#include "transport/unique_fd.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <vector>

namespace zerod::transport::detail {

namespace {

constexpr const char* kDirTemplate = "zerod-XXXXXX";

bool usable_base(const char* dir) {
  if (dir == nullptr || dir[0] != '/') return false;
  struct stat st {};
  if (::stat(dir, &st) == -1 || !S_ISDIR(st.st_mode)) return false;
  if (::access(dir, W_OK | X_OK) == -1) return false;
  // dir + "/zerod-XXXXXX/zerod.sock" must fit sun_path.
  const std::size_t full = std::string(dir).size() + 1 + std::string(kDirTemplate).size() + 1 +
                           std::string(kPrivateSocketName).size();
  return full <= kMaxSocketPath;
}

}  // namespace

std::string make_private_directory() {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  const std::string base = usable_base(xdg) ? std::string(xdg) : std::string("/tmp");
  std::string tmpl = base + "/" + kDirTemplate;
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  ZD_CHECK_SYS(::mkdtemp(buf.data()) == nullptr ? -1 : 0,
               "creating a private directory for the zerod socket under " + base);
  const std::string dir(buf.data());
  // mkdtemp asks for 0700 but the umask may take bits away; this directory
  // is what keeps other users off the socket, so its mode is set exactly.
  if (::chmod(dir.c_str(), 0700) == -1) {
    const int err = errno;
    ::rmdir(dir.c_str());
    fail(ZD_ERR_IO, "setting mode 0700 on " + dir + ": " + errno_text(err));
  }
  return dir;
}

bool socket_is_live(const std::string& path) {
  const UnixAddress addr = unix_address(path, "checking whether a zerod serves " + path);
  UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  ZD_CHECK_SYS(probe.get(), "creating a socket to probe " + path);
  if (::connect(probe.get(), addr.get(), addr.length) == 0) return true;
  const int err = errno;
  // EAGAIN: its accept queue is full, so it is very much alive.
  if (err == EAGAIN || err == EINPROGRESS) return true;
  if (err == ECONNREFUSED || err == ENOENT) return false;
  fail(ZD_ERR_IO, "cannot tell whether a zerod serves " + path + ": " + errno_text(err));
}

void prepare_socket_path(const std::string& path) {
  const std::string purpose = "cannot create the zerod socket " + path;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  struct stat st {};
  if (::stat(parent.c_str(), &st) == -1) {
    const int err = errno;
    fail(ZD_ERR_IO, purpose + ": its directory " + parent.string() + ": " + errno_text(err));
  }
  if (!S_ISDIR(st.st_mode))
    fail(ZD_ERR_IO, purpose + ": " + parent.string() + " is not a directory");

  if (::lstat(path.c_str(), &st) == -1) {
    if (errno == ENOENT) return;
    const int err = errno;
    fail(ZD_ERR_IO, purpose + ": " + errno_text(err));
  }
  if (!S_ISSOCK(st.st_mode)) {
    fail(ZD_ERR_IO, purpose + ": the path exists and is not a socket; refusing to replace it");
  }
  if (socket_is_live(path)) {
    fail(ZD_ERR_IO, purpose + ": another zerod is serving " + path);
  }
  // Left by a daemon that died without cleaning up: nobody is listening.
  if (::unlink(path.c_str()) == -1 && errno != ENOENT) {
    const int err = errno;
    fail(ZD_ERR_IO, purpose + ": removing the stale socket: " + errno_text(err));
  }
}

}  // namespace zerod::transport::detail
