// Daemon mode: the client side. At connect it sends the daemon a call ring
// (transport/ring.h); each table call is then a record in the ring and its
// reply, and set-up requests (models, registration, staging) are socket
// frames the ring announces. Views point into the daemon's arenas, which
// this side maps once when their fds arrive on the socket (memfds on the
// cpu device, CUDA allocations on a GPU: trainer_link.h, which also orders
// the trainer's stream against the daemon's). Whole-parameter
// data goes through a staging memfd the client shares with the daemon. No
// tensor bytes travel in the messages. Answers this side already holds
// (views, the loss scale, module and parameter info) cost no round trip.
#include "backend.h"

#include "dtype.h"
#include "error.h"
#include "launcher_env.h"
#include "registry.h"
#include "script_file.h"
#include "sizes.h"
#include "transport/client.h"
#include "transport/shared_memory.h"
#include "ring_call.h"
#include "transport/ring.h"
#include "trainer_link.h"
#include "wire.h"

#include <poll.h>

#include <sys/types.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <span>

namespace zerod::abi {

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != 0 || x < 0 || x > 1 << 20)
    fail(ZD_ERR_INVALID_ARGUMENT, std::string(name) + "='" + v + "' is not a valid number");
  return static_cast<int>(x);
}

class RemoteClient;

// A view as either path reports it.
struct RingViewLike {
  int32_t param;
  bool gradient;
  int32_t arena;
  uint64_t offset, bytes;
};

class RemoteModel final : public ModelBackend {
 public:
  RemoteModel(RemoteClient& c, int id, int32_t device_type, int32_t device_id, const StreamLink& link)
      : client_(c), id_(id), registry_(1), link_(device_type, device_id, link) {}
  ~RemoteModel() override;

  zd_param_id register_param(const std::string& name, const std::string& module, zd_dtype dtype,
                             std::vector<int64_t> shape, const void* init, zd_dtype init_dtype) override;
  const Registry& registry() const override { return registry_; }
  calls::Outcome call(const calls::Args& a, void* data) override;

 private:
  // The answers this side holds: no round trip.
  calls::Outcome view(const calls::Args& a);
  calls::Outcome set_stream(void* stream);
  // Through the daemon: the ring (or the socket, before a ring exists).
  calls::Outcome remote(const calls::Args& a, void* data);
  calls::Outcome optimizer_info();
  // save, load: rare and long, so a socket frame, not the ring; the
  // directory made absolute, as the daemon's working directory is not this
  // process's.
  calls::Outcome path_call(const calls::Args& a, void* data);
  // A daemon without the ring (or ZEROD_NO_RING=1): one protobuf frame each.
  calls::Outcome socket_call(const calls::Args& a);
  void take_arenas(const google::protobuf::RepeatedPtrField<v1::ArenaInfo>& arenas, std::vector<transport::UniqueFd>& fds);
  void take_view(const RingViewLike& v);
  void forget_views(const calls::Args& a);
  std::string module_label(zd_module_id m) const { return "module '" + registry_.module(m).name + "'"; }

  RemoteClient& client_;
  int id_;
  Registry registry_;  // a mirror of what this rank registered: names, shapes, modules
  TrainerLink link_;
  std::map<int32_t, ImportedArena> arenas_;
  std::map<zd_param_id, ViewInfo> param_views_, grad_views_;
  std::set<zd_module_id> in_forward_;  // this rank's modules between a forward begin and end
  double loss_scale_ = 1.0;  // as of the last reply: only this rank's calls change it
  std::vector<RingViewLike> socket_views_;
};

