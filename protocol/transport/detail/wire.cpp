#include "transport/detail/wire.h"

#include "transport/frame.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>

namespace zerod::transport::detail {

namespace {

// Room for the most fds one sendmsg can carry (SCM_MAX_FD). A recvmsg stops
// after the first segment that carries fds, so it never returns more than
// one sender's worth at a time.
constexpr std::size_t kControlBytes = CMSG_SPACE(sizeof(int) * kMaxFdsPerFrame);

union ControlBuffer {
  cmsghdr align;  // cmsg data must be aligned for cmsghdr
  char bytes[kControlBytes];
};

// Waits until fd is ready for `events`. Returns complete when it is (or has
// hung up or failed: the next send/recv reports that), timeout, or error.
IoResult wait_ready(int fd, short events, const Deadline& deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, deadline.poll_timeout());
    if (n > 0) {
      if (p.revents & POLLNVAL) return {0, IoEnd::error, EBADF};
      return {};
    }
    if (n == 0) return {0, IoEnd::timeout, 0};
    if (errno != EINTR) return {0, IoEnd::error, errno};
  }
}

// Takes ownership of every fd in the control data at once, so none can leak
// whatever happens next.
void collect_fds(msghdr& msg, std::vector<UniqueFd>& fds, bool& fds_truncated) {
  if (msg.msg_flags & MSG_CTRUNC) fds_truncated = true;
  if (msg.msg_controllen == 0) return;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const unsigned char* data = CMSG_DATA(c);
    for (std::size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, data + i * sizeof(int), sizeof(int));  // CMSG_DATA may be unaligned for int
      fds.emplace_back(fd);
    }
  }
}

}  // namespace

IoResult send_all(int fd, std::span<const std::byte> head, std::span<const std::byte> body,
                  std::span<const int> fds, const Deadline& deadline) {
  const std::size_t total = head.size() + body.size();
  std::size_t sent = 0;
  ControlBuffer control;
  while (sent < total) {
    iovec iov[2];
    int iov_count = 0;
    if (sent < head.size()) {
      iov[iov_count++] = {const_cast<std::byte*>(head.data() + sent), head.size() - sent};
      if (!body.empty()) iov[iov_count++] = {const_cast<std::byte*>(body.data()), body.size()};
    } else {
      const std::size_t off = sent - head.size();
      iov[iov_count++] = {const_cast<std::byte*>(body.data() + off), body.size() - off};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<std::size_t>(iov_count);
    // The fds ride on the first byte: once any byte has gone, they have too.
    if (sent == 0 && !fds.empty()) {
      std::memset(&control, 0, sizeof control);
      msg.msg_control = control.bytes;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    // MSG_NOSIGNAL: a vanished peer is an EPIPE error, not a SIGPIPE that
    // kills the daemon.
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0 || errno == EAGAIN || errno == EWOULDBLOCK) {
      IoResult w = wait_ready(fd, POLLOUT, deadline);
      if (w.end != IoEnd::complete) return {sent, w.end, w.err};
      continue;
    }
    if (errno == EINTR) continue;
    return {sent, IoEnd::error, errno};
  }
  return {sent, IoEnd::complete, 0};
}

IoResult receive_exact(int fd, std::span<std::byte> buffer, const Deadline& deadline,
                       std::vector<UniqueFd>& fds, bool& fds_truncated) {
  std::size_t got = 0;
  ControlBuffer control;
  while (got < buffer.size()) {
    iovec iov{buffer.data() + got, buffer.size() - got};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.bytes;
    msg.msg_controllen = sizeof control.bytes;
    // MSG_CMSG_CLOEXEC: received fds must not leak into a process the
    // daemon spawns, not even for the instant before we could set the flag.
    const ssize_t n = ::recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n >= 0) collect_fds(msg, fds, fds_truncated);
    if (n > 0) {
      got += static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) return {got, IoEnd::eof, 0};
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      IoResult w = wait_ready(fd, POLLIN, deadline);
      if (w.end != IoEnd::complete) return {got, w.end, w.err};
      continue;
    }
    if (errno == EINTR) continue;
    return {got, IoEnd::error, errno};
  }
  return {got, IoEnd::complete, 0};
}

}  // namespace zerod::transport::detail
