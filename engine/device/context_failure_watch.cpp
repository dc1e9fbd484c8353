#include "context_failure_watch.h"

#include "cuda_failure.h"
#include "log.h"

#include <exception>
#include <string>
#include <utility>

namespace zerod {

ContextFailureWatch::ContextFailureWatch(Hooks hooks, std::chrono::milliseconds period)
    : hooks_(std::move(hooks)), period_(period), thread_([this] { run(); }) {}

ContextFailureWatch::~ContextFailureWatch() { stop(); }

void ContextFailureWatch::recorded() {
  std::lock_guard<std::mutex> lock(mu_);
  ++records_;
  // Already armed: the thread is in its period or its look, and will look
  // again; waking it for every record of a step would cost a switch each.
  if (armed_) return;
  armed_ = true;
  wake_.notify_one();
}

void ContextFailureWatch::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

int ContextFailureWatch::queries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queries_;
}

bool ContextFailureWatch::fired() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fired_;
}

void ContextFailureWatch::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_.wait(lock, [this] { return stopping_ || armed_; });
    if (wake_.wait_for(lock, period_, [this] { return stopping_; })) return;
    const uint64_t seen = records_;
    lock.unlock();
    const Look l = look();
    lock.lock();
    if (l == Look::kFailed) return;  // for good: later records release themselves (signal_publish)
    // Disarmed only where no record was published during the look: the
    // pending() it made may have read the page before that publish.
    if (l == Look::kRan && records_ == seen) armed_ = false;
  }
}

ContextFailureWatch::Look ContextFailureWatch::look() {
  bool failing = false;
  try {
    if (!hooks_.pending()) return Look::kRan;
    const int code = hooks_.query();
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++queries_;
    }
    if (!cuda_context_failed_before(code)) return Look::kPending;
    failing = true;
    hooks_.failed(code);
  } catch (const std::exception& e) {
    // A hook that threw must not end the process (std::terminate on this
    // thread): a look that failed is made again, and a failed() that threw
    // counts as done (it is called once).
    log_warn(std::string("watching zerod's GPU context for a failure: ") + e.what());
    if (!failing) return Look::kPending;
  }
  std::lock_guard<std::mutex> lock(mu_);
  fired_ = true;
  return Look::kFailed;
}

}  // namespace zerod
