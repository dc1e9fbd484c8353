#include "session.h"

#include "model_host.h"
#include "server.h"
#include "status.h"
#include "sizes.h"
#include "wire.h"

#include "dtype.h"
#include "error.h"
#include "log.h"
#include "transport/errors.h"

#include <span>

namespace zerod::server {

namespace {

// A client that does not read its replies, or trickles a rejected body, does
// not hold its session thread longer than this.
constexpr int kSendTimeoutMs = 30000;
constexpr int kDiscardTimeoutMs = 10000;

ViewInfo view_of(Model& m, int rank, zd_param_id p, bool gradient) {
  return gradient ? m.grad_view(rank, p) : m.param_view(rank, p);
}

}  // namespace

Session::Session(Server& server, transport::Connection connection)
    : server_(server), conn_(std::move(connection)) {
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

void Session::stop() { conn_.shutdown(); }

void Session::join() {
  if (thread_.joinable()) thread_.join();
}

void Session::require_rank(const char* what) const {
  if (!greeted_) fail(ZD_ERR_INVALID_STATE, std::string(what) + " before hello");
  if (observer_) fail(ZD_ERR_INVALID_STATE, std::string(what) + " from an observer connection");
}

void Session::run() {
  std::string why = "its connection closed (the process exited or disconnected)";
  for (;;) {
    transport::Frame frame;
    try {
      frame = conn_.receive(wire::kMaxBody);
    } catch (const transport::ProtocolError& e) {
      // A frame we cannot take: answer it, then keep serving this client if
      // the stream is still in step, else close it. Other clients never notice.
      // An oversize body is skipped unread, unless it is absurd or trickles.
      v1::Reply err;
      wire::set_error(&err, e.code(), std::string("rejected frame: ") + e.what());
      bool in_step = e.recoverable() && conn_.rejected_body_left() <= (uint64_t{64} << 20);
      try {
        if (in_step) conn_.discard_rejected_body(kDiscardTimeoutMs);
        wire::send(conn_, wire::kReply, e.header() ? e.header()->request_id : 0, err, {},
                   kSendTimeoutMs);
      } catch (...) {
        in_step = false;
      }
      log_warn(std::string("connection from pid ") + std::to_string(pid_) + ": " + e.what());
      if (in_step) continue;
      why = std::string("it sent a malformed frame (") + e.what() + ")";
      break;
    } catch (const Error& e) {
      // Only here does "peer lost" mean this client went away; from a
      // request it means another rank did, and is answered like any error.
      if (e.code() == ZD_ERR_PEER_LOST) break;
      if (conn_.receive_out_of_step()) {  // a system error mid-frame: cannot go on
        why = std::string("its connection failed (") + e.what() + ")";
        break;
      }
      v1::Reply err;
      wire::set_error(&err, e.code(), e.what());
      try {
        wire::send(conn_, wire::kReply, 0, err, {}, kSendTimeoutMs);
      } catch (...) {
        break;
      }
      continue;
    }
    std::vector<int> fds;
    const v1::Reply reply = answer(frame, &fds);
    try {
      wire::send(conn_, wire::kReply, frame.header.request_id, reply, fds, kSendTimeoutMs);
    } catch (const std::exception& e) {
      why = std::string("its reply could not be sent (") + e.what() + ")";
      break;
    }
  }
  end(why);
}

v1::Reply Session::answer(transport::Frame& frame, std::vector<int>* fds) {
  v1::Reply reply;
  try {
    if (frame.header.type != wire::kRequest)
      fail(ZD_ERR_INVALID_ARGUMENT, "expected a request frame (type 1), got type " +
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
  // The peer sees end of stream now, not when this session is reaped.
  conn_.shutdown();
  leave_all(true, "rank " + std::to_string(rank_) + " (pid " + std::to_string(pid_) + ") is gone: " + why);
  if (rank_ >= 0) server_.release_rank(rank_, this);
  finished_.store(true);
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
  const uint32_t major = h.abi_version() >> 16;
  if (major > ZD_ABI_VERSION_MAJOR)
    fail(ZD_ERR_VERSION, "the client speaks zerod ABI " + std::to_string(major) + ".x but this daemon " +
                             ZEROD_VERSION_STRING + " provides " + std::to_string(ZD_ABI_VERSION_MAJOR) +
                             "." + std::to_string(ZD_ABI_VERSION_MINOR) + "; upgrade the daemon");
  if (h.role() == "observer") {
    observer_ = true;
  } else if (h.role() == "rank") {
    if (h.world_size() != server_.world_size())
      fail(ZD_ERR_INVALID_ARGUMENT, "the client says the job has " + std::to_string(h.world_size()) +
                                        " ranks (ZEROD_WORLD_SIZE) but this daemon serves " +
                                        std::to_string(server_.world_size()));
    if (h.rank() < 0 || h.rank() >= server_.world_size())
      fail(ZD_ERR_INVALID_ARGUMENT, "rank " + std::to_string(h.rank()) + " is outside the job's " +
                                        std::to_string(server_.world_size()) + " ranks (ZEROD_RANK)");
    if (!server_.serves(h.rank()))
      fail(ZD_ERR_INVALID_ARGUMENT, "rank " + std::to_string(h.rank()) + " is not served by this daemon, which "
                                        "serves ranks " + std::to_string(server_.first_rank()) + ".." +
                                        std::to_string(server_.first_rank() + server_.local_ranks() - 1) +
                                        "; a rank connects to the daemon of its own node (ZEROD_ENDPOINT)");
    std::string holder;
    if (!server_.claim_rank(h.rank(), this, &holder))
      fail(ZD_ERR_INVALID_STATE, "rank " + std::to_string(h.rank()) + " is already connected (" + holder +
                                     "); every rank connects once");
    rank_ = h.rank();
  } else {
    fail(ZD_ERR_INVALID_ARGUMENT, "unknown role '" + h.role() + "' in hello");
  }
  greeted_ = true;
  v1::HelloReply* r = reply->mutable_hello();
  r->set_abi_version(ZD_ABI_VERSION);
  r->set_version(ZEROD_VERSION_STRING);
  r->set_world_size(server_.world_size());
  r->set_max_frame(wire::kMaxBody);
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

void Session::add_new_arenas(ModelHost& m, v1::Reply* reply, std::vector<int>* fds) {
  size_t& sent = arenas_sent_[m.id()];
  const auto arenas = m.model().device(rank_).arenas();
  for (size_t i = sent; i < arenas.size(); ++i) {
    v1::ArenaInfo* a = reply->add_new_arenas();
    a->set_id(arenas[i]->id());
    a->set_size(arenas[i]->size());
    fds->push_back(arenas[i]->fd());
  }
  sent = arenas.size();
}

void Session::add_views(ModelHost& m, int module, bool gradients, v1::CallReply* out) {
  for (zd_param_id pid : m.model().registry().module(module).params) {
    for (bool g : {false, true}) {
      if (g && !gradients) continue;
      const ViewInfo v = view_of(m.model(), rank_, pid, g);
      v1::View* view = out->add_views();
      view->set_param(pid);
      view->set_gradient(g);
      view->set_arena(v.arena);
      view->set_offset(v.offset);
      view->set_bytes(v.bytes);
    }
  }
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
    init = staging_at(r.staging_offset(), wire::checked_bytes(numel, idt, what + "'s initial values"),
                      "zd_model_register_param");
  }
  std::vector<int64_t> shape(dims.begin(), dims.end());
  const zd_param_id id = m->reattaching(rank_)
                             ? m->verify_param(rank_, r.name(), r.module(), r.dtype(), shape)
                             : m->model().register_param(rank_, r.name(), r.module(), r.dtype(),
                                                         std::move(shape), init, r.init_dtype());
  reply->mutable_register_param()->set_param(id);
}

void Session::call(const v1::ModelCall& c, v1::Reply* reply) {
  auto host = model_of(c.model());
  Model& m = host->model();
  v1::CallReply* out = reply->mutable_call();
  switch (c.op()) {
    case v1::ModelCall::FINALIZE:
      if (host->reattaching(rank_))
        host->finish_reattach(rank_);  // resumes the kept state
      else
        m.finalize(rank_);
      break;
    case v1::ModelCall::FORWARD_BEGIN:
      m.forward_begin(rank_, c.module());
      add_views(*host, c.module(), false, out);
      break;
    case v1::ModelCall::FORWARD_END: m.forward_end(rank_, c.module()); break;
    case v1::ModelCall::BACKWARD_BEGIN:
      m.backward_begin(rank_, c.module());
      add_views(*host, c.module(), true, out);
      break;
    case v1::ModelCall::BACKWARD_END: m.backward_end(rank_, c.module()); break;
    case v1::ModelCall::STEP: {
      const StepFigures f = m.step(rank_);
      v1::StepFigures* s = out->mutable_step();
      s->set_boundary(f.boundary);
      s->set_applied(f.applied);
      s->set_skipped(f.skipped);
      s->set_step(f.step);
      s->set_micro_step(f.micro_step);
      s->set_lr(f.lr);
      s->set_loss_scale(f.loss_scale);
      s->set_grad_norm(f.grad_norm);
      break;
    }
    case v1::ModelCall::LOSS_SCALE: break;
    case v1::ModelCall::SET_STEP: m.set_applied_steps(rank_, c.step()); break;
    case v1::ModelCall::SAVE: m.save_checkpoint(rank_, c.path()); break;
    case v1::ModelCall::LOAD: m.load_checkpoint(rank_, c.path()); break;
    case v1::ModelCall::REPORT:
      m.report(rank_, c.progress().tokens(), c.progress().samples(), c.progress().has_loss(), c.progress().loss());
      break;
    case v1::ModelCall::OPTIMIZER_INFO: {
      v1::OptimizerInfo* o = out->mutable_optimizer();
      o->set_name(m.optimizer().plugin().name());
      for (uint32_t s = 0; s < m.optimizer().state_slots(); ++s) o->add_slots(m.optimizer().state_name(s));
      o->set_step(m.applied_steps(rank_));
      break;
    }
    case v1::ModelCall::COMM_FIGURES: {
      const int rank = c.rank() < 0 ? rank_ : c.rank();
      if (!m.is_local(rank))
        fail(ZD_ERR_INVALID_ARGUMENT, "rank " + std::to_string(rank) +
                                          " is served by another node's daemon; ask that rank for its figures");
      const zd_comm_figures f = m.comm().figures(rank);
      v1::CommFigures* cf = out->mutable_comm();
      cf->set_bytes_sent(f.bytes_sent);
      cf->set_network_bytes_sent(f.network_bytes_sent);
      cf->set_collectives(f.collectives);
      break;
    }
    default: fail(ZD_ERR_INVALID_ARGUMENT, "unknown model call " + std::to_string(c.op()));
  }
  out->set_loss_scale(m.loss_scale(rank_));
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
      auto m = server_.create_or_attach(rank_, c.script_text(), c.script_name(), c.allow_io());
      models_[m->id()] = m;
      reply->mutable_create_model()->set_model(m->id());
      return;
    }
    case v1::Request::kDestroyModel: {
      auto m = model_of(req.destroy_model().model());
      models_.erase(m->id());
      m->detach(rank_, false, "rank " + std::to_string(rank_) + " destroyed its model");
      server_.forget_if_unused(m);
      reply->mutable_ok();
      return;
    }
    case v1::Request::kRegisterParam:
      register_param(req.register_param(), reply);
      return;
    case v1::Request::kCall: {
      auto m = model_of(req.call().model());
      call(req.call(), reply);
      add_new_arenas(*m, reply, fds);
      return;
    }
    case v1::Request::kParamRead: {
      const auto& p = req.param_read();
      model_of(p.model())->model().read_param(rank_, p.param(), p.dtype(),
                                              staging_at(p.staging_offset(), p.bytes(), "zd_param_read"), p.bytes());
      reply->mutable_ok();
      return;
    }
    case v1::Request::kStateRead: {
      const auto& p = req.state_read();
      model_of(p.model())->model().read_state(rank_, p.param(), p.slot(), p.dtype(),
                                              staging_at(p.staging_offset(), p.bytes(), "zd_optimizer_state_read"), p.bytes());
      reply->mutable_ok();
      return;
    }
    case v1::Request::kStateWrite: {
      const auto& p = req.state_write();
      model_of(p.model())->model().write_state(rank_, p.param(), p.slot(), p.dtype(),
                                               staging_at(p.staging_offset(), p.bytes(), "zd_optimizer_state_write"), p.bytes());
      reply->mutable_ok();
      return;
    }
    case v1::Request::kParamWrite: {
      const auto& p = req.param_write();
      model_of(p.model())->model().write_param(rank_, p.param(), p.dtype(),
                                               staging_at(p.staging_offset(), p.bytes(), "zd_param_write"), p.bytes());
      reply->mutable_ok();
      return;
    }
    case v1::Request::kMemory: {
      const auto& q = req.memory();
      auto m = model_of(q.model());
      const int rank = q.rank() < 0 ? rank_ : q.rank();
      if (q.tier() < 0 || q.tier() >= ZD_TIER_COUNT || q.kind() < ZD_MEM_ALL || q.kind() >= ZD_MEM_KIND_COUNT)
        fail(ZD_ERR_INVALID_ARGUMENT, "memory query for tier " + std::to_string(q.tier()) + ", kind " +
                                          std::to_string(q.kind()) + ": out of range");
      const MemoryLedger& l = m->model().ledger(rank);
      v1::MemoryReply* r = reply->mutable_memory();
      r->set_current(l.current(q.tier(), q.kind()));
      r->set_peak(l.peak(q.tier(), q.kind()));
      r->set_budget(l.budget(q.tier()));
      return;
    }
    default:
      fail(ZD_ERR_INVALID_ARGUMENT, "unknown request (field " + std::to_string(req.body_case()) + ")");
  }
}

}  // namespace zerod::server
