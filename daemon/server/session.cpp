#include "session.h"

#include "gpu_identity.h"
#include "model_host.h"
#include "server.h"
#include "session_internal.h"
#include "status.h"
#include "sizes.h"
#include "trainer_gone_watch.h"
#include "wire.h"

#include "runtime/dtype.h"
#include "error.h"
#include "log.h"
#include "transport/errors.h"
#include "transport/process_exit.h"

#include <poll.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <span>

namespace zerod::server {

using namespace session_detail;

namespace {

// A call of the rank's, from its start to its return, as the hangup watch
// knows it (none yet: the rank has no model).
class CallInProgress {
 public:
  CallInProgress(TrainerGoneWatch* watch, const char* call) : watch_(watch) {
    if (watch_) watch_->begin_call(call);
  }
  ~CallInProgress() {
    if (watch_) watch_->end_call();
  }
  CallInProgress(const CallInProgress&) = delete;
  CallInProgress& operator=(const CallInProgress&) = delete;

 private:
  TrainerGoneWatch* watch_;
};

}  // namespace

Session::Session(Server& server, transport::Connection connection)
    : server_(server), conn_(std::move(connection)), spin_(transport::ring_spin_from_env()) {
  try {
    pid_ = conn_.peer().pid;
  } catch (...) {
    pid_ = 0;
  }
}

Session::~Session() { join(); }

void Session::start() {
  thread_ = std::thread([this] { run(); });
}

void Session::stop() {
  stopping_.store(true, std::memory_order_release);
  // Under the lock: end() may be closing the socket and unmapping the ring.
  std::lock_guard<std::mutex> lock(stop_mu_);
  conn_.shutdown();
  ring_.wake_daemon();
}

void Session::join() {
  if (thread_.joinable()) thread_.join();
}

void Session::refuse(transport::Connection& c, zd_status code, const std::string& why) {
  v1::Reply err;
  wire::set_error(&err, code, why);
  try {
    // Before the client's hello is read, so not its reply's id: the
    // client's read of its hello's reply gets this error, or the end of
    // the stream. A fresh socket's buffer takes it without waiting.
    wire::send(c, wire::kReply, 0, err, {}, 100);
  } catch (...) {
  }
  c.shutdown();
}

void Session::refuse(zd_status code, const std::string& why) {
  refuse(conn_, code, why);
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    transport::Connection closed(std::move(conn_));
  }
  ended_ = true;
  finished_.store(true);
}

void Session::require_rank(const char* what) const {
  if (!greeted_) fail(ZD_ERR_INVALID_STATE, std::string(what) + " before hello");
  if (observer_) fail(ZD_ERR_INVALID_STATE, std::string(what) + " from an observer connection");
}

void Session::run() {
  std::string why = "its connection closed (the process exited or disconnected)";
  while (serve_frame(&why)) {
    if (ring_pending_) {
      ring_pending_ = false;
      serve_ring(&why);
      break;
    }
  }
  end(why);
}

