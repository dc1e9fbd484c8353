// Internal: the sendmsg/recvmsg loops under Connection. They report how far
// they got rather than throwing, so that Connection can tell a clean end of
// stream from a torn frame and word the error for its peer.
//
// Every call uses MSG_DONTWAIT and waits in poll(), so the socket's own
// O_NONBLOCK flag does not matter and every wait can have a deadline.
#pragma once

#include "transport/detail/deadline.h"
#include "transport/unique_fd.h"

#include <cstddef>
#include <span>
#include <vector>

namespace zerod::transport::detail {

enum class IoEnd {
  complete,  // every byte moved
  eof,       // the peer closed (receive) before all bytes arrived
  timeout,   // the deadline passed
  error,     // a system error; IoResult::err holds errno
};

struct IoResult {
  std::size_t bytes = 0;  // moved before the end
  IoEnd end = IoEnd::complete;
  int err = 0;
};

// Sends head then body, with `fds` attached to the first byte of head.
IoResult send_all(int fd, std::span<const std::byte> head, std::span<const std::byte> body,
                  std::span<const int> fds, const Deadline& deadline);

// Fills `buffer` exactly. Any fds that arrive with these bytes are appended
// to `fds` (close-on-exec); `fds_truncated` is set if the kernel dropped some
// (MSG_CTRUNC). An empty buffer is complete at once.
IoResult receive_exact(int fd, std::span<std::byte> buffer, const Deadline& deadline,
                       std::vector<UniqueFd>& fds, bool& fds_truncated);

}  // namespace zerod::transport::detail
