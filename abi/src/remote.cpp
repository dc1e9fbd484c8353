// Daemon mode: the client side of the socket protocol. Each call is one
// request and its reply; views point into the daemon's arenas, which this
// side maps once when their fds arrive. Whole-parameter data goes through a
// staging memfd the client shares with the daemon. No tensor bytes travel in
// the messages.
#include "backend.h"

#include "dtype.h"
#include "error.h"
#include "registry.h"
#include "script_file.h"
#include "sizes.h"
#include "transport/client.h"
#include "transport/shared_memory.h"
#include "wire.h"

#include <sys/types.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <filesystem>
#include <map>

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

// Arenas come from the daemon, which sizes them to its device budget: any
// size a file can have is allowed, but the fd must be a sealed memfd that
// long, so a mapping here can never fault.
constexpr uint64_t kMaxArenaBytes = static_cast<uint64_t>(std::numeric_limits<off_t>::max());

class RemoteClient;

class RemoteModel final : public ModelBackend {
 public:
  RemoteModel(RemoteClient& c, int id) : client_(c), id_(id), registry_(1) {}
  ~RemoteModel() override;

  zd_param_id register_param(const std::string& name, const std::string& module, zd_dtype dtype,
                             std::vector<int64_t> shape, const void* init, zd_dtype init_dtype) override;
  void finalize() override;
  const Registry& registry() const override { return registry_; }
  void forward_begin(zd_module_id m) override { begin(v1::ModelCall::FORWARD_BEGIN, m); }
  void forward_end(zd_module_id m) override { end(v1::ModelCall::FORWARD_END, m); }
  void backward_begin(zd_module_id m) override { begin(v1::ModelCall::BACKWARD_BEGIN, m); }
  void backward_end(zd_module_id m) override { end(v1::ModelCall::BACKWARD_END, m); }
  ViewInfo param_view(zd_param_id p) override;
  ViewInfo grad_view(zd_param_id p) override;
  StepFigures step() override;
  double loss_scale() const override;
  void set_stream(void* stream) override {
    if (stream)
      fail(ZD_ERR_NOT_IMPLEMENTED, "zd_model_set_stream: the ranks of a zerod daemon compute on the cpu device, "
                                   "which has no streams (a daemon does not serve GPU memory yet)");
  }
  void read_param(zd_param_id p, zd_dtype dt, void* dst, uint64_t bytes) override;
  void write_param(zd_param_id p, zd_dtype dt, const void* src, uint64_t bytes) override;
  MemoryFigures memory(int rank, zd_tier tier, zd_mem_kind kind) const override;
  zd_comm_figures comm_figures(int rank) const override;
  OptimizerFigures optimizer() const override;
  void read_state(zd_param_id p, int slot, zd_dtype dt, void* dst, uint64_t bytes) override;
  void write_state(zd_param_id p, int slot, zd_dtype dt, const void* src, uint64_t bytes) override;
  void set_step(int64_t step) override;
  void save(const std::string& dir) override { path_call(v1::ModelCall::SAVE, dir); }
  void load(const std::string& dir) override { path_call(v1::ModelCall::LOAD, dir); }
  void report(uint64_t tokens, uint64_t samples, bool has_loss, double loss) override;

 private:
  v1::Reply call(v1::ModelCall::Op op, zd_module_id m, int64_t step = 0, int32_t rank = -1) const;
  // A call naming a directory: absolute, as the daemon's working directory is not this process's.
  void path_call(v1::ModelCall::Op op, const std::string& dir) const;
  void begin(v1::ModelCall::Op op, zd_module_id m);
  void end(v1::ModelCall::Op op, zd_module_id m);
  void take_arenas(const v1::Reply& r, std::vector<transport::UniqueFd>& fds);
  std::string module_label(zd_module_id m) const { return "module '" + registry_.module(m).name + "'"; }

  RemoteClient& client_;
  int id_;
  Registry registry_;  // a mirror of what this rank registered: names, shapes, modules
  std::map<int32_t, transport::SharedMapping> arenas_;
  std::map<zd_param_id, ViewInfo> param_views_, grad_views_;
  mutable std::vector<transport::UniqueFd> pending_fds_;
};

class RemoteClient final : public ClientBackend {
 public:
  RemoteClient(const std::string& path, uint32_t timeout_ms)
      : conn_(transport::connect_unix(path, timeout_ms ? static_cast<int>(timeout_ms) : 5000)),
        timeout_ms_(timeout_ms) {
    rank_ = env_int("ZEROD_RANK", 0);
    world_ = env_int("ZEROD_WORLD_SIZE", 1);
    local_rank_ = env_int("ZEROD_LOCAL_RANK", rank_);
    v1::Request req;
    v1::Hello* h = req.mutable_hello();
    h->set_abi_version(ZD_ABI_VERSION);
    h->set_role("rank");
    h->set_rank(rank_);
    h->set_world_size(world_);
    h->set_local_rank(local_rank_);
    rpc(req);
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
    if (s.device == "cuda")
      fail(ZD_ERR_NOT_IMPLEMENTED, "device \"cuda\": the ranks of a zerod daemon compute on the cpu device (a "
                                   "daemon does not serve GPU memory yet); train on the GPU in embedded mode "
                                   "(zd_connect(\"embedded:\"), or run the trainer without `zerod run`)");
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
    const v1::Reply r = rpc(req);
    return std::make_unique<RemoteModel>(*this, r.create_model().model());
  }