bool Session::serve_frame(std::string* why) {
  transport::Frame frame;
  // Before the hello, the connection has hello_timeout_ms in all to say it.
  int timeout_ms = transport::kWaitForever;
  if (!greeted_) {
    const auto waited =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - accepted_).count();
    timeout_ms = std::max<int>(1, server_.hello_timeout_ms() - static_cast<int>(waited));
  }
  try {
    frame = conn_.receive(wire::kMaxBody, timeout_ms);
  } catch (const transport::ProtocolError& e) {
    // A frame we cannot take: answer it, then keep serving this client if
    // the stream is still in step, else close it. Other clients never notice.
    // An oversize body is skipped unread, unless it is absurd or trickles.
    v1::Reply err;
    wire::set_error(&err, e.code(), std::string("rejected frame: ") + e.what());
    bool in_step = e.recoverable() && conn_.rejected_body_left() <= (uint64_t{64} << 20);
    try {
      if (in_step) conn_.discard_rejected_body(kDiscardTimeoutMs);
      wire::send(conn_, wire::kReply, e.header() ? e.header()->request_id : 0, err, {}, kSendTimeoutMs);
    } catch (...) {
      in_step = false;
    }
    log_warn(std::string("connection from pid ") + std::to_string(pid_) + ": " + e.what());
    if (in_step) return true;
    *why = std::string("it sent a malformed frame (") + e.what() + ")";
    return false;
  } catch (const Error& e) {
    // Only here does "peer lost" mean this client went away; from a
    // request it means another rank did, and is answered like any error.
    if (e.code() == ZD_ERR_PEER_LOST) return false;
    if (e.code() == ZD_ERR_TIMEOUT && !greeted_) {
      char secs[32];
      std::snprintf(secs, sizeof secs, "%g", server_.hello_timeout_ms() / 1000.0);
      *why = std::string("it sent no hello within ") + secs + " s of connecting";
      log_warn("connection from pid " + std::to_string(pid_) + ": " + *why + "; closing it");
      v1::Reply err;
      wire::set_error(&err, ZD_ERR_TIMEOUT, "the daemon closes a connection that " + *why);
      try {
        wire::send(conn_, wire::kReply, 0, err, {}, 1000);  // a client that reads nothing keeps us no longer
      } catch (...) {
      }
      return false;
    }
    if (conn_.receive_out_of_step()) {  // a system error mid-frame: cannot go on
      *why = std::string("its connection failed (") + e.what() + ")";
      return false;
    }
    v1::Reply err;
    wire::set_error(&err, e.code(), e.what());
    try {
      wire::send(conn_, wire::kReply, 0, err, {}, kSendTimeoutMs);
    } catch (...) {
      return false;
    }
    return true;
  }
  std::vector<int> fds;
  try {
    if (frame.header.type == wire::kCall) {
      // A model call without the ring: its record, answered as the ring would.
      v1::Reply arenas;
      const std::span<const std::byte> body = answer_call(frame, &arenas, &fds);
      if (!fds.empty()) wire::send_arenas(conn_, frame.header.request_id, arenas, fds, kSendTimeoutMs);
      wire::send_bytes(conn_, wire::kCallReply, frame.header.request_id, body, {}, kSendTimeoutMs);
      return true;
    }
    const v1::Reply reply = answer(frame, &fds);
    wire::send(conn_, wire::kReply, frame.header.request_id, reply, fds, kSendTimeoutMs);
  } catch (const std::exception& e) {
    *why = std::string("its reply could not be sent (") + e.what() + ")";
    return false;
  }
  if (close_after_reply_) {
    *why = "its hello was refused";
    return false;
  }
  return true;
}

bool Session::socket_open() const {
  if (conn_.is_shut_down()) return false;
  pollfd p{conn_.fd(), POLLRDHUP, 0};
  if (::poll(&p, 1, 0) < 0) return true;  // EINTR and the like: look again next slice
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) == 0;
}

bool Session::hung_up() {
  // Under the lock: end() closes the socket's fd under it.
  std::lock_guard<std::mutex> lock(stop_mu_);
  return !socket_open();
}

void Session::set_up_ring(int fd, uint64_t size) {
  if (ring_) fail(ZD_ERR_INVALID_STATE, "a call ring was already set up on this connection");
  transport::Ring r = transport::Ring::attach(fd, size);
  if (r.reply_slot().size() < sizeof(wire::RingReply) + 4096)
    fail(ZD_ERR_INVALID_ARGUMENT, "the call ring's reply slot of " + std::to_string(r.reply_slot().size()) +
                                      " bytes is too small");
  if (r.request_slot().size() < sizeof(wire::RingRequest))
    fail(ZD_ERR_INVALID_ARGUMENT, "the call ring's request slot is too small");
  std::lock_guard<std::mutex> lock(stop_mu_);
  ring_ = std::move(r);
  ring_pending_ = true;
}

void Session::serve_ring(std::string* why) {
  transport::RingWait w;
  w.spin = spin_;
  w.alive = [this] { return socket_open(); };
  w.abort = &stopping_;
  for (;;) {
    const transport::RingWaitEnd end = ring_.wait_request(w);
    if (end != transport::RingWaitEnd::ready) return;  // the socket hung up, or the daemon stops
    wire::RingRequest req;
    std::memcpy(&req, ring_.request_slot().data(), sizeof req);  // once: the client may write on
    if (req.kind == wire::RingKind::socket_frame) {
      // The reply is posted before the socket answer goes out, so the
      // client's next wait on the ring starts from this request.
      ring_.post_reply();
      if (!serve_frame(why)) return;
      continue;
    }
    answer_ring(req);
    ring_.post_reply();
  }
}

