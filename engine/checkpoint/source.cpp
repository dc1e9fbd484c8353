#include "source.h"

#include "error.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <list>
#include <map>
#include <memory>
#include <mutex>

namespace zerod::ckpt {

namespace {
std::atomic<uint64_t> next_source_id{1};

struct LastRecord {
  uint64_t source = 0;
  const Record* record = nullptr;
  std::vector<float> values;
};
thread_local LastRecord last_record;

// A shard's descriptor, closed when the last holder lets it go: the cache
// may drop it while a read through it is still going on.
class OpenShard {
 public:
  explicit OpenShard(int fd) : fd_(fd) {}
  ~OpenShard() { ::close(fd_); }
  OpenShard(const OpenShard&) = delete;
  OpenShard& operator=(const OpenShard&) = delete;
  int fd() const { return fd_; }

 private:
  const int fd_;
};

// The shards' descriptors kept open between reads, for all the Sources of
// the process together: at most kKeptOpen (fewer under a low limit on open
// files), the least recently used closed first. A checkpoint may have more
// shards than a process may open (ulimit -n: 1024 by default), and each
// rank a daemon runs opens its own Source of it, so no Source holds all its
// shards open; a read opens its shard again only when it is not among the
// ones read lately.
class ShardFiles {
 public:
  static constexpr size_t kKeptOpen = 64;

  static ShardFiles& process() {
    static auto* files = new ShardFiles;  // never destroyed: a static Source may go after it would
    return *files;
  }

  // The descriptor of shard `shard` of Source `source`, opened (and checked
  // to be the file whose index was read) unless it is kept.
  std::shared_ptr<const OpenShard> open(uint64_t source, size_t shard, const ShardReader& reader) {
    const Key key{source, shard};
    if (auto kept = find(key)) return kept;
    // Opened without the lock: on a network file system an open waits on
    // the server, and other threads' reads of kept shards need not wait.
    return keep(key, std::make_shared<const OpenShard>(reader.reopen()));
  }

  // Closes what a Source kept (the Source is going).
  void forget(uint64_t source) {
    std::vector<Kept> closing;  // closed once the lock is released
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = where_.lower_bound({source, 0}); it != where_.end() && it->first.first == source;) {
      closing.push_back(std::move(it->second->second));
      lru_.erase(it->second);
      it = where_.erase(it);
    }
  }

 private:
  using Key = std::pair<uint64_t, size_t>;  // (Source, shard)
  using Kept = std::shared_ptr<const OpenShard>;

  Kept find(const Key& key) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = where_.find(key);
    if (it == where_.end()) return nullptr;
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->second;
  }

  // How many to keep: kKeptOpen, or a quarter of the process's limit on
  // open files where that is less (ulimit -n 64), which leaves the rest of
  // the process most of it. Read at each open: the limit can change.
  static size_t kept_at_most() {
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return kKeptOpen;
    return std::clamp<size_t>(static_cast<size_t>(limit.rlim_cur / 4), 1, kKeptOpen);
  }

  Kept keep(const Key& key, Kept opened) {
    const size_t at_most = kept_at_most();
    std::vector<Kept> dropped;  // closed once the lock is released
    std::lock_guard<std::mutex> lock(mu_);
    if (const auto it = where_.find(key); it != where_.end()) {
      // Another thread opened it meanwhile: theirs is kept, ours closes.
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
    lru_.emplace_front(key, opened);
    where_[key] = lru_.begin();
    while (lru_.size() > at_most) {
      dropped.push_back(std::move(lru_.back().second));
      where_.erase(lru_.back().first);
      lru_.pop_back();
    }
    return opened;
  }

  std::mutex mu_;
  std::list<std::pair<Key, Kept>> lru_;  // the most recently used first
  std::map<Key, std::list<std::pair<Key, Kept>>::iterator> where_;
};

}  // namespace

Source::Source(const std::string& dir)
    : id_(next_source_id.fetch_add(1)), dir_(dir), manifest_(read_manifest(dir)) {
  for (int r = 0; r < manifest_.world_size; ++r) open_shard(r);
  sort_index();
}

Source::Source(const std::string& dir, Manifest manifest, const std::vector<int>& ranks)
    : id_(next_source_id.fetch_add(1)), dir_(dir), manifest_(std::move(manifest)) {
  for (int r : ranks) open_shard(r);
  sort_index();
}

void Source::sort_index() {
  const auto by_first = [](const Where& a, const Where& b) { return a.record->first < b.record->first; };
  for (auto& [key, list] : index_) std::sort(list.begin(), list.end(), by_first);
  for (auto& [rank, index] : rank_index_)
    for (auto& [key, list] : index) std::sort(list.begin(), list.end(), by_first);
}

namespace {

// What a buffer holds, in words (for errors).
std::string buffer_name(const Manifest& m, uint32_t buffer) {
  if (buffer == kMasterBuffer) return "master";
  if (buffer <= m.slots.size()) return m.slots[buffer - 1];
  if (buffer == kWorkerError) return "worker error feedback";
  if (buffer == kServerError || buffer == kServerErrorFused) return "server error feedback";
  if (buffer == kRankCopy) return "own master";
  if (buffer > kRankCopy && buffer - kRankCopy <= m.slots.size()) return "own " + m.slots[buffer - kRankCopy - 1];
  return "buffer " + std::to_string(buffer);
}

bool known_buffer(const Manifest& m, uint32_t buffer) {
  if (!rank_buffer(buffer)) return buffer <= m.slots.size();
  return buffer == kWorkerError || buffer == kServerError || buffer == kServerErrorFused ||
         (buffer >= kRankCopy && buffer - kRankCopy <= m.slots.size());
}

}  // namespace

