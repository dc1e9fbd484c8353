// What each rank is doing: its last call into the engine, on which module,
// since when. The engine updates it at every call; timeouts and `zerod
// status` read it to say which rank is where instead of just "timed out".
#pragma once

#include <zerod/zerod.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace zerod {

struct RankActivity {
  std::string call = "(none yet)";  // "forward_begin", "step", ...
  std::string module;               // "" when the call names none
  std::chrono::steady_clock::time_point since{};
  bool in_call = false;             // inside the call now (else returned from it)
  bool called = false;              // has made a call (call names it)
  bool joined = false;              // its trainer created the model or attached to it (mark_joined)
  int64_t step = 0;                 // applied steps
  int64_t micro_step = 0;
  bool lost = false;                // the rank's trainer went away
  std::string lost_reason;
  // The last accumulation boundary's figures.
  double lr = 0, loss_scale = 1, grad_norm = 0;
  bool last_skipped = false;
};

class ActivityTable {
 public:
  explicit ActivityTable(int world_size);

  void enter(int rank, const char* call, const std::string& module);
  void leave(int rank, int64_t step, int64_t micro_step);
  void mark_lost(int rank, const std::string& reason);
  // The rank's trainer created the model or attached to it (the daemon
  // says so). Once any rank has, describe() tells one that never did, and
  // made no call, as not having created the model; before, as having made
  // no call.
  void mark_joined(int rank);
  void clear_lost();
  void record_step(int rank, double lr, double loss_scale, double grad_norm, bool skipped);

  // With several nodes: the ranks this daemon serves; describe() names the
  // others as another node's.
  void set_local(int first, int count);

  std::vector<RankActivity> snapshot() const;
  // One line per rank: "rank 1: in forward_begin('fc2') for 31.2 s (step 4, micro-step 9)".
  std::string describe() const;

 private:
  mutable std::mutex mu_;
  std::vector<RankActivity> ranks_;
  int first_local_ = 0;
  int local_count_ = -1;  // -1: all
  bool joins_known_ = false;  // mark_joined was called
};

}  // namespace zerod
