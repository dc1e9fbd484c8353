#include "trainer_gone_watch.h"

#include "log.h"
#include "transport/process_exit.h"

#include <exception>
#include <utility>

namespace zerod::server {

TrainerGoneWatch::TrainerGoneWatch(int socket_fd, pid_t pid, std::string who, int slow_ms,
                                   std::function<bool()> closed_here)
    : pid_(pid), who_(std::move(who)), slow_ms_(slow_ms), closed_here_(std::move(closed_here)) {
  hangup_ = std::make_unique<transport::HangupWatch>(socket_fd);
  // Already hung up: runs here, with no device to release yet.
  hangup_->add([this] { on_hangup(); });
}

TrainerGoneWatch::~TrainerGoneWatch() { stop(); }

void TrainerGoneWatch::watch_model(int id, std::function<void(const std::string& call)> lose) {
  std::lock_guard<std::mutex> lock(calls_mu_);
  models_[id] = std::move(lose);
}

void TrainerGoneWatch::begin_call(const char* call) {
  std::lock_guard<std::mutex> lock(calls_mu_);
  call_ = call;
  // Hung up between calls, before this one was read (a ring request the
  // trainer wrote as it died): nothing else would end its waits.
  if (hung_up_) lose_models_locked(call_);
}

void TrainerGoneWatch::end_call() {
  std::lock_guard<std::mutex> lock(calls_mu_);
  call_ = nullptr;
}

void TrainerGoneWatch::lose_models_locked(const std::string& call) {
  if (models_.empty()) return;
  log_warn(who_ + "its connection closed during " + call + ": the rank is lost, and the calls waiting for it end");
  for (auto& [id, lose] : models_) {
    try {
      lose(call);
    } catch (const std::exception& e) {
      log_warn(who_ + "marking the rank lost on model " + std::to_string(id) + " failed: " + e.what());
    }
  }
  models_.clear();  // told once; the session's end detaches the rank
}

void TrainerGoneWatch::watch(int id, const Device& d) {
  std::lock_guard<std::mutex> lock(mu_);
  devices_[id] = &d;
}

void TrainerGoneWatch::unwatch(int id) {
  // A wait for this device in progress ends at its next look, rather than
  // hold the session's thread until the trainer exits.
  dropping_.store(id, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(calls_mu_);
    models_.erase(id);
  }
  std::lock_guard<std::mutex> lock(mu_);
  devices_.erase(id);
  dropping_.store(-1, std::memory_order_release);
}

void TrainerGoneWatch::stop() {
  // First the word to a wait in progress (its pending() reads it at each
  // look), then the thread, which HangupWatch's destructor joins.
  stopping_.store(true, std::memory_order_release);
  hangup_.reset();
}

void TrainerGoneWatch::on_hangup() {
  {
    // First the collectives, which end at once; then the GPU's waits, which
    // may wait for the trainer to exit.
    std::lock_guard<std::mutex> lock(calls_mu_);
    if (!closed_here_ || !closed_here_()) {
      hung_up_ = true;
      if (call_) lose_models_locked(call_);
    }
  }
  // Under mu_ for the whole pass: unwatch(), before its model is detached
  // and maybe freed, ends the wait for its device and then takes mu_. A
  // trainer that only closed its connection, alive, is waited for until
  // its record runs or it exits (the session's own end would wait as
  // long), or until stop() or unwatch().
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, d] : devices_) {
    if (stopping_.load(std::memory_order_acquire)) return;
    const int which = id;
    const Device& dev = *d;
    const auto wanted = [this, which] {
      return !stopping_.load(std::memory_order_acquire) && dropping_.load(std::memory_order_acquire) != which;
    };
    try {
      const std::string did = transport::release_when_gone(
          pid_, -1, slow_ms_, [&wanted, &dev] { return wanted() && dev.trainer_pending(); },
          [this, &dev] {
            dev.release_trainer();
            released_.fetch_add(1);
          },
          [this](const std::string& s) { log_warn(who_ + s); });
      if (!did.empty()) log_warn(who_ + did + " (seen at its connection's hangup)");
    } catch (const std::exception& e) {
      log_warn(who_ + "releasing its GPU stream's waits on the hangup failed: " + e.what());
    }
  }
}

}  // namespace zerod::server
