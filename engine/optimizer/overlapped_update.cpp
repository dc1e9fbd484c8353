#include "optimizer/overlapped_update.h"

#include "observe/probe.h"
#include "observe/tracer.h"

#include <algorithm>
#include <optional>
#include <string>

namespace zerod {

OverlappedUpdate::~OverlappedUpdate() {
  try {
    finish();
  } catch (...) {
    // The model is going; the failure was reported to the calls before.
  }
}

void OverlappedUpdate::reset() {
  const size_t modules = ctx_.registry.modules().size();
  pieces_.clear();
  have_pieces_ = false;
  order_.clear();
  seen_.assign(modules, 0);
  done_.assign(modules, 1);
  ticket_.assign(modules, 0);
  error_ = nullptr;
}

void OverlappedUpdate::note_forward(zd_module_id m) {
  char& s = seen_[static_cast<size_t>(m)];
  if (s) return;
  s = 1;
  order_.push_back(m);
}

void OverlappedUpdate::start(const OptimizerRunner::PassArgs& a, std::vector<zd_param_id> first) {
  finish();
  if (!have_pieces_) {
    pieces_.assign(ctx_.registry.params().size(), {});
    for (const OptimizerRunner::Piece& pc : runner_.host_pieces())
      pieces_[static_cast<size_t>(pc.tensor)].push_back(pc);
    have_pieces_ = true;
  }
  // The forward order just recorded, then the modules it did not begin.
  std::vector<zd_module_id> order = std::move(order_);
  order_.clear();
  for (zd_module_id m : order) seen_[static_cast<size_t>(m)] = 0;
  std::vector<char> listed(seen_.size(), 0);
  for (zd_module_id m : order) listed[static_cast<size_t>(m)] = 1;
  for (size_t m = 0; m < listed.size(); ++m)
    if (!listed[m]) order.push_back(static_cast<zd_module_id>(m));

  // Under the lock: a gather issued ahead may read them on zerod's stream.
  std::unique_lock<std::mutex> lock(mu_);
  bool any = false;
  for (size_t m = 0; m < done_.size(); ++m) {
    bool host = false;
    for (zd_param_id pid : ctx_.registry.module(static_cast<zd_module_id>(m)).params)
      host = host || !pieces_[static_cast<size_t>(pid)].empty();
    done_[m] = host ? 0 : 1;  // a module without host pieces has nothing to wait for
    ticket_[m] = 0;
    any = any || host;
  }
  if (!any) return;
  first_done_ = first.empty();
  first_ticket_ = 0;
  ended_ = false;
  step_ = a.t;
  error_ = nullptr;
  lock.unlock();
  // On the rank's thread: the uploads are ordered after the step's work.
  runner_.begin_host_updates();
  observe::add_relaxed(res_.probe.counters().overlapped_updates, 1);
  worker_ = std::thread([this, a, order = std::move(order), first = std::move(first)] { run(a, order, first); });
}

void OverlappedUpdate::run(OptimizerRunner::PassArgs a, std::vector<zd_module_id> order,
                           std::vector<zd_param_id> first) {
  observe::set_thread_role("optimizer");
  auto update_params = [&](const std::vector<zd_param_id>& params) {
    uint64_t last = 0;
    for (zd_param_id pid : params)
      for (const OptimizerRunner::Piece& pc : pieces_[static_cast<size_t>(pid)]) {
        const uint64_t t = runner_.update_host_piece(a, pc);
        if (t) last = t;
      }
    return last;
  };
  try {
    // Parameters wanted first (stage 3's persistent ones, gathered at the
    // step's end) are taken out of their modules' turns.
    std::vector<char> early(pieces_.size(), 0);
    if (!first.empty()) {
      for (zd_param_id pid : first) early[static_cast<size_t>(pid)] = 1;
      const uint64_t t = update_params(first);
      std::lock_guard<std::mutex> lock(mu_);
      first_ticket_ = t;
      first_done_ = true;
      cv_.notify_all();
    }
    for (zd_module_id m : order) {
      if (done_[static_cast<size_t>(m)]) continue;  // set before the thread started: read without the lock
      std::vector<zd_param_id> params;
      for (zd_param_id pid : ctx_.registry.module(m).params)
        if (!early[static_cast<size_t>(pid)]) params.push_back(pid);
      const uint64_t t = update_params(params);
      std::lock_guard<std::mutex> lock(mu_);
      ticket_[static_cast<size_t>(m)] = t;
      done_[static_cast<size_t>(m)] = 1;
      cv_.notify_all();
    }
    runner_.end_host_updates(/*stream_waits=*/false);
    std::lock_guard<std::mutex> lock(mu_);
    ended_ = true;
  } catch (...) {
    runner_.abandon_host_updates();
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
    first_done_ = true;
    ended_ = true;
    std::fill(done_.begin(), done_.end(), 1);
    cv_.notify_all();
  }
}

void OverlappedUpdate::wait_first() {
  if (!running()) return;
  uint64_t t;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return first_done_; });
    if (error_) {
      lock.unlock();
      finish();
    }
    t = first_ticket_;
  }
  res_.device->stream_waits(t);
}