// Which rank this process is, when ZEROD_ENDPOINT names the daemon: `zerod
// run`'s variables as it sets them (ZEROD_RANK, ZEROD_WORLD_SIZE), else what
// another launcher's say (torchrun's RANK... pointed at a `zerod serve`), so
// that such a rank is never rank 0 of 1 by default. The job key tells a
// daemon serving several jobs which one the rank is of.
RankIdentity identity_from_environment() {
  RankIdentity id;
  if (std::getenv("ZEROD_RANK") || std::getenv("ZEROD_WORLD_SIZE") || !launcher_ranks()) {
    id.rank = env_int("ZEROD_RANK", 0);
    id.world = env_int("ZEROD_WORLD_SIZE", 1);
    id.local_rank = env_int("ZEROD_LOCAL_RANK", id.rank);
    id.local_world = env_int("ZEROD_LOCAL_WORLD_SIZE", 0);
    if (const char* key = std::getenv("ZEROD_JOB_KEY")) id.job_key = std::string("ZEROD_JOB_KEY=") + key + ";";
    return id;
  }
  const LauncherRanks r = *launcher_ranks();
  id.rank = r.rank;
  id.world = r.world;
  id.local_rank = r.local_rank;
  id.local_world = r.local_world;
  id.job_key = r.job_key;
  return id;
}

class RemoteClient final : public ClientBackend {
 public:
  RemoteClient(const std::string& path, uint32_t timeout_ms, const RankIdentity* who)
      : conn_(transport::connect_unix(path, timeout_ms ? static_cast<int>(timeout_ms) : 5000)),
        timeout_ms_(timeout_ms) {
    const RankIdentity id = who ? *who : identity_from_environment();
    rank_ = id.rank;
    world_ = id.world;
    local_rank_ = id.local_rank;
    v1::Request req;
    v1::Hello* h = req.mutable_hello();
    h->set_abi_version(ZD_ABI_VERSION);
    h->set_role("rank");
    h->set_rank(rank_);
    h->set_world_size(world_);
    h->set_local_rank(local_rank_);
    h->set_job_key(id.job_key);
    h->set_local_world_size(id.local_world);
    const v1::Reply r = rpc(req);
    if (r.hello().ring() && std::getenv("ZEROD_NO_RING") == nullptr) set_up_ring();
    // A daemon that does not say it runs a deferred end would drop it.
    defer_end_ = defer_end_ && r.hello().deferred_end();
  }
  ~RemoteClient() override = default;

  zd_client_info info() const override {
    zd_client_info i{};
    i.struct_size = sizeof i;
    i.rank = rank_;
    i.world_size = world_;
    i.local_rank = local_rank_;
    i.embedded = 0;
    return i;
  }

  std::unique_ptr<ModelBackend> create_model(const ScriptOptions& s) override {
    std::string text = s.text, name = s.name.empty() ? "job.lua" : s.name;
    if (!s.path.empty()) {
      // Read here: the daemon may not share this process's working directory.
      text = scripting::read_script_file(s.path);
      name = s.path;
    }
    v1::Request req;
    v1::CreateModel* c = req.mutable_create_model();
    c->set_script_text(text);
    c->set_script_name(name);
    c->set_allow_io(s.allow_io);
    c->set_device(s.device);
    const v1::Reply r = rpc(req);
    const v1::CreateModelReply& cm = r.create_model();
    try {
      return std::make_unique<RemoteModel>(*this, cm.model(), cm.device_type(), cm.device_id(),
                                           StreamLink{cm.zerod_done(), cm.trainer_done()});
    } catch (...) {
      // This side cannot reach the device: the daemon's model goes again.
      v1::Request d;
      d.mutable_destroy_model()->set_model(cm.model());
      try {
        rpc(d);
      } catch (...) {
      }
      throw;
    }
  }

  // Sends a request as a socket frame and waits for its reply; throws the
  // reply's error. With a ring, the ring announces the frame first (the
  // daemon's thread waits on the ring, not on the socket).
  v1::Reply rpc(const v1::Request& req, std::vector<transport::UniqueFd>* fds = nullptr,
                std::span<const int> send_fds = {}) {
    if (ring_) {
      flush_deferred();
      wire::RingRequest announce{};
      announce.kind = wire::RingKind::socket_frame;
      std::memcpy(ring_.request_slot().data(), &announce, sizeof announce);
      ring_.post_request();
      wait_ring();  // the daemon posts before it reads the frame
    }
    const uint32_t id = next_id_++;
    transport::Frame f;
    try {
      wire::send(conn_, wire::kRequest, id, req, send_fds);
      f = receive();
    } catch (const Error& e) {
      throw_gone(e);
    }
    if (f.header.type != wire::kReply || f.header.request_id != id)
      fail(ZD_ERR_INTERNAL, "the daemon answered request " + std::to_string(id) + " with " +
                                transport::describe(f.header));
    v1::Reply r;
    wire::parse(f, &r, "reply");
    if (r.has_error()) fail(r.error().status(), r.error().message());
    if (fds) *fds = std::move(f.fds);
    return r;
  }

