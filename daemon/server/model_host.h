// A model the daemon hosts for the ranks of a job: the engine Model, the job
// script whose hooks it calls, and which ranks are attached. Every rank's
// k-th zd_model_create of a run lands on the same model, so N processes that
// each create "their" model share one (ServedJob::creates).
#pragma once

#include "error.h"
#include "job_script.h"
#include "model/model.h"
#include "node_memory.h"
#include "served_job.h"

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace zerod::server {

// A daemon that `zerod run` restarted after its daemon died (`zerod serve
// --resume-snapshots`): the job's snapshot.path and the steps of the
// snapshots this run wrote there, the only ones it may resume from
// (SnapshotConfig::restart_steps).
struct SnapshotRestart {
  std::string path;
  std::vector<int64_t> steps;
};

// The job's configuration as a daemon runs it (the device it computes on).
// trace_path, when given, overrides the script's trace.path.
// device: the trainers' zd_model_options.device, overriding the script's
// ("" = the script's). restart: a model whose snapshot.path is restart's
// resumes from those steps only, whatever its snapshot.resume says.
JobConfig daemon_config(JobConfig config, const std::string& script_name, const std::string& trace_path = "",
                        const std::string& device = "",
                        const std::optional<SnapshotRestart>& restart = std::nullopt);

class ModelHost {
 public:
  // What ends a model's wait for its snapshot.path's lock (another model
  // holds it), asked with the path (SnapshotConfig::lock_wait_ends): only
  // while the model is built, in this constructor.
  using LockWaitEnds = std::function<std::optional<Error>(const std::string& snapshot_path)>;
  // node_memory: what the ranks' state is charged against with the other
  // jobs' (null: only the job's own budgets).
  ModelHost(int id, uint64_t key, std::string script_text, std::string script_name,
            std::unique_ptr<scripting::JobScript> script, std::shared_ptr<ServedJob> job,
            const std::string& trace_path = "", const std::string& device = "",
            const std::shared_ptr<NodeMemory>& node_memory = nullptr,
            const std::optional<SnapshotRestart>& restart = std::nullopt, const LockWaitEnds& lock_wait_ends = nullptr);
  // The model's end: its final snapshot (a clean end), whose failure goes
  // into the job's lost_ends for the daemon's exit status.
  ~ModelHost();

  int id() const { return id_; }
  const std::shared_ptr<ServedJob>& job() const { return job_; }
  uint64_t key() const { return key_; }
  const std::string& script_text() const { return script_text_; }
  const std::string& script_name() const { return script_name_; }
  Model& model() { return *model_; }
  const Model& model() const { return *model_; }
  const scripting::JobScript& script() const { return *script_; }
  // The device its creator asked for ("" = the script's).
  const std::string& device_request() const { return device_request_; }
  // Its device tier is host RAM (the cpu and emulated devices): node-wide
  // host memory counts it (NodeMemory).
  bool device_in_host_ram() const;

  // Attaching and leaving. A rank that leaves without destroying the model
  // (its connection dropped) is lost: the other ranks' collectives fail.
  void attach(int rank);
  void detach(int rank, bool lost, const std::string& reason);
  bool attached(int rank) const;
  bool anyone_attached() const;
  // The rank's trainer is gone though it is still attached: its connection
  // hung up while its session's thread is inside a call, which may wait in a
  // collective for the others as they wait for it. Marks the rank lost
  // (Model::rank_lost, from any thread), which ends those waits; its session
  // detaches it once the call returns. A model of one rank has no one to tell.
  void rank_gone(int rank, const std::string& why);
  // The same for a rank that never attached to this model (nor left it) and
  // will not: its connection ended and none claimed its rank again
  // (Server::lose_unless_reclaimed). A rank that came to the model is left
  // to its own end's account. True when it marked the rank lost.
  bool lose_absent_rank(int rank, const std::string& why);

  // --- restart (the job keeps its state) -----------------------------------
  // Once no rank is attached: why the model is worth keeping for a restart
  // (how a rank was lost: "rank 1 (pid 7) is gone: ..."), or "" when it
  // should go. A model is kept when
  // its job keeps state (daemon.keep_state, or keep_state_anyway: the
  // daemon's own --job says so), it was finalized, some rank was lost
  // (its connection ended without zd_model_destroy) since it last attached,
  // and no optimizer step (nor any other write of its state: a load, a
  // resume at finalize, zd_param_write) stopped part-way in it
  // (Model::half_applied_step).
  // A model every rank destroyed is done: a new run of the same script
  // must start from its own initial values, not from this run's end. A
  // lost rank leaves every rank's state whole; a step that stopped part-way
  // does not, and a restart must not resume it (refused_restart).
  std::string kept_because(bool keep_state_anyway) const;
  // Once no rank is attached: for a model kept_because() would keep but for
  // a step that stopped part-way, what its lost ranks (lost_ranks()) are
  // told at their restart's next zd_model_create of the script
  // (Server::forget_if_unused): that step's error, and to resume from a
  // checkpoint or a snapshot. None for any other model.
  std::optional<Error> refused_restart(bool keep_state_anyway) const;
  std::vector<int> lost_ranks() const;
  // While the model is still there (other ranks are attached): the same for
  // a lost rank of it that starts again and creates the model of the same
  // script, once (that rank then counts as told, not lost). None when the
  // rank was not lost or the model can be resumed.
  std::optional<Error> refuse_restart_of(int rank);
  // Whether rank may re-attach: the job keeps state, that rank left or was
  // lost, and no step stopped part-way.
  bool can_reattach(int rank) const;
  void reattach(int rank);
  bool reattaching(int rank) const;
  // A re-attaching rank registers its parameters again: they must be the
  // ones the model has; returns the id.
  zd_param_id verify_param(int rank, const std::string& name, const std::string& module,
                           zd_dtype dtype, const std::vector<int64_t>& shape);
  // A re-attaching rank's finalize: waits for every rank to re-attach and
  // finalize, recovers the model once, rebuilds the working copies. The wait
  // lasts at most the job's comm.timeout (0: no limit), and ends sooner
  // when `interrupted` says why it must (the rank's connection closed, the
  // daemon stops): it is asked every kReattachSliceMs, under this host's
  // lock, so it must not block or call into this host. The last rank to
  // arrive recovers the model for all; if that fails, every waiting rank
  // fails with its message and the ranks may finalize again.
  void finish_reattach(int rank, const std::function<std::string()>& interrupted);
  static constexpr int kReattachSliceMs = 50;

 private:
  int id_;
  uint64_t key_;
  std::shared_ptr<ServedJob> job_;
  std::string script_text_;
  std::string script_name_;
  std::string device_request_;
  std::unique_ptr<scripting::JobScript> script_;
  std::unique_ptr<Model> model_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int first_rank_ = 0;  // the per-rank vectors below are indexed by rank - first_rank_
  size_t at(int rank) const;
  // How the first lost rank was lost, when the job keeps state and the model
  // was finalized; "" otherwise (kept_because without the step's check).
  std::string lost_since_attached(bool keep_state_anyway) const;
  Error refusal(const std::string& lost, const Error& half) const;
  std::vector<bool> attached_;
  std::vector<bool> gone_;          // left or lost since it last attached
  std::vector<std::string> lost_;   // why it was lost since it last attached; "" if it was not
  std::vector<bool> reattaching_;
  std::vector<int> verified_;       // parameters re-registered, per rank
  std::vector<bool> finalizing_;    // in finish_reattach, waiting for the others
  uint64_t recoveries_ = 0;         // rounds of finish_reattach ended, by a recovery or its failure
  std::optional<Error> recovery_failed_;  // how the last round failed; none if it recovered
};

}  // namespace zerod::server
