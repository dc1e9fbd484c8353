#include "aio_queue.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "../common/text.h"

namespace zerod::offload {
namespace {

std::string aio_limit_note() {
  unsigned long long max = 0, used = 0;
  if (FILE* f = std::fopen("/proc/sys/fs/aio-max-nr", "r")) {
    if (std::fscanf(f, "%llu", &max) != 1) max = 0;
    std::fclose(f);
  }
  if (FILE* f = std::fopen("/proc/sys/fs/aio-nr", "r")) {
    if (std::fscanf(f, "%llu", &used) != 1) used = 0;
    std::fclose(f);
  }
  if (max == 0) return "";
  return format(" (fs.aio-max-nr = %llu, %llu in use)", max, used);
}

}  // namespace

AioQueue::AioQueue(const Store& store, uint64_t split, uint32_t depth)
    : store_(store), split_(split), slots_(depth), events_(depth) {
  free_.reserve(depth);
  ready_.reserve(depth);
  batch_.reserve(depth);
  for (auto& s : slots_) free_.push_back(&s);
}

std::unique_ptr<AioQueue> AioQueue::open(const Store& store, uint64_t block, uint32_t depth, std::string* error) {
  // With one path the store is one file: only block boundaries matter.
  const uint64_t split = store.path_count() == 1 ? block : std::min(block, store.stripe());
  std::unique_ptr<AioQueue> q(new AioQueue(store, split, depth));
  const int rc = io_setup(static_cast<int>(depth), &q->ctx_);
  if (rc != 0) {
    q->ctx_ = nullptr;
    *error = format("nvme: io_setup(queue_depth = %u) failed: %s%s", depth, std::strerror(-rc),
                    rc == -EAGAIN ? aio_limit_note().c_str() : "");
    return nullptr;
  }
  return q;
}

AioQueue::~AioQueue() {
  if (ctx_ == nullptr) return;
  std::unique_lock<std::mutex> lock(mutex_);
  pending_.clear();
  for (Slot* s : ready_) free_.push_back(s);
  ready_.clear();
  std::string ignored;
  while (in_flight_ > 0 && reap(lock, &ignored)) {
  }
  io_destroy(ctx_);
}

zd_status AioQueue::submit(const zd_tier_io* ios, uint32_t count, uint64_t* ticket, std::string* error) {
  if (ticket == nullptr || (ios == nullptr && count > 0)) {
    *error = format("nvme: submit: %s is NULL", ticket == nullptr ? "ticket" : "ios");
    return ZD_ERR_INVALID_ARGUMENT;
  }
  const uint64_t align = store_.alignment();
  const uint64_t size = store_.size();
  uint64_t total = 0;
  // Everything is checked before anything starts: a bad transfer refuses
  // the whole submit.
  for (uint32_t i = 0; i < count; ++i) {
    const zd_tier_io& io = ios[i];
    if (io.bytes == 0) continue;
    if (io.buffer == nullptr) {
      *error = format("nvme: submit: transfer %u has a NULL buffer", i);
      return ZD_ERR_INVALID_ARGUMENT;
    }
    if (io.offset % align != 0 || io.bytes % align != 0 || reinterpret_cast<uintptr_t>(io.buffer) % align != 0) {
      *error = format("nvme: submit: transfer %u (store offset %llu, %llu bytes, buffer %p) is not aligned to %llu bytes",
                      i, static_cast<unsigned long long>(io.offset), static_cast<unsigned long long>(io.bytes),
                      io.buffer, static_cast<unsigned long long>(align));
      return ZD_ERR_INVALID_ARGUMENT;
    }
    if (io.offset > size || io.bytes > size - io.offset) {
      *error = format("nvme: submit: transfer %u (store offset %llu, %llu bytes) goes past the reserved store (%llu bytes)",
                      i, static_cast<unsigned long long>(io.offset), static_cast<unsigned long long>(io.bytes),
                      static_cast<unsigned long long>(size));
      return ZD_ERR_INVALID_ARGUMENT;
    }
    total += io.bytes;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t id = next_ticket_++;
  tickets_.emplace(id, Ticket{total, {}});
  for (uint32_t i = 0; i < count; ++i) {
    if (ios[i].bytes > 0) pending_.push_back({ios[i], id, 0});
  }
  top_up();
  *ticket = id;
  return ZD_OK;
}

zd_status AioQueue::wait(uint64_t ticket, std::string* error) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    auto it = tickets_.find(ticket);
    if (it == tickets_.end()) {
      *error = format("nvme: wait: unknown ticket %llu (never submitted, or already waited for)",
                      static_cast<unsigned long long>(ticket));
      return ZD_ERR_INVALID_ARGUMENT;
    }
    if (it->second.remaining == 0) {
      *error = std::move(it->second.error);
      tickets_.erase(it);
      return error->empty() ? ZD_OK : ZD_ERR_IO;
    }
    if (reaping_) {
      reaped_.wait(lock);
      continue;
    }
    if (in_flight_ == 0) {
      top_up();
      if (in_flight_ == 0 && it->second.remaining != 0) {
        *error = "nvme: wait: a transfer is neither in flight nor queued (internal error)";
        return ZD_ERR_INTERNAL;
      }
      continue;
    }
    if (!reap(lock, error)) return ZD_ERR_INTERNAL;
  }
}

