// An instance's own MPI communicator and the requests on it: transfers cut
// into pieces, a wait that polls (MPI_Testsome) so it can end at a deadline,
// after a time without progress, or when something else failed; and the
// failure notices daemons send each other. Used by one thread at a time
// (the instance's network thread, or create()).
#ifndef ZEROD_COMM_MPI_LINK_H
#define ZEROD_COMM_MPI_LINK_H

#include <zerod/zerod_plugin.h>

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mpi_env.h"
#include "topology.h"
#include "wire.h"

namespace zerod::comm::mpi {

class Link {
 public:
  using Clock = std::chrono::steady_clock;

  // The layout of Hello and of the exchange in open(). Builds before it
  // sent 0 where `version` is.
  static constexpr uint16_t kHelloVersion = 1;

  // What every daemon tells the others when it opens its instance.
  struct Hello {
    int32_t world = 0;
    int32_t first = 0;
    int32_t local = 0;
    uint16_t version = kHelloVersion;  // the 32 reserved bits of older builds, which were 0
    int16_t refused = ZD_OK;           // this daemon refused the instance with this status (open() says why)
    uint64_t piece = 0;
    int64_t pid = 0;
    char host[64] = "";
  };
  // Its size is every version's: a daemon of another version is told apart
  // by `version`, not by a gather of mismatched sizes.
  static_assert(sizeof(Hello) == 96, "the Hello every version exchanges");

  // Duplicates the daemons' world (Process::world, MPI_Comm_idup) and gathers every daemon's
  // Hello, each step waited for at most timeout_s (0: no limit): every
  // daemon opens its instances in the same order. spin_us: how long a wait
  // polls flat out after progress before it yields and then sleeps between
  // polls. On failure, a message in err.
  //
  // A daemon that refuses the instance (mine.refused, and `refusal` says
  // why) takes part all the same, so that the others fail at once with its
  // words instead of waiting for it until their timeout: when any daemon
  // refused, every daemon gathers the refusals too and fails, the refusing
  // one with its own words, the others naming the first refusing node and
  // quoting it. A daemon of another Hello version fails every daemon of
  // this one, naming it (ZD_ERR_VERSION).
  static zd_status open(const Process& p, const Hello& mine, const char* refusal, double timeout_s, double spin_us,
                        uint64_t piece, std::unique_ptr<Link>* out, std::vector<Hello>* all, char* err,
                        size_t err_size);
  // Requests still posted are cancelled (receives) or left to MPI (sends);
  // requests_left() says whether their buffers must outlive this. The
  // communicator itself is never freed (see link.cpp).
  ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  // Posts a transfer with another node, in pieces of at most `piece` bytes
  // (both sides cut alike); 0 bytes posts nothing. Whole (cut = false): one
  // message, and a receive may be larger than what is sent (headers, whose
  // eager payload varies).
  // A post MPI refuses is not retried: every later wait() fails with its
  // error (link.cpp says why).
  void post_send(int node, const void* data, uint64_t bytes, int tag, bool cut = true);
  void post_recv(int node, void* data, uint64_t bytes, int tag, bool cut = true);

  class Watch {
   public:
    // Polled between tests: true ends the wait (a failure elsewhere).
    virtual bool interrupted() noexcept = 0;

   protected:
    ~Watch() = default;
  };

  // Requests are numbered in the order they are posted; mark() is the
  // number the next one will get.
  uint64_t mark() const { return next_id_; }

  enum class Outcome { done, interrupted, expired, error };
  // Waits until every request posted before `until` (a mark(); by default
  // all) has completed; later ones keep going. It expires at `deadline`
  // (time_point::max(): none) or when no request has completed for `idle`
  // (zero: no limit). On error, *error names the node and MPI's message;
  // after a refused post, every wait is an error.
  Outcome wait(Clock::time_point deadline, Clock::duration idle, Watch& watch, std::string* error,
               uint64_t until = UINT64_MAX);
  // The nodes that still have requests posted (receives only, or all), in
  // order, once each.
  std::vector<int> pending_nodes(bool receives_only) const;
  // After a failure: cancels posted receives and leaves posted sends to
  // MPI; neither is waited for (a receive being filled by a dead daemon
  // never finishes).
  void abandon() noexcept;
  // Whether a request was abandoned unfinished: its buffer must then stay
  // valid until the process exits.
  bool requests_left() const noexcept { return left_; }

  // A failure notice from another daemon, once (later ones are not read).
  bool poll_notice(Notice* out);
  // Tells every other daemon, without waiting for them to hear it.
  void send_notices(const Notice& n);

  // Bytes handed to MPI for other nodes so far.
  uint64_t bytes_sent() const noexcept { return bytes_.load(std::memory_order_relaxed); }
  void count_bytes(uint64_t n) noexcept { bytes_.fetch_add(n, std::memory_order_relaxed); }

  int nodes() const { return nodes_; }

 private:
  Link(MPI_Comm comm, int nodes, double spin_us, uint64_t piece);

  struct Posted {
    MPI_Request request;
    int node;
    bool recv;
    uint64_t id;
  };

  void relax(Clock::time_point last_progress) const;
  void refused(const char* call, int node, int rc);

  MPI_Comm comm_;
  const int nodes_;
  const Clock::duration spin_;
  const uint64_t piece_;
  std::vector<Posted> posted_;  // in posting order
  uint64_t next_id_ = 0;
  std::vector<MPI_Request> scratch_;
  std::vector<int> indices_;
  std::atomic<uint64_t> bytes_{0};
  bool left_ = false;
  std::string post_error_;  // the first post MPI refused, for every later wait

  // The notices' buffers: kept until the process exits (a notice may
  // arrive, or leave, after this Link is gone).
  struct Notices {
    Notice in;
    Notice out;
  };
  std::shared_ptr<Notices> notices_;
  MPI_Request notice_request_ = MPI_REQUEST_NULL;
  bool notice_received_ = false;
  bool notice_sent_ = false;
  std::vector<MPI_Request> notice_sends_;
};

}  // namespace zerod::comm::mpi

#endif  // ZEROD_COMM_MPI_LINK_H
