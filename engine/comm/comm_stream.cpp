#include "comm_stream.h"

#include "observe/tracer.h"
#include <sched.h>

#include <atomic>
#include <chrono>

namespace zerod {

namespace {

// How long a waiter (for a task, or the worker for the next task) polls
// before it blocks on its condition variable. A rank's stream task is
// usually a collective that ends within microseconds, and its next task
// follows as soon as the trainer's next call arrives: a futex wake-up
// costs more than that on a VM (tens of microseconds when the other vCPU
// has gone idle). Bounded, with a yield every 16 polls, so a waiter hands
// its core to the thread it waits for when threads outnumber cores.
constexpr std::chrono::microseconds kSpin{50};

template <typename Pred>
bool spin_until(Pred ready) {
  const auto end = std::chrono::steady_clock::now() + kSpin;
  for (unsigned polls = 1;; ++polls) {
    if (ready()) return true;
    if ((polls & 15) == 0) {
      if (std::chrono::steady_clock::now() >= end) return ready();
      sched_yield();
    } else {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
  }
}

}  // namespace

struct CommStream::Ticket::State {
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> finished{false};  // done, readable without the lock
  bool done = false;
  bool claimed = false;  // someone waited for it and saw its error
  std::exception_ptr error;
};

void CommStream::Ticket::wait() const {
  if (!state_) return;
  spin_until([&] { return state_->finished.load(std::memory_order_acquire); });
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done; });
  state_->claimed = true;
  if (state_->error) std::rethrow_exception(state_->error);
}

CommStream::CommStream(bool threaded, const char* role) : threaded_(threaded), role_(role) {
  if (threaded_) worker_ = std::thread([this] { loop(); });
}

CommStream::~CommStream() {
  if (!threaded_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void CommStream::run(Item& item) {
  std::exception_ptr error;
  try {
    item.first();
  } catch (...) {
    error = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(item.second->mu);
    item.second->error = error;
    item.second->done = true;
    item.second->finished.store(true, std::memory_order_release);
  }
  item.second->cv.notify_all();
  if (error) {
    std::lock_guard<std::mutex> lock(mu_);
    failed_.push_back(item.second);
  }
}

CommStream::Ticket CommStream::enqueue(std::function<void()> task) {
  Ticket t;
  t.state_ = std::make_shared<Ticket::State>();
  Item item{std::move(task), t.state_};
  if (!threaded_) {
    run(item);
    return t;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(item));
    queued_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  return t;
}

void CommStream::loop() {
  observe::set_thread_role(role_);
  for (;;) {
    Item item;
    spin_until([&] { return queued_.load(std::memory_order_acquire) != 0; });
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      item = std::move(queue_.front());
      queue_.pop_front();
      queued_.fetch_sub(1, std::memory_order_relaxed);
    }
    run(item);
  }
}

void CommStream::drain() {
  // Tasks run in order, so once a marker has run, everything before it has.
  enqueue([] {}).wait();
  std::vector<std::shared_ptr<Ticket::State>> failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed.swap(failed_);
  }
  for (const auto& st : failed) {
    std::lock_guard<std::mutex> lock(st->mu);
    if (!st->claimed) {
      st->claimed = true;
      std::rethrow_exception(st->error);
    }
  }
}

}  // namespace zerod
