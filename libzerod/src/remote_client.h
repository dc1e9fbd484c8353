// libzerod's daemon client (remote.cpp says what it does), in three files:
//   remote.cpp            the connection: the hello, models, the entry point
//   remote_transport.cpp  the carriers: socket frames, call records through
//                         the call ring or socket frames, deferred ends, the
//                         staging memfd
//   remote_model.cpp      a model's state on this side (registration,
//                         views, arenas, modules in forward) and its calls
// Nothing outside these files includes this header.
#pragma once

#include "backend.h"

#include "model/registry.h"
#include "ring_call.h"
#include "trainer_link.h"
#include "transport/client.h"
#include "transport/hangup_watch.h"
#include "transport/ring.h"
#include "transport/shared_memory.h"
#include "wire.h"

#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace zerod::abi::remote {

class RemoteClient;

class RemoteModel final : public ModelBackend {
 public:
  RemoteModel(RemoteClient& c, int id, int32_t device_type, int32_t device_id, const StreamLink& link);
  ~RemoteModel() override;

  zd_param_id register_param(const std::string& name, const std::string& module, zd_dtype dtype,
                             std::vector<int64_t> shape, const void* init, zd_dtype init_dtype) override;
  const Registry& registry() const override { return registry_; }
  calls::Outcome call(const calls::Args& a, void* data) override;

 private:
  // The answers this side holds: no round trip.
  calls::Outcome view(const calls::Args& a);
  calls::Outcome set_stream(void* stream);
  // Through the daemon: a call record (the ring, or a socket frame).
  calls::Outcome remote(const calls::Args& a, void* data);
  // Maps the arenas one frame announces (a v1::Reply's new_arenas, their fds attached).
  void take_arenas(transport::Frame f);
  // The `frames` arena frames a reply record announced (arenas_follow).
  void take_announced_arenas(uint32_t frames);
  void take_view(const wire::RingView& v);
  // optimizer_info's names from the reply's text (ring_call.h).
  static void take_names(const std::string& text, calls::Outcome& o);
  void forget_views(const calls::Args& a);
  std::string module_label(zd_module_id m) const { return "module '" + registry_.module(m).name + "'"; }

  RemoteClient& client_;
  int id_;
  Registry registry_;  // a mirror of what this rank registered: names, shapes, modules
  TrainerLink link_;
  std::map<int32_t, ImportedArena> arenas_;
  std::map<zd_param_id, ViewInfo> param_views_, grad_views_;
  std::set<zd_module_id> in_forward_;   // this rank's modules between a forward begin and end
  std::set<zd_module_id> in_backward_;  // and between a backward begin and end
  double loss_scale_ = 1.0;  // as of the last reply: only this rank's calls change it
};

class RemoteClient final : public ClientBackend {
 public:
  RemoteClient(const std::string& path, uint32_t timeout_ms, const RankIdentity* who);
  ~RemoteClient() override = default;

  zd_client_info info() const override;
  std::unique_ptr<ModelBackend> create_model(const ScriptOptions& s) override;

  // Sends a request as a socket frame and waits for its reply; throws the
  // reply's error. With a ring, the ring announces the frame first (the
  // daemon's thread waits on the ring, not on the socket), after a deferred
  // end unless flush is false (a model's destruction: the end of another
  // model waits for that model's next call).
  v1::Reply rpc(const v1::Request& req, std::vector<transport::UniqueFd>* fds = nullptr,
                std::span<const int> send_fds = {}, bool flush = true);

  bool has_ring() const { return static_cast<bool>(ring_); }

  // A call the daemon's ABI minor version does not have yet (zd_model_set_lr
  // needs 1.7) is refused here with ZD_ERR_VERSION, naming both, instead of
  // reaching an older daemon as an unknown call.
  void require_daemon_abi(uint32_t minor, const char* call) const;

  // zd_forward_end through the ring, deferred: the client answers it at
  // once and sends it with this rank's next call to the daemon, which runs
  // it first. A begin/end pair then costs one round trip instead of two
  // (the pair's end and the next begin share one). Only forward_end: no
  // other rank waits for it (at stage 3 it releases the gathered module,
  // which the next call, often the next begin's gather, then does first,
  // and it compares the begin's gather with the peers', which waits for
  // their begins, never their ends), so holding it back cannot keep a peer
  // waiting; backward_end starts the reduction the other ranks wait for.
  // The module's views end now, on this side, and only an end of a module
  // this rank began in forward is deferred (any other goes at once and
  // fails there as before); an error only the daemon can see (a lost peer,
  // ranks in different modules) comes back from the next call, which then
  // does not run. ZEROD_SYNC_END=1 turns it off (docs/daemon.md).
  bool defers_end() const { return ring_ && defer_end_; }
  void defer_end(int model, const calls::Args& a);
  void flush_deferred();
  // flush_deferred, if the deferred end is model's.
  void flush_deferred_of(int model);
  // A reply to an end sent on its own may announce arenas an earlier call
  // of the model grew (the daemon announces them with its next answer): the
  // frames are read now, so that they are not taken for the next reply, and
  // the model takes them at its next call (take_stray_arenas).
  void keep_stray_arenas(int model, const wire::RingReply& r);
  std::vector<transport::Frame> take_stray_arenas(int model);

