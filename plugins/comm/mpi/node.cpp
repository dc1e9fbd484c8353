#include "node.h"

#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <new>

#include "mpi_env.h"
#include "plugin_text.h"
#include "staging.h"

namespace zerod::comm::mpi {
namespace {

using zerod::comm::set_error;

// The layout this process must have, from MPI: node = MPI rank, nodes = MPI
// size, and as many ranks on every node.
zd_status check_layout(const Process& p, const zd_comm_config& c, char* err, size_t size) {
  const int world = c.world_size, first = c.first_local_rank, local = c.local_ranks;
  if (world == p.nodes * local && first == p.node * local) return ZD_OK;
  if (p.nodes == 1) {
    set_error(err, size,
        "this daemon is the only MPI process, so it would serve all %d ranks, but it serves %d of the job's %d "
        "(ranks %d-%d): start one daemon per node under MPI, e.g. mpirun -np %d ... zerod run --nproc %d (or "
        "srun), or use comm = { backend = \"local\" } for one node",
        world, local, world, first, first + local - 1, world % local == 0 ? world / local : world, local);
  } else {
    set_error(err, size,
        "MPI process %d of %d serves ranks %d-%d of %d, but the mpi comm plugin expects one daemon per node in "
        "node order, each with the same number of ranks: with %d ranks here it should serve ranks %d-%d of "
        "world_size %d (nodes x local ranks). Start the daemons with the same --nproc, one per node",
        p.node, p.nodes, first, first + local - 1, world, local, p.node * local, p.node * local + local - 1,
        p.nodes * local);
  }
  return ZD_ERR_CONFIG;
}

// Every daemon must agree on the layout and the segment size (both sides
// of a transfer cut it alike).
zd_status check_daemons(const std::vector<Link::Hello>& all, const Link::Hello& mine, int node, char* err,
                        size_t size) {
  for (size_t m = 0; m < all.size(); ++m) {
    const Link::Hello& h = all[m];
    const bool same = h.world == mine.world && h.local == mine.local && h.piece == mine.piece &&
                      h.first == static_cast<int32_t>(m) * mine.local;
    if (same) continue;
    set_error(err, size,
        "the daemons disagree: node %zu (host %s, pid %" PRId64 ") has world_size %d, ranks %d-%d, segment %" PRIu64
        "; node %d (this one) has world_size %d, ranks %d-%d, segment %" PRIu64,
        m, h.host, h.pid, h.world, h.first, h.first + h.local - 1, h.piece, node, mine.world, mine.first,
        mine.first + mine.local - 1, mine.piece);
    return ZD_ERR_CONFIG;
  }
  return ZD_OK;
}

}  // namespace

Node::Node(Topology topo, const Settings& s, std::unique_ptr<Link> link)
    : topo_(std::move(topo)),
      settings_(s),
      rv_(topo_.world, topo_.first_rank(topo_.node), topo_.local, s.spin_us),
      srcs_(new const void*[static_cast<size_t>(topo_.local) * static_cast<size_t>(topo_.local)]),
      dsts_(new void*[static_cast<size_t>(topo_.local)]),
      net_(new Net(rv_, topo_, std::move(link), NetSettings{s.timeout_s, s.spin_us})) {
  instance_opened();
}

Node::~Node() {
  // A request of a failed collective may still touch the staging buffer.
  if (net_->shutdown()) keep_until_exit(staging_);
  net_.reset();
  instance_closed();
}

zd_status Node::create(const zd_host_services* host, const Settings& s, const zd_comm_config& cfg,
                       std::unique_ptr<Node>* out, char* err, size_t err_size) noexcept {
  Process p;
  zd_status st = init(&p, err, err_size);
  if (st != ZD_OK) return st;
  st = open(host, p, s, cfg, out, err, err_size);
  // A failed create may leave a request posted with a daemon that is gone
  // or never came: MPI_Finalize must not wait on it without the watchdog.
  if (st != ZD_OK) instance_failed();
  return st;
}

zd_status Node::open(const zd_host_services* host, const Process& p, const Settings& s, const zd_comm_config& cfg,
                     std::unique_ptr<Node>* out, char* err, size_t err_size) noexcept {
  // Across nodes a daemon that refuses its layout still takes part in the
  // exchange (Link::open), so that the others fail at once with its words;
  // alone, it just refuses.
  char refusal[1024] = "";
  const zd_status layout = check_layout(p, cfg, refusal, sizeof refusal);
  if (layout != ZD_OK && p.nodes == 1) {
    set_error(err, err_size, "%s", refusal);
    return layout;
  }
  try {
    Topology topo;
    topo.world = cfg.world_size;
    topo.nodes = p.nodes;
    topo.node = p.node;
    topo.local = cfg.local_ranks;
    topo.segment = s.segment;
    std::unique_ptr<Link> link;
    if (p.nodes > 1) {
      Link::Hello mine;
      mine.world = cfg.world_size;
      mine.first = cfg.first_local_rank;
      mine.local = cfg.local_ranks;
      mine.refused = static_cast<int16_t>(layout);
      mine.piece = s.segment;
      mine.pid = p.pid;
      copy_text(mine.host, sizeof mine.host, p.host.c_str());
      std::vector<Link::Hello> all;
      zd_status st = Link::open(p, mine, refusal, s.timeout_s, s.spin_us, s.segment, &link, &all, err, err_size);
      if (st != ZD_OK) return st;
      st = check_daemons(all, mine, p.node, err, err_size);
      if (st != ZD_OK) return st;
      for (const Link::Hello& h : all) {
        topo.hosts.emplace_back(h.host);
        topo.pids.push_back(h.pid);
      }
    } else {
      topo.hosts.push_back(p.host);
      topo.pids.push_back(p.pid);
    }
    out->reset(new Node(std::move(topo), s, std::move(link)));
  } catch (const std::bad_alloc&) {
    set_error(err, err_size, "out of memory creating the instance");
    return ZD_ERR_OUT_OF_MEMORY;
  } catch (...) {
    set_error(err, err_size, "internal error creating the instance");
    return ZD_ERR_INTERNAL;
  }
  const Topology& t = (*out)->topo_;
  zerod::comm::log_info(host, "mpi", "node %d of %d (host %s), ranks %d-%d of %d, %s, timeout %g s, segment %" PRIu64 " bytes", t.node,
           t.nodes, t.hosts[static_cast<size_t>(t.node)].c_str(), t.first_rank(t.node),
           t.first_rank(t.node) + t.local - 1, t.world,
           p.thread_level == MPI_THREAD_MULTIPLE ? "MPI_THREAD_MULTIPLE" : "MPI_THREAD_SERIALIZED (calls serialised)",
           s.timeout_s, s.segment);
  return ZD_OK;
}

bool Node::reserve(int index, uint64_t bytes) noexcept {
  rv_.meet(index);
  if (index == 0) {
    try {
      // Grown with room, so that sizes that creep up do not reallocate
      // every time.
      const uint64_t want = bytes + bytes / 4;
      staging_ = std::shared_ptr<uint8_t[]>(new uint8_t[want]);
      capacity_ = want;
    } catch (const std::bad_alloc&) {
      reserve_failed_ = true;
      char msg[256];
      std::snprintf(msg, sizeof msg, "node %d could not allocate %" PRIu64 " bytes of staging for a collective",
                    topo_.node, bytes);
      rv_.fail(ZD_ERR_OUT_OF_MEMORY, msg);
    }
  }
  rv_.meet(index);
  return !reserve_failed_;
}

zd_status Node::started(const Rendezvous::Started& s) noexcept {
  const int i = s.index;
  const Call& me = s.calls[i];
  if (s.last) {
    Net::Job job;
    job.seq = s.seq;
    job.call = me;
    job.call.send = nullptr;
    job.call.recv = nullptr;
    job.call.invalid = nullptr;
    copy_text(job.what, sizeof job.what, s.seen[0].what);
    job.deadline = s.deadline;
    job.since = s.deadline == Net::Clock::time_point::max() ? Net::Clock::now() : s.since;
    job.timeout_ms = s.timeout_ms;
    net_->post(job);
  }
  const Layout l = layout(me, topo_);
  // Every rank sees the same capacity here: it changes only inside reserve().
  if (l.total > capacity_ && !reserve(i, l.total)) return rv_.take_failure(i);
  const size_t n = static_cast<size_t>(topo_.local);
  stage_in(s.calls, topo_, i, staging_.get(), l, Scratch{srcs_.get() + static_cast<size_t>(i) * n, dsts_.get() + i});
  rv_.meet(i);
  if (i == 0) net_->staged(s.seq, staging_.get());
  if (!rv_.await(net_->done(), s.seq)) return rv_.take_failure(i);
  stage_out(me, topo_, i, staging_.get(), l);
  const int rank = topo_.first_rank(topo_.node) + i;
  rv_.count(i, ring_bytes(me, topo_.world, rank), me.compressed ? 0 : 1);
  return ZD_OK;
}

zd_comm_figures Node::figures(int rank) const noexcept {
  zd_comm_figures f{};
  f.struct_size = sizeof f;
  const int first = topo_.first_rank(topo_.node);
  if (rank < first || rank >= first + topo_.local) return f;
  f.bytes_sent = rv_.bytes_sent(rank);
  f.network_bytes_sent = net_->network_bytes();
  f.collectives = rv_.collectives(rank);
  return f;
}

}  // namespace zerod::comm::mpi