v1::Reply Session::answer(transport::Frame& frame, std::vector<int>* fds) {
  v1::Reply reply;
  try {
    if (frame.header.type != wire::kRequest)
      fail(ZD_ERR_INVALID_ARGUMENT, "expected a request frame (type 1) or a call (type 3), got type " +
                                        std::to_string(frame.header.type));
    v1::Request req;
    wire::parse(frame, &req, "request");
    handle(req, frame, &reply, fds);
    return reply;
  } catch (const Error& e) {
    reply.Clear();
    fds->clear();
    wire::set_error(&reply, e.code(), e.what());
  } catch (const std::exception& e) {
    reply.Clear();
    fds->clear();
    wire::set_error(&reply, ZD_ERR_INTERNAL, std::string("internal error: ") + e.what());
  }
  return reply;
}

void Session::end(const std::string& why) {
  if (ended_) return;
  ended_ = true;
  // The hangup watch goes first: a release of its in progress ends (stop()
  // returns once its thread is gone), so the pass below is the only one
  // left, and what the watch released is no longer pending there. It
  // watches the socket, closed below, and the devices, freed in leave_all.
  gone_watch_.reset();
  // The peer sees end of stream now, not when this session is reaped.
  conn_.shutdown();
  release_gpu_waits();
  leave_all(true, gone() + why);
  // What the client shared with this daemon goes now, not when the server
  // reaps this session (at the next connection, which a long-running
  // `zerod serve --jobs` may not see for hours): the staging memfd, as
  // large as the client's largest tensor and counted by no budget, the call
  // ring, the socket's fd. stop() may run meanwhile on another thread: it
  // finds the socket closed and the ring gone under the same lock.
  staging_ = transport::SharedMapping();
  std::vector<std::byte>().swap(call_reply_);
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    ring_ = transport::Ring();
    transport::Connection closed(std::move(conn_));  // closes the fd here; conn_ keeps "shut down"
  }
  if (observer_) server_.observer_left();
  if (rank_ >= 0) {
    server_.release_rank(*job_, rank_, this);
    // Not finished until then: the accept thread reaps (joins) finished
    // sessions, and must not wait out this one's wait.
    server_.lose_unless_reclaimed(job_, rank_, pid_);
  }
  finished_.store(true);
}

void Session::release_gpu_waits() {
  // Before the rank leaves its models: a model nobody keeps is freed then,
  // and its device's teardown waits for its stream. A trainer still alive
  // is waited for until it exits or its record runs (the teardown would
  // wait as long); the daemon's shutdown stops the wait. A trainer that
  // has exited is released even then: else the device's teardown
  // (~CudaDevice's cudaStreamSynchronize) would wait on its record for good.
  const std::string who = this->who();
  for (auto& [id, m] : models_) {
    try {
      const Device& d = m->model().device(rank_);
      const std::string did = transport::release_when_gone(
          pid_, -1, kTrainerExitMs,
          [this, &d] { return !stopping_.load(std::memory_order_acquire) && d.trainer_pending(); },
          [&d] { d.release_trainer(); }, [&who](const std::string& s) { log_warn(who + s); });
      if (!did.empty()) log_warn(who + did);
      if (stopping_.load(std::memory_order_acquire) && d.trainer_pending() &&
          transport::ProcessExit(pid_).wait(0)) {
        d.release_trainer();
        log_warn(who + "the daemon is stopping and its process has exited with its last record on its GPU stream "
                       "not run; the stream that waited for it no longer does");
      }
    } catch (const std::exception& e) {
      log_warn(who + "releasing its GPU stream's waits failed: " + e.what());
    }
  }
}

std::string Session::who() const {
  return "rank " + std::to_string(rank_) + " (pid " + std::to_string(pid_) + "): ";
}

std::string Session::gone() const {
  return "rank " + std::to_string(rank_) + " (pid " + std::to_string(pid_) + ") is gone: ";
}

void Session::leave_all(bool lost, const std::string& reason) {
  for (auto& [id, m] : models_) {
    m->detach(rank_, lost, reason);
    server_.forget_if_unused(m);
  }
  models_.clear();
}

