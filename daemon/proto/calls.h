// The table of model calls: every call a trainer makes on a model after
// registration, written once. libzerod's C functions turn their arguments
// into an Args, the backend carries it (embedded: straight here; daemon: the
// call ring or a socket frame to the session, which comes here), and
// dispatch() checks it and runs it on the engine's Model as the rank. Adding
// a call means one table entry, one Op, and the C function that fills Args.
//
// Args and the fixed part of Outcome are plain data: they are what crosses
// the call ring byte for byte (ring_call.h), so nothing in them points.
#pragma once

#include "model.h"

#include <zerod/zerod.h>

#include <cstdint>
#include <string>
#include <vector>

namespace zerod::calls {

enum class Op : uint32_t {
  finalize = 1,
  forward_begin = 2,
  forward_end = 3,
  backward_begin = 4,
  backward_end = 5,
  param_view = 6,
  grad_view = 7,
  step = 8,
  loss_scale = 9,
  set_stream = 10,
  param_read = 11,
  param_write = 12,
  state_read = 13,
  state_write = 14,
  set_step = 15,
  optimizer_info = 16,
  memory = 17,
  comm_figures = 18,
  save = 19,    // data: the checkpoint directory (a.bytes characters, absolute through a daemon)
  load = 20,    // likewise
  report = 21,  // tokens, samples, has_loss, loss
};
inline constexpr uint32_t kOpCount = 22;  // one past the last

struct Args {
  Op op = Op::finalize;
  int32_t module = 0;  // begin/end
  int32_t param = 0;   // views, whole-parameter and state calls
  int32_t slot = 0;    // state calls
  int32_t dtype = 0;   // whole-parameter and state calls
  int32_t rank = -1;   // memory, comm_figures: -1 = the caller
  int32_t tier = 0;    // memory
  int32_t kind = 0;    // memory
  int64_t step = 0;    // set_step
  uint64_t bytes = 0;  // whole-parameter and state calls: the buffer's size; save, load: the path's length
  uint64_t tokens = 0, samples = 0;  // report
  double loss = 0.0;                 // report, when has_loss
  int32_t has_loss = 0;              // report: 0 or 1
};

// What a call answers. The fields a call does not set keep their defaults.
struct Outcome {
  StepFigures step;           // step
  double loss_scale = 1.0;    // every call: the rank's loss scale after it
  uint64_t current = 0, peak = 0, budget = 0;  // memory
  zd_comm_figures comm{};     // comm_figures
  int64_t applied_steps = 0;  // optimizer_info
  // In-process only (not in the ring's fixed reply):
  ViewInfo view;                      // param_view, grad_view
  std::string optimizer;              // optimizer_info
  std::vector<std::string> slots;     // optimizer_info
};

// The C function's name for an op ("zd_forward_begin"), or "zd_?" for none.
const char* name(Op op);
bool valid(uint32_t op);

// Argument checks that need only the registry and the job's size: ids,
// dtypes, ranges, and the caller's buffer (data: the pointer the caller
// passed; size in a.bytes). Both modes run this same function: libzerod
// before it copies anything into shared memory, and dispatch() below
// (which is what the daemon runs) before the engine sees the call.
void check(const Registry& reg, int world_size, const Args& a, const void* data);

// check(), then the call on the model as `rank`. data: the buffer of a
// whole-parameter or state call (the caller's own in embedded mode, the
// staging memfd in the daemon), or the stream of set_stream.
Outcome dispatch(Model& m, int rank, const Args& a, void* data);

}  // namespace zerod::calls
