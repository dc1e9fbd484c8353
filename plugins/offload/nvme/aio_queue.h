// Transfers between memory and a Store through Linux AIO (libaio) on the
// store files' O_DIRECT fds.
//
// submit() cuts every transfer at block_size boundaries (and, with more
// than one path, at stripe boundaries, so each piece is contiguous in one
// file) and keeps at most queue_depth pieces in flight; the rest wait in a
// FIFO and go out as completions free slots. It never blocks on the device.
// wait(ticket) reaps completions until that submit's pieces are done; the
// pieces of other submits it reaps on the way are recorded for their own
// wait(). Every completion is checked: an error or a short transfer fails
// its submit with a message naming the path, the file offset, the bytes
// expected and got, and the reservation it falls in; once a submit has
// failed, its pieces not yet started are dropped.
//
// Threads: submit() and wait() may be called from any threads at once (one
// mutex; one waiter at a time blocks in io_getevents, without the mutex, and
// the others sleep until it has recorded what it reaped). Each ticket is
// waited for once. The destructor must not race with other calls.
#ifndef ZEROD_PLUGINS_OFFLOAD_NVME_AIO_QUEUE_H
#define ZEROD_PLUGINS_OFFLOAD_NVME_AIO_QUEUE_H

#include <libaio.h>
#include <zerod/zerod_plugin.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "store.h"

namespace zerod::offload {

class AioQueue {
 public:
  // block: a power of two, a multiple of the store's alignment.
  static std::unique_ptr<AioQueue> open(const Store& store, uint64_t block, uint32_t depth, std::string* error);
  // Waits for the pieces in flight (their buffers are the kernel's until
  // then); pieces not yet started are dropped.
  ~AioQueue();
  AioQueue(const AioQueue&) = delete;
  AioQueue& operator=(const AioQueue&) = delete;

  // ZD_ERR_INVALID_ARGUMENT (nothing started) for a transfer that is not
  // aligned or lies outside the reserved store.
  zd_status submit(const zd_tier_io* ios, uint32_t count, uint64_t* ticket, std::string* error);
  // ZD_ERR_IO with the first failure of that submit's pieces.
  zd_status wait(uint64_t ticket, std::string* error);

 private:
  // One piece in flight; cb first, so the kernel's iocb pointer is the slot.
  struct Slot {
    iocb cb;
    uint64_t ticket;
    uint64_t store_offset;
    uint64_t file_offset;
    uint64_t bytes;
    uint32_t path;
    bool write;
  };
  // A submitted transfer not yet fully started.
  struct Pending {
    zd_tier_io io;
    uint64_t ticket;
    uint64_t started;  // bytes already handed to slots
  };
  struct Ticket {
    uint64_t remaining;  // bytes not yet completed (or dropped)
    std::string error;   // the first failure
  };

  AioQueue(const Store& store, uint64_t split, uint32_t depth);

  // All under mutex_.
  bool prepare(Slot* slot);
  void top_up();
  void complete(Slot* slot, long res);
  void fail(Slot* slot, const std::string& message);
  std::string where(const Slot& slot) const;
  bool reap(std::unique_lock<std::mutex>& lock, std::string* error);

  const Store& store_;
  const uint64_t split_;  // pieces never cross a multiple of this
  io_context_t ctx_ = nullptr;

  std::mutex mutex_;
  std::condition_variable reaped_;
  std::vector<Slot> slots_;
  std::vector<Slot*> free_;
  std::vector<Slot*> ready_;  // prepared, not yet taken by io_submit
  std::vector<iocb*> batch_;
  std::vector<io_event> events_;  // the reaper's only
  std::deque<Pending> pending_;
  std::unordered_map<uint64_t, Ticket> tickets_;
  uint64_t next_ticket_ = 1;
  uint32_t in_flight_ = 0;
  bool reaping_ = false;
};

}  // namespace zerod::offload

#endif  // ZEROD_PLUGINS_OFFLOAD_NVME_AIO_QUEUE_H
