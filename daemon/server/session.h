// One connection to the daemon: a trainer rank or an observer. Its thread
// reads a request, runs it against the hosted model as that rank, and
// answers; the views it returns point into the rank's shared arenas, whose
// fds it sends once. Requests come as socket frames until the client sends
// its call ring (RingSetup); from then on the thread waits on the ring, and
// the socket carries only what the ring announces (set-up requests, fds).
// A model call is a call record (ring_call.h) on either carrier, the ring
// or a wire::kCall frame, and runs through the engine's dispatcher
// (engine/calls/dispatch.h).
#pragma once

#include "calls/dispatch.h"
#include "ring_call.h"
#include "transport/connection.h"
#include "transport/ring.h"
#include "transport/shared_memory.h"
#include "zerod_v1.pb.h"

#include <mutex>

#include <atomic>
#include <chrono>
#include <span>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace zerod::server {

class Server;
class ModelHost;
struct ServedJob;
class TrainerGoneWatch;

class Session {
 public:
  Session(Server& server, transport::Connection connection);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void start();
  void stop();  // wakes the thread (shutdown of the socket, and of the ring)
  void join();
  // A session whose thread could not start (Server::start_session): tells
  // the client why as best it can (an error reply) and closes the
  // connection. The static one is for a connection that never got its
  // session.
  void refuse(zd_status code, const std::string& why);
  static void refuse(transport::Connection& c, zd_status code, const std::string& why);
  bool finished() const { return finished_.load(); }
  // It said hello (as a rank or an observer).
  bool greeted() const { return greeted_.load(); }
  // Its hello came, answered or not: a rank waiting in claim_rank for its
  // old connection to go has said it (Server::make_room_before_hello).
  bool hello_came() const { return hello_came_.load(); }
  std::chrono::steady_clock::time_point accepted() const { return accepted_; }
  bool stopping() const { return stopping_.load(std::memory_order_acquire); }
  int rank() const { return rank_; }
  int pid() const { return pid_; }
  // Its client closed the connection, or the daemon did: its rank no longer
  // counts as live in its job (Server::join), though its thread may still
  // be ending. From any thread.
  bool hung_up();

  // What the session's thread does with each frame it receives, without the
  // socket (the fuzz target drives a session through these): answer()
  // parses and runs one request frame and returns its reply, an error reply
  // for anything the client got wrong; fds gets the arena fds to attach to
  // the reply (owned by the arenas, not to be closed). end() leaves every
  // model and frees the rank, as when the connection drops, and lets go of
  // the client's staging memfd and call ring and closes the socket; then,
  // for a rank whose run goes on, it waits up to the reclaim wait for the
  // rank to come back (Server::lose_unless_reclaimed).
  v1::Reply answer(transport::Frame& frame, std::vector<int>* fds);
  // Likewise for a wire::kCall frame: the kCallReply body (valid until the
  // next call), and in arenas/fds a v1::Reply announcing new arenas, to be
  // sent before it when fds is not empty.
  std::span<const std::byte> answer_call(const transport::Frame& frame, v1::Reply* arenas, std::vector<int>* fds);
  void end(const std::string& why);

