#include "comm_stream.h"

#include "observe/tracer.h"

namespace zerod {

struct CommStream::Ticket::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool claimed = false;  // someone waited for it and saw its error
  std::exception_ptr error;
};

void CommStream::Ticket::wait() const {
  if (!state_) return;
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done; });
  state_->claimed = true;
  if (state_->error) std::rethrow_exception(state_->error);
}

CommStream::CommStream(bool threaded) : threaded_(threaded) {
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
  }
  cv_.notify_all();
  return t;
}

void CommStream::loop() {
  observe::set_thread_role("collectives");
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      item = std::move(queue_.front());
      queue_.pop_front();
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
