#include "collective_board.h"

namespace zerod::observe {

CollectiveBoard::CollectiveBoard(int first_rank, int ranks)
    : first_(first_rank), ranks_(ranks), lanes_(new Lane[static_cast<size_t>(ranks)]) {
  reset();
}

void CollectiveBoard::bind(int rank, const RankProbe* probe) {
  const int i = rank - first_;
  if (i >= 0 && i < ranks_) lanes_[static_cast<size_t>(i)].probe = probe;
}

void CollectiveBoard::reset() {
  for (int i = 0; i < ranks_; ++i) {
    Lane& l = lanes_[static_cast<size_t>(i)];
    l.next.store(0);
    for (size_t s = 0; s < kSlots; ++s) {
      l.seq[s].store(0);
      l.ns[s].store(0);
    }
  }
}

CollectiveBoard::Arrival CollectiveBoard::arrive(int rank) {
  Arrival a;
  a.ns = now_ns();
  const int i = rank - first_;
  if (i < 0 || i >= ranks_) return a;
  Lane& l = lanes_[static_cast<size_t>(i)];
  a.seq = l.next.fetch_add(1, std::memory_order_relaxed);
  const size_t s = a.seq % kSlots;
  l.ns[s].store(a.ns, std::memory_order_relaxed);
  l.seq[s].store(a.seq + 1, std::memory_order_release);
  return a;
}

uint64_t CollectiveBoard::arrivals(int rank) const {
  const int i = rank - first_;
  return i >= 0 && i < ranks_ ? lanes_[static_cast<size_t>(i)].next.load(std::memory_order_acquire) : 0;
}

void CollectiveBoard::complete(int rank, const Arrival& a, const char* op, uint64_t tag, uint64_t bytes) {
  const int i = rank - first_;
  if (i < 0 || i >= ranks_) return;
  const int64_t done = now_ns();
  const RankProbe* me = lanes_[static_cast<size_t>(i)].probe;
  // The latest arrival at the same collective among the other ranks here.
  int64_t latest = a.ns;
  int late = -1;
  const size_t s = a.seq % kSlots;
  for (int j = 0; j < ranks_; ++j) {
    if (j == i) continue;
    const Lane& l = lanes_[static_cast<size_t>(j)];
    if (l.seq[s].load(std::memory_order_acquire) != a.seq + 1) continue;
    const int64_t t = l.ns[s].load(std::memory_order_relaxed);
    if (l.seq[s].load(std::memory_order_acquire) != a.seq + 1) continue;
    if (t > latest) {
      latest = t;
      late = j;
    }
  }
  const int64_t waited = latest - a.ns;
  if (!me) return;
  RankCounters& c = me->counters();
  if (late >= 0 && waited > 0) {
    add_relaxed(c.peer_wait_ns, waited);
    if (late < c.ranks) {
      add_relaxed(c.peer_wait_by_late[static_cast<size_t>(late)], waited);
      c.late_count[static_cast<size_t>(late)].fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (!me->tracing()) return;
  EventArgs args;
  args.bytes = bytes;
  args.value = static_cast<int64_t>(tag);
  if (late >= 0 && waited > 0) {
    args.peer = first_ + late;
    args.value2 = waited;
    EventArgs w;
    w.peer = first_ + late;
    w.value2 = waited;
    me->span("comm", "wait for rank", a.ns, latest, w);
  }
  me->span("comm", op, a.ns, done, args);
}

}  // namespace zerod::observe
