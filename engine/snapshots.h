// Snapshots a job's engine writes by itself (the job script's `snapshot`
// table): every `every` steps and at a clean end, each rank's shard of the
// model state in the checkpoint format, into <path>/step-<N>.partial/; when
// every rank's shard is written, the manifest, then a rename to
// <path>/step-<N>/, so a snapshot is whole or absent; the newest `keep` stay.
//
// A rank's shard is written in the background while training goes on: the
// masters and optimizer state it reads change only at the rank's next
// optimizer update, which waits for the shard first (fence). Nothing is
// staged in memory beyond a chunk at a time, NVMe-resident state included.
// A snapshot that fails (a full disk) is logged and removed; training goes
// on, and the older snapshots stay.
//
// One daemon's ranks only: the last of them to finish its shard commits the
// snapshot (snapshots across nodes are refused at configuration).
#pragma once

#include "checkpoint/manifest.h"
#include "loss_scaler.h"
#include "model_context.h"
#include "rank_resources.h"
#include "state_buffers.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace zerod {

class Snapshots {
 public:
  Snapshots(const ModelContext& ctx, int first_local_rank, int local_ranks);
  ~Snapshots();
  Snapshots(const Snapshots&) = delete;
  Snapshots& operator=(const Snapshots&) = delete;

  bool enabled() const { return !ctx_.config.snapshot.path.empty(); }
  // Whether after_step(step) starts a snapshot.
  bool due(int64_t step) const {
    const int64_t every = ctx_.config.snapshot.every;
    return enabled() && every > 0 && step % every == 0;
  }
  // The newest whole snapshot under the path ("" if none).
  std::string latest() const;
  // After an applied step on the rank: starts the rank's shard when a
  // snapshot is due. The manifest comes from the rank's figures.
  void after_step(int rank, int64_t step, RankResources& res, StateBuffers& buffers, const LossScaler& scaler);
  // Waits until the rank's shard in flight (if any) is written.
  void fence(int rank);
  // At a clean end, with no rank inside the model: a snapshot of `step` for
  // every local rank, now, unless the newest one is of that step.
  struct RankView {
    RankResources* res;
    StateBuffers* buffers;
  };
  void at_end(int64_t step, const std::vector<RankView>& ranks, const LossScaler& scaler);
  // The step of the newest snapshot this model wrote (or resumed from), -1 if none.
  int64_t last_step() const { return last_step_.load(); }
  void resumed_at(int64_t step) { last_step_.store(step); }

 private:
  struct InFlight;
  void begin(int64_t step, const ckpt::Manifest& manifest);
  void write_shard(const std::shared_ptr<InFlight>& s, int rank, RankResources& res, StateBuffers& buffers);
  void finish_shard(const std::shared_ptr<InFlight>& s, bool ok, const std::string& why);
  void commit(InFlight& s);
  void prune();

  const ModelContext& ctx_;
  int first_local_;
  int local_ranks_;
  std::mutex mu_;
  std::shared_ptr<InFlight> current_;   // the snapshot being written
  std::vector<std::thread> writers_;    // per local rank
  std::atomic<int64_t> last_step_{-1};
};

}  // namespace zerod
