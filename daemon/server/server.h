// The daemon's socket server: accepts trainer ranks (and `zerod status`
// observers), serves each connection on a thread of its own, and hosts the
// models the ranks create. A malformed or oversize frame gets an error reply
// and the daemon keeps serving everyone else.
#pragma once

#include "model_host.h"
#include "node_memory.h"
#include "served_job.h"
#include "transport/listener.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace zerod::server {

struct ServerOptions {
  std::string socket_path;  // "" = a private directory under $XDG_RUNTIME_DIR or /tmp
  int world_size = 1;       // ranks of the job, on every node
  // The ranks this daemon serves: [first_rank, first_rank + local_ranks)
  // (-1: all). One daemon per node, node-major, under mpirun or srun.
  int first_rank = 0;
  int local_ranks = -1;
  std::set<uid_t> allow_uid;
  // Keep a model whose rank was lost, for a restart, as daemon.keep_state
  // does (the daemon's own --job's; ModelHost::kept_because).
  bool keep_state = false;
  // How long a rank's new connection waits for its previous one to be seen
  // closed before the rank counts as taken; and how long a rank whose
  // connection ended may take to connect again before the models of its
  // run it never came to count it lost (Server::lose_unless_reclaimed).
  int reclaim_wait_ms = 5000;
  // `zerod run --trace FILE`: every model records a trace there (its job
  // script's trace.steps, or the default steps).
  std::string trace_path;
  // `zerod serve --resume-snapshots` (a daemon `zerod run` restarted): the
  // snapshots its run wrote, the only ones the job's model resumes from.
  std::optional<SnapshotRestart> snapshot_restart;
  // `zerod serve --jobs`: several jobs at once, each known by the job key
  // its ranks send (world_size, first_rank and local_ranks above are then
  // unused: each job brings its own, all of its ranks on this node), their
  // model state charged together against host_memory bytes (NodeMemory).
  bool multi_job = false;
  uint64_t host_memory = 0;
  // A connection must say hello within hello_timeout_ms of being accepted,
  // or it is closed. A trainer's libzerod and `zerod status` send it as
  // they connect; 30 s leaves room for a machine under heavy load. And at
  // most max_waiting_for_hello connections wait for their hello at once
  // (each has a thread): the next one closes the one that has waited
  // longest, which a client that meant to say hello would have said by
  // now, but never one younger than hello_grace_ms (ranks that all start
  // at once): the new one waits for room until then.
  int hello_timeout_ms = 30000;
  int max_waiting_for_hello = 64;
  int hello_grace_ms = 1000;
  // At most this many observer connections (`zerod status`, `zerod top`)
  // at once, each with a thread and no deadline once it said hello: the
  // next one is refused with ZD_ERR_INVALID_STATE saying so, and closed, so
  // that idle observers piling up cannot take the threads the ranks need.
  int max_observers = 64;
  // multi_job: the most ranks a job may claim. All of them are this node's:
  // its first zd_model_create builds a device and a comm stream for each
  // (about 100 KiB and 0.15 ms a rank on the cpu device), so a hello's claim
  // is bounded by what a node can run, not by wire::kMaxWorldSize. A job of
  // more ranks runs under `zerod run` or `zerod serve --job`.
  int max_job_ranks = 256;
};

class Session;

class Server {
 public:
  explicit Server(ServerOptions options);  // binds the socket
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  void start();  // the accept thread
  // Stops accepting, closes every connection and joins the threads. A
  // model some rank is attached to fails on every rank with "the daemon is
  // stopping" (and "(signal N)" when a signal asked for the stop), blaming
  // no rank.
  void stop(int signal = 0);
  const std::string& socket_path() const { return listener_.path(); }
  bool multi_job() const { return options_.multi_job; }
  int hello_timeout_ms() const { return options_.hello_timeout_ms; }
  // A single-job daemon's job (world size, ranks served).
  const ServedJob& job() const { return *single_; }
  int world_size() const { return single_->world_size; }
  int first_rank() const { return single_->first_rank; }
  int local_ranks() const { return single_->local_ranks; }
  // Null unless multi_job.
  const NodeMemory* node_memory() const { return node_memory_.get(); }

  // From the launcher: rank's process is gone (how = "exited with status 3").
  void rank_exited(int rank, const std::string& how);
  // A single-job daemon's models whose end was not saved (their final
  // snapshot failed: ServedJob::lost_ends), each with what the log said.
  // Complete once stop() has returned (the last models end in it).
  std::vector<std::string> lost_ends();
  // `zerod serve --until-done`: some rank came, and no rank holds a
  // connection now.
  bool ranks_came_and_left();
  bool any_rank_came();

