// libFuzzer target: the daemon's request handler (server::Session::answer,
// what a session does with each frame it receives) on arbitrary requests,
// without a socket in between: a fresh server (one rank) and one session
// per input, the input's frames answered in order, then the session ends as
// if its connection dropped.
//
// Input: a stream of frames as they go on the wire (16-byte header, then
// `length` body bytes, cut short at the end of the input); at most 64. The
// header's flags, which the protocol leaves unused, choose fds for the harness to
// attach, since a fuzzer cannot send fds:
//   bits 0-1  0: none, 1: a sealed memfd, 2: an unsealed memfd, 3: a pipe
//   bits 2-3  the memfd's size: 4 KiB, 64 KiB, 1 MiB, 16 MiB (sparse)
//   bit  4    attach the fd twice
// ZEROD_FUZZ_TRACE=1 prints each reply (to see how far a seed gets).
// Every reply must be an error with a non-OK status or a success with a
// body; an "internal error" (a std::exception escaping the handler) is a bug.
#include "error.h"
#include "keep_plugins.h"
#include "server.h"
#include "session.h"
#include "transport/shared_memory.h"
#include "wire.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

using namespace zerod;

namespace {

constexpr int kMaxFrames = 64;

std::vector<transport::UniqueFd> fds_for(uint16_t flags) {
  std::vector<transport::UniqueFd> out;
  const int kind = flags & 3;
  if (kind == 0) return out;
  const uint64_t size = uint64_t{4096} << (4 * ((flags >> 2) & 3));
  transport::UniqueFd fd;
  if (kind == 1) {
    fd = transport::create_sealed_memfd("fuzz-staging", size);
  } else if (kind == 2) {
    fd = transport::UniqueFd(memfd_create("fuzz-unsealed", MFD_CLOEXEC));
    if (fd && ftruncate(fd.get(), static_cast<off_t>(size)) != 0) std::abort();
  } else {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) std::abort();
    fd = transport::UniqueFd(p[0]);
    close(p[1]);
  }
  if (flags & 16) out.emplace_back(dup(fd.get()));
  out.push_back(std::move(fd));
  return out;
}

// A fuzzed CreateModel must not ask for the Lua io library: the script
// would then write files on this machine.
void forbid_io(std::vector<std::byte>& body) {
  v1::Request req;
  if (!req.ParseFromArray(body.data(), static_cast<int>(body.size()))) return;
  if (!req.has_create_model() || !req.create_model().allow_io()) return;
  req.mutable_create_model()->set_allow_io(false);
  std::string out;
  if (!req.SerializeToString(&out)) std::abort();
  body.resize(out.size());
  std::memcpy(body.data(), out.data(), out.size());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("ZEROD_PLUGIN_PATH", ZEROD_FUZZ_PLUGIN_DIR, 1);
  setenv("ZEROD_LOG", "error", 1);
  zerod_fuzz_keep_plugins_loaded(ZEROD_FUZZ_PLUGIN_DIR);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  server::ServerOptions o;
  o.world_size = 1;
  o.reclaim_wait_ms = 0;
  server::Server srv(o);
  auto [client, server_end] = transport::connection_pair();
  auto session = std::make_unique<server::Session>(srv, std::move(server_end));

  static const bool trace = std::getenv("ZEROD_FUZZ_TRACE") != nullptr;
  size_t at = 0;
  for (int n = 0; n < kMaxFrames && size - at >= transport::kFrameHeaderSize; ++n) {
    std::array<std::byte, transport::kFrameHeaderSize> raw;
    std::memcpy(raw.data(), data + at, raw.size());
    at += raw.size();
    transport::Frame frame;
    frame.header = transport::decode_header(raw);
    const size_t length = std::min<size_t>(frame.header.length, size - at);
    if (length > wire::kMaxBody) break;  // the transport refuses it before the session sees it
    frame.header.length = static_cast<uint32_t>(length);
    frame.body.assign(reinterpret_cast<const std::byte*>(data + at),
                      reinterpret_cast<const std::byte*>(data + at + length));
    at += length;
    forbid_io(frame.body);
    frame.fds = fds_for(frame.header.flags);

    std::vector<int> reply_fds;
    if (frame.header.type == wire::kCall) {
      // A call record without the ring: its reply record, whose lengths
      // must hold, and no internal error.
      v1::Reply arenas;
      const std::span<const std::byte> body = session->answer_call(frame, &arenas, &reply_fds);
      wire::RingReply rep;
      if (body.size() < sizeof rep) std::abort();
      std::memcpy(&rep, body.data(), sizeof rep);
      if (body.size() != sizeof rep + uint64_t{rep.view_count} * sizeof(wire::RingView) + rep.message_bytes)
        std::abort();
      const std::string text(reinterpret_cast<const char*>(body.data()) + body.size() - rep.message_bytes,
                             rep.message_bytes);
      if (trace) std::fprintf(stderr, "frame %d (call): %s\n", n, rep.status ? text.c_str() : "ok");
      if (rep.status != ZD_OK && text.rfind("internal error:", 0) == 0) {
        std::fprintf(stderr, "an exception escaped the handler: %s\n", text.c_str());
        std::abort();
      }
      continue;
    }
    const v1::Reply reply = session->answer(frame, &reply_fds);
    if (trace)
      std::fprintf(stderr, "frame %d: %s\n", n,
                   reply.has_error() ? reply.error().message().c_str() : "ok");
    if (reply.has_error()) {
      if (reply.error().status() == ZD_OK) std::abort();
      if (reply.error().message().rfind("internal error:", 0) == 0) {
        std::fprintf(stderr, "an exception escaped the handler: %s\n", reply.error().message().c_str());
        std::abort();
      }
    } else if (reply.body_case() == v1::Reply::BODY_NOT_SET) {
      std::abort();
    }
  }
  session->end("the fuzz input ended");
  session.reset();
  srv.stop();
  return 0;
}
