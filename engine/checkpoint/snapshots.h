// Snapshots a job's engine writes by itself (the job script's `snapshot`
// table): every `every` steps and at a clean end, each rank's shard of the
// model state in the checkpoint format, into <path>/step-<N>.partial/; when
// every rank's shard is written, the manifest, then a rename to
// <path>/step-<N>/, so a snapshot is whole or absent; the newest `keep` stay.
//
// A rank's shard is written in the background while training goes on: the
// masters and optimizer state it reads change only at the rank's next
// optimizer update, which waits until the shard's values are written into
// the file (fence); flushing the file to disk (fsync) and committing go on
// after that, off the training's path. Nothing is staged in memory beyond a
// chunk at a time, NVMe-resident state included (the page cache holds what
// is not on disk yet). A snapshot that fails (a full disk) is logged and
// removed; training goes on, and the older snapshots stay. The end's
// snapshot (at_end, at_leave) is another matter: nothing comes after it, so
// its failure is logged as the run's final state not saved, naming the
// newest snapshot kept, and kept for final_failure(), which the daemon
// turns into `zerod run`'s exit status (embedded, zd_model_destroy returns
// nothing: the log is all there is).
//
// On one node the last of the daemon's ranks to finish its shard commits
// the snapshot. Across nodes (several daemons) each node writes its ranks'
// shards the same way and, when they are on disk, a part file
// (node-<K>.part) saying so; at each applied step after it every rank
// learns, in one small all-reduce, whether every node's part is whole yet
// (or one failed), and once it is, one daemon writes the manifest (node 0,
// after all have reported). The answer is the same on every rank, so every
// rank goes on the same way; a snapshot due while the one before is not
// whole yet waits for it. The path may be one directory every node sees
// (shared: node 0 also renames it) or a disk of each node's own
// (node-local: every node renames its part, node 0's directory holds the
// manifest, which lists every part's host); which it is, the daemons find
// out at finalize with a probe file.
//
// Resuming (at finalize) is agreed too: every rank proposes its newest
// snapshot, they take the newest every rank has, every rank verifies the
// values it will read, and one more all-reduce says whether all could; if
// not, the next older is tried, and each skipped one is logged with why.
//
// One model writes into a path at a time: from its creation to its end the
// model holds a lock on <path>/.zerod.lock (flock; the kernel lets go of it
// when the process dies), and a second model over the path (another job, a
// second model of the same script) waits for it up to comm.timeout, then is
// refused; sooner when snapshot.lock_wait_ends says why (a daemon: it
// stops, or the holder is a model it keeps for a restart, which waiting
// would not end). Nothing else tells two writers apart: each would remove the
// other's half-written snapshots, commit over them and prune them. Across
// nodes every daemon of the job holds that lock shared (one directory every
// node sees is locked by all of them) and <path>/.zerod-node-<K>.lock
// exclusive, so another job's daemon of the same node is refused there.
//
// A snapshot of step N committed while the path holds snapshots of later
// steps means the job went back (a load or zd_model_set_step of an earlier
// step, or a start over): those are an abandoned timeline, moved aside to
// step-<M>.superseded before the commit, so that a resume never takes them;
// the newest `keep` of them stay, to be looked at.
#pragma once

