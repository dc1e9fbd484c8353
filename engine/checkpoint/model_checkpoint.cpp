// Model: checkpoints the trainer asks for (save/load, any world size and
// stage on load) and the snapshots the engine takes by itself.
#include "model/model_rank.h"

#include "checkpoint_io.h"
#include "error.h"
#include "log.h"
#include "manifest.h"
#include "shard_file.h"

#include <unistd.h>

#include <filesystem>

namespace zerod {

namespace fs = std::filesystem;

namespace {

void require_between_steps(const char* call, int active_modules, int64_t micro_step, int64_t gas) {
  if (active_modules > 0 || micro_step % gas != 0)
    fail(ZD_ERR_INVALID_STATE, std::string(call) + " inside an accumulation window; call it between steps");
}

}  // namespace

void Model::save_checkpoint(int rank, const std::string& dir) {
  Call call(*this, rank, "save_checkpoint");
  require_finalized("zd_model_save");
  RankState& rs = rank_state(rank);
  require_between_steps("zd_model_save", rs.active_modules, rs.micro_step, config_.gradient_accumulation_steps);
  if (dir.empty()) fail(ZD_ERR_INVALID_ARGUMENT, "zd_model_save: the directory is empty");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(ZD_ERR_IO, "zd_model_save: " + dir + " cannot be created: " + ec.message());
  // An old manifest goes first: until the new one is written, the directory
  // holds no whole checkpoint.
  if (rank == 0) fs::remove(dir + "/" + ckpt::kManifestName, ec);
  const std::string cleared = "zd_model_save: every rank is ready to write";
  ctx_.run(*rs.res.stream, [&] { plugins_.comm->barrier(ctx_.comm_call(rank, comm_tag(CommOp::Read, 250, 1), cleared)); });
  {
    ckpt::ShardWriter out(dir + "/" + ckpt::shard_name(rank, world_size_), rank, world_size_);
    write_rank_shard(ctx_, rs.res, rs.buffers, out);
    out.finish();
  }
  const std::string written = "zd_model_save: every rank wrote its shard";
  ctx_.run(*rs.res.stream, [&] { plugins_.comm->barrier(ctx_.comm_call(rank, comm_tag(CommOp::Read, 250, 2), written)); });
  if (rank == 0) {
    // Every shard whole before the manifest says so (with several nodes the
    // directory must be one every node writes to).
    for (int r = 0; r < world_size_; ++r) {
      const std::string path = dir + "/" + ckpt::shard_name(r, world_size_);
      if (::access(path.c_str(), R_OK) != 0)
        fail(ZD_ERR_IO, "zd_model_save: the shard of rank " + std::to_string(r) + " is not in " + dir +
                            " (with several nodes the directory must be on a file system every node sees)");
      ckpt::ShardReader check(path);
    }
    ckpt::write_manifest(dir, describe_model(ctx_, rs.applied, rs.scaler));
  }
  const std::string whole = "zd_model_save: the checkpoint is whole";
  ctx_.run(*rs.res.stream, [&] { plugins_.comm->barrier(ctx_.comm_call(rank, comm_tag(CommOp::Read, 250, 3), whole)); });
}

void Model::restore_rank(RankState& rs, const ckpt::Source& src, bool verified) {
  const ckpt::Manifest& m = src.manifest();
  {
    const ShardWrite phase(ctx_, *rs.res.stream, rs.res.rank, "a checkpoint load");
    read_rank_state(ctx_, rs.res, rs.buffers, src, verified);
  }
  // First: the copies compression.replay kept (the stage-3 parameters
  // the refresh below would read among them) are stale now.
  rs.compression.reset();
  gather_working_copies(rs);
  if (ctx_.params_partitioned()) rs.residency.refresh_persistent();
  rs.applied = m.step;
  rs.micro_step = m.step * config_.gradient_accumulation_steps;
  rs.scaler.restore(m.loss_scale, m.scaler_iteration, m.scaler_last_overflow, m.scaler_hysteresis_left);
}

void Model::load_checkpoint(int rank, const std::string& dir) {
  Call call(*this, rank, "load_checkpoint");
  require_finalized("zd_model_load");
  RankState& rs = rank_state(rank);
  require_between_steps("zd_model_load", rs.active_modules, rs.micro_step, config_.gradient_accumulation_steps);
  const ckpt::Source src(dir);
  check_checkpoint_fits(ctx_, src.manifest(), dir);
  snapshots_->fence(rank);
  restore_rank(rs, src);
}

void Model::final_snapshot(int rank) {
  if (!snapshots_ || !snapshots_->enabled() || !snapshots_->across_nodes() || !is_local(rank)) return;
  RankState& rs = rank_state(rank);
  // A job that never ran, or failed (then the others' collectives below fail
  // too, at once, as this daemon's comm goes): no final snapshot, as on one node.
  if (!rs.finalized || is_broken_.load()) return;
  bool clean = rs.active_modules == 0 && rs.micro_step % config_.gradient_accumulation_steps == 0;
  try {
    rs.update.finish();  // the masters the shard reads
  } catch (const std::exception& e) {
    log_message(ZD_LOG_ERROR, std::string("no final snapshot: the last update failed: ") + e.what());
    clean = false;
  }
  try {
    snapshots_->at_leave(rank, rs.applied, clean, rs.res, rs.buffers, rs.scaler);
  } catch (const std::exception& e) {
    log_warn("rank " + std::to_string(rank) + ": no final snapshot: " + e.what());
  }
}

void Model::final_snapshot() {
  if (!snapshots_ || !snapshots_->enabled() || !finalized_.load() || is_broken_.load()) return;
  std::vector<Snapshots::RankView> views;
  for (auto& rs : ranks_) {
    if (!rs->finalized || rs->active_modules > 0) return;  // not a clean end
    try {
      rs->update.finish();
    } catch (const std::exception& e) {
      log_message(ZD_LOG_ERROR, std::string("no final snapshot: the last update failed: ") + e.what());
      return;
    }
    views.push_back({&rs->res, &rs->buffers});
  }
  const RankState& first = *ranks_.front();
  try {
    snapshots_->at_end(first.applied, views, first.scaler);
  } catch (const std::exception& e) {
    log_message(ZD_LOG_ERROR, std::string("the final snapshot failed: ") + e.what());
  }
}

}  // namespace zerod
