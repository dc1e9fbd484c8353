// The failure messages of the communicator: what a rank's last_error() says
// after a disagreement, a timeout, an invalid call, or a call made after the
// communicator failed. Collectives are numbered from #1 in the order every
// rank calls them.
#ifndef ZEROD_COMM_LOCAL_MESSAGES_H
#define ZEROD_COMM_LOCAL_MESSAGES_H

#include <cstdint>

#include "call.h"
#include "text.h"

namespace zerod::comm {

constexpr uint64_t kNoCollective = UINT64_MAX;
// A `what` longer than this is cut in messages.
constexpr size_t kWhatMax = 160;
constexpr size_t kMessageMax = 2048;

// What the communicator last saw of a rank: the collective it last arrived
// at (counted from 0) and the `what` it gave there; its Call is kept beside.
struct Seen {
  uint64_t seq = kNoCollective;
  char what[kWhatMax] = "";
};

// ranks disagree at collective #12: rank 0 is in "..." (reduce_scatter sum,
// 1024 f32), rank 1 is in "..." (all_gather, 512 f32)
void say_disagreement(Text& t, uint64_t seq, int a, const Call& ca, const char* wa, int b, const Call& cb,
                      const char* wb);

// timeout at collective #12 (all_reduce sum, 8 f32): rank 0 waited 100 ms;
// arrived: ranks 0, 1 in "..."; not arrived: rank 2 (last seen in
// collective #11, "..."). calls and seen hold `world` served ranks, first
// first_rank; calls[index] is the waiting rank's call.
void say_timeout(Text& t, uint64_t seq, int index, int first_rank, uint64_t waited_ms, const Call* calls,
                 const Seen* seen, int world);

// rank 1's call "..." at collective #12 is invalid: buf is NULL with count 8
void say_invalid(Text& t, uint64_t seq, int rank, const char* what, const char* why);

// rank 2's collective #12 "..." was not run: <the failure>
void say_gone(Text& t, uint64_t seq, int rank, const char* what, const char* failure);

}  // namespace zerod::comm

#endif  // ZEROD_COMM_LOCAL_MESSAGES_H