  // The text that follows a reply record's views (an error's message, or
  // optimizer_info's names), its lengths checked against the reply.
  std::string message_of(const wire::RingReply& r) const;

  // A table call as a call record: through the ring (the request record, a
  // post, a wait, and the reply record, whose views and text follow it in
  // the slot), or, without a ring, the same record as a wire::kCall frame
  // answered by a kCallReply frame with the same bytes. A deferred
  // zd_forward_end of the same model travels in the same record (the
  // daemon runs it first); one of another model is sent on its own first.
  const wire::RingReply& call_record(int model, const calls::Args& a, uint64_t staging_offset);
  // What follows the last reply record: its views, then its text.
  std::span<const std::byte> reply_tail() const;

  // The next of the frames with new arena fds that a reply record announced
  // (RingReply::arenas_follow of them, kMaxFdsPerFrame fds at most each).
  transport::Frame arena_frame();

  // A staging area of at least `bytes`, shared with the daemon: a memfd
  // sealed against resizing, which the daemon requires before it maps it.
  std::byte* staging(uint64_t bytes);

  // Watches the daemon's socket for its hangup (started on first use: a
  // model on a GPU, whose stream waits on the daemon's stream signals).
  transport::HangupWatch& hangup_watch();
  // The daemon's pid as the kernel saw it at connect time; 0 where it is
  // not visible from here (another pid namespace).
  pid_t daemon_pid() const;

 private:
  // 1 MiB: a record, then up to ~32k views of a module and the message.
  // Pages the replies never reach are never allocated.
  static constexpr uint64_t kRingBytes = uint64_t{1} << 20;

  void set_up_ring();
  bool socket_open() const;
  void wait_ring();
  transport::Frame receive();
  [[noreturn]] void timed_out() const;

  // A connection out of step. When a wait for the daemon's answer gives up
  // (zd_connect_options.timeout_ms), or the carrier fails, after a request
  // went out and before its whole answer was read, the daemon may still be
  // running that call and will answer it later; that answer would be read
  // as the next call's (on the ring, whose reply slot holds one answer at a
  // time, or on the socket, with the arena frame it announces). Nor can the
  // late answer be told apart and dropped: the call ran in the daemon (a
  // model finalized, a module gathered, a step applied) and this side never
  // took what it brought (arena fds, views, figures), so the two would
  // disagree about the model from then on. So the connection is done: the
  // call that broke it fails with its own error and a word on what to do,
  // and every later exchange fails at once with the same status, naming
  // that call (check_in_step). The trainer disconnects and connects again;
  // the daemon treats the old connection's end as the rank's, as for any
  // rank that goes (its state kept for a restart where the job says so).
  void check_in_step() const;
  [[noreturn]] void fall_out_of_step(const Error& e);
  std::string in_flight_;                 // the exchange under way: "zd_model_finalize", "zd_model_create"
  std::optional<Error> out_of_step_;      // what every exchange fails with, once set

  transport::Connection conn_;
  uint32_t timeout_ms_;
  uint32_t next_id_ = 1;
  int rank_ = 0, world_ = 1, local_rank_ = 0;
  uint32_t daemon_abi_ = 0;               // the hello's: (major << 16) | minor
  std::string daemon_version_;            // the daemon's release
  transport::SharedMapping staging_;
  transport::Ring ring_;
  transport::RingWait wait_;
  wire::RingReply reply_{};
  // Without a ring: the last kCallReply body, and the arena announcements
  // that came before it (the ring's carrier reads those from the socket
  // after the reply).
  std::vector<std::byte> socket_reply_;
  std::deque<transport::Frame> socket_arenas_;
  struct Deferred {
    int model;
    calls::Args args;
  };
  std::optional<Deferred> deferred_;
  std::vector<std::pair<int, transport::Frame>> stray_arenas_;
  bool defer_end_ = std::getenv("ZEROD_SYNC_END") == nullptr;
  std::unique_ptr<transport::HangupWatch> watch_;  // after conn_: stopped before its fd closes
};

}  // namespace zerod::abi::remote
