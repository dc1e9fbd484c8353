// The record of one model call: every call a trainer makes on a model after
// registration, as plain data. It is the vocabulary of the three floors a
// call crosses, so it lives here, under all of them: libzerod's C functions
// fill an Args; the protocol carries it byte for byte in a call ring record
// (protocol/proto/ring_call.h), with the step's figures in the fixed reply;
// and the engine's dispatcher (engine/calls/dispatch.h) checks it and runs
// it on the Model. Nothing in these records points, and nothing here needs
// the engine.
//
// Adding a call: an Op and its name below (and a field of Figures if it
// answers a new figure), its entry in the dispatcher's table
// (engine/calls/dispatch.cpp), and the C function that fills Args.
#pragma once

#include <zerod/zerod.h>

#include <cstdint>
#include <iterator>

namespace zerod {

// What a step did, as the engine's Model::step returns it and the call
// ring's reply carries it (the same bytes: one type on both sides).
struct StepFigures {
  bool boundary = false;
  bool applied = false;
  bool skipped = false;
  int64_t step = 0;
  int64_t micro_step = 0;
  double lr = 0.0;
  double loss_scale = 1.0;
  double grad_norm = 0.0;
};

namespace calls {

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

// The fixed part of a call's answer: what the call ring's reply record
// carries as it is (protocol/proto/ring_call.h), and the base of the
// dispatcher's Outcome. Value-initialized (Figures{}), every field is 0
// but step's defaults; the fields a call does not set keep those.
struct Figures {
  StepFigures step;          // step
  double loss_scale;         // every call: the rank's loss scale after it
  uint64_t current, peak, budget;                  // memory
  uint64_t bytes_sent, network_bytes_sent, collectives;  // comm_figures
  int64_t applied_steps;     // optimizer_info
};

// The C functions' names, indexed by Op.
inline constexpr const char* kNames[] = {
    "zd_?",
    "zd_model_finalize",
    "zd_forward_begin",
    "zd_forward_end",
    "zd_backward_begin",
    "zd_backward_end",
    "zd_param_view",
    "zd_grad_view",
    "zd_step",
    "zd_model_loss_scale",
    "zd_model_set_stream",
    "zd_param_read",
    "zd_param_write",
    "zd_optimizer_state_read",
    "zd_optimizer_state_write",
    "zd_model_set_step",
    "zd_model_optimizer_info",
    "zd_model_memory",
    "zd_model_comm_figures",
    "zd_model_save",
    "zd_model_load",
    "zd_model_report",
};
static_assert(std::size(kNames) == kOpCount, "one name per Op");

inline bool valid(uint32_t op) { return op >= 1 && op < kOpCount; }

// The C function's name for an op ("zd_forward_begin"), or "zd_?" for none.
inline const char* name(Op op) {
  return valid(static_cast<uint32_t>(op)) ? kNames[static_cast<uint32_t>(op)] : "zd_?";
}

}  // namespace calls
}  // namespace zerod
