#include "server.h"

#include "session.h"
#include "sizes.h"

#include "error.h"
#include "log.h"
#include "transport/errors.h"

#include <unistd.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <optional>

namespace zerod::server {

namespace {

// The key holds `name=` as one of its fields.
bool carries(const std::string& key, const std::string& name) {
  const std::string field = name + "=";
  return key.rfind(field, 0) == 0 || key.find(";" + field) != std::string::npos;
}

// Why no later launch can name this job key again, so that a model kept
// under it (daemon.keep_state) would hold its memory until the daemon stops;
// "" when one can. The keys are those libzerod makes for a launcher's ranks
// (libzerod/src/launcher_env.cpp).
std::string one_launch_because(const std::string& key) {
  if (carries(key, "restart"))
    return "its key carries torchrun's restart count, so torchrun's next restart is another job; under torchrun a "
           "job resumes from its snapshots (snapshot = { path = ..., every = N })";
  // Ids each launch is given anew: a relaunch under mpirun or srun (a Slurm
  // requeue's steps count from 0 again, but it may run on other nodes) is
  // another job unless its ranks name it with ZEROD_JOB_KEY.
  for (const char* id : {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "SLURM_STEP_ID", "PMI_JOBID"})
    if (carries(key, id))
      return std::string("its key carries ") + id + ", which its launcher gives every launch anew, so a relaunch " +
             (carries(key, "ZEROD_JOB_KEY") ? "is another job (the rank's libzerod is older than this daemon; a "
                                              "libzerod as new sends ZEROD_JOB_KEY without the launcher's ids)"
                                            : "is another job; set ZEROD_JOB_KEY to the same value in every launch "
                                              "of the job to resume its kept state");
  if (carries(key, "ZEROD_JOB_KEY")) return "";
  if (carries(key, "parent"))
    return "its ranks name no job and are keyed by their parent process, which a relaunch does not have again; set "
           "ZEROD_JOB_KEY to the same value in every launch of the job to resume its kept state";
  return "";
}

// Under Server::mu_: the job's ranks that a process still holds ("rank 0
// (pid 12), rank 1 (pid 13)"), "" when none. A rank whose connection its
// client closed is not one, though its session may still be ending (a
// relaunch's first rank often comes before the daemon has seen the last
// launch's hangups). Ranks between their join and their claim are.
std::string live_ranks(const ServedJob& job) {
  std::string live;
  for (const auto& [rank, s] : job.rank_owner)
    if (!s->finished() && !s->hung_up())
      live += (live.empty() ? "" : ", ") + std::string("rank ") + std::to_string(rank) + " (pid " +
              std::to_string(s->pid()) + ")";
  if (job.joining > 0) live += (live.empty() ? "" : ", and ") + std::to_string(job.joining) + " connecting now";
  return live;
}

// Under Server::mu_: a rank of another launch than the job's live ranks'
// is refused, as two launches running at once under one ZEROD_JOB_KEY
// would be one job (claimed ranks refusing the other's, or interleaved
// ranks reducing gradients across two experiments). Once none is live the
// launch is a relaunch, whose ranks take the job (and what daemon.keep_state
// kept for it). A rank that says no launch (an older libzerod, ranks that
// no launcher id tells apart) is let in as before.
void admit_launch(ServedJob& job, const std::string& launch_id, int rank) {
  if (launch_id == job.launch_id) return;
  const std::string live = live_ranks(job);
  if (live.empty() || job.launch_id.empty()) {
    job.launch_id = launch_id;
    return;
  }
  if (launch_id.empty()) return;
  fail(ZD_ERR_INVALID_STATE,
       "rank " + std::to_string(rank) + " (launch " + launch_id + ") cannot join " + job.label +
           ": ranks of another launch of it (" + job.launch_id + ") are still connected: " + live +
           ". Jobs running at the same time need different ZEROD_JOB_KEYs (two srun steps at once: "
           "ZEROD_JOB_KEY=$SLURM_JOB_ID.a and $SLURM_JOB_ID.b, say); if this is the job's relaunch, its last "
           "launch's ranks have not all exited yet: connect again once they have");
}

}  // namespace

Server::Server(ServerOptions options)
    : options_(std::move(options)),
      listener_(transport::Listener::create_private(
          options_.socket_path, transport::ListenerOptions{options_.allow_uid, SOMAXCONN})),
      started_(std::chrono::steady_clock::now()) {
  if (options_.multi_job) {
    node_memory_ = std::make_shared<NodeMemory>(options_.host_memory);
    return;
  }
  if (options_.world_size < 1) fail(ZD_ERR_INVALID_ARGUMENT, "the daemon needs at least one rank");
  if (options_.local_ranks < 0) options_.local_ranks = options_.world_size - options_.first_rank;
  if (options_.first_rank < 0 || options_.local_ranks < 1 ||
      options_.first_rank + options_.local_ranks > options_.world_size)
    fail(ZD_ERR_INVALID_ARGUMENT, "the daemon's ranks " + std::to_string(options_.first_rank) + ".." +
                                      std::to_string(options_.first_rank + options_.local_ranks - 1) +
                                      " are outside the job's " + std::to_string(options_.world_size));
  single_ = std::make_shared<ServedJob>();
  single_->label = "the job";
  single_->world_size = options_.world_size;
  single_->first_rank = options_.first_rank;
  single_->local_ranks = options_.local_ranks;
}

std::shared_ptr<ServedJob> Server::join(const std::string& key, const std::string& launch_id, int world_size,
                                        int local_world_size, int rank, int pid) {
  // The job's own rules, checked before the rank counts as joining.
  auto check_rank = [&](const ServedJob& job) {
    if (world_size != job.world_size)
      fail(ZD_ERR_INVALID_ARGUMENT, "the client says the job has " + std::to_string(world_size) +
                                        " ranks (ZEROD_WORLD_SIZE) but this daemon serves " +
                                        std::to_string(job.world_size));
    if (rank < 0 || rank >= job.world_size)
      fail(ZD_ERR_INVALID_ARGUMENT, "rank " + std::to_string(rank) + " is outside the job's " +
                                        std::to_string(job.world_size) + " ranks (ZEROD_RANK)");
    if (!job.serves(rank))
      fail(ZD_ERR_INVALID_ARGUMENT, "rank " + std::to_string(rank) + " is not served by this daemon, which "
                                        "serves ranks " + std::to_string(job.first_rank) + ".." +
                                        std::to_string(job.first_rank + job.local_ranks - 1) +
                                        "; a rank connects to the daemon of its own node (ZEROD_ENDPOINT)");
  };
  // A claim, not yet a job: bounded before anything is made for it.
  if (world_size > wire::kMaxWorldSize)
    fail(ZD_ERR_INVALID_ARGUMENT, "rank " + std::to_string(rank) + " says its job has " + std::to_string(world_size) +
                                      " ranks; a job has at most " + std::to_string(wire::kMaxWorldSize) +
                                      " (ZEROD_WORLD_SIZE)");
  std::lock_guard<std::mutex> lock(mu_);
  if (!options_.multi_job) {
    check_rank(*single_);
    return single_;
  }
  if (world_size < 1) fail(ZD_ERR_INVALID_ARGUMENT, "a job needs at least one rank");
  // Every rank of the job is this node's, and its first model is built for
  // all of them as soon as one rank asks: the claim is bounded by what a
  // node runs before anything is built for it.
  if (world_size > options_.max_job_ranks)
    fail(ZD_ERR_CONFIG, "rank " + std::to_string(rank) + " says its job has " + std::to_string(world_size) +
                            " ranks; `zerod serve --jobs` serves jobs of at most " +
                            std::to_string(options_.max_job_ranks) + " ranks, all on its node; run a larger job "
                            "under `zerod run` (one per node under mpirun or srun, docs/multinode.md)");
  if (local_world_size > 0 && local_world_size != world_size)
    fail(ZD_ERR_CONFIG, "the rank says " + std::to_string(local_world_size) + " of its job's " +
                            std::to_string(world_size) + " ranks run on this node: `zerod serve --jobs` serves "
                            "jobs whose ranks are all on its node; run one `zerod run` per node under mpirun or "
                            "srun for several (docs/multinode.md)");
  std::string k = key;
  std::string one_launch;
  if (k.empty()) {
    // One rank alone is a job of its own; several must say which job they are.
    if (world_size > 1)
      fail(ZD_ERR_CONFIG, "this daemon serves several jobs and rank " + std::to_string(rank) + " of " +
                              std::to_string(world_size) + " names none: set ZEROD_JOB_KEY to the same value in "
                              "every rank of the job (ranks that torchrun, mpirun or srun started are told "
                              "apart by their launcher's ids)");
    k = "pid=" + std::to_string(pid) + ";connection=" + std::to_string(jobs_made_) + ";";
    one_launch = "it names no job, so it is keyed by its connection, which no restart has again; give a process "
                 "that is restarted by hand a ZEROD_JOB_KEY";
  } else {
    one_launch = one_launch_because(k);
  }
  auto it = jobs_.find(k);
  if (it != jobs_.end()) {
    if (it->second->world_size != world_size)
      fail(ZD_ERR_INVALID_ARGUMENT, "rank " + std::to_string(rank) + " says its job has " +
                                        std::to_string(world_size) + " ranks but " + it->second->label + " has " +
                                        std::to_string(it->second->world_size) + " (ZEROD_WORLD_SIZE)");
    check_rank(*it->second);
    admit_launch(*it->second, launch_id, rank);
    ++it->second->joining;
    return it->second;
  }
  if (rank < 0 || rank >= world_size)
    fail(ZD_ERR_INVALID_ARGUMENT, "rank " + std::to_string(rank) + " is outside the job's " +
                                      std::to_string(world_size) + " ranks (ZEROD_RANK)");
  auto job = std::make_shared<ServedJob>();
  job->key = k;
  job->label = "job " + std::to_string(jobs_made_++) + " (" + k + ")";
  job->world_size = world_size;
  job->first_rank = 0;
  job->local_ranks = world_size;
  job->one_launch = one_launch;
  job->launch_id = launch_id;
  job->joining = 1;
  jobs_[k] = job;
  // A long-running daemon's log says which jobs came and went.
  std::fprintf(stderr, "zerod serve: serving %s, %d rank%s\n", job->label.c_str(), world_size,
               world_size == 1 ? "" : "s");
  return job;
}

void Server::forget_job_if_done(std::shared_ptr<ServedJob> job) {
  if (!options_.multi_job || !job->rank_owner.empty() || job->joining > 0 || !job->building.empty() ||
      !job->refused_restarts.empty())
    return;
  for (const auto& [id, m] : models_)
    if (m->job().get() == job.get()) return;
  if (jobs_.erase(job->key)) std::fprintf(stderr, "zerod serve: %s is done: its ranks and models are gone\n", job->label.c_str());
}

Server::~Server() { stop(); }

void Server::start() {
  accept_thread_ = std::thread([this] { accept_loop(); });
}

void Server::accept_loop() {
  while (!stopping_.load()) {
    std::optional<transport::Connection> c;
    try {
      c = listener_.accept();
    } catch (const transport::PeerRefused& e) {
      log_warn(std::string("refused a connection: ") + e.what());
      continue;
    } catch (const Error& e) {
      log_warn(std::string("accept failed: ") + e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    if (!c) break;  // shut down
    if (!make_room_before_hello()) break;  // the daemon stops
    start_session(std::move(*c));
  }
}

void Server::start_session(transport::Connection c) {
  std::shared_ptr<Session> s;
  try {
    s = std::make_shared<Session>(*this, std::move(c));
    s->start();
  } catch (const std::exception& e) {
    // A thread that would not start (the user's process limit, ulimit -u,
    // counts threads), memory refused: this connection is turned away, and
    // every other one, and every job, goes on. Uncaught, it ended the
    // daemon and every job it served.
    const std::string why = std::string("the daemon cannot serve another connection now: ") + e.what() +
                            " (a thread per connection: see ulimit -u, or close idle `zerod status`/`zerod top` "
                            "connections); connect again later";
    log_warn("refused a connection: " + why);
    if (s)
      s->refuse(ZD_ERR_OUT_OF_MEMORY, why);
    else
      Session::refuse(c, ZD_ERR_OUT_OF_MEMORY, why);  // still ours if the session was never made
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  reap_finished();
  sessions_.push_back(std::move(s));
}

void Server::reap_finished() {
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if ((*it)->finished()) {
      (*it)->join();
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
}

bool Server::make_room_before_hello() {
  using Clock = std::chrono::steady_clock;
  while (!stopping_.load()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      int waiting = 0;
      Session* oldest = nullptr;
      for (const auto& s : sessions_)  // in the order they were accepted
        if (!s->finished() && !s->hello_came() && !s->stopping()) {
          if (!oldest) oldest = s.get();
          ++waiting;
        }
      if (waiting < options_.max_waiting_for_hello || !oldest) return true;
      if (Clock::now() - oldest->accepted() >= std::chrono::milliseconds(options_.hello_grace_ms)) {
        log_warn(std::to_string(waiting) + " connections are waiting for their hello: closing the one that has "
                 "waited longest (pid " + std::to_string(oldest->pid()) + ")");
        oldest->stop();  // its thread ends, and is reaped at a later accept
        return true;
      }
    }
    // All of them connected moments ago (ranks starting together): their
    // hellos are on the way. The new connection waits, its client none the
    // wiser, and so do those behind it in the listen queue.
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

void Server::stop(int signal) {
  if (stopping_.exchange(true)) return;
  {
    // Taken between the flag and the notify: a rank about to wait for
    // another's build has either seen the flag or is waiting already.
    std::lock_guard<std::mutex> lock(mu_);
  }
  model_built_.notify_all();
  rank_owners_changed_.notify_all();  // a session waiting for its rank's reclaim ends the wait
  listener_.shutdown();
  if (accept_thread_.joinable()) accept_thread_.join();
  std::vector<std::shared_ptr<Session>> sessions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sessions.swap(sessions_);
  }
  // A session blocked in a collective is woken by its model's comm abort.
  // The job fails as a whole, blaming no rank: marking each rank lost here
  // named the first as the cause of a stop that was asked for.
  const std::string reason =
      "the daemon is stopping" + (signal ? " (signal " + std::to_string(signal) + ")" : std::string());
  for (auto& m : models())
    if (m->anyone_attached()) m->model().stop_job(reason);
  for (auto& s : sessions) s->stop();
  for (auto& s : sessions) s->join();
  std::map<int, std::shared_ptr<ModelHost>> models;
  {
    std::lock_guard<std::mutex> lock(mu_);
    models.swap(models_);
  }
  models.clear();  // their end-of-job snapshots write to disk: not under the lock a metrics scrape takes
}

bool Server::claim_rank(ServedJob& job, int rank, Session* s, std::string* holder) {
  // A rank that disconnected and connects again (a new zd_connect in the
  // same process, a restarted trainer) may arrive before its old session has
  // seen the EOF: give that session a moment to finish.
  std::unique_lock<std::mutex> lock(mu_);
  if (job.joining > 0) --job.joining;  // from join(): it is claiming now, or refused
  const auto free = [&] {
    auto it = job.rank_owner.find(rank);
    return it == job.rank_owner.end() || it->second->finished();
  };
  rank_owners_changed_.wait_for(lock, std::chrono::milliseconds(options_.reclaim_wait_ms), free);
  if (!free()) {
    *holder = "pid " + std::to_string(job.rank_owner[rank]->pid());
    return false;
  }
  job.rank_owner[rank] = s;
  job.departed.erase(rank);  // back in the run
  job.any_rank_came = true;
  any_rank_came_ = true;
  rank_owners_changed_.notify_all();  // the rank's old session no longer waits for this claim
  return true;
}

bool Server::ranks_came_and_left() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!any_rank_came_) return false;
  if (single_ && !single_->rank_owner.empty()) return false;
  for (const auto& [key, job] : jobs_)
    if (!job->rank_owner.empty()) return false;
  return true;
}

bool Server::any_rank_came() {
  std::lock_guard<std::mutex> lock(mu_);
  return any_rank_came_;
}

void Server::release_rank(ServedJob& job, int rank, Session* s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = job.rank_owner.find(rank);
    if (it != job.rank_owner.end() && it->second == s) job.rank_owner.erase(it);
    if (job.rank_owner.empty()) end_run(job);
    if (options_.multi_job)
      if (auto j = jobs_.find(job.key); j != jobs_.end() && j->second.get() == &job) forget_job_if_done(j->second);
  }
  rank_owners_changed_.notify_all();
}

void Server::end_run(ServedJob& job) {
  // No rank holds a connection: the next one to come starts a run of its
  // own. Counted on, a rank 0 that created a model in a run whose rank 1
  // died before its create (or a create that failed on one rank) paired
  // every later run's k-th create on rank 0 with the (k-1)-th on rank 1,
  // which then waited in their collectives until comm.timeout.
  job.creates.clear();
  job.failed_creates.clear();
  job.departed.clear();
}

void Server::lose_unless_reclaimed(const std::shared_ptr<ServedJob>& job, int rank, int pid) {
  std::unique_lock<std::mutex> lock(mu_);
  // Settled: the rank is back (a new zd_connect, a restarted trainer), the
  // run is over (nobody is left to wait for it), or the daemon stops.
  const auto settled = [&] {
    return stopping_.load() || job->rank_owner.empty() || job->rank_owner.count(rank) > 0;
  };
  if (rank_owners_changed_.wait_for(lock, std::chrono::milliseconds(options_.reclaim_wait_ms), settled)) return;
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", options_.reclaim_wait_ms / 1000.0);
  const std::string why = "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) +
                          ") is gone: its connection closed, and no connection claimed rank " +
                          std::to_string(rank) + " again within " + secs + " s";
  job->departed[rank] = why;  // and the job's models made from now on (create_or_attach)
  std::vector<std::shared_ptr<ModelHost>> models;
  for (const auto& [id, m] : models_)
    if (m->job() == job) models.push_back(m);
  lock.unlock();
  for (const auto& m : models)
    if (m->lose_absent_rank(rank, why)) log_warn("model " + std::to_string(m->id()) + " counts " + why);
}

bool Server::admit_observer() {
  std::lock_guard<std::mutex> lock(mu_);
  if (observers_ >= options_.max_observers) return false;
  ++observers_;
  return true;
}

void Server::observer_left() {
  std::lock_guard<std::mutex> lock(mu_);
  --observers_;
}

int Server::rank_pid(const ServedJob& job, int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = job.rank_owner.find(rank);
  return it == job.rank_owner.end() ? 0 : it->second->pid();
}

std::shared_ptr<ModelHost> Server::create_or_attach(const std::shared_ptr<ServedJob>& job, int rank,
                                                    const std::string& text, const std::string& name,
                                                    bool allow_io, const std::string& device,
                                                    const std::string& script_dir) {
  // A model another rank made for another device is not this rank's.
  auto same_device = [&](const ModelHost& m) {
    if (m.device_request() != device)
      fail(ZD_ERR_CONFIG, "rank " + std::to_string(rank) + " asks for its model on device \"" +
                              (device.empty() ? "(the job script's)" : device) + "\" but another rank created it on \"" +
                              (m.device_request().empty() ? "(the job script's)" : m.device_request()) +
                              "\"; every rank must pass the same zd_model_options.device");
  };
  std::unique_lock<std::mutex> lock(mu_);
  // A restarted rank of a job that keeps its state whose model was not kept
  // because a step stopped part-way in it: told why, once, instead of
  // starting afresh unawares (the trainer expects to resume).
  if (auto r = job->refused_restarts.find(text); r != job->refused_restarts.end() && r->second.ranks.erase(rank)) {
    const Error e = r->second.error;
    if (r->second.ranks.empty()) job->refused_restarts.erase(r);
    throw e;
  }
  for (auto& [id, m] : models_)
    if (m->job() == job && m->script_text() == text)
      if (std::optional<Error> e = m->refuse_restart_of(rank)) throw *e;  // that model is still in use
  // A restarted rank of a job that keeps its state finds its old model.
  for (auto& [id, m] : models_) {
    if (m->job() != job) continue;
    if (m->script_text() == text && m->can_reattach(rank)) {
      same_device(*m);
      const int64_t step = m->model().activity().snapshot()[static_cast<size_t>(rank)].step;
      m->reattach(rank);
      // Said loudly: the new run's initial values are not used. A run that
      // meant to start afresh after a crash needs a new daemon.
      log_warn("rank " + std::to_string(rank) + " re-attached to model " + std::to_string(id) + " (" +
               m->script_name() + (options_.multi_job ? ", " + job->label : std::string()) +
               "), which daemon.keep_state kept when a rank of the last run was lost: it resumes that run's "
               "state at step " + std::to_string(step) +
               ", not this run's initial values (stop the daemon to start afresh)");
      return m;
    }
  }
  const uint64_t key = job->creates[rank]++;
  // A create that failed on this rank alone (its script did not load, or
  // differs from the model's, or names another device) is not counted: the
  // rank's next create is still its k-th, and meets the other ranks' k-th.
  // One that failed for every rank (failed_creates) counts on every rank.
  const auto uncount = [&] {
    if (auto c = job->creates.find(rank); c != job->creates.end() && c->second == key + 1) c->second = key;
  };
  // Another rank's model of this key: attached to it (under mu_).
  auto attach_made = [&]() -> std::shared_ptr<ModelHost> {
    for (auto& [id, m] : models_) {
      if (m->job() != job || m->key() != key) continue;
      if (m->attached(rank)) continue;  // an old model of this key whose rank is still there
      // No rank on it: a model kept for a restart (re-attached above, never
      // by its key: an earlier run's key k is not this run's), or one on
      // its way out.
      if (!m->anyone_attached()) continue;
      if (m->script_text() != text)
        fail(ZD_ERR_CONFIG, "rank " + std::to_string(rank) + "'s job script " + name +
                                " differs from the " + m->script_name() +
                                " another rank created this model with; every rank must use the "
                                "same job script");
      same_device(*m);
      m->attach(rank);
      return m;
    }
    return nullptr;
  };
  for (;;) {
    try {
      if (auto m = attach_made()) return m;
    } catch (...) {
      uncount();
      throw;
    }
    // A create of this model that failed fails the other ranks' at once with
    // its error: built again, each would be a new create of the comm instance
    // across nodes (the other daemons would wait comm.timeout for each).
    if (auto f = job->failed_creates.find(key); f != job->failed_creates.end()) throw f->second;
    if (!job->building.count(key)) break;
    // Another rank of the job is building it: this one attaches once it is
    // built, or fails with its build's error.
    if (stopping_.load()) fail(ZD_ERR_INVALID_STATE, "the daemon is stopping");
    model_built_.wait(lock);
  }
  // The first rank to ask builds it, outside the lock: the script runs Lua
  // and loads plugins; the model opens a device and a comm stream per rank
  // and makes the comm instance, which across nodes waits for the other
  // daemons (up to comm.timeout). Under the lock every other job's and
  // client's requests (hello, status, another job's create) waited as long.
  job->building.insert(key);
  const int id = next_model_id_++;
  lock.unlock();
  std::shared_ptr<ModelHost> made;
  std::exception_ptr failure;
  std::optional<Error> failed_create;  // the model's build failed: the others' would fail alike
  try {
    scripting::ScriptSource src;
    src.text = text;
    src.name = name;
    src.dir = script_dir;
    src.allow_io = allow_io;
    // A daemon serving part of the job's ranks is one of several nodes: a
    // script naming no comm backend spans them with "mpi".
    if (job->local_ranks > 0 && job->world_size > job->local_ranks) src.nodes = job->world_size / job->local_ranks;
    // A DeepSpeed config's accumulation steps may follow from the job's rank
    // count (train_batch_size / micro-batch / ranks), as `zerod run` checked.
    src.world_size = job->world_size;
    // A script that does not load is this rank's own error: another rank
    // waiting for this model then loads its own.
    auto script = scripting::JobScript::load(src);
    try {
      // The hook is asked only during this build, while this server is.
      made = std::make_shared<ModelHost>(
          id, key, text, name, std::move(script), job, options_.trace_path, device, node_memory_,
          options_.snapshot_restart, [this, job](const std::string& path) { return lock_wait_ends(*job, path); });
    } catch (const Error& e) {
      failed_create.emplace(e);
      throw;
    } catch (const std::exception& e) {
      // A thread that would not start, memory refused: the others' creates
      // would fail alike, each after its own comm.timeout across nodes.
      failed_create.emplace(ZD_ERR_INTERNAL, std::string("creating the model failed: ") + e.what());
      throw *failed_create;
    }
  } catch (...) {
    failure = std::current_exception();
  }
  lock.lock();
  job->building.erase(key);
  if (failed_create) job->failed_creates.emplace(key, *failed_create);
  if (failure && !failed_create) uncount();  // this rank's script did not load
  std::map<int, std::string> departed;  // ranks of the run that are gone: this model waits for none of them
  if (made) {
    made->attach(rank);
    models_[id] = made;
    departed = job->departed;
  }
  lock.unlock();
  model_built_.notify_all();
  for (const auto& [r, why] : departed)
    if (made->lose_absent_rank(r, why)) log_warn("model " + std::to_string(id) + " counts " + why);
  if (failed_create && stopping_.load())
    // Its reply may not reach the rank (the stop closes its connection):
    // the log says why its model was not made.
    log_warn("rank " + std::to_string(rank) + "'s zd_model_create: " + failed_create->what());
  if (failure) std::rethrow_exception(failure);
  return made;
}

std::shared_ptr<ModelHost> Server::model(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = models_.find(id);
  return it == models_.end() ? nullptr : it->second;
}

void Server::forget_if_unused(const std::shared_ptr<ModelHost>& m) {
  if (m->anyone_attached()) return;
  std::string not_kept;
  if (const std::string why = m->kept_because(options_.keep_state); !why.empty()) {
    if (m->job()->one_launch.empty()) {
      log_info("model " + std::to_string(m->id()) + " (" + m->script_name() + ") is kept for a restart " +
               "(daemon.keep_state): " + why);
      return;
    }
    // Kept, it would hold its memory (--host-memory) until the daemon stops.
    not_kept = "model " + std::to_string(m->id()) + " (" + m->script_name() + ") of " + m->job()->label +
               " is not kept for a restart, although its job asks for it (daemon.keep_state) and a rank was lost (" +
               why + "), because " + m->job()->one_launch;
  }
  // Not kept because a step stopped part-way: the lost ranks' restarts, which
  // expect to resume it, are told why.
  const std::optional<Error> refused = m->refused_restart(options_.keep_state);
  const std::vector<int> lost = refused ? m->lost_ranks() : std::vector<int>{};
  std::lock_guard<std::mutex> lock(mu_);
  const bool erased = models_.erase(m->id()) > 0;  // once, though each leaving rank's session may get here
  if (erased && !not_kept.empty()) log_warn(not_kept);
  if (erased && refused) {
    const bool recurs = m->job()->one_launch.empty();
    log_warn(std::string(refused->what()) +
             (recurs ? "\n(the restarted ranks' next zd_model_create of the script fails with this, once)" : ""));
    if (recurs) {
      auto r = m->job()->refused_restarts.find(m->script_text());
      if (r == m->job()->refused_restarts.end())
        r = m->job()->refused_restarts.emplace(m->script_text(), ServedJob::RefusedRestart{*refused, {}}).first;
      else
        r->second.error = *refused;
      r->second.ranks.insert(lost.begin(), lost.end());
    }
  }
  if (options_.multi_job)
    if (auto j = jobs_.find(m->job()->key); j != jobs_.end() && j->second == m->job()) forget_job_if_done(j->second);
}

std::vector<std::shared_ptr<ModelHost>> Server::models() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<ModelHost>> out;
  for (auto& [id, m] : models_) out.push_back(m);
  return out;
}

std::vector<ServedJob> Server::jobs() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ServedJob> out;
  auto copy = [&](const ServedJob& j) {
    out.push_back(j);
    out.back().rank_owner.clear();  // sessions of the server's, not the caller's to touch
  };
  if (single_) copy(*single_);
  for (const auto& [key, j] : jobs_) copy(*j);
  return out;
}