void OverlappedUpdate::wait_module(zd_module_id m) {
  if (!running()) return;
  uint64_t t;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!done_[static_cast<size_t>(m)]) {
      observe::EventArgs a;
      a.module = m;
      observe::Span wait(res_.probe, "optimizer", "wait for update", a, &res_.probe.counters().update_wait_ns);
      cv_.wait(lock, [&] { return done_[static_cast<size_t>(m)] != 0; });
    }
    if (error_) {
      lock.unlock();
      finish();
    }
    t = ticket_[static_cast<size_t>(m)];
  }
  res_.device->stream_waits(t);
}

bool OverlappedUpdate::module_ready(zd_module_id m) {
  if (!running()) return true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A failure is left to the rank's own waits, which report it as the
    // half-applied step it is (Model::wait_update): finish() here would
    // clear it and throw it bare from the begin call asking, the job not
    // broken, so a trainer that caught it went on and a final snapshot
    // saved the half-applied state.
    if (!done_[static_cast<size_t>(m)] || error_) return false;
  }
  wait_module(m);
  return true;
}

void OverlappedUpdate::await_module(zd_module_id m) {
  uint64_t t;
  std::optional<Error> failed;
  std::exception_ptr other;
  int64_t step;
  {
    // Not running() (the rank's thread may be joining the worker): the
    // flags alone, which start() sets under the lock before the worker
    // runs and the worker sets for every module before it ends.
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_[static_cast<size_t>(m)] != 0; });
    if (error_) {
      // A copy of its own, message and all, made while error_ keeps the
      // exception alive: this runs on the stream's thread, and the rank's
      // thread may free the exception once it has taken it (finish()); the
      // count they would share lives in the C++ runtime, where ThreadSanitizer
      // cannot see it order the two.
      try {
        std::rethrow_exception(error_);
      } catch (const Error& e) {
        failed.emplace(e.code(), std::string(e.what()));
      } catch (...) {
        other = error_;
      }
    }
    t = ticket_[static_cast<size_t>(m)];
    step = step_;
  }
  if (other) std::rethrow_exception(other);
  // Broken here, not left to the gather's waiter: a drain of the stream
  // (a gather ahead short of room settles the buckets) may come to this
  // failure before the rank's own wait_module does, and would report it
  // as a failed collective, not as the half-applied step it is.
  if (failed) ctx_.stopped_part_way(res_.rank, step, *failed);
  res_.device->stream_waits(t);
}

bool OverlappedUpdate::ended() {
  std::lock_guard<std::mutex> lock(mu_);
  return ended_;
}

void OverlappedUpdate::wait_all() {
  if (!running()) return;
  if (ended()) return finish();  // nothing left to wait for: no span
  observe::Span wait(res_.probe, "optimizer", "wait for update", {}, &res_.probe.counters().update_wait_ns);
  finish();
}

void OverlappedUpdate::finish() {
  if (!worker_.joinable()) return;
  worker_.join();
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    e = error_;
    error_ = nullptr;
  }
  if (e) std::rethrow_exception(e);
}

}  // namespace zerod
