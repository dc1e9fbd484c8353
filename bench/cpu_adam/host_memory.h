// Memory from the host tier plugin (zd_tier_host.so), opened the way the
// engine opens it: what offload.optimizer = "host" puts the optimizer's
// state in. Its huge_pages hyperparameter is the one knob the bench turns,
// to show what transparent huge pages are worth to the kernel.
#ifndef ZEROD_BENCH_HOST_MEMORY_H
#define ZEROD_BENCH_HOST_MEMORY_H

#include <zerod/zerod_plugin.h>

#include <cstdint>
#include <string>

namespace zerod::bench {

class HostMemory {
 public:
  // Exits with a message when the plugin cannot be loaded or created.
  HostMemory(const std::string& plugin_dir, bool huge_pages);
  ~HostMemory();
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;

  // Zeroed, page-aligned (2 MiB-aligned with huge pages); exits on failure.
  void* allocate(uint64_t bytes);
  void release(void* p, uint64_t bytes);
  // The tier's own line: node, binding, page-locking, pages.
  std::string describe() const;

 private:
  void* handle_ = nullptr;
  const zd_tier_v1* desc_ = nullptr;
  void* inst_ = nullptr;
};

// n elements of T from a HostMemory, released with it in scope.
template <typename T>
class Array {
 public:
  Array(HostMemory& memory, uint64_t n)
      : memory_(memory), bytes_(n * sizeof(T)), ptr_(static_cast<T*>(memory.allocate(bytes_))) {}
  ~Array() { memory_.release(ptr_, bytes_); }
  Array(const Array&) = delete;
  Array& operator=(const Array&) = delete;
  T* get() const { return ptr_; }

 private:
  HostMemory& memory_;
  uint64_t bytes_;
  T* ptr_;
};

}  // namespace zerod::bench

#endif  // ZEROD_BENCH_HOST_MEMORY_H