void Session::hello(const v1::Hello& h, v1::Reply* reply) {
  if (greeted_) fail(ZD_ERR_INVALID_STATE, "hello sent twice on one connection");
  hello_came_ = true;
  const uint32_t major = h.abi_version() >> 16;
  if (major > ZD_ABI_VERSION_MAJOR)
    fail(ZD_ERR_VERSION, "the client speaks zerod ABI " + std::to_string(major) + ".x but this daemon " +
                             ZEROD_VERSION_STRING + " provides " + std::to_string(ZD_ABI_VERSION_MAJOR) +
                             "." + std::to_string(ZD_ABI_VERSION_MINOR) + "; upgrade the daemon");
  if (h.role() == "observer") {
    if (!server_.admit_observer()) {
      close_after_reply_ = true;
      fail(ZD_ERR_INVALID_STATE, "this daemon serves at most " + std::to_string(server_.max_observers()) +
                                     " observer connections (zerod status, zerod top) at once, and that many are "
                                     "open; close one, or try again later");
    }
    observer_ = true;
  } else if (h.role() == "rank") {
    // join() checks the rank against its job (world size, range, this node's ranks).
    auto job = server_.join(h.job_key(), h.launch_id(), h.world_size(), h.local_world_size(), h.rank(), pid_);
    std::string holder;
    if (!server_.claim_rank(*job, h.rank(), this, &holder))
      fail(ZD_ERR_INVALID_STATE, "rank " + std::to_string(h.rank()) + " is already connected (" + holder +
                                     (server_.multi_job() ? ", in " + job->label : std::string()) +
                                     "); every rank connects once");
    rank_ = h.rank();
    job_ = std::move(job);
  } else {
    fail(ZD_ERR_INVALID_ARGUMENT, "unknown role '" + h.role() + "' in hello");
  }
  greeted_ = true;
  stream_signals_ = h.stream_signal_page();
  arena_batches_ = h.arena_batches();
  v1::HelloReply* r = reply->mutable_hello();
  r->set_abi_version(ZD_ABI_VERSION);
  r->set_version(ZEROD_VERSION_STRING);
  r->set_world_size(job_ ? job_->world_size : (server_.multi_job() ? 0 : server_.world_size()));
  r->set_max_frame(wire::kMaxBody);
  r->set_ring(!observer_);
  r->set_deferred_end(!observer_);
  r->set_call_records(true);
}

std::shared_ptr<ModelHost> Session::model_of(int id) {
  auto it = models_.find(id);
  if (it == models_.end())
    fail(ZD_ERR_NOT_FOUND, "no model " + std::to_string(id) + " on this connection");
  return it->second;
}

void Session::staging(int fd, uint64_t size) {
  // Checked (a sealed memfd at least `size` bytes long, `size` within the
  // limit) before it is mapped: a file the client could shrink, or one
  // shorter than it claims, would raise SIGBUS in this daemon at the first
  // touch. The old mapping stays if the new one is refused.
  staging_ = transport::SharedMapping(fd, size, wire::kMaxStagingBytes, "the client's staging memfd");
}

std::byte* Session::staging_at(uint64_t offset, uint64_t bytes, const char* what) const {
  if (!staging_)
    fail(ZD_ERR_INVALID_ARGUMENT, std::string(what) + " refers to the staging arena, but this client has "
                                                      "not sent one (a staging request)");
  wire::check_range(offset, bytes, staging_.size(), std::string(what) + " in the client's staging arena");
  return staging_.data() + offset;
}

void Session::add_new_arenas(ModelHost& m, v1::Reply* reply, std::vector<int>* fds, bool one_frame) {
  size_t& sent = arenas_sent_[m.id()];
  const std::vector<PoolExport> arenas = m.model().device(rank_).exports();
  if (one_frame && arenas.size() > sent + transport::kMaxFdsPerFrame) refuse_arenas(arenas.size() - sent);
  for (size_t i = sent; i < arenas.size(); ++i) {
    v1::ArenaInfo* a = reply->add_new_arenas();
    a->set_id(arenas[i].id);
    a->set_size(arenas[i].size);
    a->set_device_type(arenas[i].device_type);
    a->set_device_id(arenas[i].device_id);
    fds->push_back(arenas[i].fd);
  }
  sent = arenas.size();
}

void Session::refuse_arenas(size_t fresh) const {
  // Sending some now and the rest later would not do: this call's views may
  // point into any of them. `sent` stays, so each later call says so again
  // rather than answer with views the client cannot map.
  fail(ZD_ERR_VERSION, "the rank's device pool has " + std::to_string(fresh) +
                           " arenas this client has not mapped yet, more than the " +
                           std::to_string(transport::kMaxFdsPerFrame) +
                           " fds one socket frame carries, and this client takes them in one frame only (a "
                           "libzerod older than the daemon's " ZEROD_VERSION_STRING
                           "); use the daemon's own libzerod, which takes them in several");
}

