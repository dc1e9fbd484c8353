#include "placement.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "../common/text.h"

namespace zerod::offload {

uint64_t mapped_bytes(uint64_t bytes) {
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (bytes == 0) return page;
  if (bytes > UINT64_MAX - page) return 0;
  return (bytes + page - 1) / page * page;
}

std::string thp_mode() {
  std::FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (f == nullptr) return "";
  char line[128] = "";
  const bool read = std::fgets(line, sizeof line, f) != nullptr;
  std::fclose(f);
  if (!read) return "";
  const char* open = std::strchr(line, '[');
  const char* close = open ? std::strchr(open, ']') : nullptr;
  return close ? std::string(open + 1, close) : std::string();
}

namespace {

// An anonymous mapping of len bytes starting at a multiple of align (a
// power of two, or 0 for no more than a page): map align more, then unmap
// the unaligned head and the tail beyond len. MAP_FAILED with errno set.
void* map_aligned(uint64_t len, uint64_t align) {
  if (align == 0) return mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (len > UINT64_MAX - align) {
    errno = ENOMEM;
    return MAP_FAILED;
  }
  void* raw = mmap(nullptr, len + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return raw;
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + align - 1) & ~(uintptr_t{align} - 1);
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + len + align;
  if (end > aligned + len) munmap(reinterpret_cast<void*>(aligned + len), end - (aligned + len));
  return reinterpret_cast<void*>(aligned);
}

// The logical index of the first NUMA node in the nodeset of the nearest
// non-I/O ancestor of the PCI device bus_id; -1 when the topology does not
// have the device.
int node_nearest_device(hwloc_topology_t topology, const std::string& bus_id) {
  hwloc_obj_t dev = hwloc_get_pcidev_by_busidstring(topology, bus_id.c_str());
  if (dev == nullptr) return -1;
  hwloc_obj_t near = hwloc_get_non_io_ancestor_obj(topology, dev);
  if (near == nullptr || near->nodeset == nullptr) return -1;
  for (hwloc_obj_t n = hwloc_get_next_obj_by_type(topology, HWLOC_OBJ_NUMANODE, nullptr); n != nullptr;
       n = hwloc_get_next_obj_by_type(topology, HWLOC_OBJ_NUMANODE, n)) {
    if (hwloc_bitmap_isset(near->nodeset, n->os_index)) return static_cast<int>(n->logical_index);
  }
  return -1;
}

}  // namespace

std::unique_ptr<Placement> Placement::open(int32_t local_rank, int64_t requested_node,
                                           const std::string& device_bus_id, std::string* error) {
  std::unique_ptr<Placement> p(new Placement());
  if (hwloc_topology_init(&p->topology_) != 0) {
    p->topology_ = nullptr;
    *error = format("host: hwloc_topology_init failed: %s", std::strerror(errno));
    return nullptr;
  }
  // HWLOC_XMLFILE describes a machine that is not this one (tests, `zerod
  // plan`). hwloc honours it by itself but falls back to this machine when
  // the file cannot be read; selected explicitly, a bad file is an error.
  const char* xml = std::getenv("HWLOC_XMLFILE");
  if (xml != nullptr && *xml != '\0' && hwloc_topology_set_xml(p->topology_, xml) != 0) {
    *error = format("host: HWLOC_XMLFILE=%s: %s", xml, std::strerror(errno));
    return nullptr;
  }
  // PCI devices only where a device must be found (discovering them costs).
  const bool find_device = requested_node < 0 && !device_bus_id.empty();
  if (find_device) hwloc_topology_set_io_types_filter(p->topology_, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(p->topology_) != 0) {
    *error = format("host: cannot load the machine's topology%s%s: %s", xml ? " from HWLOC_XMLFILE=" : "",
                    xml ? xml : "", std::strerror(errno));
    return nullptr;
  }
  p->this_system_ = hwloc_topology_is_thissystem(p->topology_) != 0;
  p->from_xml_ = xml != nullptr && *xml != '\0';
  p->node_count_ = hwloc_get_nbobjs_by_type(p->topology_, HWLOC_OBJ_NUMANODE);
  if (p->node_count_ <= 0) {
    *error = "host: the topology has no NUMA node";
    return nullptr;
  }
  if (requested_node >= 0) {
    if (requested_node >= p->node_count_) {
      *error = format("host: numa_node = %lld is not on this machine: it has %d NUMA node%s (0..%d)",
                      static_cast<long long>(requested_node), p->node_count_, p->node_count_ == 1 ? "" : "s",
                      p->node_count_ - 1);
      return nullptr;
    }
    p->node_ = static_cast<int>(requested_node);
    p->reason_ = format("numa_node = %lld", static_cast<long long>(requested_node));
  } else {
    const int near = find_device ? node_nearest_device(p->topology_, device_bus_id) : -1;
    if (near >= 0) {
      p->node_ = near;
      p->reason_ = "nearest device " + device_bus_id;
    } else {
      p->node_ = (local_rank < 0 ? 0 : local_rank) % p->node_count_;
      p->reason_ = format("local rank %d", static_cast<int>(local_rank));
      if (find_device) p->reason_ += " (device " + device_bus_id + " is not in the topology)";
    }
  }
  p->node_obj_ = hwloc_get_obj_by_type(p->topology_, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(p->node_));
  if (p->node_obj_ == nullptr) {
    *error = format("host: NUMA node %d not found in the topology", p->node_);
    return nullptr;
  }
  // cpuset bits are the PUs' OS indexes: what sched_setaffinity takes.
  if (p->node_obj_->cpuset != nullptr) {
    for (int i = hwloc_bitmap_first(p->node_obj_->cpuset); i >= 0; i = hwloc_bitmap_next(p->node_obj_->cpuset, i)) {
      p->cpus_.push_back(i);
    }
  }
  return p;
}

Placement::~Placement() {
  if (topology_ != nullptr) hwloc_topology_destroy(topology_);
}

std::string Placement::cpu_list() const {
  if (node_obj_ == nullptr || node_obj_->cpuset == nullptr || hwloc_bitmap_iszero(node_obj_->cpuset)) return "";
  char buf[256];
  hwloc_bitmap_list_snprintf(buf, sizeof buf, node_obj_->cpuset);
  return buf;
}

void* Placement::allocate(uint64_t bytes, std::string* error, std::string* warning) {
  const uint64_t len = mapped_bytes(bytes);
  // Fresh anonymous pages are zero: no memset, and no page is touched (so
  // placed) before the binding below is in force.
  const bool huge = huge_pages_ && len >= kHugePage;
  void* p = len == 0 ? MAP_FAILED : map_aligned(len, huge ? kHugePage : 0);
  if (p == MAP_FAILED) {
    const int e = len == 0 ? ENOMEM : errno;
    *error = format("host: cannot allocate %s (%llu bytes) on NUMA node %d: %s", format_bytes(bytes).c_str(),
                    static_cast<unsigned long long>(bytes), node_, std::strerror(e));
    return nullptr;
  }
  // Advice only: a kernel without THP refuses it and the memory stays
  // usable in 4 KiB pages, which huge_pages_status() reports. A small
  // request gets no advice either way: it keeps the kernel's default.
  if (huge)
    madvise(p, len, MADV_HUGEPAGE);
  else if (!huge_pages_)
    madvise(p, len, MADV_NOHUGEPAGE);
  // A foreign topology's nodes are not this machine's: binding would fail
  // or, worse, land on a real node of the same number.
  if (this_system_) {
    const int rc = hwloc_set_area_membind(topology_, p, len, node_obj_->nodeset, HWLOC_MEMBIND_BIND,
                                          HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_STRICT);
    if (rc != 0) {
      const int e = errno;
      std::lock_guard<std::mutex> lock(mutex_);
      if (!bind_failed_.load()) {
        bind_error_ = std::strerror(e);
        bind_failed_.store(true);
        *warning = format("host: binding memory to NUMA node %d failed (%s); using unbound memory", node_,
                          bind_error_.c_str());
      }
    }
  }
  return p;
}

std::string Placement::huge_pages_status() const {
  if (!huge_pages_) return "4 KiB pages: huge_pages = false";
  const std::string mode = thp_mode();
  if (mode.empty()) return "4 KiB pages: this kernel has no transparent huge pages";
  if (mode == "never") return "4 KiB pages: transparent huge pages are never (/sys/kernel/mm/transparent_hugepage)";
  return "huge pages for allocations of 2 MiB or more (THP " + mode + ")";
}

void Placement::release(void* ptr, uint64_t bytes) {
  if (ptr != nullptr) munmap(ptr, mapped_bytes(bytes));
}

std::string Placement::binding() const {
  if (!this_system_) {
    return from_xml_ ? "intended: topology from HWLOC_XMLFILE, not this machine"
                     : "intended: the topology is not this machine's";
  }
  if (bind_failed_.load()) {
    std::lock_guard<std::mutex> lock(mutex_);
    return "not bound: binding failed: " + bind_error_;
  }
  return "bound";
}

}  // namespace zerod::offload
