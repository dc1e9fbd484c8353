// rank_device_bus_id(): the override from the environment, else what the
// build's device runtime says (page_lock_cuda.cpp / page_lock_none.cpp).
#include <cstdlib>
#include <string>
#include <vector>

#include "page_lock.h"

namespace zerod::offload {

std::string runtime_device_bus_id(int32_t local_rank);  // per build

std::string rank_device_bus_id(int32_t local_rank) {
  const char* env = std::getenv("ZEROD_DEVICE_PCI_BUS_IDS");
  if (env == nullptr || *env == '\0') return runtime_device_bus_id(local_rank);
  std::vector<std::string> ids;
  std::string cur;
  for (const char* c = env;; ++c) {
    if (*c == ',' || *c == '\0') {
      if (!cur.empty()) ids.push_back(cur);
      cur.clear();
      if (*c == '\0') break;
    } else if (*c != ' ') {
      cur += *c;
    }
  }
  if (ids.empty()) return "";
  return ids[static_cast<size_t>(local_rank < 0 ? 0 : local_rank) % ids.size()];
}

}  // namespace zerod::offload