void Session::register_param(const v1::RegisterParam& r, v1::Reply* reply) {
  auto m = model_of(r.model());
  const std::string what = "parameter '" + r.name() + "'";
  // The shape is checked before it is copied, and the bytes of the initial
  // values are computed from it without overflow, before they are read.
  const std::span<const int64_t> dims(r.shape().data(), static_cast<size_t>(r.shape_size()));
  const uint64_t numel = wire::checked_numel(dims, what);
  const void* init = nullptr;
  if (r.has_init()) {
    const zd_dtype idt = r.init_dtype() ? r.init_dtype() : r.dtype();
    init = staging_at(r.staging_offset(), checked_bytes(numel, idt, what + "'s initial values"),
                      "zd_model_register_param");
  }
  std::vector<int64_t> shape(dims.begin(), dims.end());
  const zd_param_id id = m->reattaching(rank_)
                             ? m->verify_param(rank_, r.name(), r.module(), r.dtype(), shape)
                             : m->model().register_param(rank_, r.name(), r.module(), r.dtype(),
                                                         std::move(shape), init, r.init_dtype());
  reply->mutable_register_param()->set_param(id);
}

void Session::watch_for_hangup(const std::shared_ptr<ModelHost>& m, const Device& d, bool gpu) {
  // Before the reply: a call on the model is watched from the first, and
  // on a GPU a record the trainer makes on the signals' page the reply
  // sends is one the watch can release.
  try {
    if (!gone_watch_)
      gone_watch_ = std::make_unique<TrainerGoneWatch>(conn_.fd(), pid_, who(), kTrainerExitMs, [this] {
        return stopping_.load(std::memory_order_acquire);  // Session::stop shut the socket: the daemon stops
      });
    // The host outlives its watch: this session holds it until after unwatch() or the watch's end.
    gone_watch_->watch_model(m->id(), [host = m.get(), rank = rank_, prefix = gone()](const std::string& call) {
      host->rank_gone(rank, prefix + "its connection closed during " + call);
    });
    if (gpu) gone_watch_->watch(m->id(), d);
  } catch (...) {
    if (gone_watch_) gone_watch_->unwatch(m->id());
    m->detach(rank_, false, "rank " + std::to_string(rank_) + "'s connection could not be watched");
    server_.forget_if_unused(m);
    throw;
  }
}

calls::Outcome Session::run_call(ModelHost& host, const calls::Args& a, void* data) {
  const CallInProgress watched(gone_watch_.get(), calls::name(a.op));
  if (a.op == calls::Op::finalize && host.reattaching(rank_)) {
    // Resumes the kept state once every rank has re-attached. The wait ends
    // early if this rank's connection closes or the daemon stops.
    host.finish_reattach(rank_, [this]() -> std::string {
      if (stopping_.load(std::memory_order_acquire)) return "the daemon is stopping";
      if (!socket_open()) return "rank " + std::to_string(rank_) + "'s connection closed while it waited";
      return {};
    });
    calls::Outcome o;
    o.loss_scale = host.model().loss_scale(rank_);
    return o;
  }
  return calls::dispatch(host.model(), rank_, a, data);
}

