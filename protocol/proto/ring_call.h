// A model call as it travels between libzerod and the daemon: fixed records
// copied byte for byte, both ends built from the same source. They are the
// only encoding of a model call, with two carriers: the call ring
// (transport/ring.h: the request slot, the reply slot), or, without a ring,
// socket frames (wire::kCall with a RingRequest as its body, answered by
// wire::kCallReply with the bytes the reply slot would hold). The call
// itself is base/call_record.h's Args, and the step's figures are its
// StepFigures, the very types the engine's dispatcher takes and returns. The
// daemon copies a request out of the shared slot before it reads any field,
// and checks every field it uses.
//
// Data that does not fit a record goes through the client's staging memfd
// at staging_offset: a whole parameter or state slot (args.bytes), and the
// checkpoint directory of save and load (args.bytes characters, absolute).
// Text that does not fit comes after the reply's views (message_bytes): an
// error's message, or, for optimizer_info, the optimizer's name and then
// each state slot's, each ended by a NUL.
#pragma once

#include "call_record.h"

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace zerod::wire {

enum class RingKind : uint32_t {
  call = 1,          // a table call: RingRequest::args
  socket_frame = 2,  // (the ring only) the request is the next frame on the socket, and so is its reply
};

struct RingRequest {
  RingKind kind;
  int32_t model;
  uint64_t staging_offset;  // whole-parameter and state calls: where the data is in the staging memfd
  calls::Args args;
  // 1: a zd_forward_end the client deferred (`deferred`, same model) runs
  // first; if it fails, the reply carries its error and `args` does not run.
  // Only forward_end is deferred: no other rank waits for it (remote.cpp).
  int32_t has_deferred;
  int32_t reserved;
  calls::Args deferred;
};

// A view in the rank's arenas, as a _begin call returns it.
struct RingView {
  int32_t param;
  int32_t gradient;  // 0 or 1
  int32_t arena;
  int32_t reserved;
  uint64_t offset;
  uint64_t bytes;
};

struct RingReply {
  int32_t status;          // a zd_status
  uint32_t message_bytes;  // the text after the views: an error's message, or optimizer_info's names
  uint32_t view_count;     // RingViews after this record
  // How many socket frames with new arena fds (each a v1::Reply, at most
  // transport::kMaxFdsPerFrame fds) were sent before this reply: 0, 1, or
  // more for a client whose hello said arena_batches (wire::send_arenas).
  uint32_t arenas_follow;
  calls::Figures figures;  // the answer's fixed part, as the dispatcher's Outcome holds it
};

static_assert(std::is_trivially_copyable_v<RingRequest> && std::is_trivially_copyable_v<RingReply> &&
                  std::is_trivially_copyable_v<RingView>,
              "ring records are copied as bytes");

// The reply's bytes are those of the record before Figures was a struct of
// its own (the figures one by one after arenas_follow): a client and a
// daemon built apart still agree.
static_assert(offsetof(RingReply, figures) == 16 && offsetof(calls::Figures, loss_scale) == 48 &&
              offsetof(calls::Figures, bytes_sent) == 80 && offsetof(calls::Figures, applied_steps) == 104 &&
              sizeof(RingReply) == 128);

// No record has padding: every byte is a named field, set by the sender
// (Args and StepFigures name their would-be padding `reserved`), so none
// carries the sender's stray memory to the other process.
static_assert(sizeof(calls::Args) == offsetof(calls::Args, reserved) + sizeof(int32_t) &&
              offsetof(calls::Args, reserved) == offsetof(calls::Args, has_loss) + sizeof(int32_t) &&
              offsetof(calls::Args, has_loss) == offsetof(calls::Args, value) + sizeof(double) &&
              offsetof(calls::Args, step) == offsetof(calls::Args, kind) + sizeof(int32_t));
// And the record's size and its last fields where they have always been:
// a call added since (set_lr, ABI 1.7) took a field already there.
static_assert(offsetof(calls::Args, value) == 64 && sizeof(calls::Args) == 80);
static_assert(offsetof(StepFigures, reserved) == 3 * sizeof(bool) &&
              offsetof(StepFigures, step) == offsetof(StepFigures, reserved) + sizeof(StepFigures::reserved));
static_assert(offsetof(RingRequest, args) == 16 && offsetof(RingRequest, has_deferred) == 16 + sizeof(calls::Args) &&
              offsetof(RingRequest, deferred) == offsetof(RingRequest, reserved) + sizeof(int32_t) &&
              sizeof(RingRequest) == offsetof(RingRequest, deferred) + sizeof(calls::Args));
static_assert(sizeof(RingView) == 4 * sizeof(int32_t) + 2 * sizeof(uint64_t));

// The size the ring's request slot has, and the reply slot's least size.
inline constexpr uint64_t kRingRequestBytes = 256;
static_assert(sizeof(RingRequest) <= kRingRequestBytes);

// The largest kCallReply body the daemon sends: the room of the reply slot
// of libzerod's ring (1 MiB), so a call answers alike on both carriers.
inline constexpr uint64_t kCallReplyBytes = (uint64_t{1} << 20) - kRingRequestBytes;

}  // namespace zerod::wire