  // --- for sessions ---------------------------------------------------------
  // The job a rank's hello joins: a single-job daemon's one job (key
  // ignored); with multi_job the job of that key, made by its first rank.
  // Throws Error saying why the rank cannot join (its world size, its rank
  // out of range or not this node's). The rank must then claim_rank().
  // launch_id: which launch of the job the rank is of (Hello.launch_id; ""
  // not known); one of another launch is refused while the job has a live
  // rank. pid: the client's.
  std::shared_ptr<ServedJob> join(const std::string& key, const std::string& launch_id, int world_size,
                                  int local_world_size, int rank, int pid);
  // Claims the rank for a connection; false if another connection has it.
  bool claim_rank(ServedJob& job, int rank, Session* s, std::string* holder);
  // Once no rank of the job holds a connection, its run is over
  // (ServedJob::creates).
  void release_rank(ServedJob& job, int rank, Session* s);
  // After a rank's connection ended and release_rank freed it, on that
  // session's thread: waits up to reclaim_wait_ms for a connection to claim
  // the rank again. If none did while other ranks of the job are connected,
  // the rank is gone from the run (ServedJob::departed): the job's models
  // it never attached to count it lost (ModelHost::lose_absent_rank), and
  // so does each model made after, so that the ranks waiting for it there
  // fail with ZD_ERR_PEER_LOST naming it instead of waiting comm.timeout.
  // pid: its client's, for the message.
  void lose_unless_reclaimed(const std::shared_ptr<ServedJob>& job, int rank, int pid);
  // An observer's hello: false when max_observers are connected already.
  // Each admitted one calls observer_left() as its connection ends.
  bool admit_observer();
  void observer_left();
  int max_observers() const { return options_.max_observers; }
  // The model for rank's next zd_model_create (created by the first rank
  // to ask, attached by the others). The first rank builds it without
  // holding the server's lock (loading the script, the engine's model with a
  // device per rank, the comm instance, which across nodes waits for the
  // other daemons), so every other job and client is served meanwhile; the
  // job's other ranks asking for the same model wait for that build.
  // device: the trainer's zd_model_options.device ("" = the script's); every
  // rank of a model must give the same. script_dir: where the script's
  // relative paths resolve (the trainer's side: CreateModel.script_dir).
  std::shared_ptr<ModelHost> create_or_attach(const std::shared_ptr<ServedJob>& job, int rank, const std::string& text,
                                              const std::string& name, bool allow_io, const std::string& device = "",
                                              const std::string& script_dir = "");
  std::shared_ptr<ModelHost> model(int id);
  void forget_if_unused(const std::shared_ptr<ModelHost>& m);
  std::vector<std::shared_ptr<ModelHost>> models();
  double uptime_s() const;
  int rank_pid(const ServedJob& job, int rank);
  // The jobs served now (copies without their rank tables).
  std::vector<ServedJob> jobs();

 private:
  void accept_loop();
  // The new connection's session and its thread; a connection whose
  // session cannot start is refused with an error reply and closed.
  void start_session(transport::Connection c);
  void reap_finished();
  // Under mu_: no rank of the job holds a connection; its run's record goes.
  static void end_run(ServedJob& job);
  // Before a new connection gets its session: when max_waiting_for_hello
  // connections wait for their hello, closes the one that has waited
  // longest, once it has waited hello_grace_ms (until then this waits).
  // False: the daemon stops.
  bool make_room_before_hello();
  // A model of `job` being built waits for its snapshot.path's lock, which
  // another model holds (ModelHost::LockWaitEnds): an error when the wait
  // must end now: the daemon stops, or the holder is a model this daemon
  // keeps for a restart (daemon.keep_state), which lets go of the path only
  // when it ends, so that waiting for it would only delay the refusal.
  std::optional<Error> lock_wait_ends(const ServedJob& job, const std::string& path);

  ServerOptions options_;
  transport::Listener listener_;
  std::chrono::steady_clock::time_point started_;
  std::thread accept_thread_;
  std::atomic<bool> stopping_{false};

  // A multi-job daemon's job when its ranks and models are all gone.
  void forget_job_if_done(std::shared_ptr<ServedJob> job);  // under mu_; by value: it erases the map entry it may come from

  std::mutex mu_;
  std::vector<std::shared_ptr<Session>> sessions_;
  std::shared_ptr<ServedJob> single_;                           // the job of a single-job daemon
  std::map<std::string, std::shared_ptr<ServedJob>> jobs_;      // multi_job: by key
  int jobs_made_ = 0;
  bool any_rank_came_ = false;  // under mu_
  int observers_ = 0;           // under mu_: admitted observers still connected
  // A rank's connection released or claimed (a rank_owner changed).
  std::condition_variable rank_owners_changed_;
  std::map<int, std::shared_ptr<ModelHost>> models_;  // by id
  int next_model_id_ = 0;
  // A model built (or its build failed): the job's ranks waiting for it in
  // create_or_attach look again (ServedJob::building).
  std::condition_variable model_built_;
  std::shared_ptr<NodeMemory> node_memory_;  // multi_job
};

}  // namespace zerod::server
