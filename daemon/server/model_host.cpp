#include "model_host.h"

#include "device/select.h"
#include "error.h"
#include "log.h"

#include <algorithm>
#include <chrono>

namespace zerod::server {

// The daemon's ranks compute on the device the job names, as embedded ones
// do ("auto": a GPU where the daemon sees one); their pools are shared with
// the trainers (memfd arenas on the cpu device, CUDA virtual memory on a
// GPU: device/select.h open_shared_device).
JobConfig daemon_config(JobConfig config, const std::string& script_name, const std::string& trace_path,
                        const std::string& device, const std::optional<SnapshotRestart>& restart) {
  if (!trace_path.empty()) config.trace.path = trace_path;
  // Only the snapshots the restart was told of are this run's: another
  // path's are another job's, which the restart does not concern.
  if (restart && !config.snapshot.path.empty() && config.snapshot.path == restart->path)
    config.snapshot.restart_steps = restart->steps;
  if (!device.empty()) config.device = device;  // the trainer knows where it computes
  config.device = resolve_device(config.device, script_name);
  return config;
}

ModelHost::ModelHost(int id, uint64_t key, std::string script_text, std::string script_name,
                     std::unique_ptr<scripting::JobScript> script, std::shared_ptr<ServedJob> job,
                     const std::string& trace_path, const std::string& device,
                     const std::shared_ptr<NodeMemory>& node_memory, const std::optional<SnapshotRestart>& restart,
                     const LockWaitEnds& lock_wait_ends)
    : id_(id),
      key_(key),
      job_(std::move(job)),
      script_text_(std::move(script_text)),
      script_name_(std::move(script_name)),
      device_request_(device),
      script_(std::move(script)),
      first_rank_(job_->first_rank) {
  const int world_size = job_->world_size;
  const int first_rank = job_->first_rank;
  const int local_ranks = job_->local_ranks;
  if (local_ranks < world_size && script_->config().keep_state_on_disconnect)
    fail(ZD_ERR_CONFIG, script_name_ + ": daemon.keep_state works with one daemon only: with " +
                            std::to_string(world_size / local_ranks) +
                            " nodes a lost node takes its daemon's state with it, and the job restarts under its "
                            "launcher from a snapshot instead (snapshot = { path = ..., every = N }; "
                            "docs/multinode.md)");
  const auto n = static_cast<size_t>(local_ranks);
  attached_.assign(n, false);
  gone_.assign(n, false);
  lost_.assign(n, "");
  reattaching_.assign(n, false);
  verified_.assign(n, 0);
  finalizing_.assign(n, false);
  JobConfig config = daemon_config(script_->config(), script_name_, trace_path, device, restart);
  if (lock_wait_ends && !config.snapshot.path.empty())
    config.snapshot.lock_wait_ends = [lock_wait_ends, path = config.snapshot.path] { return lock_wait_ends(path); };
  // A later model of the same daemon (an evaluation model, a second job of
  // `zerod serve`) must not overwrite the first one's trace.
  if (id_ > 0 && !config.trace.path.empty()) {
    std::string& p = config.trace.path;
    const auto dot = p.rfind('.');
    const auto slash = p.rfind('/');
    const std::string tag = ".model" + std::to_string(id_);
    if (dot != std::string::npos && (slash == std::string::npos || dot > slash))
      p.insert(dot, tag);
    else
      p += tag;
  }
  model_ = std::make_unique<Model>(std::move(config),
                                   script_->make_plugins(world_size, first_rank, local_ranks), script_.get(),
                                   world_size, first_rank, local_ranks, open_shared_device);
  if (node_memory) model_->set_memory_admission(node_memory->for_model(job_->label, id_, device_in_host_ram()));
}

bool ModelHost::device_in_host_ram() const {
  // The cpu and emulated devices keep their "device" tier in host RAM.
  const std::string& dev = model_->config().device;
  return dev == "cpu" || dev == "emulated";
}

size_t ModelHost::at(int rank) const {
  if (rank < first_rank_ || rank - first_rank_ >= static_cast<int>(attached_.size()))
    fail(ZD_ERR_INVALID_ARGUMENT, "rank " + std::to_string(rank) + " is not served by this daemon");
  return static_cast<size_t>(rank - first_rank_);
}

ModelHost::~ModelHost() {
  // The job ended cleanly (a lost rank breaks the model: then none). Its
  // end not saved is the job's failure, though every trainer exited 0: the
  // engine logged why; `zerod run` and `zerod serve` exit non-zero for it.
  const std::string lost = model_->final_snapshot();
  if (!lost.empty()) {
    {
      std::lock_guard<std::mutex> lock(job_->lost_ends->mu);
      job_->lost_ends->what.push_back("model " + std::to_string(id_) + " (" + script_name_ + "): " + lost);
    }
    // A daemon of several jobs goes on, and its log is all their ranks'
    // users have: which job lost its end.
    if (!job_->key.empty())
      log_message(ZD_LOG_ERROR, "zerod serve: " + job_->label + ", model " + std::to_string(id_) + " (" +
                                    script_name_ + "): the final snapshot failed, and the run's final state was NOT "
                                    "saved (the error above says why)");
  }
  model_.reset();  // before the script its policy points into
}

void ModelHost::attach(int rank) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    attached_[at(rank)] = true;
    lost_[at(rank)].clear();
  }
  model_->rank_joined(rank);
}

