#include "snapshots.h"

#include "checkpoint/shard_file.h"
#include "checkpoint_io.h"
#include "error.h"
#include "log.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <filesystem>

namespace zerod {

namespace fs = std::filesystem;

namespace {

std::string step_dir(int64_t step) {
  char b[64];
  std::snprintf(b, sizeof b, "step-%012" PRId64, step);
  return b;
}

// The steps of the whole snapshots under path, ascending.
std::vector<std::pair<int64_t, std::string>> whole_snapshots(const std::string& path) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    const std::string name = e.path().filename().string();
    int64_t step = 0;
    char rest = 0;
    if (std::sscanf(name.c_str(), "step-%" SCNd64 "%c", &step, &rest) != 1) continue;  // .partial and others
    if (!fs::exists(e.path() / ckpt::kManifestName, ec)) continue;
    out.emplace_back(step, e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

struct Snapshots::InFlight {
  int64_t step;
  std::string partial, final_dir;
  ckpt::Manifest manifest;
  int remaining;        // ranks still writing
  bool ok = true;
  std::string why;      // the first failure
};

Snapshots::Snapshots(const ModelContext& ctx, int first_local_rank, int local_ranks)
    : ctx_(ctx), first_local_(first_local_rank), local_ranks_(local_ranks), writers_(static_cast<size_t>(local_ranks)) {
  if (!enabled()) return;
  if (local_ranks < ctx.world_size)
    fail(ZD_ERR_CONFIG, ctx.config.source + ": snapshot: the ranks of one daemon commit a snapshot together, and this "
                                            "job spans several nodes; snapshots across nodes are not supported yet "
                                            "(save checkpoints from the trainer instead)");
  std::error_code ec;
  fs::create_directories(ctx.config.snapshot.path, ec);
  if (ec)
    fail(ZD_ERR_IO, ctx.config.source + ": snapshot.path " + ctx.config.snapshot.path + " cannot be created: " +
                        ec.message());
  if (::access(ctx.config.snapshot.path.c_str(), W_OK) != 0)
    fail(ZD_ERR_IO, ctx.config.source + ": snapshot.path " + ctx.config.snapshot.path + " is not writable: " +
                        errno_text(errno));
}

Snapshots::~Snapshots() {
  for (auto& t : writers_)
    if (t.joinable()) t.join();
}

std::string Snapshots::latest() const {
  if (!enabled()) return "";
  const auto all = whole_snapshots(ctx_.config.snapshot.path);
  return all.empty() ? "" : all.back().second;
}

void Snapshots::begin(int64_t step, const ckpt::Manifest& manifest) {
  // The first rank to arrive makes the snapshot; the others join it.
  if (current_ && current_->step == step && current_->remaining > 0) return;
  auto s = std::make_shared<InFlight>();
  s->step = step;
  s->final_dir = ctx_.config.snapshot.path + "/" + step_dir(step);
  s->partial = s->final_dir + ".partial";
  s->manifest = manifest;
  s->remaining = local_ranks_;
  std::error_code ec;
  fs::remove_all(s->partial, ec);  // a leftover of a crash
  fs::create_directories(s->partial, ec);
  if (ec) {
    s->ok = false;
    s->why = "cannot create " + s->partial + ": " + ec.message();
  }
  current_ = s;
}

void Snapshots::after_step(int rank, int64_t step, RankResources& res, StateBuffers& buffers,
                           const LossScaler& scaler) {
  if (!due(step)) return;
  fence(rank);
  std::shared_ptr<InFlight> s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    begin(step, describe_model(ctx_, step, scaler));
    s = current_;
  }
  writers_[static_cast<size_t>(rank - first_local_)] =
      std::thread([this, s, rank, &res, &buffers] { write_shard(s, rank, res, buffers); });
}

void Snapshots::fence(int rank) {
  std::thread& t = writers_[static_cast<size_t>(rank - first_local_)];
  if (t.joinable()) t.join();
}

void Snapshots::write_shard(const std::shared_ptr<InFlight>& s, int rank, RankResources& res, StateBuffers& buffers) {
  bool ok = s->ok;
  std::string why;
  if (ok) {
    try {
      ckpt::ShardWriter out(s->partial + "/" + ckpt::shard_name(rank, ctx_.world_size), rank, ctx_.world_size);
      write_rank_shard(ctx_, res, buffers, out);
      out.finish();
    } catch (const std::exception& e) {
      ok = false;
      why = "rank " + std::to_string(rank) + ": " + e.what();
    }
  }
  finish_shard(s, ok, why);
}

void Snapshots::finish_shard(const std::shared_ptr<InFlight>& s, bool ok, const std::string& why) {
  bool last = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ok && s->ok) {
      s->ok = false;
      s->why = why;
    }
    last = --s->remaining == 0;
  }
  if (last) commit(*s);
}

void Snapshots::commit(InFlight& s) {
  std::error_code ec;
  if (s.ok) {
    try {
      ckpt::write_manifest(s.partial, s.manifest);
      sync_dir(s.partial);
      fs::remove_all(s.final_dir, ec);
      fs::rename(s.partial, s.final_dir);
      sync_dir(ctx_.config.snapshot.path);
      last_step_.store(s.step);
      log_info("snapshot of step " + std::to_string(s.step) + " written: " + s.final_dir);
      prune();
      return;
    } catch (const std::exception& e) {
      s.why = e.what();
    }
  }
  fs::remove_all(s.partial, ec);
  log_message(ZD_LOG_ERROR, "the snapshot of step " + std::to_string(s.step) + " failed and was removed (" + s.why +
                                "); training goes on, and the older snapshots under " + ctx_.config.snapshot.path +
                                " are kept");
}

void Snapshots::prune() {
  auto all = whole_snapshots(ctx_.config.snapshot.path);
  const auto keep = static_cast<size_t>(ctx_.config.snapshot.keep);
  std::error_code ec;
  for (size_t i = 0; i + keep < all.size(); ++i) fs::remove_all(all[i].second, ec);
}

void Snapshots::at_end(int64_t step, const std::vector<RankView>& ranks, const LossScaler& scaler) {
  if (!enabled()) return;
  for (int r = first_local_; r < first_local_ + local_ranks_; ++r) fence(r);
  if (last_step_.load() == step || step == 0) return;
  std::shared_ptr<InFlight> s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    begin(step, describe_model(ctx_, step, scaler));
    s = current_;
  }
  for (const RankView& v : ranks) write_shard(s, v.res->rank, *v.res, *v.buffers);
}

}  // namespace zerod