double Server::uptime_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
}

std::vector<std::string> Server::lost_ends() {
  if (!single_) return {};
  std::lock_guard<std::mutex> lock(single_->lost_ends->mu);
  return single_->lost_ends->what;
}

std::optional<Error> Server::lock_wait_ends(const ServedJob& job, const std::string& path) {
  // Server::stop joins the session building this model: before, it waited
  // out the whole comm.timeout (300 s by default) here.
  if (stopping_.load())
    return Error(ZD_ERR_INVALID_STATE, "the daemon is stopping, so this model no longer waits for it and is not made");
  const auto same_dir = [&](const std::string& other) {
    std::error_code ec;
    return other == path || std::filesystem::equivalent(other, path, ec);
  };
  for (const auto& m : models()) {
    const std::string& held = m->model().config().snapshot.path;
    if (held.empty() || m->anyone_attached() || !same_dir(held)) continue;
    const std::string kept = m->kept_because(options_.keep_state);
    if (kept.empty()) continue;  // ending: it lets go of the path as it goes
    const std::vector<int> lost = m->lost_ranks();
    const int rank = lost.empty() ? m->model().first_local_rank() : lost.front();
    const int64_t step = m->model().activity().snapshot()[static_cast<size_t>(rank)].step;
    const bool same_job = m->job().get() == &job;
    return Error(
        ZD_ERR_CONFIG,
        "it is the path of model " + std::to_string(m->id()) + " (" + m->script_name() + ") of " + m->job()->label +
            ", which daemon.keep_state keeps for a restart since " + kept + ", at step " + std::to_string(step) +
            ". A kept model is re-attached only by a restart of the same job with its job script unchanged; " +
            (same_job ? "this model's script differs (an edited script makes a new model)"
                      : "this model is " + job.label + "'s") +
            ", and the kept model holds the path until it ends, which no wait brings about. Restart the job with the "
            "unchanged script to resume the kept model, or stop this daemon (SIGINT or SIGTERM to its zerod serve or "
            "zerod run; zerod status lists its models) to drop the kept state and start afresh");
  }
  return std::nullopt;
}

void Server::rank_exited(int rank, const std::string& how) {
  // Only `zerod run` (one job) launches ranks itself.
  for (auto& m : models())
    if (m->job() == single_ && m->attached(rank)) m->detach(rank, true, how);
}

}  // namespace zerod::server
