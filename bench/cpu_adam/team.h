// A fixed team of threads that runs one function per thread and waits for
// all of them: the way the engine threads a shard's ranges, without OpenMP.
#ifndef ZEROD_BENCH_TEAM_H
#define ZEROD_BENCH_TEAM_H

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace zerod::bench {

class Team {
 public:
  explicit Team(int size) : size_(size) {
    for (int t = 1; t < size; ++t) workers_.emplace_back([this, t] { work(t); });
  }
  ~Team() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      ++generation_;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
  }
  Team(const Team&) = delete;
  Team& operator=(const Team&) = delete;

  int size() const { return size_; }

  // Runs fn(0..size-1), thread 0 being the caller; returns when all are done.
  void run(const std::function<void(int)>& fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      pending_ = size_ - 1;
      ++generation_;
    }
    wake_.notify_all();
    fn(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [this] { return pending_ == 0; });
  }

 private:
  void work(int t) {
    unsigned long seen = 0;
    for (;;) {
      const std::function<void(int)>* fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        if (stop_) return;
        fn = fn_;
      }
      (*fn)(t);
      {
        std::lock_guard<std::mutex> lock(mu_);
        --pending_;
      }
      done_.notify_one();
    }
  }

  int size_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* fn_ = nullptr;
  unsigned long generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

// [begin, end) of part t of n elements split in `parts`, cut at multiples of
// 16 elements (64 bytes) so no cache line is shared by two threads.
inline void split(size_t n, int parts, int t, size_t* begin, size_t* end) {
  const size_t lines = (n + 15) / 16;
  const size_t b = lines * static_cast<size_t>(t) / static_cast<size_t>(parts) * 16;
  const size_t e = lines * static_cast<size_t>(t + 1) / static_cast<size_t>(parts) * 16;
  *begin = b < n ? b : n;
  *end = e < n ? e : n;
}

}  // namespace zerod::bench

#endif  // ZEROD_BENCH_TEAM_H
