// Model: checkpoints the trainer asks for (save/load, any world size and
// stage on load) and the snapshots the engine takes by itself.
#include "model/model_rank.h"

#include "checkpoint_io.h"
#include "error.h"
#include "log.h"
#include "manifest.h"
#include "shard_file.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>

namespace zerod {

namespace fs = std::filesystem;

namespace {

void require_between_steps(const char* call, int active_modules, int64_t micro_step, int64_t gas) {
  if (active_modules > 0 || micro_step % gas != 0)
    fail(ZD_ERR_INVALID_STATE, std::string(call) + " inside an accumulation window; call it between steps");
}

// The collectives of zd_model_save and zd_model_load: CommOp::Read in a
// group of their own (the snapshots' are 251-254, snapshots_internal.h).
constexpr uint64_t kSaveLoad = 250;

// The ranks' verdict on a part of a save or load that any one rank may
// fail alone (its shard, its reads): the lowest failing rank, or -1. The
// others learn it here instead of waiting for that rank at the next
// collective until the comm timeout.
int first_failed_rank(const ModelContext& ctx, RankResources& res, int rank, uint64_t id, bool failed,
                      const std::string& what) {
  // world - rank from a failing rank: the max names the lowest (as a
  // snapshot's resume verdict does).
  const double v = all_reduce_max(ctx, res, rank, kSaveLoad, id, what, failed ? ctx.world_size - rank : 0);
  return v > 0 ? ctx.world_size - static_cast<int>(v) : -1;
}

// Runs `fn`, keeping its error for after the verdict.
template <typename Fn>
bool attempt(Fn&& fn, zd_status* code, std::string* why) {
  try {
    fn();
    return true;
  } catch (const Error& e) {
    *code = e.code();
    *why = e.what();
  } catch (const std::exception& e) {
    *code = ZD_ERR_IO;
    *why = e.what();
  }
  return false;
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
  // A whole checkpoint already there stays whole until the new one is: the
  // new shards go to the other shard set's names, and the manifest, renamed
  // over the old one last, is the commit. A save that fails or is killed
  // halfway leaves the old checkpoint loadable (a reused directory is how
  // Lightning's last.ckpt and Accelerate's save_state keep theirs). Every
  // rank reads the old manifest before any rank can replace it (the
  // agreement below comes first); the ranks take the highest set proposed,
  // so one that could not read it does not write over the old shards.
  const int shard_set = all_reduce_max(ctx_, rs.res, rank, kSaveLoad, 1,
                                       "zd_model_save: the shard set every rank writes",
                                       ckpt::shard_set_to_write(dir)) > 0 ? 1 : 0;
  const std::string kept = " (the checkpoint already in " + dir + ", if any, is kept)";
  zd_status code = ZD_OK;
  std::string why;
  const bool wrote = attempt(
      [&] {
        ckpt::ShardWriter out(dir + "/" + ckpt::shard_name(rank, world_size_, shard_set), rank, world_size_);
        write_rank_shard(ctx_, rs.res, rs.buffers, rs.compression, out);
        out.finish();
      },
      &code, &why);
  const int failed = first_failed_rank(ctx_, rs.res, rank, 2, !wrote, "zd_model_save: every rank wrote its shard");
  if (!wrote) fail(code, why + kept);
  if (failed >= 0)
    fail(ZD_ERR_IO, "zd_model_save: rank " + std::to_string(failed) + " could not write its shard to " + dir +
                        " (its error says why)" + kept);
  const bool committed = rank != 0 || attempt(
      [&] {
        // Every shard whole before the manifest says so (with several
        // nodes the directory must be one every node writes to).
        for (int r = 0; r < world_size_; ++r) {
          const std::string path = dir + "/" + ckpt::shard_name(r, world_size_, shard_set);
          if (::access(path.c_str(), R_OK) != 0)
            fail(ZD_ERR_IO, "zd_model_save: the shard of rank " + std::to_string(r) + " is not in " + dir +
                                " (with several nodes the directory must be on a file system every node sees)");
          ckpt::ShardReader check(path);
        }
        ckpt::Manifest m = describe_model(ctx_, rs.applied, rs.scaler, rs.trainer_lr, rs.buffers, rs.compression);
        m.shard_set = shard_set;
        ckpt::write_manifest(dir, m);
        // The rename durable before the call returns; then the old
        // checkpoint's shards (and those of a save that failed) go.
        ckpt::sync_dir(dir);
        ckpt::remove_other_shards(dir, m);
      },
      &code, &why);
  if (first_failed_rank(ctx_, rs.res, rank, 3, !committed, "zd_model_save: the checkpoint is whole") >= 0) {
    if (!committed) fail(code, why + kept);
    fail(ZD_ERR_IO, "zd_model_save: rank 0 could not commit the checkpoint in " + dir + " (its error says why)" +
                        kept);
  }
}

void Model::restore_rank(RankState& rs, const ckpt::Source& src, bool verified) {
  const ckpt::Manifest& m = src.manifest();
  // Training starts over from the checkpoint: gradients of a backward no
  // zd_step applied go (the next update would apply them to the loaded
  // parameters), and the next update's plan is asked again.
  discard_gradients(rs, "zd_model_load");
  // Modules a forward gathered ahead (zd_model_load after a forward_end)
  // would keep their copies of the old parameters.
  if (ctx_.params_partitioned()) rs.residency.forget_gathered();
  {
    const ShardWrite phase(ctx_, *rs.res.stream, rs.res.rank, "a checkpoint load");
    try {
      read_rank_state(ctx_, rs.res, rs.buffers, src, verified);
      // The copies compression.replay kept (the stage-3 parameters the
      // refresh below would read among them) are stale now, and the error
      // feedback restarts from the checkpoint's (zero where it holds none
      // for this job: rank_carry, whose warning one rank gives).
      rs.compression.reset();
      read_rank_errors(ctx_, rs.res, rs.compression, src);
    } catch (...) {
      // The phase ends when this scope does, failed or not, and the other
      // ranks' gathers then copy this rank's shards, part the checkpoint's
      // and part the old state: the job breaks first, which fails those
      // gathers and every wait and collective, rather than letting any rank
      // train on the mix.
      //
      // A resume at finalize: undo_finalize gives up the rank's state (and
      // breaks a job of several ranks, which happens here first).
      if (!rs.finalized) {
        if (world_size_ > 1) break_for_failed_resume(rs.res.rank);
        throw;
      }
      const Error cause = error_being_handled(ZD_ERR_IO);
      // A load: the rank's state is a mix for good, on one rank too; no
      // restart may resume it either (part-way: Model::recover refuses).
      break_job(Error(cause.code(), "rank " + std::to_string(rs.res.rank) +
                                        "'s zd_model_load failed part-way through reading its part of " + src.dir() +
                                        ", which the other ranks may have finished: its parameters and optimizer "
                                        "state are part the checkpoint's, part what they were: " + cause.what()),
                /*part_way=*/true);
    }
  }
  if (rs.res.rank == first_local_)
    if (const std::string why = rank_carry(ctx_, m, src.dir()).warning; !why.empty()) log_warn(why);
  gather_working_copies(rs);
  if (ctx_.params_partitioned()) rs.residency.refresh_persistent();
  rs.applied = m.step;
  rs.micro_step = m.step * config_.gradient_accumulation_steps;
  // The trace's steps and the step-time histogram go on from here: the next
  // step is m.step + 1, as zd_step_result numbers it.
  rs.res.probe.restart(m.step);
  // Where the run stood includes the lr the trainer had set (none: the
  // job's schedule applies), so a resume goes on at it until the trainer
  // sets another.
  rs.trainer_lr = m.lr;
  // The job's own loss-scale setting wins over another setting's state in
  // the checkpoint (LossScaler::restore); said once where they differ.
  if (!rs.scaler.restore(m.loss_scale, m.scaler_iteration, m.scaler_last_overflow, m.scaler_hysteresis_left) &&
      m.loss_scale != rs.scaler.scale() && rs.res.rank == first_local_) {
    const auto number = [](double v) {
      char b[32];
      std::snprintf(b, sizeof b, "%g", v);
      return std::string(b);
    };
    log_info("the loss scale " + number(m.loss_scale) + " of " + src.dir() + " is not taken: this job's is " +
             number(rs.scaler.scale()) + " (" +
             (rs.scaler.dynamic() ? "dynamic, from its start: the checkpoint's scaler made no dynamic update"
              : config_.loss_scale.enabled ? "fp16 with a static fp16.loss_scale"
                                           : "no loss scaling: the precision is not fp16") +
             ")");
  }
}

void Model::load_checkpoint(int rank, const std::string& dir) {
  Call call(*this, rank, "load_checkpoint");
  require_finalized("zd_model_load");
  RankState& rs = rank_state(rank);
  require_between_steps("zd_model_load", rs.active_modules, rs.micro_step, config_.gradient_accumulation_steps);
  // Every rank checks all it will read, then the ranks agree before any
  // changes its state: a checkpoint one rank cannot read (a damaged or
  // missing shard only it reads) changes no rank, and no rank is left
  // waiting in the gather below for one that gave up.
  std::unique_ptr<const ckpt::Source> src;
  zd_status code = ZD_OK;
  std::string why;
  const bool readable = attempt(
      [&] {
        src = std::make_unique<const ckpt::Source>(dir);
        check_checkpoint_fits(ctx_, src->manifest(), dir);
        verify_rank_state(ctx_, rs.res, rs.buffers, *src);
      },
      &code, &why);
  const int failed = first_failed_rank(ctx_, rs.res, rank, 4, !readable, "zd_model_load: can every rank read " + dir);
  if (!readable) fail(code, why + (world_size_ > 1 ? " (no rank loaded anything)" : ""));
  if (failed >= 0)
    fail(ZD_ERR_IO, "zd_model_load: rank " + std::to_string(failed) + " cannot read " + dir +
                        " (its error, and its log, say why); no rank loaded anything");
  snapshots_->fence(rank);
  restore_rank(rs, *src, /*verified=*/true);
  // A rank whose load failed part-way broke the job (restore_rank); the
  // others may have nothing collective left in theirs (stage 3 on a shard
  // board), so they meet here, and fail with its reason, instead of
  // returning as if the load had succeeded.
  all_reduce_max(ctx_, rs.res, rank, kSaveLoad, 5, "zd_model_load: every rank loaded its part of " + dir, 0);
}

std::string Model::final_snapshot(int rank) {
  if (!snapshots_ || !snapshots_->enabled() || !snapshots_->across_nodes() || !is_local(rank)) return "";
  RankState& rs = rank_state(rank);
  // A job that never ran, or failed (then the others' collectives below fail
  // too, at once, as this daemon's comm goes): no final snapshot, as on one node.
  if (!rs.finalized || is_broken_.load()) return snapshots_->final_failure();
  bool clean = rs.active_modules == 0 && rs.micro_step % config_.gradient_accumulation_steps == 0;
  try {
    rs.update.finish();  // the masters the shard reads
  } catch (const std::exception& e) {
    // The other ranks learn only that this one does not leave cleanly.
    snapshots_->lose_end(rs.applied, "rank " + std::to_string(rank) + ": no final snapshot was taken: the last "
                                     "optimizer update failed (" + std::string(e.what()) + ")");
    clean = false;
  }
  try {
    snapshots_->at_leave(rank, rs.applied, clean, rs.res, rs.buffers, rs.compression, rs.scaler, rs.trainer_lr);
  } catch (const std::exception& e) {
    snapshots_->lose_end(rs.applied, "rank " + std::to_string(rank) + ": the final snapshot, of step " +
                                         std::to_string(rs.applied) + ", failed: " + e.what());
  }
  return snapshots_->final_failure();
}

std::string Model::final_snapshot() {
  if (!snapshots_) return "";
  // Across nodes the end's snapshot was taken as the ranks left
  // (final_snapshot(rank)): only its verdict is left to tell.
  if (!snapshots_->enabled() || snapshots_->across_nodes() || !finalized_.load() || is_broken_.load())
    return snapshots_->final_failure();
  std::vector<Snapshots::RankView> views;
  for (auto& rs : ranks_) {
    if (!rs->finalized || rs->active_modules > 0) return "";  // not a clean end: no final snapshot is due
    try {
      rs->update.finish();
    } catch (const std::exception& e) {
      snapshots_->lose_end(rs->applied, std::string("no final snapshot was taken: the last optimizer update failed (") +
                                            e.what() + ")");
      return snapshots_->final_failure();
    }
    views.push_back({&rs->res, &rs->buffers, &rs->compression});
  }
  const RankState& first = *ranks_.front();
  try {
    snapshots_->at_end(first.applied, views, first.scaler, first.trainer_lr);
  } catch (const std::exception& e) {
    snapshots_->lose_end(first.applied, "the final snapshot, of step " + std::to_string(first.applied) +
                                            ", failed: " + e.what());
  }
  return snapshots_->final_failure();
}

}  // namespace zerod