void ModelHost::detach(int rank, bool lost, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!attached_[at(rank)]) return;
    attached_[at(rank)] = false;
    gone_[at(rank)] = true;
    // Kept as kept_because() says it: "rank 1 (pid 7) is gone: ..." from a
    // session, "rank 1 exited with status 3" from the launcher's "exited ...".
    lost_[at(rank)] = !lost ? ""
                      : reason.rfind("rank ", 0) == 0 ? reason
                                                      : "rank " + std::to_string(rank) + " " + reason;
  }
  if (model_->world_size() > 1) {
    if (lost)
      model_->rank_lost(rank, reason);
    else
      model_->rank_left(rank, reason);
  }
}

bool ModelHost::attached(int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  return attached_[at(rank)];
}

void ModelHost::rank_gone(int rank, const std::string& why) {
  if (model_->world_size() > 1) model_->rank_lost(rank, why);
}

bool ModelHost::lose_absent_rank(int rank, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t r = at(rank);
    if (attached_[r] || gone_[r]) return false;
  }
  if (model_->world_size() == 1) return false;
  // Not under mu_: Model::rank_lost aborts the comm's collectives, which
  // across nodes (nccl's abort) can take seconds, and every create, attach
  // and status call asks attached() meanwhile. A rank that claims its place
  // just as the reclaim wait ran out may attach between the check and this
  // call: the model then breaks with it attached, as it would had the loss
  // come first, and the rank is told why at its next call.
  rank_gone(rank, why);
  return true;
}

bool ModelHost::anyone_attached() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (bool a : attached_)
    if (a) return true;
  return false;
}

std::string ModelHost::lost_since_attached(bool keep_state_anyway) const {
  if (!keep_state_anyway && !model_->config().keep_state_on_disconnect) return "";
  // Not finalized: nothing a restart could resume (can_reattach wants a
  // finalized model), so keeping it would only hold its memory.
  if (!model_->finalized()) return "";
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < lost_.size(); ++i)
    if (!lost_[i].empty()) return lost_[i];
  return "";  // every rank destroyed it
}

std::string ModelHost::kept_because(bool keep_state_anyway) const {
  // A step half applied: a restart would apply part of it twice (or leave
  // the ranks a step apart), so the state is worth nothing to it. So is a
  // state that any other write left part written (Model::half_applied_step).
  if (model_->half_applied_step()) return "";
  return lost_since_attached(keep_state_anyway);
}

Error ModelHost::refusal(const std::string& lost, const Error& half) const {
  return Error(half.code(),
               "daemon.keep_state did not keep model " + std::to_string(id_) + " (" + script_name_ +
                   ") for a restart: a write of its state in its last run (an optimizer step, a checkpoint load or "
                   "snapshot resume, a zd_param_write or zd_optimizer_state_write) stopped part-way and left the "
                   "model's state half applied, which no restart may resume\nits error: " + half.what() +
                   "\nthen the run ended: " + lost +
                   "\nresume from a checkpoint (zd_model_load after zd_model_finalize) or, in a job that takes "
                   "snapshots, from the newest snapshot (at zd_model_finalize); the next zd_model_create of this "
                   "script makes a new model from the trainer's initial values");
}

std::optional<Error> ModelHost::refused_restart(bool keep_state_anyway) const {
  const std::optional<Error> half = model_->half_applied_step();
  if (!half) return std::nullopt;
  const std::string lost = lost_since_attached(keep_state_anyway);
  if (lost.empty()) return std::nullopt;
  return refusal(lost, *half);
}

std::vector<int> ModelHost::lost_ranks() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> out;
  for (size_t i = 0; i < lost_.size(); ++i)
    if (!lost_[i].empty()) out.push_back(first_rank_ + static_cast<int>(i));
  return out;
}

std::optional<Error> ModelHost::refuse_restart_of(int rank) {
  const std::optional<Error> half = model_->half_applied_step();
  if (!half || !model_->config().keep_state_on_disconnect || !model_->finalized()) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  const size_t r = at(rank);
  if (attached_[r] || lost_[r].empty()) return std::nullopt;
  const Error e = refusal(lost_[r], *half);
  lost_[r].clear();  // told: its next create makes a new model, and no later refusal names it
  return e;
}

bool ModelHost::can_reattach(int rank) const {
  if (model_->half_applied_step()) return false;  // kept_because() keeps no such model; never resumed
  std::lock_guard<std::mutex> lock(mu_);
  const size_t r = at(rank);
  return model_->config().keep_state_on_disconnect && model_->finalized() && !attached_.at(r) &&
         gone_.at(r);
}

