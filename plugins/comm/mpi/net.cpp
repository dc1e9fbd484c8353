#include "net.h"

#include <sched.h>

#include <new>

#include "node_messages.h"

namespace zerod::comm::mpi {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

Net::Clock::duration Net::seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

Net::Net(Rendezvous& rv, const Topology& topo, std::unique_ptr<Link> link, NetSettings settings)
    : rv_(rv),
      topo_(topo),
      link_(std::move(link)),
      settings_(settings),
      // Not make_shared: its tag would be a GNU-unique symbol the plugin exports.
      headers_(new Headers),
      last_(static_cast<size_t>(topo.nodes)) {
  headers_->theirs.resize(static_cast<size_t>(topo.nodes));
  headers_->in.resize(static_cast<size_t>(topo.nodes));
  for (Header& h : last_) h.seq = kNoCollective;
  if (link_ != nullptr && topo_.nodes > 1) {
    rv_.on_failure(&Net::kick, this);
    thread_ = std::thread([this] { loop(); });
  }
}

void Net::kick(void* self) noexcept {
  auto* net = static_cast<Net*>(self);
  {
    std::lock_guard<std::mutex> lk(net->mu_);
    net->kicked_ = true;
  }
  net->cv_.notify_one();
}

bool Net::shutdown() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (link_ == nullptr) return false;
  // A failure just before the end still reaches the other daemons.
  if (topo_.nodes > 1) housekeep();
  rv_.on_failure(nullptr, nullptr);
  link_->abandon();
  if (!link_->requests_left()) return false;
  keep_until_exit(headers_);
  return true;
}

Net::~Net() { shutdown(); }

void Net::post(const Job& job) {
  if (link_ == nullptr || topo_.nodes < 2) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = job;
    posted_.store(job.seq + 1, std::memory_order_release);
  }
  cv_.notify_one();
}

void Net::staged(uint64_t seq, uint8_t* staging) {
  if (link_ == nullptr || topo_.nodes < 2) {
    done_.store(seq + 1, std::memory_order_release);
    rv_.notify();
    return;
  }
  staging_.store(staging, std::memory_order_relaxed);
  staged_.store(seq + 1, std::memory_order_release);
}

void Net::loop() {
  uint64_t taken = 0;
  const Clock::duration spin = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double, std::micro>(settings_.spin_us));
  for (;;) {
    // Back-to-back collectives: the next job usually comes at once.
    const Clock::time_point spin_end = Clock::now() + spin;
    while (posted_.load(std::memory_order_acquire) <= taken && Clock::now() < spin_end) cpu_relax();
    Job job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      while (!stop_ && posted_.load(std::memory_order_acquire) <= taken) {
        kicked_ = false;
        lk.unlock();
        housekeep();
        lk.lock();
        if (stop_ || kicked_ || posted_.load(std::memory_order_acquire) > taken) continue;
        cv_.wait_for(lk, std::chrono::milliseconds(2));
      }
      if (stop_) return;
      job = job_;
      taken = job.seq + 1;
    }
    run(job);
    current_ = nullptr;
  }
}

void Net::housekeep() {
  if (!notice_pending_ && link_->poll_notice(&notice_)) notice_pending_ = true;
  // The collective this thread is in, or the next one it will run.
  const uint64_t at = current_ != nullptr ? current_->seq : done_.load(std::memory_order_acquire);
  if (notice_pending_ && at >= notice_.completed) {
    // The sender never took part in this collective: it fails here too.
    notice_pending_ = false;
    char msg[kMessageMax];
    Text t(msg, sizeof msg);
    say_remote_failure(t, notice_, topo_);
    remote_ = !rv_.failed();
    rv_.fail(notice_.status != ZD_OK ? notice_.status : ZD_ERR_PEER_LOST, msg);
  }
  if (!notified_ && rv_.failed()) {
    notified_ = true;
    instance_failed();
    if (!remote_) {
      Notice out;
      out.node = topo_.node;
      out.completed = done_.load(std::memory_order_acquire);
      out.status = rv_.failure(out.message, sizeof out.message);
      link_->send_notices(out);
    }
  }
}

bool Net::interrupted() noexcept {
  housekeep();
  return rv_.failed();
}

void Net::fail(zd_status status, const char* message) {
  link_->abandon();
  rv_.fail(status, message);
  housekeep();
}

void Net::run(const Job& job) {
  if (rv_.failed()) return;  // the ranks find the failure themselves
  current_ = &job;
  uint8_t* staging = nullptr;
  if (eager(job.call, topo_.nodes)) {
    // The partial is ready after the (tiny) staging; it goes with the header.
    if (!await_staged(job, &staging)) return;
    const uint32_t bytes = static_cast<uint32_t>(job.call.count * element_bytes(job.call));
    if (!arrive(job, staging + layout(job.call, topo_).node, bytes)) return;
    reduce_eager(job, staging);
  } else {
    if (!arrive(job, nullptr, 0)) return;
    if (!await_staged(job, &staging)) return;
    bool ok = false;
    try {
      ok = exchange(job.call, topo_, staging, *this);
    } catch (const std::bad_alloc&) {
      fail(ZD_ERR_OUT_OF_MEMORY, "out of memory in the exchange between daemons");
      return;
    }
    if (!ok) return;
  }
  done_.store(job.seq + 1, std::memory_order_release);
  rv_.notify();
}

Net::Clock::duration Net::idle_limit(const Job& job) const {
  if (job.timeout_ms > 0) return std::chrono::milliseconds(job.timeout_ms);
  if (settings_.timeout_s > 0) return seconds(settings_.timeout_s);
  return Clock::duration::zero();
}

void Net::send(int node, const void* data, uint64_t bytes) { link_->post_send(node, data, bytes, kTagData); }

void Net::recv(int node, void* data, uint64_t bytes) { link_->post_recv(node, data, bytes, kTagData); }

bool Net::flush(uint64_t until) {
  std::string error;
  const Clock::duration idle = idle_limit(*current_);
  const Link::Outcome out = link_->wait(Clock::time_point::max(), idle, *this, &error, until);
  if (out == Link::Outcome::done) return true;
  if (out == Link::Outcome::interrupted) {
    link_->abandon();
    return false;
  }
  char msg[kMessageMax];
  Text t(msg, sizeof msg);
  const Header& mine = headers_->mine.header;
  if (out == Link::Outcome::expired) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(idle).count();
    say_stalled(t, mine, static_cast<uint64_t>(ms), link_->pending_nodes(false), topo_);
    fail(ZD_ERR_TIMEOUT, msg);
  } else {
    say_mpi_error(t, mine, error.c_str());
    fail(ZD_ERR_PEER_LOST, msg);
  }
  return false;
}

}  // namespace zerod::comm::mpi