 private:
  void run();
  // One frame from the socket, answered on it. False: the connection is done (why says how).
  bool serve_frame(std::string* why);
  // The ring loop, until the client goes (why says how).
  void serve_ring(std::string* why);
  void answer_ring(const wire::RingRequest& req);
  // A call record answered into slot (the ring's reply slot, or call_reply_):
  // returns the bytes written. New arenas are left in arenas/fds.
  size_t answer_record(const wire::RingRequest& req, std::span<std::byte> slot, v1::Reply* arenas,
                       std::vector<int>* fds);
  void run_deferred(ModelHost& host, const wire::RingRequest& req);
  void set_up_ring(int fd, uint64_t size);
  bool socket_open() const;
  // A table call on a hosted model as this rank (a kept model's finalize resumes it).
  calls::Outcome run_call(ModelHost& host, const calls::Args& a, void* data);
  void handle(const v1::Request& req, transport::Frame& frame, v1::Reply* reply,
              std::vector<int>* fds);
  void register_param(const v1::RegisterParam& r, v1::Reply* reply);
  void hello(const v1::Hello& h, v1::Reply* reply);
  std::shared_ptr<ModelHost> model_of(int id);
  // The views of a _begin call into a call's reply after the record; returns how many.
  uint32_t record_views(ModelHost& m, int module, bool gradients, std::span<std::byte> room);
  // The protobuf model calls of an older libzerod (session_v1_calls.cpp).
  void v1_call(const v1::ModelCall& c, v1::Reply* reply);
  void v1_data_call(calls::Op op, const v1::ParamData& p, v1::Reply* reply);
  void v1_add_views(ModelHost& m, int module, bool gradients, v1::CallReply* out);
  // The arenas of the rank's pool the client has not been sent, into reply
  // and fds. one_frame: the answer has room for kMaxFdsPerFrame of them at
  // most (a client without arena_batches, a protobuf model call), and more
  // are refused (refuse_arenas) instead of breaking the connection.
  void add_new_arenas(ModelHost& m, v1::Reply* reply, std::vector<int>* fds, bool one_frame);
  [[noreturn]] void refuse_arenas(size_t fresh) const;
  void staging(int fd, uint64_t size);
  std::byte* staging_at(uint64_t offset, uint64_t bytes, const char* what) const;
  void leave_all(bool lost, const std::string& reason);
  // A trainer gone on a GPU: what zerod's streams still wait for from it
  // (transport/process_exit.h).
  void release_gpu_waits();
  // "rank R (pid P): ", to start a log line.
  std::string who() const;
  // "rank R (pid P) is gone: ", to start why the rank was lost.
  std::string gone() const;
  // Watches the connection for the trainer's hangup during the model's
  // calls (trainer_gone_watch.h); on a GPU (link) also its device's waits.
  void watch_for_hangup(const std::shared_ptr<ModelHost>& m, const Device& d, bool gpu);
  void require_rank(const char* what) const;

  Server& server_;
  transport::Connection conn_;
  std::thread thread_;
  std::atomic<bool> finished_{false};
  std::atomic<bool> greeted_{false};
  std::atomic<bool> hello_came_{false};
  // Until the hello: when the connection was accepted (ServerOptions::hello_timeout_ms).
  std::chrono::steady_clock::time_point accepted_ = std::chrono::steady_clock::now();
  bool observer_ = false;       // an admitted observer (Server::admit_observer)
  bool close_after_reply_ = false;  // the hello was refused for good: the connection ends with its reply
  bool stream_signals_ = false;  // the client maps a page of GPU stream signals (hello)
  bool arena_batches_ = false;   // the client takes a call's new arenas in several frames (hello)
  int rank_ = -1;
  std::shared_ptr<ServedJob> job_;  // the rank's job, from its hello
  int pid_ = 0;
  std::map<int, std::shared_ptr<ModelHost>> models_;  // attached, by id
  std::map<int, size_t> arenas_sent_;                 // per model: arenas of our pool already sent
  transport::SharedMapping staging_;  // the client's sealed staging memfd, checked before it was mapped
  bool ended_ = false;
  std::vector<std::byte> call_reply_;  // a kCallReply body, as big as a ring's reply slot (once used)
  transport::Ring ring_;         // the client's call ring, once set up (written under stop_mu_)
  bool ring_pending_ = false;    // set up by the last request; serve it from the next one
  std::mutex stop_mu_;           // ring_, and conn_'s fd closing in end(), against stop()
  std::atomic<bool> stopping_{false};
  std::chrono::microseconds spin_;
  // A rank's connection's hangup, watched on another thread while this
  // thread may be stuck in a call: marks the rank lost on its models, which
  // ends the collectives it waits in, and on a GPU releases the waits of
  // their devices (trainer_gone_watch.h). Made at the rank's first model;
  // stopped first thing in end().
  std::unique_ptr<TrainerGoneWatch> gone_watch_;
};

}  // namespace zerod::server
