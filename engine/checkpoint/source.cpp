#include "source.h"

#include "error.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

namespace zerod::ckpt {

namespace {
std::atomic<uint64_t> next_source_id{1};

struct LastRecord {
  uint64_t source = 0;
  const Record* record = nullptr;
  std::vector<float> values;
};
thread_local LastRecord last_record;
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
}

const std::vector<float>& Source::record_values(const Where& w) const {
  LastRecord& last = last_record;
  if (last.source != id_ || last.record != w.record) {
    last.source = 0;  // nothing valid while reading
    last.values = shards_[w.shard]->read(*w.record);
    last.source = id_;
    last.record = w.record;
  }
  return last.values;
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
