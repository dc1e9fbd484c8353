#include "store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "../common/text.h"

namespace zerod::offload {

Store::Store(std::vector<StoreFile> files, uint64_t stripe, uint64_t alignment, int32_t rank)
    : files_(std::move(files)), stripe_(stripe), alignment_(alignment), rank_(rank) {}

Store::~Store() {
  for (auto& f : files_) {
    if (f.fd >= 0) ::close(f.fd);
  }
}

Store::Location Store::locate(uint64_t v) const {
  const uint64_t paths = files_.size();
  const uint64_t s = v / stripe_;
  return {static_cast<uint32_t>(s % paths), (s / paths) * stripe_ + v % stripe_};
}

uint64_t Store::file_bytes(uint32_t path, uint64_t v) const {
  const uint64_t paths = files_.size();
  const uint64_t full = v / stripe_;  // whole stripes below v
  const uint64_t tail = v % stripe_;  // bytes of the stripe v is in
  uint64_t bytes = (full / paths + (path < full % paths ? 1 : 0)) * stripe_;
  if (path == full % paths) bytes += tail;
  return bytes;
}

bool Store::reserve(uint64_t bytes, const char* what, uint64_t* offset, std::string* report,
                    std::string* error) {
  const std::string name = what != nullptr && *what != '\0' ? what : "(unnamed)";
  std::lock_guard<std::mutex> lock(mutex_);
  if (bytes > UINT64_MAX - size_ - alignment_) {
    *error = format("nvme: reserving %llu bytes for %s on rank %d: the store cannot grow that far",
                    static_cast<unsigned long long>(bytes), name.c_str(), rank_);
    return false;
  }
  const uint64_t rounded = (bytes + alignment_ - 1) / alignment_ * alignment_;
  const uint64_t begin = size_, end = size_ + rounded;
  std::string per_path;
  for (uint32_t p = 0; p < files_.size(); ++p) {
    const uint64_t from = file_bytes(p, begin), to = file_bytes(p, end);
    if (to == from) continue;
    // Mode 0 allocates the extents and extends the file: later writes
    // into them need no free space.
    int rc;
    do {
      rc = ::fallocate(files_[p].fd, 0, static_cast<off_t>(from), static_cast<off_t>(to - from));
    } while (rc != 0 && errno == EINTR);
    if (rc != 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) {
      // A file system that cannot preallocate: the store still works, but
      // a full disk would fail a write later.
      rc = ::ftruncate(files_[p].fd, static_cast<off_t>(to));
      if (rc == 0) per_path += format(", %s +%s (not preallocated: %s cannot)", files_[p].dir.c_str(),
                                      format_bytes(to - from).c_str(), files_[p].fs.c_str());
    } else if (rc == 0) {
      per_path += format(", %s +%s", files_[p].dir.c_str(), format_bytes(to - from).c_str());
    }
    if (rc != 0) {
      const int e = errno;
      // Give back what this reservation took on every path so far.
      for (uint32_t q = 0; q <= p; ++q) {
        if (::ftruncate(files_[q].fd, static_cast<off_t>(file_bytes(q, begin))) != 0) {
          // Nothing better to do: the bytes stay allocated but unused.
        }
      }
      const std::string share =
          files_.size() == 1 ? format_bytes(to - from)
                             : format("%s (its share of %s striped over %zu paths)", format_bytes(to - from).c_str(),
                                      format_bytes(rounded).c_str(), files_.size());
      // The free space leaves out what this store's earlier reservations
      // hold on the path, which closing the store gives back (zerod closes
      // it when a finalize fails): name it, or the disk shows more free
      // after the failure than the message said.
      const uint64_t held = file_bytes(p, begin);
      const std::string space =
          format_bytes(free_bytes(files_[p].fd)) +
          (held == 0 ? std::string(" free")
                     : " free, besides " + format_bytes(held) + " held by this rank's earlier reservations");
      *error = format("nvme path %s: reserving %s for %s on rank %d failed: %s (%s)", files_[p].dir.c_str(),
                      share.c_str(), name.c_str(), rank_, std::strerror(e), space.c_str());
      return false;
    }
  }
  reservations_.push_back({begin, end, name});
  size_ = end;
  *offset = begin;
  *report = format("reserved %s for %s at store offset %llu on rank %d: ", format_bytes(rounded).c_str(),
                   name.c_str(), static_cast<unsigned long long>(begin), rank_) +
            (per_path.empty() ? std::string("nothing") : per_path.substr(2));
  return true;
}

uint64_t Store::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return size_;
}

std::string Store::what_at(uint64_t v) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = std::upper_bound(reservations_.begin(), reservations_.end(), v,
                             [](uint64_t x, const Reservation& r) { return x < r.begin; });
  if (it == reservations_.begin()) return "";
  --it;
  return v < it->end ? it->what : "";
}

}  // namespace zerod::offload
