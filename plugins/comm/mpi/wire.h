// What daemons tell each other besides the data: a header per collective
// (every daemon's ranks have arrived at collective #k, and which call it is)
// and a failure notice. Plain fixed-size records sent as MPI_BYTE: the
// daemons of a job run the same build on the same architecture.
#ifndef ZEROD_COMM_MPI_WIRE_H
#define ZEROD_COMM_MPI_WIRE_H

#include <zerod/zerod_plugin.h>

#include <cstddef>
#include <cstdint>

#include "call.h"
#include "messages.h"

namespace zerod::comm::mpi {

// MPI tags on an instance's own communicator. Between two daemons, messages
// of one tag are matched in the order they were posted (MPI's
// non-overtaking rule), and every daemon posts in the same order, so one tag
// per kind is enough.
enum Tag : int { kTagHeader = 1, kTagNotice = 2, kTagData = 3 };

// A small all_reduce travels whole with the header: one message each way
// instead of three (header, reduce-scatter, all-gather), at the cost of
// sending the whole partial to every daemon, which for this size is less
// than the latency it saves.
constexpr uint32_t kEagerBytes = 4096;

struct Header {
  uint64_t seq = 0;  // the collective, counted from 0
  int32_t node = 0;
  int32_t coll = 0;
  uint64_t tag = 0;
  uint64_t count = 0;
  int32_t dtype = 0;
  int32_t op = 0;
  int32_t root = 0;
  int32_t compressed = 0;
  uint64_t compressed_count = 0;
  uint32_t payload = 0;      // bytes of the daemon's partial after the header (eager)
  uint32_t reserved = 0;
  char what[kWhatMax] = "";  // the `what` of the daemon's first rank
};

// What is sent: the header, then the payload's bytes right after it (at a
// multiple of 8: aligned for any element type).
struct Envelope {
  Header header;
  uint8_t payload[kEagerBytes];
};
static_assert(offsetof(Envelope, payload) == sizeof(Header) && sizeof(Header) % 8 == 0,
              "the payload follows the header, 8-byte aligned");

// Whether collective c of daemons of `nodes` goes eager.
bool eager(const Call& c, int nodes);

struct Notice {
  int32_t status = 0;
  int32_t node = 0;
  // Collectives the sender's network thread had completed when it failed:
  // a receiver still finishes those (their data was all sent) and fails
  // from the next one, so that a daemon whose ranks leave right after a
  // collective does not fail the others' tail of that same collective.
  uint64_t completed = 0;
  char message[kMessageMax] = "";
};

Header header_of(uint64_t seq, int node, const Call& c, const char* what);
// The call a header describes, without buffers.
Call call_of(const Header& h);

}  // namespace zerod::comm::mpi

#endif  // ZEROD_COMM_MPI_WIRE_H