#include "compression/momentum_compression.h"
#include "optimizer/loss_scaler.h"
#include "manifest.h"
#include "model/model_context.h"
#include "model/rank_resources.h"
#include "source.h"
#include "memory/state_buffers.h"

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
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
  // Several daemons serve the job.
  bool across_nodes() const { return local_ranks_ < ctx_.world_size; }

  // At finalize, on every rank of the job (a collective when there are
  // several): across nodes, finds out whether the path is shared; removes
  // what a crash left half written; then, when the job resumes, returns the
  // newest snapshot every rank can read, whose values this rank will read
  // are verified (null: there is none, a fresh start). Skipped snapshots
  // are logged with why; when snapshots exist but none can be resumed from,
  // throws ZD_ERR_IO naming each and why.
  std::shared_ptr<const ckpt::Source> start(int rank, RankResources& res, StateBuffers& buffers);
  // After an applied step on the rank: across nodes, first the verdict on
  // the snapshot the rank wrote last (every node's part whole?), which then
  // commits it; then the rank's shard when a snapshot is due. The manifest
  // comes from the rank's figures (its step, loss scaler and the lr the
  // trainer set, if any).
  void after_step(int rank, int64_t step, RankResources& res, StateBuffers& buffers,
                  MomentumCompression& compression, const LossScaler& scaler, std::optional<double> trainer_lr);
  // Waits until the rank's shard in flight (if any) has read everything it
  // writes (its flush to disk may go on).
  void fence(int rank);
  // At a clean end, with no rank inside the model: a snapshot of `step` for
  // every local rank, now, unless the newest one is of that step. One node
  // only (across nodes, see at_leave).
  struct RankView {
    RankResources* res;
    StateBuffers* buffers;
    MomentumCompression* compression;  // what the rank holds alone (its error feedback, its own copy)
  };
  void at_end(int64_t step, const std::vector<RankView>& ranks, const LossScaler& scaler,
              std::optional<double> trainer_lr);
  // Across nodes, when a rank leaves the job (zd_model_destroy), before its
  // comm goes: a collective of every rank. When every rank leaves cleanly
  // (between steps) and steps were applied since the newest snapshot, the
  // last state is snapshotted, agreed and committed as during training.
  void at_leave(int rank, int64_t step, bool clean, RankResources& res, StateBuffers& buffers,
                MomentumCompression& compression, const LossScaler& scaler, std::optional<double> trainer_lr);
  // The step of the newest snapshot this model wrote (or resumed from), -1 if none.
  int64_t last_step() const { return last_step_.load(); }
  void resumed_at(int64_t step) { last_step_.store(step); }
  // The end's snapshot of `step` was not written: `failure` says how ("the
  // final snapshot of step 9 failed (...) and was removed"). Logged as an
  // error saying that the run's final state was NOT saved, which snapshot
  // under the path is the newest kept (what a new run resumes) or that
  // there is none, and what to do; the first is kept for final_failure().
  void lose_end(int64_t step, const std::string& failure);
  // "" unless the end's snapshot failed; else what lose_end logged first.
  std::string final_failure() const;

 private:
  struct InFlight;
  void begin(int64_t step, const ckpt::Manifest& manifest);
  // begin() with the model's description (the per-tensor scalars from
  // `buffers`, what each rank holds alone from `compression`), and the rank
  // marked reading it; the snapshot begun.
  // `final`: the end's snapshot (at_leave), whose failure is lose_end's.
  std::shared_ptr<InFlight> begin_reading(int rank, int64_t step, const LossScaler& scaler,
                                          std::optional<double> trainer_lr, const StateBuffers& buffers,
                                          const MomentumCompression& compression, bool final = false);
  void write_shard(const std::shared_ptr<InFlight>& s, int rank, RankResources& res, StateBuffers& buffers,
                   MomentumCompression& compression);
  void finish_shard(const std::shared_ptr<InFlight>& s, bool ok, int rank, const std::string& why);
  // A snapshot that was not written, `how` ("failed (why) and was
  // removed"): the end's is lose_end's; another is logged as an error,
  // training going on with the older snapshots kept.
  void report_lost(const InFlight& s, const std::string& how);
  void commit(InFlight& s);
  // Before the snapshot of `step` is renamed in: the snapshots of later
  // steps (this node's, as candidates() sees them) go aside as superseded.
  void supersede(int64_t step);
  // Removes all but the newest `keep` snapshots, and of the superseded ones.
  void prune();
  // At construction: the path's lock (see above), or ZD_ERR_CONFIG.
  void lock_path();
  // Across nodes.
  void discover(int rank, RankResources& res);
  // The verdict on the rank's snapshot in flight: `wait` waits until this
  // node's part is whole; else a part not whole yet on some node leaves it
  // in flight until the next call (every rank gets the same answer).
  void settle(int rank, RankResources& res, bool wait);
  void join_writer(int rank);
  void conclude(const std::shared_ptr<InFlight>& s, int failed_rank);
  void commit_across(InFlight& s);
  void join_committer();
  double all_reduce_max(int rank, RankResources& res, uint64_t group, uint64_t id, const std::string& what,
                        double value) const;
  std::string node_of(int rank) const;  // "node 1 (host b)"
  std::string part_name() const;        // this node's part file
  ckpt::Manifest with_parts(ckpt::Manifest m, bool all) const;
  std::vector<std::pair<int64_t, std::string>> candidates() const;
  std::shared_ptr<const ckpt::Source> open_for(RankResources& res, StateBuffers& buffers, const std::string& dir) const;

  const ModelContext& ctx_;
  int first_local_;
  int local_ranks_;
  int node_ = 0, nodes_ = 1;
  mutable std::mutex mu_;
  std::condition_variable cv_;         // a node part is done; a writer stopped reading
  std::shared_ptr<InFlight> current_;  // the snapshot being written
  std::vector<std::thread> writers_;   // per local rank
  std::vector<char> reading_;          // per local rank, under mu_: its writer still reads its buffers
  std::atomic<int64_t> last_step_{-1};
  std::string final_failure_;  // under mu_: lose_end's first message
  std::mutex clean_mu_;  // start: the first local rank cleans what a crash left, the others wait
  bool cleaned_ = false;
  std::vector<int> lock_fds_;  // the path's lock files, held until the model goes
  // Across nodes.
  std::atomic<bool> shared_{true};                  // the path is one directory every node sees
  std::vector<std::string> hosts_;                  // per node, set at start
  std::vector<std::shared_ptr<InFlight>> pending_;  // per local rank: written, not yet agreed
  std::mutex commit_mu_;
  std::thread committer_;  // commits (or removes) an agreed snapshot
  // At start: why a local rank could not use a snapshot, by step:
  std::map<int64_t, std::pair<int, std::string>> refused_;  // the lowest rank and its why
};

}  // namespace zerod
