#include "link.h"

#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <thread>

namespace zerod::comm::mpi {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Waits for one request of create() (MPI_Comm_idup, MPI_Iallgather),
// polling every millisecond: creation is rare, and its wait may be long.
bool wait_one(MPI_Request* r, Link::Clock::time_point deadline, int* rc) {
  for (;;) {
    int done = 0;
    {
      Lock l;
      *rc = MPI_Test(r, &done, MPI_STATUS_IGNORE);
    }
    if (*rc != MPI_SUCCESS) return false;
    if (done) return true;
    if (Link::Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// The words of a refusal, whole (a layout refusal runs to about 400 bytes).
constexpr size_t kRefusalBytes = 1024;

// A gather's buffers, which MPI writes for as long as the gather is posted:
// one that did not finish (a daemon late or gone) keeps them until the
// process exits, since the gather may still complete.
template <typename T>
struct GatherBuffers {
  std::shared_ptr<T[]> in, out;
  GatherBuffers(size_t each, size_t nodes) : in(new T[each]()), out(new T[each * nodes]()) {}
  void keep() {
    keep_until_exit(in);
    keep_until_exit(out);
  }
};

Link::Clock::time_point deadline_in(double seconds) {
  if (seconds <= 0) return Link::Clock::time_point::max();
  return Link::Clock::now() + std::chrono::duration_cast<Link::Clock::duration>(std::chrono::duration<double>(seconds));
}

}  // namespace

Link::Link(MPI_Comm comm, int nodes, double spin_us, uint64_t piece)
    : comm_(comm),
      nodes_(nodes),
      spin_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::micro>(spin_us))),
      piece_(piece),
      notices_(new Notices) {}

zd_status Link::open(const Process& p, const Hello& mine, const char* refusal, double timeout_s, double spin_us,
                     uint64_t piece, std::unique_ptr<Link>* out, std::vector<Hello>* all, char* err,
                     size_t err_size) {
  const Clock::time_point deadline = deadline_in(timeout_s);
  const bool refusing = mine.refused != ZD_OK;
  // A daemon that refused says so whatever else went wrong: its reason is
  // what its ranks need to hear.
  auto own_refusal = [&] {
    std::snprintf(err, err_size, "%s", refusal != nullptr ? refusal : "");
    return static_cast<zd_status>(mine.refused);
  };
  // MPI writes the new communicator when the duplicate completes, which a
  // request left posted may still do: the handle is kept until exit then.
  const std::shared_ptr<MPI_Comm> dup(new MPI_Comm(MPI_COMM_NULL));
  MPI_Request r = MPI_REQUEST_NULL;
  int rc;
  {
    Lock l;
    rc = MPI_Comm_idup(p.world, dup.get(), &r);
  }
  if (rc != MPI_SUCCESS || !wait_one(&r, deadline, &rc)) {
    keep_until_exit(dup);
    if (refusing) return own_refusal();
    // A request still posted is left to MPI: it cannot be cancelled.
    if (rc != MPI_SUCCESS) {
      std::snprintf(err, err_size, "MPI_Comm_idup of the daemons' world failed: %s", error_text(rc).c_str());
      return ZD_ERR_PEER_LOST;
    }
    std::snprintf(err, err_size,
                  "waited %g s for the other %d daemons (MPI processes) to create their mpi comm instance; every "
                  "daemon of the job must create it (is one of them stuck, dead, or configured for another backend?)",
                  timeout_s, p.nodes - 1);
    return ZD_ERR_TIMEOUT;
  }
  const MPI_Comm comm = *dup;
  {
    Lock l;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  }
  if (p.world != MPI_COMM_WORLD) spanning_communicator(comm);
  GatherBuffers<Hello> hellos(1, static_cast<size_t>(p.nodes));
  hellos.in[0] = mine;
  {
    Lock l;
    rc = MPI_Iallgather(hellos.in.get(), sizeof mine, MPI_BYTE, hellos.out.get(), sizeof mine, MPI_BYTE, comm, &r);
  }
  if (rc != MPI_SUCCESS || !wait_one(&r, deadline, &rc)) {
    hellos.keep();
    if (refusing) return own_refusal();
    if (rc != MPI_SUCCESS) {
      std::snprintf(err, err_size, "exchanging the daemons' layouts failed: %s", error_text(rc).c_str());
      return ZD_ERR_PEER_LOST;
    }
    std::snprintf(err, err_size, "waited %g s for the other %d daemons to describe themselves", timeout_s, p.nodes - 1);
    return ZD_ERR_TIMEOUT;
  }
  all->assign(hellos.out.get(), hellos.out.get() + p.nodes);
  // A daemon of another version may not take part in what follows.
  for (size_t m = 0; m < all->size(); ++m) {
    const Hello& h = (*all)[m];
    if (h.version == kHelloVersion) continue;
    if (refusing) return own_refusal();
    std::snprintf(err, err_size,
                  "node %zu (host %.64s, pid %lld) speaks the mpi plugin's hello v%u%s, this daemon v%u: run the "
                  "same zerod build on every node",
                  m, h.host, static_cast<long long>(h.pid), static_cast<unsigned>(h.version),
                  h.version == 0 ? " (a build from before versions were sent)" : "", unsigned{kHelloVersion});
    return ZD_ERR_VERSION;
  }
  size_t first_refusing = all->size();
  for (size_t m = 0; m < all->size() && first_refusing == all->size(); ++m)
    if ((*all)[m].refused != ZD_OK) first_refusing = m;
  if (first_refusing < all->size()) {
    // Every daemon saw the same Hellos, so every one gathers the reasons.
    GatherBuffers<char> texts(kRefusalBytes, all->size());
    if (refusing && refusal != nullptr) std::snprintf(texts.in.get(), kRefusalBytes, "%s", refusal);
    {
      Lock l;
      rc = MPI_Iallgather(texts.in.get(), static_cast<int>(kRefusalBytes), MPI_BYTE, texts.out.get(),
                          static_cast<int>(kRefusalBytes), MPI_BYTE, comm, &r);
    }
    const bool heard = rc == MPI_SUCCESS && wait_one(&r, deadline, &rc);
    if (!heard) texts.keep();
    if (refusing) return own_refusal();
    const Hello& h = (*all)[first_refusing];
    const char* text = "(its reason did not arrive; its own log has it)";
    if (heard) {
      char* words = texts.out.get() + first_refusing * kRefusalBytes;
      words[kRefusalBytes - 1] = '\0';
      text = words;
    }
    std::snprintf(err, err_size,
                  "node %zu (host %.64s, pid %lld) refused the mpi comm instance, so no daemon can open it: %s",
                  first_refusing, h.host, static_cast<long long>(h.pid), text);
    return static_cast<zd_status>(h.refused);
  }
  std::unique_ptr<Link> link(new Link(comm, p.nodes, spin_us, piece));
  if (p.nodes > 1) {
    Lock l;
    MPI_Irecv(&link->notices_->in, sizeof(Notice), MPI_BYTE, MPI_ANY_SOURCE, kTagNotice, comm,
              &link->notice_request_);
  }
  *out = std::move(link);
  return ZD_OK;
}

// The communicator is never freed. A daemon cannot know that no other
// daemon will still send on it: a failure notice from a daemon that failed
// after this one finished, a header or data of a collective this one gave
// up on. Open MPI crashes on a message for a communicator freed here (and a
// freed context id could be reused by the next instance, which would then
// match stale messages). MPI_Finalize frees it; a daemon creates a handful
// of instances in its life.
Link::~Link() {
  abandon();
  Lock l;
  if (notice_request_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&notice_request_);
    MPI_Request_free(&notice_request_);
  }
  for (MPI_Request& r : notice_sends_) {
    int done = 0;
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    if (!done) MPI_Request_free(&r);
  }
  keep_until_exit(notices_);
}

