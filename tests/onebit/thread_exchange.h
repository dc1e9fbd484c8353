// An in-process Exchange for the 1-bit driver: W threads, one per rank,
// meeting at a barrier and copying from each other's send buffers. It can be
// told to fail in phase 1 (all_to_all) or phase 2 (all_gather), scribbling
// over the receive buffer first, as a failing transport might; and it records
// the byte counts it was asked for.
#ifndef ZEROD_TESTS_ONEBIT_THREAD_EXCHANGE_H
#define ZEROD_TESTS_ONEBIT_THREAD_EXCHANGE_H

#include <barrier>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "onebit.h"

namespace zerod::comm::onebit::test {

enum class Fail { none, phase1, phase2 };

class ThreadExchange {
 public:
  explicit ThreadExchange(int32_t world) : world_(world), barrier_(world), sends_(static_cast<size_t>(world)) {}

  // Rank r's collectives. Every rank must be given the same `fail`.
  Exchange for_rank(int32_t rank, Fail fail = Fail::none) {
    Exchange e;
    e.all_to_all = [this, rank, fail](const void* send, void* recv, uint64_t bytes) -> zd_status {
      if (rank == 0) a2a_bytes.push_back(bytes);
      if (fail == Fail::phase1) return scribble(recv, bytes * world_);
      exchange(rank, send, recv, bytes, true);
      return ZD_OK;
    };
    e.all_gather = [this, rank, fail](const void* send, void* recv, uint64_t bytes) -> zd_status {
      if (rank == 0) gather_bytes.push_back(bytes);
      if (fail == Fail::phase2) return scribble(recv, bytes * world_);
      exchange(rank, send, recv, bytes, false);
      return ZD_OK;
    };
    return e;
  }

  // Runs f(rank) on world threads and joins them.
  template <typename F>
  void run(F&& f) {
    std::vector<std::thread> threads;
    for (int32_t r = 0; r < world_; ++r) threads.emplace_back([&f, r] { f(r); });
    for (auto& t : threads) t.join();
  }

  // Byte counts rank 0 was asked to exchange, in call order.
  std::vector<uint64_t> a2a_bytes, gather_bytes;

 private:
  static zd_status scribble(void* recv, uint64_t bytes) {
    std::memset(recv, 0x5A, bytes);
    return ZD_ERR_TIMEOUT;
  }

  // all_to_all: block `rank` of every rank's send; all_gather: every rank's
  // one block. The second barrier keeps the send buffers alive until all
  // have copied.
  void exchange(int32_t rank, const void* send, void* recv, uint64_t bytes, bool to_all) {
    sends_[static_cast<size_t>(rank)] = static_cast<const uint8_t*>(send);
    barrier_.arrive_and_wait();
    for (int32_t k = 0; k < world_; ++k) {
      const uint8_t* src = sends_[static_cast<size_t>(k)] + (to_all ? static_cast<uint64_t>(rank) * bytes : 0);
      std::memcpy(static_cast<uint8_t*>(recv) + static_cast<uint64_t>(k) * bytes, src, bytes);
    }
    barrier_.arrive_and_wait();
  }

  int32_t world_;
  std::barrier<> barrier_;
  std::vector<const uint8_t*> sends_;
};

}  // namespace zerod::comm::onebit::test

#endif  // ZEROD_TESTS_ONEBIT_THREAD_EXCHANGE_H
