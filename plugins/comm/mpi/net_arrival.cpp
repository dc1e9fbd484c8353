// The arrival across nodes (the header exchange and its checks), and what
// an eager all_reduce does instead of an exchange: the network thread's
// side of steps 1 and 2 in net.h.
#include <sched.h>

#include <cstddef>
#include <cstdio>
#include <cstring>

#include "kernels.h"
#include "net.h"
#include "node_messages.h"

namespace zerod::comm::mpi {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

void Net::reduce_eager(const Job& job, uint8_t* staging) {
  void* mine = staging + layout(job.call, topo_).node;
  const void* srcs[64];
  std::vector<const void*> many;
  const void** src = srcs;
  if (topo_.nodes > 64) {
    many.resize(static_cast<size_t>(topo_.nodes));
    src = many.data();
  }
  for (int m = 0; m < topo_.nodes; ++m) {
    src[m] = m == topo_.node ? mine : headers_->in[static_cast<size_t>(m)].payload;
  }
  void* dsts[1] = {mine};
  ReduceJob r;
  r.srcs = src;
  r.nsrc = topo_.nodes;
  r.dsts = dsts;
  r.ndst = 1;
  r.count = job.call.count;
  r.dtype = dtype_of(job.call);
  r.op = reduce_of(job.call);
  reduce(r);
}

bool Net::arrive(const Job& job, const uint8_t* payload, uint32_t payload_bytes) {
  Headers& h = *headers_;
  h.mine.header = header_of(job.seq, topo_.node, job.call, job.what);
  h.mine.header.payload = payload_bytes;
  if (payload_bytes > 0) std::memcpy(h.mine.payload, payload, payload_bytes);
  h.theirs[static_cast<size_t>(topo_.node)] = h.mine.header;
  for (int m = 0; m < topo_.nodes; ++m) {
    if (m == topo_.node) continue;
    link_->post_recv(m, &h.in[static_cast<size_t>(m)], sizeof(Envelope), kTagHeader, false);
    link_->post_send(m, &h.mine, sizeof(Header) + payload_bytes, kTagHeader, false);
  }
  Clock::time_point deadline = job.deadline;
  Clock::time_point since = job.since;
  if (deadline == Clock::time_point::max() && settings_.timeout_s > 0) {
    since = Clock::now();
    deadline = since + seconds(settings_.timeout_s);
  }
  std::string error;
  const Link::Outcome out = link_->wait(deadline, Clock::duration::zero(), *this, &error);
  if (out == Link::Outcome::interrupted) {
    link_->abandon();
    return false;
  }
  char msg[kMessageMax];
  Text t(msg, sizeof msg);
  std::vector<bool> arrived(static_cast<size_t>(topo_.nodes), true);
  if (out != Link::Outcome::done) {
    for (int m : link_->pending_nodes(true)) arrived[static_cast<size_t>(m)] = false;
  }
  for (int m = 0; m < topo_.nodes; ++m) {
    if (m == topo_.node || !arrived[static_cast<size_t>(m)]) continue;
    h.theirs[static_cast<size_t>(m)] = h.in[static_cast<size_t>(m)].header;
    h.theirs[static_cast<size_t>(m)].what[kWhatMax - 1] = '\0';
  }
  for (int m = 0; m < topo_.nodes; ++m) {
    if (arrived[static_cast<size_t>(m)]) last_[static_cast<size_t>(m)] = h.theirs[static_cast<size_t>(m)];
  }
  if (out == Link::Outcome::expired) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count();
    say_node_timeout(t, h.mine.header, static_cast<uint64_t>(waited), arrived, last_, topo_);
    fail(ZD_ERR_TIMEOUT, msg);
    return false;
  }
  if (out == Link::Outcome::error) {
    link_->abandon();
    say_mpi_error(t, h.mine.header, error.c_str());
    fail(ZD_ERR_PEER_LOST, msg);
    return false;
  }
  if (say_if_disagree(t, h.theirs, topo_)) {
    fail(ZD_ERR_INVALID_STATE, msg);
    return false;
  }
  // An eager partial must be what this daemon expects (the headers agree,
  // so a short one would be a bug, not a user's mistake).
  for (int m = 0; m < topo_.nodes; ++m) {
    if (h.theirs[static_cast<size_t>(m)].payload != payload_bytes) {
      std::snprintf(msg, sizeof msg, "internal error: node %d sent %u bytes of data with the header of collective "
                    "#%llu, this daemon %u", m, h.theirs[static_cast<size_t>(m)].payload,
                    static_cast<unsigned long long>(job.seq + 1), payload_bytes);
      fail(ZD_ERR_INTERNAL, msg);
      return false;
    }
  }
  return true;
}

bool Net::await_staged(const Job& job, uint8_t** staging) {
  // Bounded memory work of this daemon's ranks: no deadline, but notices
  // and aborts still end it.
  // The ranks are working: after spin_us, give them the core.
  const Clock::time_point spin_end =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double, std::micro>(settings_.spin_us));
  while (staged_.load(std::memory_order_acquire) <= job.seq) {
    if (interrupted()) {
      link_->abandon();
      return false;
    }
    if (Clock::now() < spin_end) cpu_relax();
    else sched_yield();
  }
  *staging = staging_.load(std::memory_order_relaxed);
  return true;
}

}  // namespace zerod::comm::mpi