  bool has_ring() const { return static_cast<bool>(ring_); }

  // zd_forward_end through the ring, deferred: the client answers it at
  // once and sends it with this rank's next call to the daemon, which runs
  // it first. A begin/end pair then costs one round trip instead of two
  // (the pair's end and the next begin share one). Only forward_end: no
  // other rank waits for it (at stage 3 it releases the gathered module,
  // which the next call, often the next begin's gather, then does first,
  // and it compares the begin's gather with the peers', which waits for
  // their begins, never their ends), so holding it back cannot keep a peer
  // waiting; backward_end starts the reduction the other ranks wait for.
  // The module's views end now, on this side, and only an end of a module
  // this rank began in forward is deferred (any other goes at once and
  // fails there as before); an error only the daemon can see (a lost peer,
  // ranks in different modules) comes back from the next call, which then
  // does not run. ZEROD_SYNC_END=1 turns it off (docs/daemon.md).
  bool defers_end() const { return ring_ && defer_end_; }
  void defer_end(int model, const calls::Args& a) {
    if (deferred_) {
      // Two ends in a row (nested modules): the first travels with the second, which waits.
      const wire::RingReply& r = ring_call(model, a, 0);
      keep_stray_arenas(model, r);
      if (r.status != ZD_OK) fail(r.status, message_of(r));
      return;
    }
    deferred_ = Deferred{model, a};
  }
  void flush_deferred() {
    if (!deferred_) return;
    const Deferred d = *deferred_;
    deferred_.reset();
    const wire::RingReply& r = ring_call(d.model, d.args, 0);
    keep_stray_arenas(d.model, r);
    if (r.status != ZD_OK)
      fail(r.status, message_of(r) + "\n(this is the error of zd_forward_end of module " +
                         std::to_string(d.args.module) +
                         ", which the client sent before this rank's next call; that call did not run. "
                         "ZEROD_SYNC_END=1 makes zd_forward_end wait for the daemon.)");
  }
  // A reply to an end sent on its own may announce arenas an earlier call
  // of the model grew (the daemon announces them with its next answer): the
  // frame is read now, so that it is not taken for the next reply, and the
  // model takes them at its next call (take_stray_arenas).
  void keep_stray_arenas(int model, const wire::RingReply& r) {
    if (r.arenas_follow) stray_arenas_.emplace_back(model, arena_frame());
  }
  std::vector<transport::Frame> take_stray_arenas(int model) {
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

  std::string message_of(const wire::RingReply& r) const {
    const std::span<const std::byte> tail = reply_tail();
    const uint64_t view_bytes = uint64_t{r.view_count} * sizeof(wire::RingView);
    if (view_bytes > tail.size() || r.message_bytes > tail.size() - view_bytes)
      fail(ZD_ERR_INTERNAL, "the daemon's ring reply overruns its slot");
    return std::string(reinterpret_cast<const char*>(tail.data() + view_bytes), r.message_bytes);
  }

  // A table call through the ring: the request record, a post, a wait, and
  // the reply record (whose views and message follow it in the slot).
  // A deferred zd_forward_end of the same model travels in the same record
  // (the daemon runs it first); one of another model is sent on its own
  // first.
  const wire::RingReply& ring_call(int model, const calls::Args& a, uint64_t staging_offset) {
    if (deferred_ && deferred_->model != model) flush_deferred();
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
    std::memcpy(ring_.request_slot().data(), &req, sizeof req);
    ring_.post_request();
    wait_ring();
    std::memcpy(&reply_, ring_.reply_slot().data(), sizeof reply_);
    return reply_;
  }
  std::span<const std::byte> reply_tail() const { return ring_.reply_slot().subspan(sizeof(wire::RingReply)); }

  // The frame with new arena fds that a ring reply announced.
  transport::Frame arena_frame() {
    try {
      return receive();
    } catch (const Error& e) {
      throw_gone(e);
    }
  }

  // A staging area of at least `bytes`, shared with the daemon: a memfd
  // sealed against resizing, which the daemon requires before it maps it.
  std::byte* staging(uint64_t bytes) {
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

 private:
  // 1 MiB: a record, then up to ~32k views of a module and the message.
  // Pages the replies never reach are never allocated.
  static constexpr uint64_t kRingBytes = uint64_t{1} << 20;

  void set_up_ring() {
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

  bool socket_open() const {
    pollfd p{conn_.fd(), POLLRDHUP, 0};
    if (::poll(&p, 1, 0) < 0) return true;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) == 0;
  }

  void wait_ring() {
    if (timeout_ms_)
      wait_.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
    switch (ring_.wait_reply(wait_)) {
      case transport::RingWaitEnd::ready: return;
      case transport::RingWaitEnd::timeout:
        fail(ZD_ERR_TIMEOUT, "no reply from the zerod daemon within " + std::to_string(timeout_ms_) +
                                 " ms (zd_connect_options.timeout_ms)");
      default:
        fail(ZD_ERR_PEER_LOST, "the zerod daemon is gone: its socket hung up while this rank waited for a reply "
                               "on the call ring");
    }
  }

  transport::Frame receive() {
    return conn_.receive(wire::kMaxBody, timeout_ms_ ? static_cast<int>(timeout_ms_) : transport::kWaitForever);
  }

  [[noreturn]] static void throw_gone(const Error& e) {
    // The socket itself failed: the daemon went away (or never answered).
    if (e.code() == ZD_ERR_PEER_LOST) fail(ZD_ERR_PEER_LOST, std::string("the zerod daemon is gone: ") + e.what());
    throw;
  }

  transport::Connection conn_;
  uint32_t timeout_ms_;
  uint32_t next_id_ = 1;
  int rank_ = 0, world_ = 1, local_rank_ = 0;
  transport::SharedMapping staging_;
  transport::Ring ring_;
  transport::RingWait wait_;
  wire::RingReply reply_{};
  struct Deferred {
    int model;
    calls::Args args;
  };
  std::optional<Deferred> deferred_;
  std::vector<std::pair<int, transport::Frame>> stray_arenas_;
  bool defer_end_ = std::getenv("ZEROD_SYNC_END") == nullptr;
};

// ---------------------------------------------------------------------------

RemoteModel::~RemoteModel() {
  try {
    client_.flush_deferred();  // on its own: its error must not keep the destroy from going out
  } catch (...) {
    // A broken job's end: the destroy below still detaches the model.
  }
  try {
    v1::Request req;
    req.mutable_destroy_model()->set_model(id_);
    client_.rpc(req);
  } catch (...) {
    // The daemon may be gone already; nothing is left to free then.
  }
}

zd_param_id RemoteModel::register_param(const std::string& name, const std::string& module,
                                        zd_dtype dtype, std::vector<int64_t> shape, const void* init,
                                        zd_dtype init_dtype) {
  v1::Request req;
  v1::RegisterParam* r = req.mutable_register_param();
  r->set_model(id_);
  r->set_name(name);
  r->set_module(module);
  r->set_dtype(dtype);
  for (int64_t e : shape) r->add_shape(e);
  r->set_init_dtype(init_dtype);
  if (init) {
    // The bytes to copy, from a checked shape and dtype (what the engine
    // would refuse is refused here, in its words, before anything is read).
    const std::string what = "parameter '" + name + "'";
    const zd_dtype idt = init_dtype ? init_dtype : dtype;
    if (!dtype_valid(idt))
      fail(ZD_ERR_INVALID_ARGUMENT, what + " has an invalid init_dtype (" + std::to_string(idt) + ")");
    const uint64_t bytes = wire::checked_bytes(wire::checked_numel(shape, what), idt, what);
    std::memcpy(client_.staging(bytes), init, bytes);
    r->set_has_init(true);
    r->set_staging_offset(0);
  }
  const v1::Reply reply = client_.rpc(req);
  const zd_param_id id = registry_.add(name, module, dtype, std::move(shape));
  if (id != reply.register_param().param())
    fail(ZD_ERR_INTERNAL, "the daemon numbered parameter '" + name + "' " +
                              std::to_string(reply.register_param().param()) + ", this client " +
                              std::to_string(id));
  return id;
}

calls::Outcome RemoteModel::call(const calls::Args& a, void* data) {
  switch (a.op) {
    case calls::Op::param_view:
    case calls::Op::grad_view: return view(a);
    case calls::Op::set_stream: return set_stream(data);
    case calls::Op::loss_scale: {
      calls::Outcome o;
      o.loss_scale = loss_scale_;
      return o;
    }
    case calls::Op::optimizer_info: return optimizer_info();
    case calls::Op::save:
    case calls::Op::load: return path_call(a, data);
    default: return remote(a, data);
  }
}

calls::Outcome RemoteModel::path_call(const calls::Args& a, void* data) {
  calls::check(registry_, client_.info().world_size, a, data);
  v1::Request req;
  v1::ModelCall* c = req.mutable_call();
  c->set_model(id_);
  c->set_op(a.op == calls::Op::save ? v1::ModelCall::SAVE : v1::ModelCall::LOAD);
  const std::string dir(static_cast<const char*>(data), a.bytes);
  c->set_path(std::filesystem::absolute(dir).lexically_normal().string());
  const v1::Reply r = client_.rpc(req);
  calls::Outcome o;
  o.loss_scale = loss_scale_ = r.call().loss_scale();
  return o;
}

calls::Outcome RemoteModel::view(const calls::Args& a) {
  calls::check(registry_, 1, a, nullptr);
  const ParamRecord& p = registry_.param(a.param);
  const bool grad = a.op == calls::Op::grad_view;
  const auto& views = grad ? grad_views_ : param_views_;
  auto it = views.find(a.param);
  if (it == views.end()) {
    if (grad)
      fail(ZD_ERR_INVALID_STATE, "parameter '" + p.name + "' has no gradient buffer now: its " +
                                     module_label(p.module) + " is not between zd_backward_begin and zd_backward_end");
    fail(ZD_ERR_INVALID_STATE, "parameter '" + p.name + "' is not resident: its " + module_label(p.module) +
                                   " is not between a _begin and its _end call");
  }
  calls::Outcome o;
  o.view = it->second;
  o.loss_scale = loss_scale_;
  return o;
}

calls::Outcome RemoteModel::set_stream(void* stream) {
  link_.set_stream(stream);
  return {};
}

calls::Outcome RemoteModel::optimizer_info() {
  v1::Request req;
  v1::ModelCall* c = req.mutable_call();
  c->set_model(id_);
  c->set_op(v1::ModelCall::OPTIMIZER_INFO);
  const v1::Reply r = client_.rpc(req);
  calls::Outcome o;
  o.optimizer = r.call().optimizer().name();
  o.slots.assign(r.call().optimizer().slots().begin(), r.call().optimizer().slots().end());
  o.applied_steps = r.call().optimizer().step();
  o.loss_scale = loss_scale_ = r.call().loss_scale();
  return o;
}

void RemoteModel::take_arenas(const google::protobuf::RepeatedPtrField<v1::ArenaInfo>& arenas,
                              std::vector<transport::UniqueFd>& fds) {
  if (static_cast<size_t>(arenas.size()) != fds.size())
    fail(ZD_ERR_INTERNAL, "the daemon announced " + std::to_string(arenas.size()) + " arenas but sent " +
                              std::to_string(fds.size()) + " fds");
  for (int i = 0; i < arenas.size(); ++i) {
    const v1::ArenaInfo& a = arenas.Get(i);
    const PoolExport e{a.id(), a.size(), fds[static_cast<size_t>(i)].get(), a.device_type(), a.device_id()};
    arenas_.insert_or_assign(a.id(), ImportedArena(e, "device-pool arena " + std::to_string(a.id()) + " from the daemon"));
  }
  fds.clear();  // the mappings keep the memory; the fds can go
}

void RemoteModel::take_view(const RingViewLike& v) {
  auto a = arenas_.find(v.arena);
  if (a == arenas_.end() || v.offset > a->second.size() || v.bytes > a->second.size() - v.offset)
    fail(ZD_ERR_INTERNAL, "the daemon sent a view outside its arenas");
  const ParamRecord& p = registry_.param(v.param);
  ViewInfo info;
  info.data = a->second.data() + v.offset;
  info.bytes = v.bytes;
  info.arena = v.arena;
  info.offset = v.offset;
  info.dtype = p.dtype;
  info.shape = &p.shape;
  info.read_only = !v.gradient;
  info.device_type = link_.device_type();
  info.device_id = link_.device_id();
  (v.gradient ? grad_views_ : param_views_)[v.param] = info;
}

void RemoteModel::forget_views(const calls::Args& a) {
  for (zd_param_id p : registry_.module(a.module).params) {
    param_views_.erase(p);
    if (a.op == calls::Op::backward_end) grad_views_.erase(p);
  }
}

calls::Outcome RemoteModel::socket_call(const calls::Args& a) {
  v1::Request req;
  calls::Outcome o;
  o.loss_scale = loss_scale_;
  const auto data = [&](v1::ParamData* d) {
    d->set_model(id_);
    d->set_param(a.param);
    d->set_slot(a.slot);
    d->set_dtype(a.dtype);
    d->set_bytes(a.bytes);
    d->set_staging_offset(0);
  };
  switch (a.op) {
    case calls::Op::param_read: data(req.mutable_param_read()); client_.rpc(req); return o;
    case calls::Op::param_write: data(req.mutable_param_write()); client_.rpc(req); return o;
    case calls::Op::state_read: data(req.mutable_state_read()); client_.rpc(req); return o;
    case calls::Op::state_write: data(req.mutable_state_write()); client_.rpc(req); return o;
    case calls::Op::memory: {
      v1::MemoryQuery* q = req.mutable_memory();
      q->set_model(id_);
      q->set_rank(a.rank);
      q->set_tier(a.tier);
      q->set_kind(a.kind);
      const v1::MemoryReply r = client_.rpc(req).memory();
      o.current = r.current();
      o.peak = r.peak();
      o.budget = r.budget();
      return o;
    }
    default: break;
  }
  v1::ModelCall* c = req.mutable_call();
  c->set_model(id_);
  switch (a.op) {
    case calls::Op::finalize: c->set_op(v1::ModelCall::FINALIZE); break;
    case calls::Op::forward_begin: c->set_op(v1::ModelCall::FORWARD_BEGIN); break;
    case calls::Op::forward_end: c->set_op(v1::ModelCall::FORWARD_END); break;
    case calls::Op::backward_begin: c->set_op(v1::ModelCall::BACKWARD_BEGIN); break;
    case calls::Op::backward_end: c->set_op(v1::ModelCall::BACKWARD_END); break;
    case calls::Op::step: c->set_op(v1::ModelCall::STEP); break;
    case calls::Op::set_step: c->set_op(v1::ModelCall::SET_STEP); break;
    case calls::Op::comm_figures: c->set_op(v1::ModelCall::COMM_FIGURES); break;
    case calls::Op::report: {
      c->set_op(v1::ModelCall::REPORT);
      v1::Progress* p = c->mutable_progress();
      p->set_tokens(a.tokens);
      p->set_samples(a.samples);
      p->set_has_loss(a.has_loss != 0);
      p->set_loss(a.loss);
      break;
    }
    default: fail(ZD_ERR_INTERNAL, std::string(calls::name(a.op)) + " has no socket form");
  }
  c->set_module(a.module);
  c->set_step(a.step);
  c->set_rank(a.rank);
  std::vector<transport::UniqueFd> fds;
  const v1::Reply r = client_.rpc(req, &fds);
  take_arenas(r.new_arenas(), fds);
  const v1::CallReply& cr = r.call();
  for (const v1::View& v : cr.views()) socket_views_.push_back({v.param(), v.gradient(), v.arena(), v.offset(), v.bytes()});
  const v1::StepFigures& sf = cr.step();
  o.step.boundary = sf.boundary();
  o.step.applied = sf.applied();
  o.step.skipped = sf.skipped();
  o.step.step = sf.step();
  o.step.micro_step = sf.micro_step();
  o.step.lr = sf.lr();
  o.step.loss_scale = sf.loss_scale();
  o.step.grad_norm = sf.grad_norm();
  o.comm.bytes_sent = cr.comm().bytes_sent();
  o.comm.network_bytes_sent = cr.comm().network_bytes_sent();
  o.comm.collectives = cr.comm().collectives();
  o.loss_scale = cr.loss_scale();
  return o;
}

calls::Outcome RemoteModel::remote(const calls::Args& a, void* data) {
  // Checked here too (the same function the daemon runs) before anything
  // is copied into the staging memfd.
  calls::check(registry_, client_.info().world_size, a, data);
  if (a.op == calls::Op::forward_end && client_.defers_end() && in_forward_.erase(a.module) != 0) {
    forget_views(a);
    client_.defer_end(id_, a);
    calls::Outcome o;
    o.loss_scale = loss_scale_;
    return o;
  }
  const bool writes = a.op == calls::Op::param_write || a.op == calls::Op::state_write;
  const bool reads = a.op == calls::Op::param_read || a.op == calls::Op::state_read;
  std::byte* st = (reads || writes) ? client_.staging(a.bytes) : nullptr;
  if (writes) std::memcpy(st, data, a.bytes);
  calls::Outcome o;
  std::vector<RingViewLike> views;
  link_.before_call();
  if (client_.has_ring()) {
    const wire::RingReply& r = client_.ring_call(id_, a, 0);
    const std::span<const std::byte> tail = client_.reply_tail();
    const std::string message = client_.message_of(r);  // checks the record's lengths against the slot
    std::vector<transport::Frame> frames = client_.take_stray_arenas(id_);
    if (r.arenas_follow) frames.push_back(client_.arena_frame());
    for (transport::Frame& f : frames) {
      v1::Reply ar;
      wire::parse(f, &ar, "arena announcement");
      take_arenas(ar.new_arenas(), f.fds);
    }
    if (r.status != ZD_OK) fail(r.status, message);
    o.step = r.step;
    o.loss_scale = r.loss_scale;
    o.current = r.current;
    o.peak = r.peak;
    o.budget = r.budget;
    o.comm.bytes_sent = r.bytes_sent;
    o.comm.network_bytes_sent = r.network_bytes_sent;
    o.comm.collectives = r.collectives;
    o.applied_steps = r.applied_steps;
    for (uint32_t i = 0; i < r.view_count; ++i) {
      wire::RingView v;
      std::memcpy(&v, tail.data() + i * sizeof v, sizeof v);
      views.push_back({v.param, v.gradient != 0, v.arena, v.offset, v.bytes});
    }
  } else {
    o = socket_call(a);  // a daemon without the ring
    views = std::move(socket_views_);
    socket_views_.clear();
  }
  for (const RingViewLike& v : views) take_view(v);
  if (a.op == calls::Op::forward_begin || a.op == calls::Op::backward_begin) link_.after_begin();
  if (a.op == calls::Op::forward_end || a.op == calls::Op::backward_end) forget_views(a);
  if (a.op == calls::Op::forward_begin) in_forward_.insert(a.module);
  if (a.op == calls::Op::forward_end) in_forward_.erase(a.module);
  if (reads) std::memcpy(data, st, a.bytes);
  loss_scale_ = o.loss_scale;
  return o;
}

}  // namespace

std::unique_ptr<ClientBackend> make_remote_client(const std::string& path, uint32_t timeout_ms,
                                                  const RankIdentity* who) {
  return std::make_unique<RemoteClient>(path, timeout_ms, who);
}

}  // namespace zerod::abi
