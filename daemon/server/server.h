// The daemon's socket server: accepts trainer ranks (and `zerod status`
// observers), serves each connection on a thread of its own, and hosts the
// models the ranks create. A malformed or oversize frame gets an error reply
// and the daemon keeps serving everyone else.
#pragma once

#include "model_host.h"
#include "transport/listener.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
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
  bool keep_state = false;  // keep models whose ranks all left (for a restart)
  // How long a rank's new connection waits for its previous one to be seen
  // closed before the rank counts as taken.
  int reclaim_wait_ms = 5000;
  // `zerod run --trace FILE`: every model records a trace there (its job
  // script's trace.steps, or the default steps).
  std::string trace_path;
};

class Session;

class Server {
 public:
  explicit Server(ServerOptions options);  // binds the socket
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  void start();  // the accept thread
  // Stops accepting, closes every connection and joins the threads.
  void stop();
  const std::string& socket_path() const { return listener_.path(); }
  int world_size() const { return options_.world_size; }
  int first_rank() const { return options_.first_rank; }
  int local_ranks() const { return options_.local_ranks; }
  bool serves(int rank) const { return rank >= first_rank() && rank < first_rank() + local_ranks(); }

  // From the launcher: rank's process is gone (how = "exited with status 3").
  void rank_exited(int rank, const std::string& how);
  // `zerod serve --until-done`: some rank came, and no rank holds a
  // connection now.
  bool ranks_came_and_left();
  bool any_rank_came();

  // --- for sessions ---------------------------------------------------------
  // Claims the rank for a connection; false if another connection has it.
  bool claim_rank(int rank, Session* s, std::string* holder);
  void release_rank(int rank, Session* s);
  // The model for rank's next zd_model_create (created by the first rank
  // to ask, attached by the others).
  // device: the trainer's zd_model_options.device ("" = the script's); every
  // rank of a model must give the same.
  std::shared_ptr<ModelHost> create_or_attach(int rank, const std::string& text, const std::string& name,
                                              bool allow_io, const std::string& device = "");
  std::shared_ptr<ModelHost> model(int id);
  void forget_if_unused(const std::shared_ptr<ModelHost>& m);
  std::vector<std::shared_ptr<ModelHost>> models();
  double uptime_s() const;
  int rank_pid(int rank);

 private:
  void accept_loop();
  void reap_finished();

  ServerOptions options_;
  transport::Listener listener_;
  std::chrono::steady_clock::time_point started_;
  std::thread accept_thread_;
  std::atomic<bool> stopping_{false};

  std::mutex mu_;
  std::vector<std::shared_ptr<Session>> sessions_;
  std::map<int, Session*> rank_owner_;
  bool any_rank_came_ = false;  // under mu_
  std::condition_variable rank_freed_;
  std::map<int, std::shared_ptr<ModelHost>> models_;  // by id
  std::vector<uint64_t> creates_;                      // per rank: models it created so far
  int next_model_id_ = 0;
};

}  // namespace zerod::server