void ModelHost::reattach(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t r = at(rank);
  attached_.at(r) = true;
  gone_[r] = false;
  lost_[r].clear();
  reattaching_[r] = true;
  verified_[r] = 0;
}

bool ModelHost::reattaching(int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  return reattaching_[at(rank)];
}

zd_param_id ModelHost::verify_param(int rank, const std::string& name, const std::string& module,
                                    zd_dtype dtype, const std::vector<int64_t>& shape) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t r = at(rank);
  const auto& reg = model_->registry();
  const auto index = static_cast<size_t>(verified_[r]);
  if (index >= reg.params().size())
    fail(ZD_ERR_INVALID_STATE, "rank " + std::to_string(rank) + " re-registered more parameters (" +
                                   std::to_string(index + 1) + ") than the kept model has (" +
                                   std::to_string(reg.params().size()) + ")");
  const ParamRecord& p = reg.params()[index];
  if (p.name != name || reg.module(p.module).name != module || p.dtype != dtype || p.shape != shape)
    fail(ZD_ERR_INVALID_ARGUMENT, "rank " + std::to_string(rank) + " re-registered parameter #" +
                                      std::to_string(index) + " as '" + name +
                                      "', but the kept model's is '" + p.name +
                                      "' with another module, dtype or shape; a restarted job "
                                      "must register what it registered before");
  ++verified_[r];
  return static_cast<zd_param_id>(index);
}

void ModelHost::finish_reattach(int rank, const std::function<std::string()>& interrupted) {
  using Clock = std::chrono::steady_clock;
  std::unique_lock<std::mutex> lock(mu_);
  const size_t r = at(rank);
  if (static_cast<size_t>(verified_[r]) != model_->registry().params().size())
    fail(ZD_ERR_INVALID_STATE, "rank " + std::to_string(rank) + " re-registered " +
                                   std::to_string(verified_[r]) + " of the kept model's " +
                                   std::to_string(model_->registry().params().size()) + " parameters");
  if (finalizing_[r]) fail(ZD_ERR_INVALID_STATE, "rank " + std::to_string(rank) + " is already finalizing");
  // Every rank re-attaches before the model is recovered: nobody is inside
  // it then. The last to arrive recovers it.
  const uint64_t round = recoveries_;
  finalizing_[r] = true;
  if (std::count(finalizing_.begin(), finalizing_.end(), true) == model_->local_ranks()) {
    // The round ends here whether the recovery works or not, so that no
    // rank waits on for a round that cannot end and the next try counts
    // from nobody (a failed make_comm would otherwise leave the others
    // counted, and a later round would recover with a rank missing).
    finalizing_.assign(finalizing_.size(), false);
    ++recoveries_;
    recovery_failed_.reset();
    try {
      model_->recover(
          script_->make_comm(model_->world_size(), model_->first_local_rank(), model_->local_ranks()));
    } catch (const Error& e) {
      recovery_failed_.emplace(e.code(), std::string("recovering the kept model failed: ") + e.what());
    } catch (const std::exception& e) {
      recovery_failed_.emplace(ZD_ERR_INTERNAL, std::string("recovering the kept model failed: ") + e.what());
    }
    cv_.notify_all();
  } else {
    // Waited in slices, not on the notify alone: the last rank is not the
    // only one with news. This rank's own connection may close (its session
    // must end, or the rank stays counted and its next incarnation is
    // refused as still connected) and the daemon may stop (Server::stop
    // joins this thread); neither has a hand on this condition variable.
    // comm.timeout = 0 waits for the others as long as it takes, as a
    // collective does.
    const double timeout_s = model_->config().comm_timeout_s;
    const Clock::time_point deadline =
        timeout_s > 0
            ? Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s))
            : Clock::time_point::max();
    std::string why;
    zd_status code = ZD_ERR_TIMEOUT;
    while (recoveries_ == round) {
      const Clock::time_point now = Clock::now();
      if (now >= deadline) {
        std::string missing;
        for (size_t i = 0; i < finalizing_.size(); ++i)
          if (!finalizing_[i])
            missing += (missing.empty() ? "" : ", ") + std::to_string(first_rank_ + static_cast<int>(i));
        why = "not every rank did within the job's comm.timeout (still to finalize: rank " + missing + ")";
        break;
      }
      cv_.wait_for(lock, std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(kReattachSliceMs)));
      if (recoveries_ != round) break;
      why = interrupted();
      if (!why.empty()) {
        code = ZD_ERR_PEER_LOST;
        break;
      }
    }
    if (recoveries_ == round) {
      finalizing_[r] = false;
      fail(code, "rank " + std::to_string(rank) + " re-attached to the kept model and waited for the other ranks "
                                                   "to, but " + why);
    }
  }
  if (recovery_failed_) throw *recovery_failed_;
  reattaching_[r] = false;
  lock.unlock();
  model_->rebuild_working_copies(rank);
}

}  // namespace zerod::server
