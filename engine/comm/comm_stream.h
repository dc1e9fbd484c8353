// A rank's collectives, run in the order the rank issued them on a thread of
// their own. Every rank issues the same collectives in the same order (its
// program order), so the streams of all ranks meet; meanwhile the rank's
// calls return to the trainer, which computes while its parameters are
// gathered ahead (prefetch) and its gradients are reduced behind (buckets).
// With one rank there is nobody to meet: tasks run inline.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace zerod {

class CommStream {
 public:
  // A handle on one task: wait() returns when it ran, rethrowing its error.
  class Ticket {
   public:
    Ticket() = default;
    void wait() const;

   private:
    friend class CommStream;
    struct State;
    std::shared_ptr<State> state_;
  };

  // role: the thread's name on the timeline.
  explicit CommStream(bool threaded, const char* role = "collectives");
  ~CommStream();
  CommStream(const CommStream&) = delete;
  CommStream& operator=(const CommStream&) = delete;

  Ticket enqueue(std::function<void()> task);
  // Waits for everything enqueued so far; rethrows the first error any of
  // those tasks raised that nobody has waited for.
  void drain();

 private:
  using Item = std::pair<std::function<void()>, std::shared_ptr<Ticket::State>>;
  void loop();
  void run(Item& item);

  bool threaded_;
  const char* role_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  std::atomic<size_t> queued_{0};  // queue_.size(), for the worker's spin before it blocks
  bool stop_ = false;
  std::vector<std::shared_ptr<Ticket::State>> failed_;  // tasks that threw, for drain()
  std::thread worker_;
};

}  // namespace zerod