// A post MPI refuses (the communicator runs with MPI_ERRORS_RETURN) leaves
// no request to wait for: its piece would never move, and a wait that
// skipped it would report the transfer done, or run into its deadline as if
// a peer were late. The first refusal is kept, the rest of that transfer is
// not posted, and every later wait() fails with MPI's message.
void Link::post_send(int node, const void* data, uint64_t bytes, int tag, bool cut) {
  const auto* p = static_cast<const char*>(data);
  const uint64_t piece = cut ? piece_ : bytes;
  for (uint64_t off = 0; off < bytes; off += piece) {
    const int n = static_cast<int>(std::min(piece, bytes - off));
    Posted x{MPI_REQUEST_NULL, node, false, next_id_++};
    int rc;
    {
      Lock l;
      rc = MPI_Isend(p + off, n, MPI_BYTE, node, tag, comm_, &x.request);
    }
    if (rc != MPI_SUCCESS) {
      refused("MPI_Isend", node, rc);
      return;
    }
    posted_.push_back(x);
  }
  count_bytes(bytes);
}

void Link::post_recv(int node, void* data, uint64_t bytes, int tag, bool cut) {
  auto* p = static_cast<char*>(data);
  const uint64_t piece = cut ? piece_ : bytes;
  for (uint64_t off = 0; off < bytes; off += piece) {
    const int n = static_cast<int>(std::min(piece, bytes - off));
    Posted x{MPI_REQUEST_NULL, node, true, next_id_++};
    int rc;
    {
      Lock l;
      rc = MPI_Irecv(p + off, n, MPI_BYTE, node, tag, comm_, &x.request);
    }
    if (rc != MPI_SUCCESS) {
      refused("MPI_Irecv", node, rc);
      return;
    }
    posted_.push_back(x);
  }
}

void Link::refused(const char* call, int node, int rc) {
  if (!post_error_.empty()) return;
  post_error_ = "with node " + std::to_string(node) + ": " + call + " failed: " + error_text(rc);
}

