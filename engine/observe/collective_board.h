// Who a collective waited for. Every served rank notes when it arrives at
// its k-th collective (ranks call collectives in the same order, so their
// k-th calls meet); when a rank's collective completes, the latest arrival
// among the ranks of this process is the one it waited for, and the time
// between its own arrival and that one is time spent waiting on another
// rank. Ranks of other nodes (the mpi plugin) are not seen here: their
// lateness shows as a longer collective, not as a named wait.
//
// Thread-safety: arrive/complete from any thread, one collective per rank
// at a time (the comm plugins' own rule). reset() while no rank is inside
// a collective.
#pragma once

#include "probe.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace zerod::observe {

class CollectiveBoard {
 public:
  CollectiveBoard(int first_rank, int ranks);
  void bind(int rank, const RankProbe* probe);
  void reset();

  struct Arrival {
    uint64_t seq = 0;
    int64_t ns = 0;
  };
  Arrival arrive(int rank);
  // op: "all_gather", ...; bytes: this rank's buffer; tag: zd_comm_call.tag.
  void complete(int rank, const Arrival& a, const char* op, uint64_t tag, uint64_t bytes);
  // Collectives the rank has arrived at since the last reset.
  uint64_t arrivals(int rank) const;

 private:
  static constexpr size_t kSlots = 8;  // ranks are at most one collective apart; 8 is ample
  struct alignas(64) Lane {
    std::atomic<uint64_t> next{0};
    std::atomic<uint64_t> seq[kSlots];  // seq + 1 of the arrival held; 0 = none
    std::atomic<int64_t> ns[kSlots];
    const RankProbe* probe = nullptr;
  };
  const int first_;
  const int ranks_;
  std::unique_ptr<Lane[]> lanes_;
};

}  // namespace zerod::observe