// Blocks in io_getevents without the mutex; records what came back and
// refills the queue.
bool AioQueue::reap(std::unique_lock<std::mutex>& lock, std::string* error) {
  reaping_ = true;
  lock.unlock();
  int n;
  do {
    n = io_getevents(ctx_, 1, static_cast<long>(events_.size()), events_.data(), nullptr);
  } while (n == -EINTR);
  lock.lock();
  reaping_ = false;
  if (n < 0) {
    reaped_.notify_all();
    *error = format("nvme: io_getevents failed: %s", std::strerror(-n));
    return false;
  }
  for (int i = 0; i < n; ++i) complete(static_cast<Slot*>(events_[static_cast<size_t>(i)].data),
                                       static_cast<long>(events_[static_cast<size_t>(i)].res));
  in_flight_ -= static_cast<uint32_t>(n);
  top_up();
  reaped_.notify_all();
  return true;
}

// Fills slot with the next piece of the oldest pending transfer whose
// submit has not failed.
bool AioQueue::prepare(Slot* slot) {
  while (!pending_.empty()) {
    Pending& p = pending_.front();
    Ticket& t = tickets_[p.ticket];
    if (!t.error.empty()) {
      t.remaining -= p.io.bytes - p.started;
      pending_.pop_front();
      continue;
    }
    const uint64_t v = p.io.offset + p.started;
    const uint64_t n = std::min(p.io.bytes - p.started, split_ - v % split_);
    const Store::Location loc = store_.locate(v);
    const int fd = store_.file(loc.path).fd;
    void* buf = static_cast<char*>(p.io.buffer) + p.started;
    if (p.io.write) {
      io_prep_pwrite(&slot->cb, fd, buf, n, static_cast<long long>(loc.file_offset));
    } else {
      io_prep_pread(&slot->cb, fd, buf, n, static_cast<long long>(loc.file_offset));
    }
    slot->cb.data = slot;
    slot->ticket = p.ticket;
    slot->store_offset = v;
    slot->file_offset = loc.file_offset;
    slot->bytes = n;
    slot->path = loc.path;
    slot->write = p.io.write != 0;
    p.started += n;
    if (p.started == p.io.bytes) pending_.pop_front();
    return true;
  }
  return false;
}

void AioQueue::top_up() {
  while (!free_.empty()) {
    Slot* s = free_.back();
    if (!prepare(s)) break;
    free_.pop_back();
    ready_.push_back(s);
  }
  while (!ready_.empty()) {
    batch_.clear();
    for (Slot* s : ready_) batch_.push_back(&s->cb);
    const int rc = io_submit(ctx_, static_cast<long>(batch_.size()), batch_.data());
    if (rc > 0) {
      in_flight_ += static_cast<uint32_t>(rc);
      ready_.erase(ready_.begin(), ready_.begin() + rc);
      // The kernel took fewer than offered: try the rest after completions.
      if (!ready_.empty() && in_flight_ > 0) return;
      continue;
    }
    // EAGAIN while pieces are in flight is the kernel out of room for now:
    // a completion makes room. Any other error belongs to the first piece.
    if (rc == -EAGAIN && in_flight_ > 0) return;
    Slot* s = ready_.front();
    ready_.erase(ready_.begin());
    fail(s, format("nvme path %s: io_submit of the %s %s failed: %s", store_.file(s->path).dir.c_str(),
                   s->write ? "write" : "read", where(*s).c_str(), std::strerror(rc == 0 ? EAGAIN : -rc)));
    free_.push_back(s);
    // The failed piece may have freed room for more of another submit.
    while (!free_.empty()) {
      Slot* f = free_.back();
      if (!prepare(f)) break;
      free_.pop_back();
      ready_.push_back(f);
    }
  }
}

std::string AioQueue::where(const Slot& s) const {
  const std::string what = store_.what_at(s.store_offset);
  return format("of %s at file offset %llu (store offset %llu on rank %d%s%s)", format_bytes(s.bytes).c_str(),
                static_cast<unsigned long long>(s.file_offset), static_cast<unsigned long long>(s.store_offset),
                store_.rank(), what.empty() ? "" : ", in ", what.c_str());
}

void AioQueue::fail(Slot* slot, const std::string& message) {
  Ticket& t = tickets_[slot->ticket];
  if (t.error.empty()) t.error = message;
  t.remaining -= slot->bytes;
}

void AioQueue::complete(Slot* slot, long res) {
  const char* op = slot->write ? "write" : "read";
  const std::string& dir = store_.file(slot->path).dir;
  if (res < 0) {
    fail(slot, format("nvme path %s: %s %s failed: %s", dir.c_str(), op, where(*slot).c_str(),
                      std::strerror(static_cast<int>(-res))));
  } else if (static_cast<uint64_t>(res) != slot->bytes) {
    fail(slot, format("nvme path %s: short %s %s: expected %llu bytes, got %ld", dir.c_str(), op,
                      where(*slot).c_str(), static_cast<unsigned long long>(slot->bytes), res));
  } else {
    tickets_[slot->ticket].remaining -= slot->bytes;
  }
  free_.push_back(slot);
}

}  // namespace zerod::offload
