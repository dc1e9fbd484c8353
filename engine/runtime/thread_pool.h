// A fixed set of threads that run index-parallel loops for the engine: the
// optimizer step, gradient statistics. The calling thread takes part, so a
// pool of 1 runs everything inline.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace zerod {

// Cores this process may run on (its affinity mask), at least 1.
unsigned available_cores();
// Their ids, ascending.
std::vector<int> affinity_cpus();

class ThreadPool {
 public:
  // threads counts the caller; 0 means available_cores().
  explicit ThreadPool(unsigned threads);
  // A pool whose threads run on these CPUs (one thread each); the caller
  // only waits, so every task runs there. The CPUs are recorded even when
  // the machine cannot pin to them (a topology read from a file).
  explicit ThreadPool(const std::vector<int>& cpus);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  unsigned size() const { return static_cast<unsigned>(workers_.size()) + (caller_helps_ ? 1 : 0); }
  const std::vector<int>& cpus() const { return cpus_; }  // empty: not pinned

  // Calls fn(i) for every i in [0, n), spread over the threads; returns when
  // all calls have returned. The first exception thrown is rethrown here.
  // Not re-entrant: one run() at a time per pool.
  void run(size_t n, const std::function<void(size_t)>& fn);

 private:
  void worker_loop();
  void drain();

  std::vector<std::thread> workers_;
  std::vector<int> cpus_;
  bool caller_helps_ = true;
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t n_ = 0;
  std::atomic<size_t> next_{0};
  size_t busy_ = 0;
  unsigned long generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace zerod
