// Where a rank's host memory lives: one NUMA node of the machine, found with
// hwloc, and the CPUs beside it.
//
// The node is the job's choice (numa_node) or, by default, the node nearest
// the rank's device when it has one (its PCI bus id, found in hwloc's
// topology of I/O devices), else local_rank modulo the number of nodes, so
// that CPU ranks spread over the sockets.
#ifndef ZEROD_PLUGINS_OFFLOAD_HOST_PLACEMENT_H
#define ZEROD_PLUGINS_OFFLOAD_HOST_PLACEMENT_H

#include <hwloc.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace zerod::offload {

class Placement {
 public:
  // requested_node: a logical NUMA node index, or -1 for the default.
  // Returns nullptr with *error set when the topology cannot be loaded or
  // the node is not on the machine.
  // device_bus_id: the PCI bus id of the rank's device ("0000:41:00.0"),
  // "" for none.
  static std::unique_ptr<Placement> open(int32_t local_rank, int64_t requested_node,
                                         const std::string& device_bus_id, std::string* error);
  ~Placement();
  Placement(const Placement&) = delete;
  Placement& operator=(const Placement&) = delete;

  int node() const { return node_; }
  int node_count() const { return node_count_; }
  // False when the topology came from HWLOC_XMLFILE or similar: the node is
  // only intended, memory is not bound.
  bool this_system() const { return this_system_; }
  const std::vector<int32_t>& cpus() const { return cpus_; }
  std::string cpu_list() const;  // "8-15", "" when the node has no CPUs

  // Zero-filled, page-aligned memory bound to the node (when this_system()).
  // nullptr with *error naming the bytes and the node on failure. A failed
  // binding is not a failure: the memory is usable, *warning says so once.
  // With huge pages on, a request of kHugePage bytes or more is aligned to
  // kHugePage and advised MADV_HUGEPAGE (a smaller one keeps the kernel's
  // default); off, every request is advised MADV_NOHUGEPAGE (4 KiB pages
  // even where the kernel's THP mode is always).
  void* allocate(uint64_t bytes, std::string* error, std::string* warning);
  void release(void* ptr, uint64_t bytes);

  // "bound", "not bound: <why>" or the note for a foreign topology.
  std::string binding() const;

  // Transparent huge pages for large allocations (the tier's huge_pages):
  // the optimizer streams its state once per step, and with 4 KiB pages
  // every 4 KiB of each stream is a TLB miss. Set before any allocation.
  void set_huge_pages(bool on) { huge_pages_ = on; }
  // "huge pages" with what the kernel makes of them, or why not.
  std::string huge_pages_status() const;
  // Why this node: "numa_node = 3", "nearest device 0000:41:00.0",
  // "local rank 1", or that the device was not found.
  const std::string& reason() const { return reason_; }

 private:
  Placement() = default;

  hwloc_topology_t topology_ = nullptr;
  hwloc_obj_t node_obj_ = nullptr;
  int node_ = 0;
  int node_count_ = 0;
  bool this_system_ = true;
  bool from_xml_ = false;
  std::vector<int32_t> cpus_;
  std::string reason_;
  bool huge_pages_ = true;

  // The first failed binding, kept for describe(); binding failures leave
  // the memory usable (unbound) rather than failing the allocation.
  mutable std::mutex mutex_;
  std::atomic<bool> bind_failed_{false};
  std::string bind_error_;
};

// Bytes actually mapped for a request: whole pages, at least one.
uint64_t mapped_bytes(uint64_t bytes);

// The transparent huge page size on x86-64 and on arm64 with 4 KiB pages.
constexpr uint64_t kHugePage = uint64_t{2} << 20;

// The bracketed word of /sys/kernel/mm/transparent_hugepage/enabled
// ("always", "madvise", "never"); "" where the kernel has no THP.
std::string thp_mode();

}  // namespace zerod::offload

#endif  // ZEROD_PLUGINS_OFFLOAD_HOST_PLACEMENT_H