  // Sends a request and waits for its reply; throws the reply's error.
  v1::Reply rpc(const v1::Request& req, std::vector<transport::UniqueFd>* fds = nullptr,
                std::span<const int> send_fds = {}) {
    const uint32_t id = next_id_++;
    transport::Frame f;
    try {
      wire::send(conn_, wire::kRequest, id, req, send_fds);
      f = conn_.receive(wire::kMaxBody, timeout_ms_ ? static_cast<int>(timeout_ms_)
                                                    : transport::kWaitForever);
    } catch (const Error& e) {
      // The socket itself failed: the daemon went away (or never answered).
      if (e.code() == ZD_ERR_PEER_LOST)
        fail(ZD_ERR_PEER_LOST, std::string("the zerod daemon is gone: ") + e.what());
      throw;
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
  transport::Connection conn_;
  uint32_t timeout_ms_;
  uint32_t next_id_ = 1;
  int rank_ = 0, world_ = 1, local_rank_ = 0;
  transport::SharedMapping staging_;
};

// ---------------------------------------------------------------------------

RemoteModel::~RemoteModel() {
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
  const zd_param_id id = registry_.add(name, module, dtype, std::move(shape), {});
  if (id != reply.register_param().param())
    fail(ZD_ERR_INTERNAL, "the daemon numbered parameter '" + name + "' " +
                              std::to_string(reply.register_param().param()) + ", this client " +
                              std::to_string(id));
  return id;
}

v1::Reply RemoteModel::call(v1::ModelCall::Op op, zd_module_id m, int64_t step, int32_t rank) const {
  v1::Request req;
  v1::ModelCall* c = req.mutable_call();
  c->set_model(id_);
  c->set_op(op);
  c->set_module(m);
  c->set_step(step);
  c->set_rank(rank);
  return client_.rpc(req, &pending_fds_);
}

void RemoteModel::path_call(v1::ModelCall::Op op, const std::string& dir) const {
  v1::Request req;
  v1::ModelCall* c = req.mutable_call();
  c->set_model(id_);
  c->set_op(op);
  c->set_path(std::filesystem::absolute(dir).lexically_normal().string());
  client_.rpc(req, &pending_fds_);
}

void RemoteModel::finalize() {
  v1::Reply r = call(v1::ModelCall::FINALIZE, 0);
  take_arenas(r, pending_fds_);
}

void RemoteModel::take_arenas(const v1::Reply& r, std::vector<transport::UniqueFd>& fds) {
  if (static_cast<size_t>(r.new_arenas_size()) != fds.size())
    fail(ZD_ERR_INTERNAL, "the daemon announced " + std::to_string(r.new_arenas_size()) +
                              " arenas but sent " + std::to_string(fds.size()) + " fds");
  for (int i = 0; i < r.new_arenas_size(); ++i) {
    const v1::ArenaInfo& a = r.new_arenas(i);
    arenas_[a.id()] = transport::SharedMapping(fds[static_cast<size_t>(i)].get(), a.size(), kMaxArenaBytes,
                                               "device-pool arena " + std::to_string(a.id()) + " from the daemon",
                                               ZD_ERR_INTERNAL);
  }
  fds.clear();  // the mappings keep the memory; the fds can go
}

void RemoteModel::begin(v1::ModelCall::Op op, zd_module_id m) {
  v1::Reply r = call(op, m);
  take_arenas(r, pending_fds_);
  for (const v1::View& v : r.call().views()) {
    auto a = arenas_.find(v.arena());
    if (a == arenas_.end() || v.offset() > a->second.size() || v.bytes() > a->second.size() - v.offset())
      fail(ZD_ERR_INTERNAL, "the daemon sent a view outside its arenas");
    const ParamRecord& p = registry_.param(v.param());
    ViewInfo info;
    info.data = a->second.data() + v.offset();
    info.bytes = v.bytes();
    info.arena = v.arena();
    info.offset = v.offset();
    info.dtype = p.dtype;
    info.shape = &p.shape;
    info.read_only = !v.gradient();
    (v.gradient() ? grad_views_ : param_views_)[v.param()] = info;
  }
}

void RemoteModel::end(v1::ModelCall::Op op, zd_module_id m) {
  call(op, m);
  for (zd_param_id p : registry_.module(m).params) {
    param_views_.erase(p);
    if (op == v1::ModelCall::BACKWARD_END) grad_views_.erase(p);
  }
}

ViewInfo RemoteModel::param_view(zd_param_id id) {
  const ParamRecord& p = registry_.param(id);
  auto it = param_views_.find(id);
  if (it == param_views_.end())
    fail(ZD_ERR_INVALID_STATE, "parameter '" + p.name + "' is not resident: its " + module_label(p.module) +
                                   " is not between a _begin and its _end call");
  return it->second;
}

ViewInfo RemoteModel::grad_view(zd_param_id id) {
  const ParamRecord& p = registry_.param(id);
  auto it = grad_views_.find(id);
  if (it == grad_views_.end())
    fail(ZD_ERR_INVALID_STATE, "parameter '" + p.name + "' has no gradient buffer now: its " +
                                   module_label(p.module) +
                                   " is not between zd_backward_begin and zd_backward_end");
  return it->second;
}

StepFigures RemoteModel::step() {
  const v1::StepFigures s = call(v1::ModelCall::STEP, 0).call().step();
  StepFigures f;
  f.boundary = s.boundary();
  f.applied = s.applied();
  f.skipped = s.skipped();
  f.step = s.step();
  f.micro_step = s.micro_step();
  f.lr = s.lr();
  f.loss_scale = s.loss_scale();
  f.grad_norm = s.grad_norm();
  return f;
}

double RemoteModel::loss_scale() const { return call(v1::ModelCall::LOSS_SCALE, 0).call().loss_scale(); }

void RemoteModel::read_param(zd_param_id p, zd_dtype dt, void* dst, uint64_t bytes) {
  std::byte* st = client_.staging(bytes);
  v1::Request req;
  v1::ParamData* d = req.mutable_param_read();
  d->set_model(id_);
  d->set_param(p);
  d->set_dtype(dt);
  d->set_bytes(bytes);
  d->set_staging_offset(0);
  client_.rpc(req);
  if (dst) std::memcpy(dst, st, bytes);
}

void RemoteModel::write_param(zd_param_id p, zd_dtype dt, const void* src, uint64_t bytes) {
  std::byte* st = client_.staging(bytes);
  if (src) std::memcpy(st, src, bytes);
  v1::Request req;
  v1::ParamData* d = req.mutable_param_write();
  d->set_model(id_);
  d->set_param(p);
  d->set_dtype(dt);
  d->set_bytes(src ? bytes : 0);  // a NULL src is reported by the daemon as such
  d->set_staging_offset(0);
  client_.rpc(req);
}

MemoryFigures RemoteModel::memory(int rank, zd_tier tier, zd_mem_kind kind) const {
  v1::Request req;
  v1::MemoryQuery* q = req.mutable_memory();
  q->set_model(id_);
  q->set_rank(rank);
  q->set_tier(tier);
  q->set_kind(kind);
  const v1::MemoryReply r = client_.rpc(req).memory();
  return {r.current(), r.peak(), r.budget()};
}

zd_comm_figures RemoteModel::comm_figures(int rank) const {
  const v1::CommFigures c = call(v1::ModelCall::COMM_FIGURES, 0, 0, rank).call().comm();
  zd_comm_figures f = ZD_COMM_FIGURES_INIT;
  f.bytes_sent = c.bytes_sent();
  f.network_bytes_sent = c.network_bytes_sent();
  f.collectives = c.collectives();
  return f;
}

OptimizerFigures RemoteModel::optimizer() const {
  const v1::OptimizerInfo o = call(v1::ModelCall::OPTIMIZER_INFO, 0).call().optimizer();
  OptimizerFigures f;
  f.name = o.name();
  f.slots.assign(o.slots().begin(), o.slots().end());
  f.step = o.step();
  return f;
}

void RemoteModel::read_state(zd_param_id p, int slot, zd_dtype dt, void* dst, uint64_t bytes) {
  std::byte* st = client_.staging(bytes);
  v1::Request req;
  v1::ParamData* d = req.mutable_state_read();
  d->set_model(id_);
  d->set_param(p);
  d->set_slot(slot);
  d->set_dtype(dt);
  d->set_bytes(bytes);
  d->set_staging_offset(0);
  client_.rpc(req);
  if (dst) std::memcpy(dst, st, bytes);
}

void RemoteModel::write_state(zd_param_id p, int slot, zd_dtype dt, const void* src, uint64_t bytes) {
  std::byte* st = client_.staging(bytes);
  if (src) std::memcpy(st, src, bytes);
  v1::Request req;
  v1::ParamData* d = req.mutable_state_write();
  d->set_model(id_);
  d->set_param(p);
  d->set_slot(slot);
  d->set_dtype(dt);
  d->set_bytes(src ? bytes : 0);
  d->set_staging_offset(0);
  client_.rpc(req);
}

void RemoteModel::set_step(int64_t step) { call(v1::ModelCall::SET_STEP, 0, step); }

void RemoteModel::report(uint64_t tokens, uint64_t samples, bool has_loss, double loss) {
  v1::Request req;
  v1::ModelCall* c = req.mutable_call();
  c->set_model(id_);
  c->set_op(v1::ModelCall::REPORT);
  v1::Progress* p = c->mutable_progress();
  p->set_tokens(tokens);
  p->set_samples(samples);
  p->set_has_loss(has_loss);
  p->set_loss(loss);
  client_.rpc(req);
}

}  // namespace

std::unique_ptr<ClientBackend> make_remote_client(const std::string& path, uint32_t timeout_ms) {
  return std::make_unique<RemoteClient>(path, timeout_ms);
}

}  // namespace zerod::abi
