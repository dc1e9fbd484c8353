#include "node.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <onebit.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "messages.h"
#include "plugin_text.h"

namespace zerod::comm::nccl {

namespace {

using Clock = std::chrono::steady_clock;

// What each rank says about its call before the call runs (check_calls):
// gathered from every rank, so that every rank of every daemon sees the
// same table and fails alike when they differ.
struct Desc {
  uint32_t coll;
  int32_t dtype;
  int32_t op;
  int32_t root;
  uint64_t tag;
  uint64_t count;
  uint64_t compressed_count;
  uint32_t compressed;
  uint32_t valid;
  int32_t rank;
  int32_t reserved;
  char what[120];
  char why[80];
};
static_assert(sizeof(Desc) == 256, "Desc is gathered as 256 bytes per rank");

// The instances this process has bootstrapped: every daemon creates its
// instances in the same order (new models under the server's lock; a
// kept model's recovery under its own, which keep_state across nodes,
// refused, never reaches), so the count agrees across daemons
// (bootstrap.h). A node that fails after the root sent every welcome (its
// read of the welcome lost) leaves the root one count ahead: the next
// create is refused as a restart alone, which is what restarting every
// node fixes. Only
// an exchange that succeeded counts. One that failed failed on every daemon
// that took part (the root tells them), and a create that failed before the
// exchange (no root address, say) never reached the others: counted, it
// made this daemon's next create claim a later instance than theirs, which
// the root refuses as a daemon restarted alone.
std::atomic<uint64_t> g_generation{0};

ncclDataType_t nccl_dtype(zd_comm_dtype d) {
  switch (d) {
    case ZD_COMM_BF16: return ncclBfloat16;
    case ZD_COMM_F16: return ncclFloat16;
    case ZD_COMM_F64: return ncclFloat64;
    case ZD_COMM_U8: return ncclUint8;
    default: return ncclFloat32;
  }
}

std::string describe_call(const Call& c, const char* what) {
  char buf[512];
  Text t(buf, sizeof buf);
  t.quoted(what, kWhatMax);
  t.add(" (");
  describe(t, c, true);
  t.add(")");
  return buf;
}

Call call_of(const Desc& d) {
  Call c;
  c.coll = static_cast<Coll>(d.coll);
  c.tag = d.tag;
  c.count = d.count;
  c.dtype = d.dtype;
  c.op = d.op;
  c.root = d.root;
  c.compressed = d.compressed != 0;
  c.compressed_count = d.compressed_count;
  return c;
}

// The calling thread's current device, put back at scope end: the
// plugin sets each rank's GPU around its work, and the engine's thread
// (which may drive a GPU of its own) finds its device as it left it.
class DeviceGuard {
 public:
  DeviceGuard() {
    if (cudaGetDevice(&device_) != cudaSuccess) {
      cudaGetLastError();
      device_ = -1;
    }
  }
  ~DeviceGuard() {
    if (device_ >= 0) cudaSetDevice(device_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_ = -1;
};

std::string this_host() {
  char h[256] = "";
  if (gethostname(h, sizeof h - 1) != 0) return "?";
  return h;
}

}  // namespace

struct RankState {
  int device = 0;
  ncclComm_t comm = nullptr;  // null once aborted; guarded by mu
  cudaStream_t stream = nullptr;
  void* scratch = nullptr;
  uint64_t scratch_bytes = 0;
  Desc* desc_dev = nullptr;  // world Descs on the rank's GPU
  Desc mine{};
  std::vector<Desc> descs;
  std::mutex mu;  // held around every NCCL call on comm, and by the aborter
  std::string error;
  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> collectives{0};
};

zd_status Node::create(const zd_host_services* host, const Settings& s, const zd_comm_config& cfg,
                       std::unique_ptr<Node>* out, char* err, size_t err_size) noexcept {
  try {
    if (cfg.world_size % cfg.local_ranks != 0 || cfg.first_local_rank % cfg.local_ranks != 0) {
      set_error(err, err_size,
                "the nccl backend expects one daemon per node in node order, each with the same number of ranks: "
                "this daemon serves ranks %d-%d of world_size %d, which is not such a block (start every daemon "
                "with the same --nproc)",
                cfg.first_local_rank, cfg.first_local_rank + cfg.local_ranks - 1, cfg.world_size);
      return ZD_ERR_CONFIG;
    }
    int gpus = 0;
    const cudaError_t ce = cudaGetDeviceCount(&gpus);
    if (ce != cudaSuccess || gpus == 0) {
      set_error(err, err_size,
                "the nccl backend runs collectives on GPUs, but this daemon sees none (cudaGetDeviceCount: %s); on "
                "nodes without GPUs use comm = { backend = \"mpi\" } (or \"local\" on one node)",
                ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
      cudaGetLastError();
      return ZD_ERR_CONFIG;
    }
    if (cfg.local_ranks > gpus) {
      set_error(err, err_size,
                "this daemon serves %d ranks but sees %d GPU%s: NCCL takes one rank per GPU in a process, so the "
                "nccl backend runs at most one rank per visible GPU in a daemon. Run more daemons of fewer ranks "
                "(two daemons on one GPU need distinct NCCL_HOSTID values), or use the mpi backend",
                cfg.local_ranks, gpus, gpus == 1 ? "" : "s");
      return ZD_ERR_CONFIG;
    }
    int version = 0;
    ncclGetVersion(&version);
    if (version < 21900) {
      set_error(err, err_size,
                "the nccl backend needs NCCL 2.19 or newer (non-blocking communicators and their asynchronous "
                "errors), but libnccl.so reports version code %d",
                version);
      return ZD_ERR_CONFIG;
    }
    const DeviceGuard guard;
    std::unique_ptr<Node> n(new Node());
    n->settings_ = s;
    n->world_ = cfg.world_size;
    n->first_ = cfg.first_local_rank;
    n->local_ = cfg.local_ranks;
    n->nodes_ = cfg.world_size / cfg.local_ranks;
    n->node_ = cfg.first_local_rank / cfg.local_ranks;

    BootstrapRequest req;
    req.node = n->node_;
    req.nodes = n->nodes_;
    req.world = n->world_;
    req.local = n->local_;
    req.generation = g_generation.load();
    req.timeout_s = s.timeout_s;
    req.host = this_host();
    req.pid = static_cast<int64_t>(getpid());
    req.log = [host](const std::string& m) { zerod::comm::log_info(host, "nccl", "%s", m.c_str()); };
    if (n->nodes_ > 1) {
      zd_status st = resolve_root(s.port, [](const char* k) { return std::getenv(k); }, &req.root, err, err_size);
      if (st != ZD_OK) return st;
    }
    if (n->node_ == 0) {
      ncclUniqueId id;
      const ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess) {
        set_error(err, err_size, "ncclGetUniqueId: %s (%s)", ncclGetErrorString(r), ncclGetLastError(nullptr));
        return ZD_ERR_IO;
      }
      static_assert(sizeof id == kIdBytes, "ncclUniqueId is 128 bytes");
      std::memcpy(req.id.data(), &id, kIdBytes);
    }
    BootstrapResult boot;
    zd_status st = bootstrap(req, &boot, err, err_size);
    if (st != ZD_OK) return st;
    g_generation.fetch_add(1);
    n->peers_ = std::move(boot.peers);
    n->fds_ = std::move(boot.fds);
    ncclUniqueId id;
    std::memcpy(&id, boot.id.data(), kIdBytes);

    for (int i = 0; i < n->local_; ++i) {
      auto r = std::make_unique<RankState>();
      r->device = i % gpus;
      r->descs.resize(static_cast<size_t>(n->world_));
      cudaError_t e = cudaSetDevice(r->device);
      if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking);
      if (e == cudaSuccess)
        e = cudaMalloc(reinterpret_cast<void**>(&r->desc_dev), sizeof(Desc) * static_cast<size_t>(n->world_));
      n->ranks_.push_back(std::move(r));
      if (e != cudaSuccess) {
        set_error(err, err_size, "rank %d on GPU %d: %s", n->first_ + i, i % gpus, cudaGetErrorString(e));
        cudaGetLastError();
        return ZD_ERR_IO;
      }
    }
    // Non-blocking: no NCCL call holds a thread that an abort must reach.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; i < n->local_ && (r == ncclSuccess || r == ncclInProgress); ++i) {
      RankState& rs = *n->ranks_[static_cast<size_t>(i)];
      cudaSetDevice(rs.device);
      r = ncclCommInitRankConfig(&rs.comm, n->world_, id, n->first_ + i, &config);
    }
    const ncclResult_t end = ncclGroupEnd();
    if (r == ncclSuccess || r == ncclInProgress) r = end;
    const auto deadline = s.timeout_s > 0 ? Clock::now() + std::chrono::microseconds(static_cast<int64_t>(s.timeout_s * 1e6))
                                          : Clock::time_point::max();
    for (int i = 0; i < n->local_ && (r == ncclSuccess || r == ncclInProgress); ++i) {
      RankState& rs = *n->ranks_[static_cast<size_t>(i)];
      ncclResult_t a = ncclInProgress;
      int looks = 0;
      while (rs.comm != nullptr && (a = ncclInProgress, ncclCommGetAsyncError(rs.comm, &a), a == ncclInProgress)) {
        if (Clock::now() > deadline) {
          set_error(err, err_size,
                    "node %d (host %s): NCCL's communicator for rank %d was not set up within %g s (comm.timeout): a "
                    "daemon of the job did not take part, or its GPUs cannot reach this node's (NCCL_DEBUG=INFO says "
                    "more)",
                    n->node_, req.host.c_str(), n->first_ + i, s.timeout_s);
          n->fail(ZD_ERR_TIMEOUT, err, true);
          return ZD_ERR_TIMEOUT;
        }
        // A daemon whose setup failed says so (below) and goes: the others
        // stop at once with its words instead of waiting out the timeout.
        // The root passes it on to the nodes that only hear from it.
        if (++looks % 10 == 0 && n->nodes_ > 1) {
          const std::string news = setup_news(n->fds_, n->peers_, n->node_);
          if (!news.empty()) {
            set_error(err, err_size, "NCCL's setup of ranks %d-%d stopped: %s", n->first_,
                      n->first_ + n->local_ - 1, news.c_str());
            n->fail(ZD_ERR_PEER_LOST, err, n->node_ == 0);
            return ZD_ERR_PEER_LOST;
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      r = a;
    }
    if (r != ncclSuccess) {
      set_error(err, err_size, "node %d (host %s): NCCL could not set up the communicator of ranks %d-%d: %s (%s)",
                n->node_, req.host.c_str(), n->first_, n->first_ + n->local_ - 1, ncclGetErrorString(r),
                ncclGetLastError(nullptr));
      n->fail(ZD_ERR_IO, err, true);  // the other daemons, waiting in their setup, stop with these words
      return ZD_ERR_IO;
    }
    if (n->nodes_ > 1) {
      if (pipe2(n->wake_, O_CLOEXEC) != 0) {
        set_error(err, err_size, "pipe2: %s", std::strerror(errno));
        return ZD_ERR_IO;
      }
      n->monitor_ = std::thread([p = n.get()] { p->monitor(); });
    }
    zerod::comm::log_info(host, "nccl", "node %d of %d (host %s), ranks %d-%d of %d on GPU%s %d%s, NCCL %d, timeout %g s",
                          n->node_, n->nodes_, req.host.c_str(), n->first_, n->first_ + n->local_ - 1, n->world_,
                          n->local_ == 1 ? "" : "s", n->ranks_[0]->device, n->local_ == 1 ? "" : "..", version,
                          s.timeout_s);
    *out = std::move(n);
    return ZD_OK;
  } catch (const std::bad_alloc&) {
    set_error(err, err_size, "out of memory creating the instance");
    return ZD_ERR_OUT_OF_MEMORY;
  } catch (...) {
    set_error(err, err_size, "internal error creating the instance");
    return ZD_ERR_INTERNAL;
  }
}

Node::~Node() {
  const DeviceGuard guard;
  if (monitor_.joinable()) {
    const char b = 1;
    // The monitor wakes on this byte (an empty pipe of our own: it fits).
    if (write(wake_[1], &b, 1) != 1) std::fprintf(stderr, "zerod nccl: could not wake the monitor thread\n");
    monitor_.join();
  }
  {
    // A goodbye first, so that the others do not take the closing
    // connection for a lost daemon.
    std::lock_guard<std::mutex> g(send_mu_);
    Notice bye;
    bye.kind = Notice::kBye;
    bye.node = node_;
    for (int fd : fds_) send_notice(fd, bye);
    close_fds(fds_);
  }
  for (int fd : wake_)
    if (fd >= 0) close(fd);
  // Finalize flushes what is in flight, on every local communicator first
  // (one may wait for another's), then each is destroyed once it settles;
  // one that does not within 10 s, or any of a broken instance, is aborted.
  const bool broken = broken_.load();
  std::vector<ncclResult_t> state(ranks_.size(), ncclSuccess);
  for (size_t i = 0; i < ranks_.size(); ++i) {
    RankState& r = *ranks_[i];
    if (r.comm == nullptr || broken) continue;
    cudaSetDevice(r.device);
    state[i] = ncclCommFinalize(r.comm);
  }
  const auto limit = Clock::now() + std::chrono::seconds(10);
  for (size_t i = 0; i < ranks_.size(); ++i) {
    RankState& r = *ranks_[i];
    cudaSetDevice(r.device);
    if (r.comm != nullptr) {
      ncclResult_t a = state[i];
      while (!broken && (a == ncclSuccess || a == ncclInProgress)) {
        a = ncclInProgress;
        ncclCommGetAsyncError(r.comm, &a);
        if (a != ncclInProgress || Clock::now() > limit) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (!broken && a == ncclSuccess) ncclCommDestroy(r.comm);
      else ncclCommAbort(r.comm);
      r.comm = nullptr;
    }
    if (r.stream != nullptr) {
      cudaStreamSynchronize(r.stream);
      cudaStreamDestroy(r.stream);
    }
    if (r.scratch != nullptr) cudaFree(r.scratch);
    if (r.desc_dev != nullptr) cudaFree(r.desc_dev);
  }
  cudaGetLastError();
}

void Node::fail(zd_status status, const std::string& message, bool tell) noexcept {
  {
    std::lock_guard<std::mutex> g(fail_mu_);
    if (broken_.load()) return;
    fail_status_ = status;
    try {
      fail_message_ = message;
    } catch (...) {
      fail_message_.clear();
    }
    broken_.store(true);
  }
  // The other daemons first: an abort can take seconds (it joins NCCL's
  // threads, which may be setting up connections to them).
  if (tell && nodes_ > 1) {
    Notice n;
    n.kind = Notice::kAbort;
    n.node = node_;
    n.status = status;
    try {
      n.reason = message;
    } catch (...) {
    }
    std::lock_guard<std::mutex> g(send_mu_);
    for (int fd : fds_) send_notice(fd, n);
  }
  // Every local communicator aborted: a rank waiting in NCCL sees its
  // communicator gone at its next poll and fails with the message.
  const DeviceGuard guard;
  for (auto& r : ranks_) {
    std::lock_guard<std::mutex> g(r->mu);
    if (r->comm == nullptr) continue;
    cudaSetDevice(r->device);
    ncclCommAbort(r->comm);
    r->comm = nullptr;
  }
}

zd_status Node::failed(int index) noexcept {
  RankState& r = *ranks_[static_cast<size_t>(index)];
  std::lock_guard<std::mutex> g(fail_mu_);
  try {
    r.error = fail_message_;
  } catch (...) {
  }
  return fail_status_;
}

void Node::abort(zd_status status, const char* reason) noexcept {
  char msg[kMessageMax];
  std::snprintf(msg, sizeof msg, "node %d (host %s, pid %" PRId64 ") aborted the collectives: %s", node_,
                peers_.empty() ? "?" : peers_[static_cast<size_t>(node_)].host.c_str(),
                peers_.empty() ? int64_t{0} : peers_[static_cast<size_t>(node_)].pid, reason ? reason : "(no reason)");
  fail(status == ZD_OK ? ZD_ERR_INVALID_STATE : status, msg, true);
}

const char* Node::last_error(int rank) const noexcept {
  if (rank < first_ || rank >= first_ + local_) return "";
  return ranks_[static_cast<size_t>(rank - first_)]->error.c_str();
}

zd_comm_figures Node::figures(int rank) const noexcept {
  zd_comm_figures f{};
  f.struct_size = sizeof f;
  if (rank < first_ || rank >= first_ + local_) return f;
  const RankState& r = *ranks_[static_cast<size_t>(rank - first_)];
  f.bytes_sent = r.bytes_sent.load();
  f.network_bytes_sent = network_bytes_.load();
  f.collectives = r.collectives.load();
  return f;
}

// The daemons' connections: notices in, a lost daemon named. The root
// forwards what it hears to every other node.
void Node::monitor() noexcept {
  try {
    watch();
  } catch (...) {
    // Out of memory in a notice's text: the connections go unwatched; a
    // lost daemon is then found by the collectives' timeouts.
  }
}

void Node::watch() {
  std::vector<bool> open(fds_.size(), false), said_bye(fds_.size(), false);
  for (size_t i = 0; i < fds_.size(); ++i) open[i] = fds_[i] >= 0;
  auto peer = [&](size_t i) {
    const int who = node_ == 0 ? static_cast<int>(i) : 0;
    char b[256];
    std::snprintf(b, sizeof b, "node %d (host %s, pid %" PRId64 ")", who, peers_[static_cast<size_t>(who)].host.c_str(),
                  peers_[static_cast<size_t>(who)].pid);
    return std::string(b);
  };
  auto forward = [&](const Notice& n, size_t except) {
    if (node_ != 0) return;
    std::lock_guard<std::mutex> g(send_mu_);
    for (size_t j = 0; j < fds_.size(); ++j)
      if (j != except && open[j]) send_notice(fds_[j], n);
  };
  while (true) {
    std::vector<pollfd> p;
    std::vector<size_t> which;
    p.push_back(pollfd{wake_[0], POLLIN, 0});
    for (size_t i = 0; i < fds_.size(); ++i)
      if (open[i]) {
        p.push_back(pollfd{fds_[i], POLLIN, 0});
        which.push_back(i);
      }
    const int pr = poll(p.data(), p.size(), -1);
    if (pr < 0 && errno == EINTR) continue;
    if (pr < 0 || (p[0].revents & POLLIN)) return;
    for (size_t k = 1; k < p.size(); ++k) {
      if (p[k].revents == 0) continue;
      const size_t i = which[k - 1];
      Notice n;
      const int got = read_notice(fds_[i], &n);
      if (got == 1 && n.kind == Notice::kBye) {
        said_bye[i] = true;
        continue;
      }
      if (got == 1) {
        // The sender's message names itself.
        fail(n.status, n.reason, false);
        forward(n, i);
        continue;
      }
      open[i] = false;
      if (said_bye[i]) continue;  // a daemon that left in order
      Notice lost;
      lost.kind = Notice::kAbort;
      lost.node = node_ == 0 ? static_cast<int>(i) : 0;
      lost.status = ZD_ERR_PEER_LOST;
      lost.reason = peer(i) + (got == 0 ? " was lost: its daemon's connection to " : " sent garbage on its connection to ") +
                    (node_ == 0 ? "node 0" : "this node") +
                    (got == 0 ? " closed without a goodbye (the daemon died, or its host or network went down)"
                              : " (not a zerod nccl daemon's notice)");
      fail(lost.status, lost.reason, false);
      forward(lost, i);
    }
  }
}

zd_status Node::refused(int index, const zd_comm_call& call, const Call& c, int result) noexcept {
  const auto res = static_cast<ncclResult_t>(result);
  char msg[kMessageMax];
  std::snprintf(msg, sizeof msg, "node %d: NCCL refused rank %d's %s: %s (%s)", node_, call.rank,
                describe_call(c, call.what).c_str(), ncclGetErrorString(res),
                ncclGetLastError(nullptr));
  // The other ranks are in the collective already: it fails for all.
  fail(ZD_ERR_INTERNAL, msg, true);
  return failed(index);
}

zd_status Node::wait(int index, const zd_comm_call& call, const Call& c) noexcept {
  RankState& r = *ranks_[static_cast<size_t>(index)];
  const auto start = Clock::now();
  const double limit_s = call.timeout_ms > 0 ? call.timeout_ms / 1000.0 : settings_.timeout_s;
  const auto deadline = limit_s > 0 ? start + std::chrono::microseconds(static_cast<int64_t>(limit_s * 1e6))
                                    : Clock::time_point::max();
  const auto spin = std::chrono::microseconds(static_cast<int64_t>(settings_.spin_us));
  while (true) {
    {
      std::lock_guard<std::mutex> g(r.mu);
      if (r.comm == nullptr) break;  // aborted: the failure is recorded
      ncclResult_t a = ncclSuccess;
      ncclCommGetAsyncError(r.comm, &a);
      if (a != ncclSuccess && a != ncclInProgress) {
        // A daemon that died shows here as NCCL's socket error, which does
        // not say who; the monitor names it once its connection closes, so
        // give it a moment to.
        r.mu.unlock();
        for (int i = 0; i < 100 && nodes_ > 1 && !broken_.load(); ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        r.mu.lock();
        if (broken_.load()) continue;
        char msg[kMessageMax];
        std::snprintf(msg, sizeof msg, "node %d: NCCL failed rank %d's %s: %s (%s)", node_, call.rank,
                      describe_call(c, call.what).c_str(), ncclGetErrorString(a), ncclGetLastError(nullptr));
        // fail() takes every rank's mu, this one's included.
        r.mu.unlock();
        fail(ZD_ERR_IO, msg, true);
        r.mu.lock();
        break;
      }
      if (a == ncclSuccess) {
        const cudaError_t q = cudaStreamQuery(r.stream);
        if (q == cudaSuccess) return ZD_OK;
        if (q != cudaErrorNotReady) {
          char msg[kMessageMax];
          std::snprintf(msg, sizeof msg, "node %d: rank %d's %s failed on GPU %d: %s", node_, call.rank,
                        describe_call(c, call.what).c_str(), r.device, cudaGetErrorString(q));
          r.mu.unlock();
          fail(ZD_ERR_INTERNAL, msg, true);
          r.mu.lock();
          break;
        }
      }
    }
    if (broken_.load()) continue;  // the next pass finds the communicator gone
    const auto now = Clock::now();
    if (now > deadline) {
      char msg[kMessageMax];
      std::snprintf(msg, sizeof msg,
                    "node %d (host %s, pid %" PRId64 "): rank %d's %s did not complete within %g s: a rank of another "
                    "daemon did not arrive at it or was lost, or the ranks are in different collectives (with "
                    "comm.check = false nothing compares them)",
                    node_, peers_[static_cast<size_t>(node_)].host.c_str(), peers_[static_cast<size_t>(node_)].pid,
                    call.rank, describe_call(c, call.what).c_str(), limit_s);
      fail(ZD_ERR_TIMEOUT, msg, true);
      continue;
    }
    if (now - start > spin) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return failed(index);
}

zd_status Node::check_across(int index, const zd_comm_call& call, const Call& c, bool valid, const char* why) noexcept {
  RankState& r = *ranks_[static_cast<size_t>(index)];
  Desc& d = r.mine;
  d = Desc{};
  d.coll = static_cast<uint32_t>(c.coll);
  d.dtype = c.dtype;
  d.op = c.op;
  d.root = c.root;
  d.tag = c.tag;
  d.count = c.count;
  d.compressed_count = c.compressed_count;
  d.compressed = c.compressed;
  d.valid = valid;
  d.rank = call.rank;
  copy_text(d.what, sizeof d.what, call.what);
  copy_text(d.why, sizeof d.why, why);
  Desc* slot = r.desc_dev + call.rank;
  ncclResult_t res = ncclSuccess;
  cudaMemcpyAsync(slot, &d, sizeof d, cudaMemcpyHostToDevice, r.stream);
  {
    std::lock_guard<std::mutex> g(r.mu);
    if (r.comm == nullptr) return failed(index);
    res = ncclAllGather(slot, r.desc_dev, sizeof(Desc), ncclUint8, r.comm, r.stream);
  }
  if (res != ncclSuccess && res != ncclInProgress) return refused(index, call, c, res);
  // Waited for as the call itself: a timeout here names the rank's call.
  zd_status st = wait(index, call, c);
  if (st != ZD_OK) return st;
  if (cudaMemcpyAsync(r.descs.data(), r.desc_dev, sizeof(Desc) * r.descs.size(), cudaMemcpyDeviceToHost, r.stream) !=
          cudaSuccess ||
      cudaStreamSynchronize(r.stream) != cudaSuccess) {
    fail(ZD_ERR_INTERNAL, "node " + std::to_string(node_) + ": copying the ranks' call descriptions back failed", true);
    return failed(index);
  }
  // Every rank computes the same verdict from the same table.
  const Desc& first = r.descs[0];
  bool same = true, all_valid = true;
  for (const Desc& o : r.descs) {
    same = same && same_collective(call_of(o), call_of(first));
    all_valid = all_valid && o.valid;
  }
  if (same && all_valid) return ZD_OK;
  char msg[kMessageMax];
  Text t(msg, sizeof msg);
  if (!all_valid) {
    t.add("invalid arguments:");
    for (const Desc& o : r.descs)
      if (!o.valid) t.add(" rank %d's %s: %s;", o.rank, describe_call(call_of(o), o.what).c_str(), o.why);
  } else {
    t.add("the ranks are in different collectives:");
    for (const Desc& o : r.descs) t.add(" rank %d in %s;", o.rank, describe_call(call_of(o), o.what).c_str());
  }
  // Each daemon reaches the same verdict; none needs telling.
  fail(all_valid ? ZD_ERR_INVALID_STATE : ZD_ERR_INVALID_ARGUMENT, msg, false);
  return failed(index);
}

zd_status Node::execute(int index, const zd_comm_call& call, const Call& c) noexcept {
  RankState& r = *ranks_[static_cast<size_t>(index)];
  const uint64_t es = dtype_size(c.dtype);
  const auto W = static_cast<uint64_t>(world_);
  uint64_t in_b = 0, out_b = 0;
  const bool one_buffer = c.coll == Coll::all_reduce || c.coll == Coll::broadcast;
  switch (c.coll) {
    case Coll::all_reduce:
    case Coll::broadcast: in_b = out_b = c.count * es; break;
    case Coll::reduce_scatter: in_b = W * c.count * es, out_b = c.count * es; break;
    case Coll::all_gather: in_b = c.count * es, out_b = W * c.count * es; break;
    case Coll::all_to_all: in_b = out_b = W * c.count * es; break;
    case Coll::barrier: break;
  }
  ncclResult_t res = ncclSuccess;
  if (c.coll == Coll::barrier || c.count == 0) {
    if (c.coll == Coll::barrier && !settings_.check_calls) {
      // Without the call check nothing has met yet: a one-float all-reduce.
      {
        std::lock_guard<std::mutex> g(r.mu);
        if (r.comm == nullptr) return failed(index);
        res = ncclAllReduce(r.desc_dev, r.desc_dev, 1, ncclFloat32, ncclSum, r.comm, r.stream);
      }
      if (res != ncclSuccess && res != ncclInProgress) return refused(index, call, c, res);
      return wait(index, call, c);
    }
    return ZD_OK;
  }
  // Where each buffer is: a device pointer of this rank's GPU goes to NCCL
  // as it is; host memory through the rank's device scratch.
  auto on_device = [&](const void* p, const char* name, zd_status* bad) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) return false;
    if (a.device != r.device) {
      char msg[kMessageMax];
      std::snprintf(msg, sizeof msg, "rank %d's %s is memory of GPU %d, but its NCCL rank runs on GPU %d", call.rank,
                    name, a.device, r.device);
      r.error = msg;
      *bad = ZD_ERR_INVALID_ARGUMENT;
    }
    return true;
  };
  zd_status bad = ZD_OK;
  const bool send_dev = on_device(c.send, "send buffer", &bad);
  const bool recv_dev = one_buffer ? send_dev : on_device(c.recv, "recv buffer", &bad);
  if (bad != ZD_OK) {
    // The others are in the collective already: the instance fails for all.
    fail(bad, "node " + std::to_string(node_) + ": " + r.error, true);
    return failed(index);
  }
  const uint64_t in_at = 0, in_need = send_dev ? 0 : (in_b + 255) / 256 * 256;
  const uint64_t out_at = one_buffer ? 0 : in_need, need = one_buffer ? in_need : in_need + (recv_dev ? 0 : out_b);
  if (need > r.scratch_bytes) {
    if (r.scratch != nullptr) cudaFree(r.scratch);
    r.scratch = nullptr;
    r.scratch_bytes = 0;
    const uint64_t want = need + need / 4;
    if (cudaMalloc(&r.scratch, want) != cudaSuccess) {
      cudaGetLastError();
      r.scratch = nullptr;
      fail(ZD_ERR_OUT_OF_MEMORY,
           "node " + std::to_string(node_) + ": rank " + std::to_string(call.rank) + " could not allocate " +
               std::to_string(want) + " bytes of GPU scratch for host buffers",
           true);
      return failed(index);
    }
    r.scratch_bytes = want;
  }
  auto* scratch = static_cast<uint8_t*>(r.scratch);
  const void* dsend = send_dev ? c.send : scratch + in_at;
  void* drecv = one_buffer ? const_cast<void*>(dsend) : recv_dev ? c.recv : scratch + out_at;
  if (!send_dev) cudaMemcpyAsync(const_cast<void*>(dsend), c.send, in_b, cudaMemcpyHostToDevice, r.stream);
  const ncclDataType_t dt = nccl_dtype(c.dtype);
  const ncclRedOp_t op = c.op == ZD_REDUCE_MAX ? ncclMax : ncclSum;
  {
    std::lock_guard<std::mutex> g(r.mu);
    if (r.comm == nullptr) return failed(index);
    switch (c.coll) {
      case Coll::all_reduce: res = ncclAllReduce(dsend, drecv, c.count, dt, op, r.comm, r.stream); break;
      case Coll::reduce_scatter: res = ncclReduceScatter(dsend, drecv, c.count, dt, op, r.comm, r.stream); break;
      case Coll::all_gather: res = ncclAllGather(dsend, drecv, c.count, dt, r.comm, r.stream); break;
      case Coll::broadcast: res = ncclBroadcast(dsend, drecv, c.count, dt, c.root, r.comm, r.stream); break;
      case Coll::all_to_all: {
        const uint64_t block = c.count * es;
        res = ncclGroupStart();
        for (int k = 0; k < world_ && (res == ncclSuccess || res == ncclInProgress); ++k) {
          res = ncclSend(static_cast<const uint8_t*>(dsend) + k * block, c.count, dt, k, r.comm, r.stream);
          if (res == ncclSuccess || res == ncclInProgress)
            res = ncclRecv(static_cast<uint8_t*>(drecv) + k * block, c.count, dt, k, r.comm, r.stream);
        }
        const ncclResult_t end = ncclGroupEnd();
        if (res == ncclSuccess || res == ncclInProgress) res = end;
        break;
      }
      case Coll::barrier: break;
    }
  }
  if (res != ncclSuccess && res != ncclInProgress) return refused(index, call, c, res);
  // Host outputs are written only once the collective is done, so that a
  // failed one leaves them as they were.
  zd_status st = wait(index, call, c);
  if (st != ZD_OK) return st;
  if (!recv_dev) {
    if (cudaMemcpyAsync(c.recv, drecv, out_b, cudaMemcpyDeviceToHost, r.stream) != cudaSuccess ||
        cudaStreamSynchronize(r.stream) != cudaSuccess) {
      cudaGetLastError();
      fail(ZD_ERR_INTERNAL,
           "node " + std::to_string(node_) + ": rank " + std::to_string(call.rank) + ": copying the result to host "
           "memory failed",
           true);
      return failed(index);
    }
  }
  return ZD_OK;
}

zd_status Node::run(const zd_comm_call* call, Call c) noexcept {
  // The other ranks are waiting for a call that will never come: fail them
  // all at once with the reason, as the local and mpi plugins do, rather
  // than leave them to the timeout. No rank's last_error can hold it here.
  if (call == nullptr || call->struct_size < sizeof(zd_comm_call)) {
    fail(ZD_ERR_INVALID_ARGUMENT,
         "node " + std::to_string(node_) + ": a collective was called with a " +
             (call == nullptr ? "NULL" : "short") + " zd_comm_call",
         true);
    return ZD_ERR_INVALID_ARGUMENT;
  }
  if (call->rank < first_ || call->rank >= first_ + local_) {
    char msg[kMessageMax];
    std::snprintf(msg, sizeof msg, "node %d: a collective (\"%.*s\") was called with rank %d, outside %d..%d%s", node_,
                  static_cast<int>(kWhatMax), call->what != nullptr ? call->what : "", call->rank, first_,
                  first_ + local_ - 1, local_ < world_ ? " (the ranks this daemon serves)" : "");
    fail(ZD_ERR_INVALID_ARGUMENT, msg, true);
    return ZD_ERR_INVALID_ARGUMENT;
  }
  const int index = call->rank - first_;
  RankState& r = *ranks_[static_cast<size_t>(index)];
  r.error.clear();
  if (broken_.load()) return failed(index);
  c.tag = call->tag;
  const DeviceGuard guard;
  cudaSetDevice(r.device);
  char why[256];
  Text t(why, sizeof why);
  const bool valid = check_call(c, world_, call->rank, t);
  zd_status st;
  if (settings_.check_calls) {
    st = check_across(index, *call, c, valid, why);
    if (st == ZD_OK) st = execute(index, *call, c);
  } else if (!valid) {
    char msg[kMessageMax];
    std::snprintf(msg, sizeof msg, "node %d: rank %d's %s: %s", node_, call->rank, describe_call(c, call->what).c_str(),
                  why);
    fail(ZD_ERR_INVALID_ARGUMENT, msg, true);
    st = failed(index);
  } else {
    st = execute(index, *call, c);
  }
  if (st != ZD_OK) return st;
  r.bytes_sent.fetch_add(ring_bytes(c, world_, call->rank));
  if (!c.compressed) r.collectives.fetch_add(1);
  // What a ring puts on this node's link to the next node: the sends of
  // its last rank, whose successor is on another daemon (an estimate: NCCL
  // may pick a tree or another ring order).
  if (nodes_ > 1 && index == local_ - 1) network_bytes_.fetch_add(ring_bytes(c, world_, call->rank));
  return ZD_OK;
}

zd_status Node::compressed_all_reduce(const zd_comm_call* call, float* buf, uint64_t count, float* worker_error,
                                      float* server_error) noexcept {
  Call step;
  step.coll = Coll::barrier;
  step.compressed = true;
  step.compressed_count = count;
  if (call == nullptr || call->struct_size < sizeof(zd_comm_call) || call->rank < first_ ||
      call->rank >= first_ + local_)
    return run(call, step);
  RankState& r = *ranks_[static_cast<size_t>(call->rank - first_)];
  if (count == 0) {
    const zd_status st = run(call, step);
    if (st == ZD_OK) r.collectives.fetch_add(1);
    return st;
  }
  if (buf == nullptr || worker_error == nullptr || server_error == nullptr) {
    step.invalid = buf == nullptr ? "buf is NULL" : worker_error == nullptr ? "worker_error is NULL" : "server_error is NULL";
    return run(call, step);
  }
  zd_status st;
  bool exchange_failed = false;
  try {
    onebit::Exchange ex;
    auto exchange = [&](Coll coll, const void* send, void* recv, uint64_t bytes) {
      Call c = step;
      c.coll = coll;
      c.dtype = ZD_COMM_U8;
      c.count = bytes;
      c.send = send;
      c.recv = recv;
      const zd_status s = run(call, c);
      exchange_failed = s != ZD_OK;
      return s;
    };
    ex.all_to_all = [&](const void* s, void* rv, uint64_t b) { return exchange(Coll::all_to_all, s, rv, b); };
    ex.all_gather = [&](const void* s, void* rv, uint64_t b) { return exchange(Coll::all_gather, s, rv, b); };
    st = onebit::compressed_all_reduce(call->rank, world_, buf, count, worker_error, server_error, ex);
  } catch (...) {
    st = ZD_ERR_OUT_OF_MEMORY;
  }
  if (st == ZD_OK) {
    r.collectives.fetch_add(1);
    return ZD_OK;
  }
  if (!exchange_failed) {
    // This rank's driver failed alone: the others wait in an exchange it
    // will never join.
    fail(st, "node " + std::to_string(node_) + ": rank " + std::to_string(call->rank) +
                 "'s compressed_all_reduce failed on that rank: out of memory for its scratch",
         true);
    return failed(call->rank - first_);
  }
  return st;
}

}  // namespace zerod::comm::nccl
