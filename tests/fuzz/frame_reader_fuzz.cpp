// libFuzzer target: the frame reader (transport::Connection::receive and
// discard_rejected_body) on whatever bytes a peer writes.
//
// Input: byte 0 picks the receiver's body limit (bit 7: 64 bytes, else 4096)
// and how many memfds ride on the first byte (bits 0-1: 0..3); the rest is
// written to one end of a socketpair, which is then closed for writing. The
// other end reads frames until the stream ends or is out of step, as the
// daemon's session loop does: an oversize body is discarded and reading goes
// on, any other protocol error ends it.
#include "error.h"
#include "transport/connection.h"
#include "transport/errors.h"
#include "transport/shared_memory.h"

#include <sys/socket.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

using namespace zerod;

namespace {

// Well under a unix socket's send buffer, so the whole input is written
// before anything is read, without blocking.
constexpr size_t kMaxStream = 64 * 1024;

// Writes bytes with fds attached to the first byte; stops where the socket
// would block (it never should, see kMaxStream).
void write_stream(int fd, const uint8_t* data, size_t size, const std::vector<int>& fds) {
  size_t sent = 0;
  bool first = true;
  while (sent < size) {
    iovec iov{const_cast<uint8_t*>(data + sent), size - sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 3)];
    if (first && !fds.empty()) {
      std::memset(control, 0, sizeof control);
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    const ssize_t n = ::sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
    first = false;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t control = data[0];
  ++data;
  --size;
  if (size > kMaxStream) size = kMaxStream;

  // The header codec is its own inverse.
  if (size >= transport::kFrameHeaderSize) {
    std::array<std::byte, transport::kFrameHeaderSize> raw;
    std::memcpy(raw.data(), data, raw.size());
    if (transport::encode_header(transport::decode_header(raw)) != raw) std::abort();
  }

  auto [tx, rx] = transport::connection_pair();
  std::vector<transport::UniqueFd> owned;
  std::vector<int> fds;
  for (int i = 0; i < (control & 3); ++i) {
    owned.push_back(transport::create_sealed_memfd("fuzz", 4096));
    fds.push_back(owned.back().get());
  }
  write_stream(tx.fd(), data, size, fds);
  owned.clear();
  ::shutdown(tx.fd(), SHUT_WR);

  const uint32_t max_body = (control & 0x80) ? 64 : 4096;
  for (int frames = 0; frames < 1024; ++frames) {
    try {
      transport::Frame f = rx.receive(max_body, 1000);
      if (f.body.size() != f.header.length || f.body.size() > max_body) std::abort();
      (void)transport::describe(f.header);
    } catch (const transport::ProtocolError& e) {
      (void)transport::kind_name(e.kind());
      if (!e.recoverable()) break;
      try {
        rx.discard_rejected_body(1000);
      } catch (const Error&) {
        break;
      }
    } catch (const Error&) {
      break;  // the end of the stream, or a stream out of step
    }
  }
  return 0;
}