// Polls flat out for spin_ after the last progress, then yields the core
// for up to a millisecond, then sleeps 50 us between polls: a daemon whose
// peers are slow leaves the CPU to its ranks. Open MPI moves TCP data only
// inside MPI calls, so the sleep bounds how long a socket waits for a
// refill; 50 us is far less than a socket buffer lasts at 10 Gbit/s.
void Link::relax(Clock::time_point last_progress) const {
  const Clock::duration since = Clock::now() - last_progress;
  if (since < spin_) {
    for (int i = 0; i < 16; ++i) cpu_relax();
  } else if (since < std::chrono::milliseconds(1)) {
    sched_yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

Link::Outcome Link::wait(Clock::time_point deadline, Clock::duration idle, Watch& watch, std::string* error,
                         uint64_t until) {
  if (!post_error_.empty()) {
    if (error != nullptr) *error = post_error_;
    return Outcome::error;
  }
  Clock::time_point last = Clock::now();
  std::vector<MPI_Status> statuses;
  // posted_ is in id order and only loses completed requests.
  while (!posted_.empty() && posted_.front().id < until) {
    const int n = static_cast<int>(posted_.size());
    scratch_.resize(posted_.size());
    indices_.resize(posted_.size());
    statuses.resize(posted_.size());
    for (size_t i = 0; i < posted_.size(); ++i) scratch_[i] = posted_[i].request;
    int outcount = 0;
    int rc;
    {
      Lock l;
      rc = MPI_Testsome(n, scratch_.data(), &outcount, indices_.data(), statuses.data());
    }
    if (rc != MPI_SUCCESS) {
      // MPI_ERR_IN_STATUS: the failed requests' own codes are in statuses.
      int code = rc;
      int node = -1;
      if (rc == MPI_ERR_IN_STATUS) {
        for (int i = 0; i < outcount; ++i) {
          if (statuses[static_cast<size_t>(i)].MPI_ERROR != MPI_SUCCESS) {
            code = statuses[static_cast<size_t>(i)].MPI_ERROR;
            node = posted_[static_cast<size_t>(indices_[static_cast<size_t>(i)])].node;
            break;
          }
        }
      }
      if (error != nullptr) {
        char where[32] = "";
        if (node >= 0) std::snprintf(where, sizeof where, "with node %d: ", node);
        *error = where + error_text(code);
      }
      for (size_t i = 0; i < posted_.size(); ++i) posted_[i].request = scratch_[i];
      return Outcome::error;
    }
    if (outcount > 0 && outcount != MPI_UNDEFINED) {
      // Completed requests are MPI_REQUEST_NULL in scratch_ now.
      size_t keep = 0;
      for (size_t i = 0; i < posted_.size(); ++i) {
        if (scratch_[i] == MPI_REQUEST_NULL) continue;
        posted_[keep] = posted_[i];
        posted_[keep].request = scratch_[i];
        ++keep;
      }
      posted_.resize(keep);
      last = Clock::now();
      continue;
    }
    if (watch.interrupted()) return Outcome::interrupted;
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return Outcome::expired;
    if (idle > Clock::duration::zero() && now - last >= idle) return Outcome::expired;
    relax(last);
  }
  return Outcome::done;
}

std::vector<int> Link::pending_nodes(bool receives_only) const {
  std::vector<int> nodes;
  for (const Posted& p : posted_) {
    if (p.recv || !receives_only) nodes.push_back(p.node);
  }
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  return nodes;
}

void Link::abandon() noexcept {
  if (posted_.empty()) return;
  Lock l;
  for (Posted& p : posted_) {
    int done = 0;
    MPI_Test(&p.request, &done, MPI_STATUS_IGNORE);
    if (done) continue;
    if (p.recv) MPI_Cancel(&p.request);
    MPI_Request_free(&p.request);
    left_ = true;
  }
  posted_.clear();
}

bool Link::poll_notice(Notice* out) {
  if (notice_received_ || notice_request_ == MPI_REQUEST_NULL) return false;
  int done = 0;
  {
    Lock l;
    if (MPI_Test(&notice_request_, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
  }
  if (!done) return false;
  notice_received_ = true;
  *out = notices_->in;
  out->message[sizeof out->message - 1] = '\0';
  return true;
}

void Link::send_notices(const Notice& n) {
  if (notice_sent_ || nodes_ < 2) return;  // once
  notice_sent_ = true;
  notices_->out = n;
  count_bytes(sizeof(Notice) * static_cast<uint64_t>(nodes_ - 1));
  Lock l;
  for (int node = 0; node < nodes_; ++node) {
    if (node == n.node) continue;
    MPI_Request r = MPI_REQUEST_NULL;
    if (MPI_Isend(&notices_->out, sizeof(Notice), MPI_BYTE, node, kTagNotice, comm_, &r) == MPI_SUCCESS) {
      notice_sends_.push_back(r);
    }
  }
}

}  // namespace zerod::comm::mpi
