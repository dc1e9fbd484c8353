// One connection to the daemon: a trainer rank or an observer. Its thread
// reads a request, runs it against the hosted model as that rank, and
// answers; the views it returns point into the rank's shared arenas, whose
// fds it sends once.
#pragma once

#include "transport/connection.h"
#include "transport/shared_memory.h"
#include "zerod_v1.pb.h"

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace zerod::server {

class Server;
class ModelHost;

class Session {
 public:
  Session(Server& server, transport::Connection connection);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void start();
  void stop();  // wakes the thread (shutdown of the socket)
  void join();
  bool finished() const { return finished_.load(); }
  int rank() const { return rank_; }
  int pid() const { return pid_; }

  // What the session's thread does with each frame it receives, without the
  // socket (the fuzz target drives a session through these): answer()
  // parses and runs one request frame and returns its reply, an error reply
  // for anything the client got wrong; fds gets the arena fds to attach to
  // the reply (owned by the arenas, not to be closed). end() leaves every
  // model and frees the rank, as when the connection drops.
  v1::Reply answer(transport::Frame& frame, std::vector<int>* fds);
  void end(const std::string& why);

 private:
  void run();
  void handle(const v1::Request& req, transport::Frame& frame, v1::Reply* reply,
              std::vector<int>* fds);
  void register_param(const v1::RegisterParam& r, v1::Reply* reply);
  void hello(const v1::Hello& h, v1::Reply* reply);
  std::shared_ptr<ModelHost> model_of(int id);
  void call(const v1::ModelCall& c, v1::Reply* reply);
  void add_views(ModelHost& m, int module, bool gradients, v1::CallReply* out);
  void add_new_arenas(ModelHost& m, v1::Reply* reply, std::vector<int>* fds);
  void staging(int fd, uint64_t size);
  std::byte* staging_at(uint64_t offset, uint64_t bytes, const char* what) const;
  void leave_all(bool lost, const std::string& reason);
  void require_rank(const char* what) const;

  Server& server_;
  transport::Connection conn_;
  std::thread thread_;
  std::atomic<bool> finished_{false};
  bool greeted_ = false;
  bool observer_ = false;
  int rank_ = -1;
  int pid_ = 0;
  std::map<int, std::shared_ptr<ModelHost>> models_;  // attached, by id
  std::map<int, size_t> arenas_sent_;                 // per model: arenas of our pool already sent
  transport::SharedMapping staging_;  // the client's sealed staging memfd, checked before it was mapped
  bool ended_ = false;
};

}  // namespace zerod::server