void Source::open_shard(int r) {
  const std::string path = dir_ + "/" + shard_name(r, manifest_.world_size, manifest_.shard_set);
  if (!manifest_.shared && ::access(path.c_str(), F_OK) != 0)
    for (const NodePart& p : manifest_.parts)
      if (r >= p.first_rank && r < p.first_rank + p.ranks)
        fail(ZD_ERR_IO, path + " is not here: this snapshot was taken across " + std::to_string(manifest_.nodes) +
                            " nodes on node-local disks, and rank " + std::to_string(r) + "'s shard is on node " +
                            std::to_string(p.node) + " (host " + p.host + "); copy every node's files of " + dir_ +
                            " into one directory to read it whole");
  shards_.push_back(std::make_unique<ShardReader>(path));
  const ShardReader& s = *shards_.back();
  for (const Record& rec : s.records()) {
    if (rec.param >= manifest_.params.size() || !known_buffer(manifest_, rec.buffer) ||
        rec.first + rec.count > manifest_.params[rec.param].numel)
      fail(ZD_ERR_INVALID_ARGUMENT, path + ": a record outside the parameters the manifest lists");
    Index& index = rank_buffer(rec.buffer) ? rank_index_[r] : index_;
    index[{rec.param, rec.buffer}].push_back({shards_.size() - 1, &rec});
  }
}

const Source::Index& Source::rank_index(int rank) const {
  static const Index none;
  const auto it = rank_index_.find(rank);
  return it == rank_index_.end() ? none : it->second;
}

Source::~Source() {
  if (last_record.source == id_) last_record = LastRecord{};  // this thread's cached record goes with it
  ShardFiles::process().forget(id_);
}

const std::vector<float>& Source::record_values(const Where& w) const {
  LastRecord& last = last_record;
  if (last.source != id_ || last.record != w.record) {
    last.source = 0;  // nothing valid while reading
    last.values = read_record(w);
    last.source = id_;
    last.record = w.record;
  }
  return last.values;
}

std::vector<float> Source::read_record(const Where& w) const {
  const ShardReader& shard = *shards_[w.shard];
  const auto file = ShardFiles::process().open(id_, w.shard, shard);
  return shard.read(*w.record, file->fd());
}

bool Source::has(uint32_t param, uint32_t buffer) const { return index_.count({param, buffer}) != 0; }

void Source::read(uint32_t param, uint32_t buffer, uint64_t first, uint64_t count, float* out) const {
  visit(index_, param, buffer, first, count, out);
}

void Source::verify(uint32_t param, uint32_t buffer, uint64_t first, uint64_t count) const {
  visit(index_, param, buffer, first, count, nullptr);
}

void Source::read_rank(int rank, uint32_t param, uint32_t buffer, uint64_t first, uint64_t count, float* out) const {
  visit(rank_index(rank), param, buffer, first, count, out);
}

uint64_t Source::verify_rank(int rank) const {
  uint64_t records = 0;
  for (const auto& [key, list] : rank_index(rank))
    for (const Where& w : list) {
      record_values(w);  // read and checked
      ++records;
    }
  return records;
}

std::vector<Record> Source::rank_records(int rank) const {
  std::vector<Record> out;
  for (const auto& [key, list] : rank_index(rank))
    for (const Where& w : list) out.push_back(*w.record);
  return out;
}

// Reads (and checks) every record overlapping [first, first + count); copies
// the overlap into out unless out is null.
void Source::visit(const Index& index, uint32_t param, uint32_t buffer, uint64_t first, uint64_t count,
                   float* out) const {
  if (count == 0) return;
  auto it = index.find({param, buffer});
  const std::string what = "parameter '" + (param < manifest_.params.size() ? manifest_.params[param].name : "?") +
                           "' (" + buffer_name(manifest_, buffer) + ")";
  if (it == index.end()) fail(ZD_ERR_INVALID_ARGUMENT, dir_ + " holds no values of " + what);
  uint64_t covered = first;  // everything before this is filled
  for (const Where& w : it->second) {
    const Record& r = *w.record;
    const uint64_t lo = std::max(first, r.first), hi = std::min(first + count, r.first + r.count);
    if (lo >= hi) continue;
    if (lo > covered) break;  // a gap
    const std::vector<float>& values = record_values(w);
    if (out) std::memcpy(out + (lo - first), values.data() + (lo - r.first), (hi - lo) * 4);
    covered = std::max(covered, hi);
    if (covered >= first + count) return;
  }
  fail(ZD_ERR_INVALID_ARGUMENT, dir_ + " holds " + what + " only up to element " + std::to_string(covered) + " of " +
                                    std::to_string(first) + ".." + std::to_string(first + count) +
                                    ": a shard is missing records");
}

}  // namespace zerod::ckpt
