// The dispatcher of the model calls (base/call_record.h): the checks of a
// call's arguments and the call run on the engine's Model as a rank. It is
// the engine's side of the call record, so it lives with the engine; the
// protocol that carries the record (protocol/proto) includes none of this.
// libzerod's embedded backend and the daemon's session run every call here.
#pragma once

#include "call_record.h"
#include "model/model.h"

#include <zerod/zerod.h>

#include <cstdint>
#include <string>
#include <vector>

namespace zerod::calls {

// What a call answers: the fixed figures the reply record carries
// (call_record.h), the view (answered by libzerod itself in daemon mode),
// and optimizer_info's names (the reply record's text in daemon mode).
// The fields a call does not set keep their defaults (0, a loss scale of 1).
struct Outcome : Figures {
  Outcome() : Figures{} { loss_scale = 1.0; }
  // In-process only (not in the ring's fixed reply):
  ViewInfo view;                      // param_view, grad_view
  std::string optimizer;              // optimizer_info
  std::vector<std::string> slots;     // optimizer_info
};

// Argument checks that need only the registry and the job's size: ids,
// dtypes, ranges, and the caller's buffer (data: the pointer the caller
// passed; size in a.bytes). Both modes run this same function: libzerod
// before it copies anything into shared memory, and dispatch() below
// (which is what the daemon runs: the trust boundary) before the engine
// sees the call. What needs the model's state (an optimizer's state slots,
// a step's sign against the step counter, the call order) the Model checks
// itself, in its own words; nothing is checked both here and there except
// check_whole_param, one function that the Model's public calls run too.

void check(const Registry& reg, int world_size, const Args& a, const void* data);

// check(), then the call on the model as `rank`. data: the buffer of a
// whole-parameter or state call (the caller's own in embedded mode, the
// staging memfd in the daemon), or the stream of set_stream.
Outcome dispatch(Model& m, int rank, const Args& a, void* data);

}  // namespace zerod::calls
