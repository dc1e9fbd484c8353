// Snapshots at finalize: across nodes, whether the path is one directory
// every node sees; what a crash left half written; and the newest snapshot
// every rank can read, agreed by all ranks (snapshots.h).
#include "snapshots.h"

#include "checkpoint_io.h"
#include "error.h"
#include "file_access.h"
#include "log.h"
#include "shard_file.h"
#include "snapshots_internal.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <system_error>

namespace zerod {

namespace fs = std::filesystem;
using namespace snapshot_detail;

namespace {

constexpr size_t kHostBytes = 64;

std::string host_name() {
  char b[kHostBytes] = {};
  if (::gethostname(b, sizeof b - 1) != 0) return "?";
  return b;
}

}  // namespace

// ---------------------------------------------------------------------------
// Finalize: where the path is, and which snapshot the job resumes from

void Snapshots::discover(int rank, RankResources& res) {
  const std::string& path = ctx_.config.snapshot.path;
  // Every node's host, for the manifest and the messages.
  std::vector<uint8_t> mine(kHostBytes, 0), all(kHostBytes * static_cast<size_t>(ctx_.world_size), 0);
  const std::string host = host_name();
  std::memcpy(mine.data(), host.data(), std::min(host.size(), kHostBytes - 1));
  const std::string hosts_what = "snapshots: every node's host";
  ctx_.run(*res.stream, [&] {
    ctx_.comm().all_gather(ctx_.comm_call(rank, comm_tag(CommOp::Read, kDiscover, 0), hosts_what), mine.data(),
                           all.data(), kHostBytes, ZD_COMM_U8);
  });
  // Whether the path is one directory: node 0 leaves a file of a random
  // name there, and every rank looks for it.
  double token = 0;
  if (rank == 0) {
    std::random_device rd;
    const uint64_t t = (((static_cast<uint64_t>(rd()) << 21) ^ rd()) & ((uint64_t{1} << 52) - 1)) | 1;
    char name[64];
    std::snprintf(name, sizeof name, "/.zerod-probe-%013" PRIx64, t);
    const int fd = ckpt::open_to_write(path + name, O_WRONLY | O_EXCL, ckpt::FileAccess::OwnerOnly);
    if (fd >= 0) {
      ::close(fd);
      token = static_cast<double>(t);
    } else {
      log_message(ZD_LOG_ERROR, "snapshots: cannot create " + path + name + ": " + errno_text(errno));
    }
  }
  token = all_reduce_max(rank, res, kDiscover, 1, "snapshots: node 0's probe file", token);
  char name[64];
  std::snprintf(name, sizeof name, "/.zerod-probe-%013" PRIx64, static_cast<uint64_t>(token));
  const bool seen = token > 0 && ::access((path + name).c_str(), F_OK) == 0;
  const double unseen = all_reduce_max(rank, res, kDiscover, 2, "snapshots: who sees node 0's probe file",
                                       seen ? 0.0 : 1.0);
  if (rank == 0 && token > 0) ::unlink((path + name).c_str());
  if (token == 0)
    fail(ZD_ERR_IO, ctx_.config.source + ": snapshot.path " + path + ": node 0 cannot create a file there (its log "
                                         "says why)");
  std::lock_guard<std::mutex> lock(mu_);
  hosts_.assign(static_cast<size_t>(nodes_), "");
  for (int n = 0; n < nodes_; ++n)
    hosts_[static_cast<size_t>(n)] =
        std::string(reinterpret_cast<const char*>(&all[static_cast<size_t>(n * local_ranks_) * kHostBytes]));
  shared_.store(unseen == 0);
  if (rank == first_local_)
    log_info(shared_.load()
                 ? "snapshots: " + path + " is one directory every node sees (shared): node 0 commits each snapshot"
                 : "snapshots: " + path + " is on each node's own disk (node-local): every node keeps its part, and "
                                          "a restart needs the same nodes (docs/checkpoints.md)");
}

std::vector<std::pair<int64_t, std::string>> Snapshots::candidates() const {
  // Node-local parts: a node other than 0 has its part file, node 0 the manifest.
  const bool own_part = across_nodes() && !shared_.load() && node_ != 0;
  return whole_snapshots(ctx_.config.snapshot.path, own_part ? part_name() : "");
}

std::shared_ptr<const ckpt::Source> Snapshots::open_for(RankResources& res, StateBuffers& buffers,
                                                        const std::string& dir) const {
  const bool have_manifest = ::access((dir + "/" + ckpt::kManifestName).c_str(), F_OK) == 0;
  const ckpt::Manifest m =
      have_manifest ? ckpt::read_manifest(dir) : ckpt::read_manifest_file(dir + "/" + part_name(), dir);
  bool every_shard = true;
  for (int r = 0; r < m.world_size && every_shard; ++r)
    every_shard = ::access((dir + "/" + ckpt::shard_name(r, m.world_size, m.shard_set)).c_str(), F_OK) == 0;
  std::shared_ptr<const ckpt::Source> src;
  if (have_manifest && (every_shard || m.nodes == 0 || m.shared)) {
    src = std::make_shared<ckpt::Source>(dir);  // any layout (a missing shard is named)
  } else {
    // A node's own part of a snapshot on node-local disks: its ranks read
    // only their own shards, so the layout must be the one that wrote it.
    const int per_node = m.world_size / std::max(1, m.nodes);
    if (m.world_size != ctx_.world_size || m.nodes != nodes_ || m.zero_stage != ctx_.config.zero_stage)
      fail(ZD_ERR_IO, dir + " was written by " + std::to_string(m.nodes) + " nodes of " + std::to_string(per_node) +
                          " ranks at ZeRO stage " + std::to_string(m.zero_stage) +
                          ", each node keeping its part on its own disk, and this job runs " +
                          std::to_string(nodes_) + " nodes of " + std::to_string(local_ranks_) +
                          " ranks at stage " + std::to_string(ctx_.config.zero_stage) +
                          ": a node reads only its own part. Copy every node's files of it into one "
                          "directory every node sees to resume at another size");
    std::vector<int> ranks;
    for (int r = first_local_; r < first_local_ + local_ranks_; ++r) ranks.push_back(r);
    src = std::make_shared<ckpt::Source>(dir, m, ranks);
  }
  check_checkpoint_fits(ctx_, src->manifest(), dir);
  verify_rank_state(ctx_, res, buffers, *src);
  return src;
}

std::shared_ptr<const ckpt::Source> Snapshots::start(int rank, RankResources& res, StateBuffers& buffers) {
  if (!enabled()) return nullptr;
  {
    // A retried finalize (its snapshots moved aside or mended) asks
    // afresh: an earlier attempt's reasons are not this one's, and a
    // rank's own stale one would stand (the lowest rank's is kept). Every
    // local rank clears before its first collective below, so before any
    // rank records a reason after it.
    std::lock_guard<std::mutex> lock(mu_);
    refused_.clear();
  }
  const std::string& path = ctx_.config.snapshot.path;
  if (across_nodes()) discover(rank, res);
  // What a crash left half written goes before any rank can start a
  // snapshot (its first step waits for every rank at a collective), and
  // before any of this node's ranks looks for snapshots: the first of them
  // to come cleans, once; the others wait for it. One directory of several
  // nodes is node 0's to clean.
  {
    std::lock_guard<std::mutex> clean_lock(clean_mu_);
    if (!cleaned_ && (!across_nodes() || !shared_.load() || node_ == 0)) {
      // On a node-local disk other than node 0's, a part whose report was
      // written is whole: the node may have died between the verdict and its
      // rename. It is renamed now; node 0's manifest and the agreement below
      // decide whether its snapshot is complete.
      const bool own_parts = across_nodes() && !shared_.load() && node_ != 0;
      // A step being replaced by a new snapshot of the same step: its old
      // copy back, or gone if the new one got in (replace_dir).
      const bool repaired = repair_replaced(path);
      std::error_code ec;
      std::vector<fs::path> partials;
      for (const auto& e : fs::directory_iterator(path, ec)) {
        const std::string name = e.path().filename().string();
        if (name.rfind("step-", 0) == 0 && name.size() > 8 && name.substr(name.size() - 8) == ".partial")
          partials.push_back(e.path());
      }
      for (const fs::path& p : partials) {
        if (own_parts && fs::exists(p / part_name(), ec)) {
          try {
            replace_dir(p.string(), (p.parent_path() / p.stem()).string());
            continue;
          } catch (const std::exception&) {
            // removed below, as any other leftover
          }
        }
        fs::remove_all(p, ec);
      }
      if (repaired || !partials.empty()) sync_dir(path);
    }
    cleaned_ = true;
  }
  // A daemon `zerod run` restarted resumes whatever `resume` says, from its
  // run's own snapshots only (SnapshotConfig::restart_steps).
  const auto& only = ctx_.config.snapshot.restart_steps;
  if (!ctx_.config.snapshot.resume && !only) return nullptr;

  const int world = ctx_.world_size;
  auto mine = candidates();
  if (only)
    std::erase_if(mine, [&](const auto& c) { return std::find(only->begin(), only->end(), c.first) == only->end(); });
  int64_t bound = INT64_MAX;
  std::vector<std::string> skipped;  // "dir (why)"
  bool any = false;
  const auto note = [&](const std::string& dir, const std::string& why) {
    skipped.push_back(dir + " (" + why + ")");
    if (rank == first_local_) log_warn("snapshot " + dir + " skipped: " + why + "; trying the next older one");
  };
  for (uint64_t round = 0;; ++round) {
    // Each rank's newest below the bound; the newest every rank has is the
    // least of them (MAX of the negated), if every rank has one.
    int64_t proposal = -1;
    for (auto it = mine.rbegin(); it != mine.rend(); ++it)
      if (it->first < bound) {
        proposal = it->first;
        break;
      }
    const double newest = all_reduce_max(rank, res, kResume, 3 * round, "resume: each rank's newest snapshot",
                                         static_cast<double>(proposal));
    const double least = -all_reduce_max(rank, res, kResume, 3 * round + 1, "resume: the least of them",
                                         -static_cast<double>(proposal));
    if (newest < 0) break;  // none (left) anywhere
    any = true;
    const auto common = static_cast<int64_t>(least);
    for (auto it = mine.rbegin(); it != mine.rend(); ++it)
      if (it->first < bound && it->first > common)
        note(it->second, common < 0 ? "not every node has it (a node has no older snapshot)"
                                    : "not every node has it whole (the newest every node has is step " +
                                          std::to_string(common) + ")");
    if (common < 0) break;
    const std::string dir = path + "/" + step_dir(common);
    std::string why;
    std::shared_ptr<const ckpt::Source> src;
    if (std::none_of(mine.begin(), mine.end(), [&](const auto& c) { return c.first == common; })) {
      why = "this node has no whole part of it";
    } else {
      try {
        src = open_for(res, buffers, dir);
      } catch (const std::exception& e) {
        why = e.what();
      }
    }
    if (!why.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = refused_.find(common);
      if (it == refused_.end() || rank < it->second.first) refused_[common] = {rank, why};
    }
    const double verdict = all_reduce_max(rank, res, kResume, 3 * round + 2, "resume: can every rank read it",
                                          why.empty() ? 0.0 : static_cast<double>(world - rank));
    if (verdict == 0) {
      resumed_at(common);
      if (rank == first_local_ && !skipped.empty()) {
        std::string list;
        for (const auto& s : skipped) list += (list.empty() ? "" : "; ") + s;
        log_warn("resuming from " + dir + " at step " + std::to_string(common) + ", the newest snapshot every rank " +
                 "can read; skipped: " + list);
      }
      return src;
    }
    const int failed = world - static_cast<int>(verdict);
    std::string reason;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = refused_.find(common);
      reason = it != refused_.end() ? "rank " + std::to_string(it->second.first) + ": " + it->second.second
                                    : "rank " + std::to_string(failed) + " on " + node_of(failed) +
                                          " cannot read it (that node's log says why)";
    }
    note(dir, reason);
    bound = common;
  }
  if (any) {
    std::string list;
    for (const auto& s : skipped) list += "\n  " + s;
    fail(ZD_ERR_IO, "snapshot: no snapshot under " + path + " can be resumed from:" + list +
                        "\nmove them aside (or remove them) to start the job from scratch, or set "
                        "snapshot.resume = false in " + ctx_.config.source);
  }
  return nullptr;
}

}  // namespace zerod
