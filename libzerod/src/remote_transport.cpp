// The daemon client's carriers (remote_client.h): requests as socket
// frames, table calls as call records through the call ring or socket
// frames, the deferred zd_forward_end, arena frames a reply record
// announces, and the staging memfd.
#include "remote_client.h"

#include "error.h"
#include "sizes.h"

#include <poll.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <string>

namespace zerod::abi::remote {

namespace {

// What a set-up request is, in the words of the call that sent it.
const char* request_name(const v1::Request& req) {
  switch (req.body_case()) {
    case v1::Request::kHello: return "zd_connect (its hello)";
    case v1::Request::kRing: return "zd_connect (its call ring)";
    case v1::Request::kCreateModel: return "zd_model_create";
    case v1::Request::kRegisterParam: return "zd_model_register_param";
    case v1::Request::kDestroyModel: return "zd_model_destroy";
    case v1::Request::kStaging: return "the staging memfd's resize";
    default: return "a request";
  }
}

}  // namespace

v1::Reply RemoteClient::rpc(const v1::Request& req, std::vector<transport::UniqueFd>* fds,
                            std::span<const int> send_fds, bool flush) {
  if (ring_ && flush) flush_deferred();
  check_in_step();
  in_flight_ = request_name(req);
  const uint32_t id = next_id_++;
  transport::Frame f;
  try {
    if (ring_) {
      wire::RingRequest announce{};
      announce.kind = wire::RingKind::socket_frame;
      std::memcpy(ring_.request_slot().data(), &announce, sizeof announce);
      ring_.post_request();
      wait_ring();  // the daemon posts before it reads the frame
    }
    wire::send(conn_, wire::kRequest, id, req, send_fds);
    f = receive();
    if (f.header.type != wire::kReply || f.header.request_id != id)
      fail(ZD_ERR_INTERNAL, "the daemon answered request " + std::to_string(id) + " with " +
                                transport::describe(f.header));
  } catch (const Error& e) {
    fall_out_of_step(e);
  }
  v1::Reply r;
  wire::parse(f, &r, "reply");
  if (r.has_error()) fail(r.error().status(), r.error().message());
  if (fds) *fds = std::move(f.fds);
  return r;
}

void RemoteClient::check_in_step() const {
  if (out_of_step_) throw *out_of_step_;
}

void RemoteClient::fall_out_of_step(const Error& e) {
  const std::string what = in_flight_.empty() ? std::string("a call") : in_flight_;
  std::string cause = e.what();
  if (e.code() == ZD_ERR_PEER_LOST && cause.rfind("the zerod daemon is gone", 0) != 0)
    cause = "the zerod daemon is gone: " + cause;
  // A status that says who is at fault, as the first failure said it: a
  // trainer that handles ZD_ERR_TIMEOUT by restarting does so for each
  // later call too, and none of them can succeed.
  out_of_step_.emplace(e.code(), "this connection to the zerod daemon is out of step and takes no more calls: " + what +
                                     " failed (" + cause + "), and the daemon may still be running it, so its "
                                     "answer would be taken for a later call's; destroy the models, zd_disconnect "
                                     "and connect again");
  if (e.code() == ZD_ERR_PEER_LOST) fail(ZD_ERR_PEER_LOST, cause);
  fail(e.code(), cause + "; the daemon may still be running " + what +
                     ", so this connection takes no more calls: destroy the models, zd_disconnect and connect again");
}

void RemoteClient::defer_end(int model, const calls::Args& a) {
  check_in_step();  // an end answered here must not say ZD_OK on a connection that takes no calls
  if (deferred_) {
    // Two ends in a row (nested modules): the first travels with the second, which waits.
    const wire::RingReply& r = call_record(model, a, 0);
    keep_stray_arenas(model, r);
    if (r.status != ZD_OK) fail(r.status, message_of(r));
    return;
  }
  deferred_ = Deferred{model, a};
}

void RemoteClient::flush_deferred() {
  if (!deferred_) return;
  const Deferred d = *deferred_;
  deferred_.reset();
  const wire::RingReply& r = call_record(d.model, d.args, 0);
  keep_stray_arenas(d.model, r);
  if (r.status != ZD_OK)
    fail(r.status, message_of(r) + "\n(this is the error of zd_forward_end of module " +
                       std::to_string(d.args.module) +
                       ", which the client sent before this rank's next call; that call did not run. "
                       "ZEROD_SYNC_END=1 makes zd_forward_end wait for the daemon.)");
}

void RemoteClient::flush_deferred_of(int model) {
  if (deferred_ && deferred_->model == model) flush_deferred();
}

void RemoteClient::keep_stray_arenas(int model, const wire::RingReply& r) {
  for (uint32_t i = 0; i < r.arenas_follow; ++i) stray_arenas_.emplace_back(model, arena_frame());
}

std::vector<transport::Frame> RemoteClient::take_stray_arenas(int model) {
  std::vector<transport::Frame> out;
  for (auto it = stray_arenas_.begin(); it != stray_arenas_.end();) {
    if (it->first == model) {
      out.push_back(std::move(it->second));
      it = stray_arenas_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::string RemoteClient::message_of(const wire::RingReply& r) const {
  const std::span<const std::byte> tail = reply_tail();
  const uint64_t view_bytes = uint64_t{r.view_count} * sizeof(wire::RingView);
  if (view_bytes > tail.size() || r.message_bytes > tail.size() - view_bytes)
    fail(ZD_ERR_INTERNAL, "the daemon's reply record overruns its reply");
  return std::string(reinterpret_cast<const char*>(tail.data() + view_bytes), r.message_bytes);
}

const wire::RingReply& RemoteClient::call_record(int model, const calls::Args& a, uint64_t staging_offset) {
  if (deferred_ && deferred_->model != model) flush_deferred();
  check_in_step();
  in_flight_ = calls::name(a.op);
  wire::RingRequest req{};
  req.kind = wire::RingKind::call;
  req.model = model;
  req.staging_offset = staging_offset;
  req.args = a;
  if (deferred_) {
    req.has_deferred = 1;
    req.deferred = deferred_->args;
    deferred_.reset();
  }
  if (ring_) {
    std::memcpy(ring_.request_slot().data(), &req, sizeof req);
    ring_.post_request();
    try {
      wait_ring();
    } catch (const Error& e) {
      fall_out_of_step(e);
    }
    std::memcpy(&reply_, ring_.reply_slot().data(), sizeof reply_);
    return reply_;
  }
  // No ring: the same record as a socket frame. New arenas come first, in
  // frames of their own, as the ring's carrier sends them.
  const uint32_t id = next_id_++;
  transport::Frame f;
  std::optional<Error> refused;
  try {
    wire::send_bytes(conn_, wire::kCall, id, std::as_bytes(std::span(&req, 1)));
    f = receive();
    while (!refused && f.header.type == wire::kReply && f.header.request_id == id) {
      // New arenas, or the daemon's refusal of the frame itself (its whole
      // answer: nothing follows it).
      v1::Reply r;
      wire::parse(f, &r, "reply");
      if (r.has_error()) {
        refused.emplace(static_cast<zd_status>(r.error().status()), r.error().message());
      } else {
        socket_arenas_.push_back(std::move(f));
        f = receive();
      }
    }
    if (!refused && (f.header.type != wire::kCallReply || f.header.request_id != id || f.body.size() < sizeof reply_))
      fail(ZD_ERR_INTERNAL,
           "the daemon answered call " + std::to_string(id) + " with " + transport::describe(f.header));
    if (!refused) std::memcpy(&reply_, f.body.data(), sizeof reply_);
    if (!refused && reply_.arenas_follow != socket_arenas_.size())
      fail(ZD_ERR_INTERNAL, "the daemon's answer to call " + std::to_string(id) + " says " +
                                std::to_string(reply_.arenas_follow) + " arena frames came before it, not " +
                                std::to_string(socket_arenas_.size()));
  } catch (const Error& e) {
    socket_arenas_.clear();
    fall_out_of_step(e);
  }
  if (refused) throw *refused;
  socket_reply_.assign(f.body.begin(), f.body.end());
  return reply_;
}

std::span<const std::byte> RemoteClient::reply_tail() const {
  if (ring_) return ring_.reply_slot().subspan(sizeof(wire::RingReply));
  return std::span<const std::byte>(socket_reply_).subspan(sizeof(wire::RingReply));
}

transport::Frame RemoteClient::arena_frame() {
  if (!socket_arenas_.empty()) {
    transport::Frame f = std::move(socket_arenas_.front());
    socket_arenas_.pop_front();
    return f;
  }
  // The rest of the last call's answer: a failure here leaves it half read.
  check_in_step();
  try {
    return receive();
  } catch (const Error& e) {
    fall_out_of_step(e);
  }
}

std::byte* RemoteClient::staging(uint64_t bytes) {
  if (bytes <= staging_.size() && staging_) return staging_.data();
  if (bytes > wire::kMaxStagingBytes)
    fail(ZD_ERR_INVALID_ARGUMENT, std::to_string(bytes) + " bytes cannot go through the daemon's staging arena, "
                                  "whose limit is " + std::to_string(wire::kMaxStagingBytes) + " bytes");
  const uint64_t size = std::max<uint64_t>(uint64_t{1} << 20, std::bit_ceil(bytes));
  const transport::UniqueFd fd = transport::create_sealed_memfd("zerod-staging", size);
  transport::SharedMapping m(fd.get(), size, wire::kMaxStagingBytes, "the staging memfd");
  v1::Request req;
  req.mutable_staging()->set_size(size);
  const int fds[1] = {fd.get()};
  rpc(req, nullptr, fds);
  staging_ = std::move(m);
  return staging_.data();
}

void RemoteClient::set_up_ring() {
  transport::UniqueFd fd;
  transport::Ring r = transport::Ring::create(kRingBytes, wire::kRingRequestBytes, &fd);
  v1::Request req;
  req.mutable_ring()->set_size(kRingBytes);
  const int fds[1] = {fd.get()};
  rpc(req, nullptr, fds);
  ring_ = std::move(r);
  wait_.spin = transport::ring_spin_from_env();
  wait_.alive = [this] { return socket_open(); };
}

bool RemoteClient::socket_open() const {
  pollfd p{conn_.fd(), POLLRDHUP, 0};
  if (::poll(&p, 1, 0) < 0) return true;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) == 0;
}

transport::HangupWatch& RemoteClient::hangup_watch() {
  if (!watch_) watch_ = std::make_unique<transport::HangupWatch>(conn_.fd());
  return *watch_;
}

pid_t RemoteClient::daemon_pid() const {
  try {
    return conn_.peer().pid;
  } catch (...) {
    return 0;
  }
}

void RemoteClient::wait_ring() {
  if (timeout_ms_)
    wait_.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
  switch (ring_.wait_reply(wait_)) {
    case transport::RingWaitEnd::ready: return;
    case transport::RingWaitEnd::timeout: timed_out();
    default:
      fail(ZD_ERR_PEER_LOST, "the zerod daemon is gone: its socket hung up while this rank waited for a reply "
                             "on the call ring");
  }
}

transport::Frame RemoteClient::receive() {
  try {
    return conn_.receive(wire::kMaxBody, timeout_ms_ ? static_cast<int>(timeout_ms_) : transport::kWaitForever);
  } catch (const Error& e) {
    // Nothing of an answer came: said as the ring's carrier says it. (A
    // frame torn by the timeout keeps the transport's account of it.)
    if (e.code() == ZD_ERR_TIMEOUT && !conn_.receive_out_of_step()) timed_out();
    throw;
  }
}

void RemoteClient::timed_out() const {
  fail(ZD_ERR_TIMEOUT, "no reply from the zerod daemon within " + std::to_string(timeout_ms_) +
                           " ms (zd_connect_options.timeout_ms)");
}

}  // namespace zerod::abi::remote
