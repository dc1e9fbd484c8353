// The optimizer's update of state in host memory, run behind the step
// instead of inside it (DESIGN.md §10): zd_step decides everything that
// needs the whole gradient (the norm, clipping, an overflow's skip) and
// returns; a thread of the rank's own then updates the host's shards module
// by module, in the order the last step's forward began them, and uploads
// each module's new working copy as soon as it is written. The next
// forward_begin(k) waits only for module k. While the GPU runs the forward
// of modules 0..k, the CPU updates module k+1: the update hides behind the
// forward as far as the forward is long.
//
// Exact: each element gets the arithmetic of the synchronous pass (the
// update is elementwise; only the order of elements changes), and nothing
// reads a module's state, master or working copy before its update is done
// (the model finishes the update before any call other than a forward's, a
// backward's or zd_model_set_lr, whose lr is the next boundary's).
// tests/engine/overlap_test.cpp compares the two paths bit for bit.
#pragma once

#include "model/model_context.h"
#include "optimizer/optimizer_runner.h"
#include "model/rank_resources.h"

#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace zerod {

class OverlappedUpdate {
 public:
  OverlappedUpdate(const ModelContext& ctx, RankResources& res, OptimizerRunner& runner)
      : ctx_(ctx), res_(res), runner_(runner) {}
  ~OverlappedUpdate();
  OverlappedUpdate(const OverlappedUpdate&) = delete;
  OverlappedUpdate& operator=(const OverlappedUpdate&) = delete;

  // Sized for the registry (at finalize).
  void reset();
  // forward_begin(m) of the window being accumulated: the first begin of
  // each module sets the order of the next update.
  void note_forward(zd_module_id m);
  // Starts the update of the host pieces (a plain pass with these args) and
  // returns. The caller ran the rest of the pass already. The parameters
  // `first` are updated before every module (wait_first()).
  void start(const OptimizerRunner::PassArgs& a, std::vector<zd_param_id> first);
  bool running() const { return worker_.joinable(); }
  // Module m's update is written and its working copies are on their way
  // to the device; zerod's stream waits for them. Rethrows the update's
  // failure. From the rank's thread.
  void wait_module(zd_module_id m);
  // Like wait_module when m's update is done already; false (nothing
  // waited) when it is not, or when the update failed: the failure stays
  // for the rank's next wait_module or wait_all, whose caller reports it as
  // a step that stopped part-way (Model::wait_update). Never throws, so the
  // prefetch that asks (Residency) cannot hand the trainer a bare failure.
  bool module_ready(zd_module_id m);
  // From zerod's stream (a gather issued ahead, Residency): waits until m's
  // update is written, then makes the stream wait for its uploads. Never
  // blocks past the update's end: a failed update marks every module
  // written. Its failure breaks the job here as a step that stopped
  // part-way (ModelContext::stopped_part_way), whichever of the rank's
  // waits comes to the gather first.
  void await_module(zd_module_id m);
  // wait_module for the parameters start() was given first.
  void wait_first();
  // Waits for the whole update; rethrows its failure once.
  void finish();
  // finish() for a call the trainer waits in: the time the update was
  // still running is the trainer's (update_wait_ns, a "wait for update"
  // span), as a begin call's wait for its module is.
  void wait_all();

 private:
  void run(OptimizerRunner::PassArgs a, std::vector<zd_module_id> order, std::vector<zd_param_id> first);
  // The worker has written everything it will (a failure included).
  bool ended();

  const ModelContext& ctx_;
  RankResources& res_;
  OptimizerRunner& runner_;
  // Host pieces per parameter, found at the first start().
  std::vector<std::vector<OptimizerRunner::Piece>> pieces_;
  bool have_pieces_ = false;
  // The window's forward order, and which modules it holds.
  std::vector<zd_module_id> order_;
  std::vector<char> seen_;

  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<char> done_;        // per module, under mu_
  std::vector<uint64_t> ticket_;  // per module: its last upload, under mu_
  bool first_done_ = true;        // under mu_
  uint64_t first_ticket_ = 0;     // under mu_
  bool ended_ = true;             // the worker's last write done (its uploads too), under mu_
  int64_t step_ = 0;              // the step being applied, for a failure's report; under mu_
  std::exception_ptr error_;      // under mu_
};

}  // namespace zerod