void Session::handle(const v1::Request& req, transport::Frame& frame, v1::Reply* reply,
                     std::vector<int>* fds) {
  switch (req.body_case()) {
    case v1::Request::kHello:
      hello(req.hello(), reply);
      return;
    case v1::Request::kStatus:
      if (!greeted_) fail(ZD_ERR_INVALID_STATE, "status before hello");
      fill_status(server_, reply->mutable_status());
      return;
    default:
      break;
  }
  require_rank("a model request");
  switch (req.body_case()) {
    case v1::Request::kStaging: {
      if (frame.fds.size() != 1)
        fail(ZD_ERR_INVALID_ARGUMENT, "a staging request carries one fd, got " +
                                          std::to_string(frame.fds.size()));
      staging(frame.fds[0].get(), req.staging().size());
      reply->mutable_ok();
      return;
    }
    case v1::Request::kCreateModel: {
      const auto& c = req.create_model();
      auto m = server_.create_or_attach(job_, rank_, c.script_text(), c.script_name(), c.allow_io(), c.device(),
                                          c.script_dir());
      const Device& d = m->model().device(rank_);
      if (const std::string why = gpu_mismatch(rank_, c.gpu_uuid(), d.gpu_uuid(), d.ordinal()); !why.empty()) {
        m->detach(rank_, false, "rank " + std::to_string(rank_) + " computes on another GPU");
        server_.forget_if_unused(m);
        fail(ZD_ERR_CONFIG, why);
      }
      const StreamLink link = d.stream_link();
      if (link.page_fd >= 0 && !stream_signals_) {
        m->detach(rank_, false, "rank " + std::to_string(rank_) + "'s libzerod is too old for a GPU");
        server_.forget_if_unused(m);
        fail(ZD_ERR_VERSION, "rank " + std::to_string(rank_) + ": this daemon (" ZEROD_VERSION_STRING
                                 ") serves the rank on a GPU, whose stream it orders against the trainer's "
                                 "through a page of stream signals, which this libzerod predates (it used "
                                 "interprocess events, then for a few hours of 2026-11-27 signals in GPU "
                                 "memory); run the libzerod of the daemon's release");
      }
      watch_for_hangup(m, d, link.page_fd >= 0);
      models_[m->id()] = m;
      v1::CreateModelReply* r = reply->mutable_create_model();
      r->set_model(m->id());
      // Where this rank computes, and (a GPU) how its stream is ordered
      // against the daemon's.
      r->set_device_type(d.dlpack_type());
      r->set_device_id(d.ordinal());
      if (link.page_fd >= 0) {
        r->set_signal_page(true);
        fds->push_back(link.page_fd);
      }
      return;
    }
    case v1::Request::kDestroyModel: {
      auto m = model_of(req.destroy_model().model());
      // Across nodes the end-of-job snapshot needs every rank's comm: it is
      // taken as the ranks leave, before this one's goes (it logs its errors;
      // the model's end, ~ModelHost, records a failure for the exit status).
      {
        const CallInProgress watched(gone_watch_.get(), "zd_model_destroy");
        static_cast<void>(m->model().final_snapshot(rank_));
      }
      if (gone_watch_) gone_watch_->unwatch(m->id());  // before its device may go with the model
      models_.erase(m->id());
      m->detach(rank_, false, "rank " + std::to_string(rank_) + " destroyed its model");
      server_.forget_if_unused(m);
      reply->mutable_ok();
      return;
    }
    case v1::Request::kRegisterParam:
      register_param(req.register_param(), reply);
      return;
    case v1::Request::kRing: {
      if (frame.fds.size() != 1)
        fail(ZD_ERR_INVALID_ARGUMENT, "a ring request carries one fd, got " + std::to_string(frame.fds.size()));
      set_up_ring(frame.fds[0].get(), req.ring().size());
      reply->mutable_ok();
      return;
    }
    // An older libzerod's protobuf model calls (session_v1_calls.cpp).
    case v1::Request::kCall: {
      auto m = model_of(req.call().model());
      v1_call(req.call(), reply);
      // Its reply is one frame, the fds attached to it.
      add_new_arenas(*m, reply, fds, /*one_frame=*/true);
      return;
    }
    case v1::Request::kParamRead: v1_data_call(calls::Op::param_read, req.param_read(), reply); return;
    case v1::Request::kParamWrite: v1_data_call(calls::Op::param_write, req.param_write(), reply); return;
    case v1::Request::kStateRead: v1_data_call(calls::Op::state_read, req.state_read(), reply); return;
    case v1::Request::kStateWrite: v1_data_call(calls::Op::state_write, req.state_write(), reply); return;
    case v1::Request::kMemory: {
      const auto& q = req.memory();
      calls::Args a;
      a.op = calls::Op::memory;
      a.rank = q.rank();
      a.tier = q.tier();
      a.kind = q.kind();
      const calls::Outcome o = run_call(*model_of(q.model()), a, nullptr);
      v1::MemoryReply* r = reply->mutable_memory();
      r->set_current(o.current);
      r->set_peak(o.peak);
      r->set_budget(o.budget);
      return;
    }
    default:
      fail(ZD_ERR_INVALID_ARGUMENT, "unknown request (field " + std::to_string(req.body_case()) + ")");
  }
}

}  // namespace zerod::server
