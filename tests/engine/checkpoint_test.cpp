// Checkpoints across ranks: at every ZeRO stage (and with the optimizer
// state on NVMe) each rank reads the whole parameters and optimizer state
// (collectives where they are partitioned), a fresh model of the same job
// loads them, and the next steps end bit-identical with the uninterrupted run.
#include "zero_fixture.h"

#include "checkpoint/manifest.h"
#include "checkpoint/source.h"
#include "checkpoint/tools.h"
#include "checkpoint/torch_state.h"

#include "../harness/comma_locale.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <thread>
#include <utility>

namespace {

using namespace zerod_test;
namespace fs = std::filesystem;

const std::vector<int64_t> kSizes = {300, 1000, 7};

struct Saved {
  std::vector<std::vector<float>> params;
  std::vector<std::vector<std::vector<float>>> slots;  // [param][slot]
  int64_t step = 0;
};

void register_all(Model& model, int rank, std::vector<zd_param_id>* ids) {
  for (size_t i = 0; i < kSizes.size(); ++i) {
    std::vector<float> init(static_cast<size_t>(kSizes[i]));
    for (size_t j = 0; j < init.size(); ++j) init[j] = std::sin(static_cast<float>(j + 5 * i));
    ids->push_back(model.register_param(rank, "w" + std::to_string(i), "m" + std::to_string(i), ZD_DTYPE_F32,
                                        {kSizes[i]}, init.data(), ZD_DTYPE_F32));
  }
  model.finalize(rank);
}

void train(Model& model, int rank, const std::vector<zd_param_id>& ids, int from, int to) {
  for (int s = from; s < to; ++s) {
    for (size_t m = ids.size(); m-- > 0;) {
      const auto mid = static_cast<zd_module_id>(m);
      model.backward_begin(rank, mid);
      const ViewInfo w = model.param_view(rank, ids[m]);
      const ViewInfo g = model.grad_view(rank, ids[m]);
      const auto* wd = static_cast<const float*>(w.data);
      auto* gd = static_cast<float*>(g.data);
      for (size_t j = 0; j < g.bytes / 4; ++j) gd[j] = wd[j] - std::cos(static_cast<float>(j + 3 * s + rank));
      model.backward_end(rank, mid);
    }
    model.step(rank);
  }
}

// Both ranks register the model and train steps [from, to).
void train_both(Model& model, int from, int to) {
  run_ranks(2, [&](int rank) {
    std::vector<zd_param_id> ids;
    register_all(model, rank, &ids);
    train(model, rank, ids, from, to);
  });
}

// Both ranks register the model, train steps [0, steps) and save it in dir.
void train_and_save(Model& model, int steps, const std::string& dir) {
  run_ranks(2, [&](int rank) {
    std::vector<zd_param_id> ids;
    register_all(model, rank, &ids);
    train(model, rank, ids, 0, steps);
    model.save_checkpoint(rank, dir);
  });
}

Saved save(Model& model, int rank, const std::vector<zd_param_id>& ids) {
  Saved c;
  c.step = model.applied_steps(rank);
  const int slots = static_cast<int>(model.optimizer().state_slots());
  for (size_t i = 0; i < ids.size(); ++i) {
    std::vector<float> v(static_cast<size_t>(kSizes[i]));
    model.read_param(rank, ids[i], ZD_DTYPE_F32, v.data(), v.size() * 4);
    c.params.push_back(v);
    c.slots.emplace_back();
    for (int s = 0; s < slots; ++s) {
      model.read_state(rank, ids[i], s, ZD_DTYPE_F32, v.data(), v.size() * 4);
      c.slots.back().push_back(v);
    }
  }
  return c;
}

void load(Model& model, int rank, const std::vector<zd_param_id>& ids, const Saved& c) {
  for (size_t i = 0; i < ids.size(); ++i) {
    model.write_param(rank, ids[i], ZD_DTYPE_F32, c.params[i].data(), c.params[i].size() * 4);
    for (size_t s = 0; s < c.slots[i].size(); ++s)
      model.write_state(rank, ids[i], static_cast<int>(s), ZD_DTYPE_F32, c.slots[i][s].data(),
                        c.slots[i][s].size() * 4);
  }
  model.set_applied_steps(rank, c.step);
}

struct Case {
  int stage;
  bool nvme;
};

void PrintTo(const Case& c, std::ostream* os) { *os << "stage " << c.stage << (c.nvme ? ", state on nvme" : ""); }

class Checkpoint : public ::testing::TestWithParam<Case> {};

TEST_P(Checkpoint, AResumedRunEndsBitIdentical) {
  const Case k = GetParam();
  const int world = 2;
  JobOptions o;
  o.stage = k.stage;
  o.optimizer_hparams = {{"lr", 1e-2}, {"weight_decay", 0.01}};
  if (k.stage == 3) o.zero_hparams = {{"param_persistence_threshold", 0}};
  std::string dir;
  if (k.nvme) {
    char t[] = "/var/tmp/zerod-ckpt-XXXXXX";
    ASSERT_NE(mkdtemp(t), nullptr);
    dir = t;
    o.offload.optimizer = ZD_TIER_NVME;
    o.offload.nvme_paths = {dir};
    o.offload.nvme_tile_elems = 2048;
  }
  auto a = make_model(o, world);
  auto b = make_model(o, world);
  std::vector<Saved> saved(world);
  std::vector<std::vector<std::vector<float>>> want(world), got(world);
  run_ranks(world, [&](int rank) {
    std::vector<zd_param_id> ids;
    register_all(*a, rank, &ids);
    train(*a, rank, ids, 0, 3);
    saved[static_cast<size_t>(rank)] = save(*a, rank, ids);
    train(*a, rank, ids, 3, 6);
    want[static_cast<size_t>(rank)] = save(*a, rank, ids).params;

    std::vector<zd_param_id> ids_b;
    register_all(*b, rank, &ids_b);
    load(*b, rank, ids_b, saved[static_cast<size_t>(rank)]);
    train(*b, rank, ids_b, 3, 6);
    got[static_cast<size_t>(rank)] = save(*b, rank, ids_b).params;
  });
  EXPECT_EQ(saved[0].step, 3);
  EXPECT_EQ(saved[0].params, saved[1].params) << "every rank reads the whole value";
  EXPECT_EQ(saved[0].slots, saved[1].slots);
  EXPECT_NE(saved[0].slots[1][0][17], 0.0f) << "the state moved";
  for (int r = 0; r < world; ++r) EXPECT_EQ(got[static_cast<size_t>(r)], want[static_cast<size_t>(r)]) << "rank " << r;
  if (!dir.empty()) fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Stages, Checkpoint,
                         ::testing::Values(Case{0, false}, Case{1, false}, Case{2, false}, Case{3, false},
                                           Case{1, true}, Case{3, true}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return "stage" + std::to_string(i.param.stage) + (i.param.nvme ? "_nvme" : "");
                         });

}  // namespace

// Checkpoint files (zd_model_save / zd_model_load): the format loads at any
// world size and stage, bit-identical; damage is named and loses nothing;
// snapshots the engine takes by itself resume where they were.
namespace {

using namespace zerod_test;
namespace fs = std::filesystem;

struct TempDir {
  TempDir() {
    char t[] = "/var/tmp/zerod-ckptfiles-XXXXXX";
    path = mkdtemp(t);
  }
  ~TempDir() {
    if (mounted) umount2(path.c_str(), MNT_DETACH);
    fs::remove_all(path);
  }
  std::string path;
  bool mounted = false;
};

JobOptions job(int stage) {
  JobOptions o;
  o.stage = stage;
  o.optimizer_hparams = {{"lr", 1e-2}, {"weight_decay", 0.01}};
  if (stage == 3) o.zero_hparams = {{"param_persistence_threshold", 0}};
  return o;
}

// The whole values every rank reads, from rank 0.
Saved whole(Model& m, int world) {
  std::vector<Saved> s(static_cast<size_t>(world));
  run_ranks(world, [&](int rank) {
    std::vector<zd_param_id> ids = {0, 1, 2};
    s[static_cast<size_t>(rank)] = save(m, rank, ids);
  });
  return s[0];
}

// What a snapshot path holds, sorted, but its lock files (dot files).
std::vector<std::string> entries(const std::string& path) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(path))
    if (e.path().filename().string()[0] != '.') out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

class CheckpointFiles : public ::testing::TestWithParam<int> {};

TEST_P(CheckpointFiles, LoadAtAnyWorldSizeAndStageBitIdentical) {
  const int stage = GetParam();
  TempDir dir;
  auto a = make_model(job(stage), 2);
  train_and_save(*a, 3, dir.path);
  const Saved want = whole(*a, 2);
  EXPECT_TRUE(fs::exists(dir.path + "/zerod-checkpoint.txt"));
  for (int world : {1, 3})
    for (int to : {0, 1, 2, 3}) {
      auto b = make_model(job(to), world);
      run_ranks(world, [&](int rank) {
        std::vector<zd_param_id> ids;
        register_all(*b, rank, &ids);
        b->load_checkpoint(rank, dir.path);
      });
      const Saved got = whole(*b, world);
      EXPECT_EQ(got.step, 3) << "stage " << stage << " x2 -> stage " << to << " x" << world;
      EXPECT_EQ(got.params, want.params) << "stage " << stage << " x2 -> stage " << to << " x" << world;
      EXPECT_EQ(got.slots, want.slots) << "stage " << stage << " x2 -> stage " << to << " x" << world;
    }
}

TEST_P(CheckpointFiles, AResumedRunEndsBitIdentical) {
  const int stage = GetParam();
  TempDir dir, nvme;
  JobOptions o = job(stage);
  o.offload.optimizer = ZD_TIER_NVME;  // streamed to and from disk, never all in RAM
  o.offload.nvme_paths = {nvme.path};
  o.offload.nvme_tile_elems = 2048;
  auto a = make_model(o, 2);
  auto b = make_model(o, 2);
  run_ranks(2, [&](int rank) {
    std::vector<zd_param_id> ids;
    register_all(*a, rank, &ids);
    train(*a, rank, ids, 0, 3);
    a->save_checkpoint(rank, dir.path);
    train(*a, rank, ids, 3, 6);
    std::vector<zd_param_id> ids_b;
    register_all(*b, rank, &ids_b);
    b->load_checkpoint(rank, dir.path);
    train(*b, rank, ids_b, 3, 6);
  });
  EXPECT_EQ(whole(*b, 2).params, whole(*a, 2).params);
  EXPECT_EQ(whole(*b, 2).slots, whole(*a, 2).slots);
}

// A micro-batch the trainer throws away (its loss diverged, say): a
// backward, then a load instead of a step. The load starts over from the
// checkpoint: the gradients of that backward go, and the run ends as the
// one that never took it. So does zd_model_set_step (the end of a restore
// through the whole-tensor calls). They were kept, and the next update
// applied them to the loaded parameters. Stage 2-3 buckets of one module:
// some of the gradients are in flight when the load comes, some pending.
void throw_away_backward(Model& model, int rank, const std::vector<zd_param_id>& ids) {
  for (size_t m = ids.size(); m-- > 0;) {
    const auto mid = static_cast<zd_module_id>(m);
    model.backward_begin(rank, mid);
    const ViewInfo g = model.grad_view(rank, ids[m]);
    auto* gd = static_cast<float*>(g.data);
    for (size_t j = 0; j < g.bytes / 4; ++j) gd[j] = 100.0f;
    model.backward_end(rank, mid);
  }
}

TEST_P(CheckpointFiles, ALoadOrASetStepDropsTheGradientsOfABackwardNoStepApplied) {
  const int stage = GetParam();
  TempDir dir;
  JobOptions o = job(stage);
  if (stage >= 2) o.zero_hparams.push_back({"reduce_bucket_size", 300});
  auto straight = make_model(o, 2);
  auto loaded = make_model(o, 2);
  auto restored = make_model(o, 2);
  run_ranks(2, [&](int rank) {
    std::vector<zd_param_id> ids;
    register_all(*straight, rank, &ids);
    train(*straight, rank, ids, 0, 6);

    std::vector<zd_param_id> ids_l;
    register_all(*loaded, rank, &ids_l);
    train(*loaded, rank, ids_l, 0, 3);
    loaded->save_checkpoint(rank, dir.path);
    throw_away_backward(*loaded, rank, ids_l);
    loaded->load_checkpoint(rank, dir.path);
    train(*loaded, rank, ids_l, 3, 6);

    std::vector<zd_param_id> ids_r;
    register_all(*restored, rank, &ids_r);
    train(*restored, rank, ids_r, 0, 3);
    const Saved at3 = save(*restored, rank, ids_r);
    throw_away_backward(*restored, rank, ids_r);
    load(*restored, rank, ids_r, at3);  // zd_param_write, zd_optimizer_state_write, zd_model_set_step
    train(*restored, rank, ids_r, 3, 6);
  });
  const Saved want = whole(*straight, 2);
  EXPECT_EQ(whole(*loaded, 2).params, want.params);
  EXPECT_EQ(whole(*loaded, 2).slots, want.slots);
  EXPECT_EQ(whole(*restored, 2).step, 6);
  EXPECT_EQ(whole(*restored, 2).slots, want.slots);
  EXPECT_EQ(whole(*restored, 2).params, want.params);
}

// The process's limit on open files lowered while it lives, and put back.
class OpenFileLimit {
 public:
  explicit OpenFileLimit(rlim_t soft) {
    EXPECT_EQ(getrlimit(RLIMIT_NOFILE, &before_), 0);
    rlimit lowered = before_;
    lowered.rlim_cur = std::min(soft, before_.rlim_max);
    EXPECT_EQ(setrlimit(RLIMIT_NOFILE, &lowered), 0) << std::strerror(errno);
  }
  ~OpenFileLimit() { setrlimit(RLIMIT_NOFILE, &before_); }
  OpenFileLimit(const OpenFileLimit&) = delete;
  OpenFileLimit& operator=(const OpenFileLimit&) = delete;

 private:
  rlimit before_{};
};

size_t open_files() {
  return static_cast<size_t>(std::distance(fs::directory_iterator("/proc/self/fd"), fs::directory_iterator()));
}

// A checkpoint of more shards than the process may open (zerod ckpt
// reshard to a thousand ranks, a job of hundreds of ranks, each rank of a
// daemon reading all of them) is checked, read, exported and loaded: a
// reader keeps no shard open but the few it read last.
TEST_P(CheckpointFiles, ACheckpointOfMoreShardsThanOpenFilesLoads) {
  const int stage = GetParam();
  constexpr int kShards = 300;
  constexpr rlim_t kLimit = 128;
  TempDir dir, many, exported;
  auto a = make_model(job(stage), 2);
  train_and_save(*a, 3, dir.path);
  const Saved want = whole(*a, 2);

  auto b = make_model(job(stage), 2);
  run_ranks(2, [&](int rank) {
    std::vector<zd_param_id> ids;
    register_all(*b, rank, &ids);
  });
  ASSERT_LT(open_files() + 32, kLimit) << "the test's own files leave no room to lower the limit";
  const OpenFileLimit limit(kLimit);
  ckpt::reshard(ckpt::Source(dir.path), many.path, kShards, 4);
  {
    const ckpt::Source src(many.path);
    ASSERT_EQ(src.manifest().world_size, kShards);
    EXPECT_GT(ckpt::verify_all(src, 4), 0u);
    for (uint32_t p = 0; p < kSizes.size(); ++p) {
      std::vector<float> master(static_cast<size_t>(kSizes[p]));
      src.read(p, ckpt::kMasterBuffer, 0, master.size(), master.data());
      EXPECT_EQ(master, want.params[p]) << "parameter " << p;
    }
    ckpt::ExportOptions o;
    o.out = exported.path + "/model.safetensors";
    o.threads = 4;
    EXPECT_EQ(ckpt::export_safetensors(src, o).written.size(), 1u);
  }
  run_ranks(2, [&](int rank) { b->load_checkpoint(rank, many.path); });
  const Saved got = whole(*b, 2);
  EXPECT_EQ(got.step, 3);
  EXPECT_EQ(got.params, want.params);
  EXPECT_EQ(got.slots, want.slots);
}

INSTANTIATE_TEST_SUITE_P(Stages, CheckpointFiles, ::testing::Values(0, 1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& i) { return "stage" + std::to_string(i.param); });

// Loading a damaged or foreign checkpoint fails naming it, and the model
// keeps what it had.
TEST(CheckpointDamage, IsNamedAndLosesNothing) {
  TempDir dir;
  auto a = make_model(job(1), 2);
  train_and_save(*a, 2, dir.path);
  auto fresh = [&](JobOptions o) {
    auto m = make_model(o, 1);
    std::vector<zd_param_id> ids;
    register_all(*m, 0, &ids);
    return m;
  };
  auto expect_failure = [&](Model& m, zd_status code, const std::string& text, const std::string& d) {
    const Saved before = whole(m, 1);
    try {
      m.load_checkpoint(0, d);
      ADD_FAILURE() << "loaded: " << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
    const Saved after = whole(m, 1);
    EXPECT_EQ(after.params, before.params) << "nothing changed: " << text;
    EXPECT_EQ(after.slots, before.slots) << "nothing changed: " << text;
  };
  {
    auto m = fresh(job(3));
    m->load_checkpoint(0, dir.path);  // whole: loads (at another stage and world)
  }
  // A flipped byte in a record.
  const std::string shard = dir.path + "/rank-00001-of-00002.zdshard";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x7f');
  }
  {
    auto m = fresh(job(0));
    expect_failure(*m, ZD_ERR_IO, "fails its checksum", dir.path);
  }
  // A shard cut short.
  fs::resize_file(shard, 100);
  {
    auto m = fresh(job(0));
    expect_failure(*m, ZD_ERR_IO, "rank-00001-of-00002.zdshard", dir.path);
  }
  // No manifest: no whole checkpoint.
  fs::remove(dir.path + "/zerod-checkpoint.txt");
  {
    auto m = fresh(job(0));
    expect_failure(*m, ZD_ERR_IO, "no checkpoint at", dir.path);
  }
  // Another model's, another optimizer's.
  TempDir other;
  auto c = make_model(job(0), 1);
  std::vector<zd_param_id> ids;
  register_all(*c, 0, &ids);
  c->save_checkpoint(0, other.path);
  {
    JobOptions o = job(0);
    o.optimizer = "sgd";
    o.optimizer_hparams = {{"lr", 0.1}};
    auto m = fresh(o);
    expect_failure(*m, ZD_ERR_CONFIG, "written by optimizer 'adamw', this job runs 'sgd'", other.path);
  }
  {
    auto m = make_model(job(0), 1);
    m->register_param(0, "w0", "m0", ZD_DTYPE_F32, {300}, nullptr, 0);
    m->register_param(0, "w1", "m1", ZD_DTYPE_F32, {999}, nullptr, 0);
    m->register_param(0, "w2", "m2", ZD_DTYPE_F32, {7}, nullptr, 0);
    m->finalize(0);
    try {
      m->load_checkpoint(0, other.path);
      ADD_FAILURE() << "loaded another model's checkpoint";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ZD_ERR_SHAPE_MISMATCH) << e.what();
      EXPECT_NE(std::string(e.what()).find("parameter 'w1' has another shape"), std::string::npos) << e.what();
    }
  }
}

// A shard removed, or another file put at its name, after a Source read its
// index (it keeps the shards closed between reads) fails the read, naming
// the shard, as a damaged one does: its index no longer describes the file.
TEST(CheckpointDamage, AShardRemovedOrReplacedAfterItsIndexWasReadIsNamed) {
  TempDir dir;
  auto a = make_model(job(1), 2);
  train_and_save(*a, 2, dir.path);
  const std::string shard = dir.path + "/rank-00001-of-00002.zdshard";
  auto expect_read_fails = [&](const ckpt::Source& src, const std::string& why) {
    try {
      ckpt::verify_all(src, 1);
      ADD_FAILURE() << "read a shard that " << why;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ZD_ERR_IO) << e.what();
      EXPECT_NE(std::string(e.what()).find(shard), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  {
    const ckpt::Source src(dir.path);
    fs::copy_file(shard, shard + ".copy");
    fs::rename(shard + ".copy", shard);  // the same bytes, another file
    expect_read_fails(src, "changed after its index was read");
  }
  EXPECT_GT(ckpt::verify_all(ckpt::Source(dir.path), 1), 0u);  // the copy is a whole shard
  {
    const ckpt::Source src(dir.path);
    fs::remove(shard);
    expect_read_fails(src, "removed after its index was read");
  }
}

// What `call(rank)` threw on each of `world` ranks, each a ZD_ERR_IO (a
// rank that did not throw fails the test).
std::vector<std::string> io_errors_of_every_rank(int world, const std::function<void(int rank)>& call) {
  std::vector<std::string> errors(static_cast<size_t>(world));
  run_ranks(world, [&](int rank) {
    try {
      call(rank);
      ADD_FAILURE() << "rank " << rank << " did not fail";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ZD_ERR_IO) << e.what();
      errors[static_cast<size_t>(rank)] = e.what();
    }
  });
  return errors;
}

// The shard files in a directory, sorted.
std::vector<std::string> shard_files(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".zdshard") names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Saving over a whole checkpoint (Lightning's last.ckpt, Accelerate's
// save_state: one directory, saved again and again) keeps it whole until
// the new one is: a save that fails on one rank leaves the old one to load,
// and every rank hears of the failure at once.
TEST(CheckpointSave, ASaveOverAWholeCheckpointKeepsItUntilTheNewOneIsWhole) {
  TempDir dir;
  auto a = make_model(job(1), 2);
  const std::vector<zd_param_id> all = {0, 1, 2};
  train_and_save(*a, 2, dir.path);
  EXPECT_EQ(shard_files(dir.path), (std::vector<std::string>{"rank-00000-of-00002.zdshard", "rank-00001-of-00002.zdshard"}));
  run_ranks(2, [&](int rank) {
    train(*a, rank, all, 2, 3);
    a->save_checkpoint(rank, dir.path);
  });
  // The other set, and the old one's shards gone once the new one was whole.
  EXPECT_EQ(shard_files(dir.path),
            (std::vector<std::string>{"rank-00000-of-00002-b.zdshard", "rank-00001-of-00002-b.zdshard"}));
  const Saved second = whole(*a, 2);
  // Rank 1's shard cannot be written (a directory holds its name).
  fs::create_directory(dir.path + "/rank-00001-of-00002.zdshard");
  const std::vector<std::string> errors = io_errors_of_every_rank(2, [&](int rank) {
    train(*a, rank, all, 3, 4);
    a->save_checkpoint(rank, dir.path);
  });
  EXPECT_NE(errors[0].find("rank 1 could not write its shard"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("rank-00001-of-00002.zdshard"), std::string::npos) << errors[1];
  for (const std::string& e : errors) EXPECT_NE(e.find("is kept"), std::string::npos) << e;
  {
    auto b = make_model(job(2), 1);
    std::vector<zd_param_id> ids;
    register_all(*b, 0, &ids);
    b->load_checkpoint(0, dir.path);
    const Saved got = whole(*b, 1);
    EXPECT_EQ(got.step, 3);
    EXPECT_EQ(got.params, second.params);
    EXPECT_EQ(got.slots, second.slots);
  }
  // The model the failed save left trains and saves on.
  fs::remove(dir.path + "/rank-00001-of-00002.zdshard");
  run_ranks(2, [&](int rank) { a->save_checkpoint(rank, dir.path); });
  EXPECT_EQ(shard_files(dir.path), (std::vector<std::string>{"rank-00000-of-00002.zdshard", "rank-00001-of-00002.zdshard"}));
  auto c = make_model(job(0), 1);
  std::vector<zd_param_id> ids;
  register_all(*c, 0, &ids);
  c->load_checkpoint(0, dir.path);
  EXPECT_EQ(whole(*c, 1).params, whole(*a, 2).params);
  EXPECT_EQ(whole(*c, 1).step, 4);
}

// A checkpoint that one rank cannot read (a damaged record only it reads)
// changes no rank: each says why, and the model trains on as it was.
TEST(CheckpointDamage, ARankThatCannotReadItsPartChangesNoRank) {
  TempDir dir;
  {
    auto a = make_model(job(3), 2);
    train_and_save(*a, 3, dir.path);
  }
  {
    std::fstream f(dir.path + "/rank-00001-of-00002.zdshard", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x7f');
  }
  auto b = make_model(job(3), 2);
  auto ref = make_model(job(3), 2);
  train_both(*b, 0, 1);
  train_both(*ref, 0, 1);
  const std::vector<std::string> errors =
      io_errors_of_every_rank(2, [&](int rank) { b->load_checkpoint(rank, dir.path); });
  EXPECT_NE(errors[0].find("rank 1 cannot read"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("fails its checksum"), std::string::npos) << errors[1];
  run_ranks(2, [&](int rank) {
    const std::vector<zd_param_id> ids = {0, 1, 2};
    train(*b, rank, ids, 1, 3);
    train(*ref, rank, ids, 1, 3);
  });
  const Saved got = whole(*b, 2), want = whole(*ref, 2);
  EXPECT_EQ(got.step, 3);
  EXPECT_EQ(got.params, want.params);
  EXPECT_EQ(got.slots, want.slots);
}

// The engine's own snapshots: every N steps, the newest K kept, written in
// the background; a new job over the same path resumes at the newest, and
// its next steps end where an uninterrupted run ends.
TEST(Snapshots, EveryNStepsKeepKAndResumeBitIdentical) {
  TempDir snaps;
  JobOptions o = job(3);
  o.snapshot.path = snaps.path;
  o.snapshot.every = 2;
  o.snapshot.keep = 2;
  JobOptions plain = job(3);
  auto ref = make_model(plain, 2);
  train_both(*ref, 0, 9);
  {
    auto a = make_model(o, 2);
    train_both(*a, 0, 7);
    // The process dies here: no final snapshot.
  }
  EXPECT_EQ(entries(snaps.path), (std::vector<std::string>{"step-000000000004", "step-000000000006"}));
  auto b = make_model(o, 2);
  run_ranks(2, [&](int rank) {
    std::vector<zd_param_id> ids;
    register_all(*b, rank, &ids);  // finalize resumes at step 6
    EXPECT_EQ(b->applied_steps(rank), 6);
    train(*b, rank, ids, 6, 9);
  });
  EXPECT_EQ(whole(*b, 2).params, whole(*ref, 2).params);
  EXPECT_EQ(whole(*b, 2).slots, whole(*ref, 2).slots);
  // A clean end writes the last one (step 9; snapshot at 8 written already).
  b->final_snapshot();
  EXPECT_EQ(entries(snaps.path), (std::vector<std::string>{"step-000000000008", "step-000000000009"}));
}

// The lr a trainer set (zd_model_set_lr) is where the run stood, as the
// step is: a snapshot holds it, and a job resumed from it trains on at it
// (not at the job's lr) and ends where the uninterrupted run ends.
TEST(Snapshots, AResumeGoesOnAtTheLrTheTrainerSet) {
  TempDir snaps;
  JobOptions o = job(3);
  o.snapshot.path = snaps.path;
  o.snapshot.every = 2;
  const double lr = 3e-3;
  const auto train_setting_lr_at_3 = [&](Model& m, int to) {
    run_ranks(2, [&](int rank) {
      std::vector<zd_param_id> ids;
      register_all(m, rank, &ids);
      train(m, rank, ids, 0, 3);
      m.set_lr(rank, lr);
      train(m, rank, ids, 3, to);
    });
  };
  JobOptions plain = job(3);
  auto ref = make_model(plain, 2);
  train_setting_lr_at_3(*ref, 7);
  {
    auto a = make_model(o, 2);
    train_setting_lr_at_3(*a, 5);  // the snapshot of step 4 holds the lr; then the process dies
  }
  EXPECT_EQ(ckpt::read_manifest(snaps.path + "/step-000000000004").lr, lr);
  EXPECT_EQ(ckpt::read_manifest(snaps.path + "/step-000000000002").lr, std::nullopt);
  auto b = make_model(o, 2);
  run_ranks(2, [&](int rank) {
    std::vector<zd_param_id> ids;
    register_all(*b, rank, &ids);  // finalize resumes at step 4
    EXPECT_EQ(b->applied_steps(rank), 4);
    train(*b, rank, ids, 4, 7);
  });
  EXPECT_EQ(whole(*b, 2).params, whole(*ref, 2).params);
  EXPECT_EQ(whole(*b, 2).slots, whole(*ref, 2).slots);
}

// A job that starts over (snapshot.resume = false) in a path where an
// earlier run left snapshots of later steps: those are a timeline the job
// left. Its first snapshot moves them aside (step-<N>.superseded, named in
// the log), so a restart resumes this job's newest, not the earlier run's
// (before, they stayed as they were and the restart took the newest of them).
TEST(Snapshots, AJobThatStartsOverMovesTheEarlierRunsLaterSnapshotsAside) {
  TempDir snaps;
  JobOptions o = job(1);
  o.snapshot.path = snaps.path;
  o.snapshot.every = 2;
  o.snapshot.keep = 2;
  {
    auto a = make_model(o, 2);
    train_both(*a, 0, 8);  // 2, 4, 6, 8: 6 and 8 kept
  }
  o.snapshot.resume = false;
  ::testing::internal::CaptureStderr();
  {
    auto b = make_model(o, 2);
    train_both(*b, 0, 7);  // 2 (6 and 8 aside), 4, 6; the last one committed as b goes
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(entries(snaps.path), (std::vector<std::string>{"step-000000000004", "step-000000000006",
                                                           "step-000000000006.superseded",
                                                           "step-000000000008.superseded"}));
  EXPECT_NE(err.find("the job writes the snapshot of step 2 where " + snaps.path + " holds snapshots of later steps"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find(snaps.path + "/step-000000000008.superseded"), std::string::npos) << err;
  o.snapshot.resume = true;
  auto c = make_model(o, 2);
  run_ranks(2, [&](int rank) {
    std::vector<zd_param_id> ids;
    register_all(*c, rank, &ids);
  });
  EXPECT_EQ(c->applied_steps(0), 6) << "the restart resumed the run the job had left";
}

// A job that goes back (zd_model_load of an earlier checkpoint, or
// zd_model_set_step) and writes snapshots of earlier steps than those in
// the path: a restart resumes where the job is, not the timeline it left,
// and ends as a run that never went further does.
TEST(Snapshots, ARollbackIsWhatARestartResumes) {
  TempDir snaps, ck;
  JobOptions o = job(1);
  o.snapshot.path = snaps.path;
  o.snapshot.every = 2;
  o.snapshot.keep = 2;
  {
    auto a = make_model(o, 2);
    run_ranks(2, [&](int rank) {
      std::vector<zd_param_id> ids;
      register_all(*a, rank, &ids);
      train(*a, rank, ids, 0, 3);
      a->save_checkpoint(rank, ck.path);
      train(*a, rank, ids, 3, 8);  // snapshots 6 and 8 kept
    });
  }
  // The reference: from the checkpoint of step 3 straight to 7.
  auto ref = make_model(job(1), 2);
  run_ranks(2, [&](int rank) {
    std::vector<zd_param_id> ids;
    register_all(*ref, rank, &ids);
    ref->load_checkpoint(rank, ck.path);
    train(*ref, rank, ids, 3, 7);
  });
  {
    auto b = make_model(o, 2);
    ::testing::internal::CaptureStderr();
    run_ranks(2, [&](int rank) {
      std::vector<zd_param_id> ids;
      register_all(*b, rank, &ids);  // resumes at 8
      EXPECT_EQ(b->applied_steps(rank), 8);
      b->load_checkpoint(rank, ck.path);  // back to 3
      train(*b, rank, ids, 3, 5);         // the snapshot of 4: 6 and 8 aside
    });
    b->final_snapshot();  // a clean end at 5
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("the job writes the snapshot of step 4 where"), std::string::npos) << err;
  }
  EXPECT_EQ(entries(snaps.path), (std::vector<std::string>{"step-000000000004", "step-000000000005",
                                                           "step-000000000006.superseded",
                                                           "step-000000000008.superseded"}));
  {
    auto c = make_model(o, 2);
    run_ranks(2, [&](int rank) {
      std::vector<zd_param_id> ids;
      register_all(*c, rank, &ids);
      EXPECT_EQ(c->applied_steps(rank), 5) << "the restart resumed the timeline the job had left";
      train(*c, rank, ids, 5, 7);
    });
    EXPECT_EQ(whole(*c, 2).params, whole(*ref, 2).params);
    EXPECT_EQ(whole(*c, 2).slots, whole(*ref, 2).slots);
  }
  // c wrote the snapshot of 6. zd_model_set_step back to 1 (a restore
  // through the whole-tensor calls): the snapshot of 2 moves 5 and 6 aside,
  // and those of the timeline left before go.
  {
    auto d = make_model(o, 2);
    ::testing::internal::CaptureStderr();
    run_ranks(2, [&](int rank) {
      std::vector<zd_param_id> ids;
      register_all(*d, rank, &ids);  // resumes at 6
      EXPECT_EQ(d->applied_steps(rank), 6);
      d->set_applied_steps(rank, 1);
      train(*d, rank, ids, 1, 3);  // the snapshot of 2
    });
    ::testing::internal::GetCapturedStderr();
  }
  EXPECT_EQ(entries(snaps.path), (std::vector<std::string>{"step-000000000002", "step-000000000005.superseded",
                                                           "step-000000000006.superseded"}));
  auto e = make_model(o, 2);
  run_ranks(2, [&](int rank) {
    std::vector<zd_param_id> ids;
    register_all(*e, rank, &ids);
  });
  EXPECT_EQ(e->applied_steps(0), 2);
}

// A snapshot of a step the path already holds replaces it through a rename
// aside (step-<N>.old), the new one in, then the old one removed. A crash
// between the two renames leaves the old copy under .old and the new one
// .partial: the next start puts the old one back (before, the old one was
// removed first, and such a crash lost both). One after them: .old goes.
TEST(Snapshots, ACrashWhileAStepIsReplacedLosesNeitherCopy) {
  TempDir snaps;
  JobOptions o = job(1);
  o.snapshot.path = snaps.path;
  o.snapshot.every = 2;
  o.snapshot.keep = 2;
  {
    auto a = make_model(o, 2);
    train_both(*a, 0, 7);  // 4 and 6 kept
  }
  const std::string six = snaps.path + "/step-000000000006";
  fs::rename(six, six + ".old");  // as a crash between the renames leaves it
  fs::create_directory(six + ".partial");
  {
    auto b = make_model(o, 2);
    run_ranks(2, [&](int rank) {
      std::vector<zd_param_id> ids;
      register_all(*b, rank, &ids);
    });
    EXPECT_EQ(b->applied_steps(0), 6) << "the snapshot of step 6 was lost";
  }
  EXPECT_EQ(entries(snaps.path), (std::vector<std::string>{"step-000000000004", "step-000000000006"}));
  fs::copy(six, six + ".old", fs::copy_options::recursive);  // a crash after them
  {
    auto c = make_model(o, 2);
    run_ranks(2, [&](int rank) {
      std::vector<zd_param_id> ids;
      register_all(*c, rank, &ids);
    });
    EXPECT_EQ(c->applied_steps(0), 6);
  }
  EXPECT_EQ(entries(snaps.path), (std::vector<std::string>{"step-000000000004", "step-000000000006"}));
}

// Two models over one snapshot path (a GAN's two models of one script, two
// runs of a job started at once) removed, replaced and pruned each other's
// snapshots, and the restart of both failed. The first holds the path for
// its life; a second waits comm.timeout for it to let go, then is refused,
// naming the path and the holder. The daemons of one job across nodes share
// it; a job on one daemon and another job's daemon of the same node do not.
TEST(Snapshots, ASecondModelOverThePathIsRefusedNamingItsHolder) {
  TempDir snaps;
  JobOptions o = job(1);
  o.snapshot.path = snaps.path;
  o.snapshot.every = 2;
  o.timeout_s = 0.2;
  const std::string me = "pid " + std::to_string(::getpid()) + " on host ";
  const auto refusal = [&](const std::function<std::unique_ptr<Model>()>& make) {
    ::testing::internal::CaptureStderr();
    std::string what;
    try {
      make();
      ADD_FAILURE() << "a second model over " << snaps.path << " was made";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ZD_ERR_CONFIG) << e.what();
      what = e.what();
    }
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("snapshots: " + snaps.path + " is in use by "), std::string::npos) << err;
    EXPECT_NE(what.find("snapshot.path " + snaps.path + " is in use by "), std::string::npos) << what;
    EXPECT_NE(what.find("give each model its own snapshot.path"), std::string::npos) << what;
    return what;
  };
  {
    auto a = make_model(o, 2);
    const std::string what = refusal([&] { return make_model(o, 1); });
    EXPECT_NE(what.find("another model of the same process, " + me), std::string::npos) << what;
    // One daemon's part of a job across nodes is refused too.
    refusal([&] { return make_model(o, 2, 1, 1); });
    train_both(*a, 0, 4);  // a's snapshots, untouched
  }
  EXPECT_EQ(entries(snaps.path), (std::vector<std::string>{"step-000000000002", "step-000000000004"}));
  // Gone with its model: the next one takes the path.
  {
    auto b = make_model(o, 1);
  }
  // Both daemons of one job across nodes (one directory every node sees).
  auto node0 = make_model(o, 2, 0, 1);
  auto node1 = make_model(o, 2, 1, 1);
  const std::string what = refusal([&] { return make_model(o, 1); });
  EXPECT_NE(what.find("a job across nodes (node 0: " + me), std::string::npos) << what;
  // Another job's daemon of node 1.
  const std::string other = refusal([&] { return make_model(o, 2, 1, 1); });
  EXPECT_NE(other.find(".zerod-node-00001.lock"), std::string::npos) << other;
  EXPECT_NE(other.find("ranks 1-1"), std::string::npos) << other;
}

// Two runs of a job at once, in two processes: the second is refused,
// naming the first's pid; once the first is gone (killed: the kernel lets go
// of its lock), a model waiting for the path takes it.
TEST(Snapshots, AnotherProcessHoldsThePathUntilItIsGone) {
  TempDir snaps;
  JobOptions o = job(0);
  o.snapshot.path = snaps.path;
  o.snapshot.every = 2;
  int ready[2], hold[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(hold), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ready[0]);
    ::close(hold[1]);
    char c = 1;
    try {
      auto m = make_model(o, 1);
      static_cast<void>(::write(ready[1], &c, 1));
      static_cast<void>(::read(hold[0], &c, 1));  // held until killed
    } catch (...) {
    }
    ::_exit(1);
  }
  ::close(ready[1]);
  ::close(hold[0]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1) << "the other process made no model";
  o.timeout_s = 0.2;
  ::testing::internal::CaptureStderr();
  try {
    make_model(o, 1);
    ADD_FAILURE() << "a model over the path another process holds was made";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ZD_ERR_CONFIG) << e.what();
    EXPECT_NE(std::string(e.what()).find("is in use by pid " + std::to_string(child) + " on host "),
              std::string::npos)
        << e.what();
  }
  ::testing::internal::GetCapturedStderr();
  // A model that waits (up to 30 s) while the holder dies.
  o.timeout_s = 30;
  int err_pipe[2];
  ASSERT_EQ(::pipe(err_pipe), 0);
  const int saved = ::dup(2);
  ::dup2(err_pipe[1], 2);
  ::close(err_pipe[1]);
  std::unique_ptr<Model> waited;
  std::string failed;
  std::thread maker([&] {
    try {
      waited = make_model(o, 1);
    } catch (const std::exception& e) {
      failed = e.what();
    }
    std::fprintf(stderr, "maker done\n");  // the read below ends, waited or not
  });
  std::string log;
  char buf[512];
  while (log.find("is in use by pid") == std::string::npos && log.find("maker done") == std::string::npos) {
    const ssize_t n = ::read(err_pipe[0], buf, sizeof buf);
    if (n <= 0) break;
    log.append(buf, static_cast<size_t>(n));
  }
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  maker.join();
  ::dup2(saved, 2);
  ::close(saved);
  ::close(err_pipe[0]);
  ::close(ready[0]);
  ::close(hold[1]);
  EXPECT_NE(log.find("waiting up to 30 s (comm.timeout)"), std::string::npos) << log;
  EXPECT_TRUE(waited) << failed;
}

// The wait for the path ends when snapshot.lock_wait_ends says why (a
// daemon: it stops, or the holder is a model it keeps, which no wait
// ends): at once, with that error's code, after the path and its holder.
TEST(Snapshots, TheWaitForThePathEndsWhenTheDaemonSaysWhy) {
  TempDir snaps;
  JobOptions o = job(0);
  o.snapshot.path = snaps.path;
  o.snapshot.every = 2;
  auto holder = make_model(o, 1);
  o.timeout_s = 30;
  int asked = 0;
  o.snapshot.lock_wait_ends = [&]() -> std::optional<Error> {
    if (++asked < 3) return std::nullopt;  // asked again while it waits
    return Error(ZD_ERR_INVALID_STATE, "the daemon is stopping");
  };
  const auto t0 = std::chrono::steady_clock::now();
  ::testing::internal::CaptureStderr();
  try {
    make_model(o, 1);
    ADD_FAILURE() << "a second model over the path was made";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ZD_ERR_INVALID_STATE) << e.what();
    EXPECT_NE(std::string(e.what()).find("snapshot.path " + snaps.path + " is in use by another model of the same "
                                         "process, "),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find(".zerod.lock: the daemon is stopping"), std::string::npos) << e.what();
  }
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(asked, 3);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
}

// A process forked while a model lived (a DataLoader's workers) shares the
// lock's open file: the model's end unlocks it, so the next model over the
// path is made at once while the child still lives (close() alone left the
// lock held until the last child was gone).
TEST(Snapshots, AChildForkedWhileAModelLivedDoesNotHoldItsPathAfterIt) {
  TempDir snaps;
  JobOptions o = job(0);
  o.snapshot.path = snaps.path;
  o.snapshot.every = 2;
  o.timeout_s = 0.2;
  auto first = make_model(o, 1);
  int hold[2];
  ASSERT_EQ(::pipe(hold), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(hold[1]);
    char c;
    static_cast<void>(::read(hold[0], &c, 1));  // lives until the parent closes its end
    ::_exit(0);
  }
  ::close(hold[0]);
  first.reset();
  std::unique_ptr<Model> second;
  std::string failed;
  try {
    second = make_model(o, 1);
  } catch (const std::exception& e) {
    failed = e.what();
  }
  ::close(hold[1]);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(second) << failed;
}

// A loss scale from a checkpoint or snapshot of another setting: a dynamic
// fp16 run's 65536 taken by a job of a static fp16.loss_scale stayed there
// for good, and by a bf16 or fp32 job (which zerod.h says scales by 1) it
// divided the gradients of a trainer that does not scale its loss. The
// job's own setting wins; a dynamic scaler takes a dynamic one's state, and
// starts from its own where the checkpoint's made no dynamic update.
void train_scaled(Model& m, zd_param_id id, int steps, float grad) {
  for (int s = 0; s < steps; ++s) {
    m.backward_begin(0, 0);
    const ViewInfo g = m.grad_view(0, id);
    std::vector<float> v(g.bytes / dtype_size(g.dtype), grad * static_cast<float>(m.loss_scale(0)));
    convert(v.data(), ZD_DTYPE_F32, g.data, g.dtype, v.size());
    m.backward_end(0, 0);
    m.step(0);
  }
}

TEST(CheckpointLossScale, TheJobsOwnSettingWinsOverAnotherOnesState) {
  TempDir ck, bf16_ck, snaps;
  JobOptions dynamic = job(0);
  dynamic.precision = ZD_DTYPE_F16;
  dynamic.snapshot.path = snaps.path;
  dynamic.snapshot.every = 2;
  {
    auto a = make_model(dynamic, 1);
    const auto ids = register_sine_modules(*a, 0, {16}, ZD_DTYPE_F16);
    train_scaled(*a, ids[0], 2, std::numeric_limits<float>::infinity());  // two overflows, skipped: halved
    train_scaled(*a, ids[0], 2, 0.01f);                                   // steps 1, 2: the snapshot of 2
    ASSERT_EQ(a->loss_scale(0), 32768.0);
    a->save_checkpoint(0, ck.path);
  }
  // scale after a load of `dir`, and after a resume of the snapshots
  const auto loaded = [&](JobOptions o, const std::string& dir) {
    o.snapshot = {};
    auto m = make_model(o, 1);
    register_sine_modules(*m, 0, {16}, o.precision);
    m->load_checkpoint(0, dir);
    EXPECT_EQ(m->applied_steps(0), 2);
    return m->loss_scale(0);
  };
  const auto resumed = [&](const JobOptions& o) {
    auto m = make_model(o, 1);
    register_sine_modules(*m, 0, {16}, o.precision);
    EXPECT_EQ(m->applied_steps(0), 2);
    return m->loss_scale(0);
  };
  JobOptions fixed = dynamic;
  fixed.static_loss_scale = 128;
  EXPECT_EQ(loaded(fixed, ck.path), 128.0);
  EXPECT_EQ(resumed(fixed), 128.0);
  JobOptions bf16 = dynamic;
  bf16.precision = ZD_DTYPE_BF16;
  EXPECT_EQ(loaded(bf16, ck.path), 1.0);
  EXPECT_EQ(resumed(bf16), 1.0);
  JobOptions fp32 = dynamic;
  fp32.precision = ZD_DTYPE_F32;
  EXPECT_EQ(loaded(fp32, ck.path), 1.0);
  // A dynamic scaler takes a dynamic one's state...
  EXPECT_EQ(loaded(dynamic, ck.path), 32768.0);
  EXPECT_EQ(resumed(dynamic), 32768.0);
  // ... and keeps its own start over a bf16 checkpoint's 1.
  {
    bf16.snapshot = {};
    auto m = make_model(bf16, 1);
    register_sine_modules(*m, 0, {16}, ZD_DTYPE_BF16);
    m->load_checkpoint(0, ck.path);
    m->save_checkpoint(0, bf16_ck.path);
  }
  EXPECT_EQ(loaded(dynamic, bf16_ck.path), 65536.0);
}

// A snapshot that cannot be written (a full disk) is removed, logged, and
// training goes on; the snapshots before it stay.
TEST(Snapshots, AFailedOneIsRemovedAndTrainingGoesOn) {
  TempDir snaps;
  if (::mount("tmpfs", snaps.path.c_str(), "tmpfs", 0, "size=16k") != 0)
    GTEST_SKIP() << "mounting a small tmpfs needs CAP_SYS_ADMIN: " << std::strerror(errno);
  snaps.mounted = true;
  JobOptions o = job(0);
  o.snapshot.path = snaps.path;
  o.snapshot.every = 1;
  auto a = make_model(o, 1);
  std::vector<zd_param_id> ids;
  register_all(*a, 0, &ids);
  train(*a, 0, ids, 0, 3);  // each snapshot needs ~16 KiB of state: the disk is full
  a->sync(0);
  EXPECT_EQ(a->applied_steps(0), 3) << "training went on";
  a.reset();  // the last snapshot's flush and commit (or removal) run behind training until the model goes
  for (const auto& e : fs::directory_iterator(snaps.path))
    EXPECT_EQ(e.path().filename().string().find(".partial"), std::string::npos) << "a partial snapshot was left";
}

// Fills the file system of dir to the last byte: a file grows until a write fails.
void fill_disk(const std::string& dir) {
  const int fd = ::open((dir + "/.filler").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  const std::vector<char> block(4096, 'x');
  while (::write(fd, block.data(), block.size()) > 0) {
  }
  ::close(fd);
}

// The end's snapshot is another matter: nothing comes after it. One that
// failed (a full disk) was logged as "training goes on, and the older
// snapshots are kept" and the job ended as if saved; a job of every = 0
// lost the whole run without a word of it. The log now says that the run's
// final state was NOT saved, which snapshot is the newest kept (or that none
// is) and what to do, and final_snapshot() returns it (the daemon's exit
// status; embedded, the log is all there is).
TEST(Snapshots, AFailedFinalOneSaysTheRunsEndWasNotSaved) {
  for (const int every : {0, 2}) {
    SCOPED_TRACE("snapshot.every = " + std::to_string(every));
    TempDir snaps;
    if (::mount("tmpfs", snaps.path.c_str(), "tmpfs", 0, "size=1m") != 0)
      GTEST_SKIP() << "mounting a small tmpfs needs CAP_SYS_ADMIN: " << std::strerror(errno);
    snaps.mounted = true;
    JobOptions o = job(0);
    o.snapshot.path = snaps.path;
    o.snapshot.every = every;
    auto a = make_model(o, 1);
    std::vector<zd_param_id> ids;
    register_all(*a, 0, &ids);
    train(*a, 0, ids, 0, 3);
    a->sync(0);
    if (every > 0) {  // the snapshot of step 2 is committed behind training
      const std::vector<std::string> step2{"step-000000000002"};
      for (int i = 0; i < 500 && entries(snaps.path) != step2; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      ASSERT_EQ(entries(snaps.path), (std::vector<std::string>{"step-000000000002"}));
    }
    fill_disk(snaps.path);
    ::testing::internal::CaptureStderr();
    const std::string lost = a->final_snapshot();
    const std::string err = ::testing::internal::GetCapturedStderr();
    for (const std::string& said : {lost, err}) {
      EXPECT_NE(said.find("the final snapshot, of step 3, failed ("), std::string::npos) << said;
      EXPECT_NE(said.find("the run's final state (step 3) was NOT saved"), std::string::npos) << said;
      EXPECT_NE(said.find("Free space on the disk of " + snaps.path), std::string::npos) << said;
      EXPECT_NE(said.find("zd_model_save"), std::string::npos) << said;
      EXPECT_EQ(said.find("training goes on"), std::string::npos) << said;
      if (every == 0) {
        EXPECT_NE(said.find("no snapshot is kept under " + snaps.path), std::string::npos) << said;
        EXPECT_NE(said.find("snapshot.every = 0 snapshots only the end"), std::string::npos) << said;
      } else {
        EXPECT_NE(said.find("the newest snapshot kept is of step 2 (" + snaps.path + "/step-000000000002)"),
                  std::string::npos)
            << said;
      }
    }
    EXPECT_EQ(a->final_snapshot(), lost) << "the flag is kept";
    a.reset();
    EXPECT_EQ(entries(snaps.path),
              every == 0 ? std::vector<std::string>{} : std::vector<std::string>{"step-000000000002"})
        << "a partial snapshot was left, or the one kept went";
  }
}

// A snapshot across nodes says where its parts are (format 2); everything
// else stays format 1, which older readers read. On a node-local disk a
// missing shard is named with the node and host that keep it.
// A trainer that set a comma-decimal locale (setlocale, std::locale::global)
// saves: the manifest is the one the "C" locale writes (lr 0x1.0624dd2f1a9fcp-10,
// not 0x1,0624dd2f1a9fcp-10, which no reader took: the checkpoint was lost),
// and it reads back exactly under either locale.
TEST(SnapshotManifest, TheProcesssLocaleChangesNoNumber) {
  ckpt::Manifest m;
  m.step = 1234;  // no thousands grouping ("1.234")
  m.precision = "fp16";
  m.optimizer = "onebit_lamb";
  m.slots = {"exp_avg"};
  m.loss_scale = 1536.0 * 0.75;
  m.scaler_iteration = 1200;
  m.lr = 0.001;
  m.params = {{"w", "m", "f16", {1000, 300}, 300000}};
  m.tensor_scalars = 2;
  m.scalars = {0.1f, -2.5f};
  TempDir c_dir, comma_dir;
  ckpt::write_manifest(c_dir.path, m);
  const auto text = [](const std::string& dir) {
    std::ifstream in(dir + "/" + ckpt::kManifestName);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  ASSERT_NE(text(c_dir.path).find("\nlr 0x1.0624dd2f1a9fcp-10\n"), std::string::npos) << text(c_dir.path);
  const auto expect_same = [&](const ckpt::Manifest& back) {
    EXPECT_EQ(back.step, m.step);
    EXPECT_EQ(back.loss_scale, m.loss_scale);
    EXPECT_EQ(back.scaler_iteration, m.scaler_iteration);
    ASSERT_TRUE(back.lr.has_value());
    EXPECT_EQ(*back.lr, *m.lr);
    EXPECT_EQ(back.scalars, m.scalars);
    ASSERT_EQ(back.params.size(), 1u);
    EXPECT_EQ(back.params[0].numel, m.params[0].numel);
  };
  {
    const zerod_test::CommaLocale comma;
    if (!comma.available()) GTEST_SKIP() << comma.why_not();
    ckpt::write_manifest(comma_dir.path, m);
    EXPECT_EQ(text(comma_dir.path), text(c_dir.path));
    expect_same(ckpt::read_manifest(c_dir.path));
  }
  expect_same(ckpt::read_manifest(comma_dir.path));
}

// What zerod wrote before under a comma-decimal locale (lr 0x1,06...p-10,
// the scalars alike) still loads, as it did then.
TEST(SnapshotManifest, ACommaRadixAnEarlierZerodWroteStillReads) {
  ckpt::Manifest m;
  m.step = 7;
  m.precision = "fp32";
  m.optimizer = "onebit_lamb";
  m.slots = {"exp_avg"};
  m.lr = 0.001;
  m.params = {{"w", "m", "f32", {4}, 4}};
  m.tensor_scalars = 2;
  m.scalars = {0.1f, -2.5f};
  TempDir dir;
  ckpt::write_manifest(dir.path, m);
  const std::string path = dir.path + "/" + ckpt::kManifestName;
  std::string text;
  {
    std::ifstream in(path);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  int commas = 0;
  for (size_t at = text.find("0x"); at != std::string::npos; at = text.find("0x", at + 2)) {
    const size_t dot = text.find('.', at);
    if (dot != std::string::npos && dot < text.find_first_of(" \n", at)) {
      text[dot] = ',';
      ++commas;
    }
  }
  ASSERT_GE(commas, 2) << text;  // the lr and a scalar at least
  {
    std::ofstream out(path, std::ios::trunc);
    out << text;
  }
  const ckpt::Manifest back = ckpt::read_manifest(dir.path);
  ASSERT_TRUE(back.lr.has_value());
  EXPECT_EQ(*back.lr, *m.lr);
  EXPECT_EQ(back.scalars, m.scalars);
}

TEST(SnapshotManifest, PartsRoundTripAndAMissingPartIsNamed) {
  TempDir dir;
  auto a = make_model(job(1), 2);
  train_and_save(*a, 2, dir.path);
  const auto first_line = [&] {
    std::ifstream in(dir.path + "/zerod-checkpoint.txt");
    std::string l;
    std::getline(in, l);
    return l;
  };
  EXPECT_EQ(first_line(), "zerod-checkpoint 1");
  ckpt::Manifest m = ckpt::read_manifest(dir.path);
  EXPECT_EQ(m.nodes, 0);
  m.nodes = 2;
  m.shared = false;
  m.parts = {{0, "host a", 0, 1}, {1, "hostb", 1, 1}};
  ckpt::write_manifest(dir.path, m);
  EXPECT_EQ(first_line(), "zerod-checkpoint 2");
  const ckpt::Manifest back = ckpt::read_manifest(dir.path);
  EXPECT_EQ(back.nodes, 2);
  EXPECT_FALSE(back.shared);
  ASSERT_EQ(back.parts.size(), 2u);
  EXPECT_EQ(back.parts[0].host, "host a");  // escaped on disk
  EXPECT_EQ(back.parts[1].node, 1);
  EXPECT_EQ(back.parts[1].first_rank, 1);
  EXPECT_EQ(back.parts[1].ranks, 1);
  EXPECT_NO_THROW(ckpt::Source src(dir.path));  // every part here: a whole checkpoint
  fs::remove(dir.path + "/rank-00001-of-00002.zdshard");
  try {
    ckpt::Source src(dir.path);
    ADD_FAILURE() << "opened without rank 1's shard";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ZD_ERR_IO);
    EXPECT_NE(std::string(e.what()).find("rank 1's shard is on node 1 (host hostb)"), std::string::npos) << e.what();
  }
  // Only this node's part: reads what its shards hold.
  const ckpt::Source part(dir.path, back, {0});
  std::vector<float> v(10);
  EXPECT_NO_THROW(part.read(0, ckpt::kMasterBuffer, 0, 10, v.data()));
}

// `zerod ckpt export` to one output, as one file, then as shards, then as
// shards of another count, then as one file again: each export leaves its
// own files and nothing of the one before (which a loader could read
// instead: Hugging Face's takes out.safetensors before an index), and says
// what it removed. A file of such a name that zerod's export did not write
// is never removed: the export refuses before writing anything.
TEST(CheckpointExport, AnExportRemovesWhatAnEarlierOneToTheSameOutputLeft) {
  TempDir ck, out_dir;
  auto a = make_model(job(1), 2);
  train_and_save(*a, 2, ck.path);
  const ckpt::Source src(ck.path);
  const std::string out = out_dir.path + "/out.safetensors";
  auto file = [&](const std::string& name) { return out_dir.path + "/" + name; };
  auto listing = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(out_dir.path)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  using Names = std::vector<std::string>;
  auto export_to = [&](uint64_t max_shard_bytes) {
    ckpt::ExportOptions o;
    o.out = out;
    o.max_shard_bytes = max_shard_bytes;  // 1200, 4000 and 28 bytes of fp32: one file, 3 shards or 2
    return ckpt::export_safetensors(src, o);
  };

  ckpt::ExportResult r = export_to(0);
  EXPECT_EQ(r.written, Names{out});
  EXPECT_TRUE(r.removed.empty());

  r = export_to(2000);
  EXPECT_EQ(listing(), (Names{"out-00001-of-00003.safetensors", "out-00002-of-00003.safetensors",
                              "out-00003-of-00003.safetensors", "out.safetensors.index.json"}));
  EXPECT_EQ(r.removed, Names{out}) << "the one file of the export before";

  r = export_to(5000);
  EXPECT_EQ(listing(), (Names{"out-00001-of-00002.safetensors", "out-00002-of-00002.safetensors",
                              "out.safetensors.index.json"}));
  EXPECT_EQ(r.removed, (Names{file("out-00001-of-00003.safetensors"), file("out-00002-of-00003.safetensors"),
                              file("out-00003-of-00003.safetensors")}))
      << "the shards of another count";

  r = export_to(0);
  EXPECT_EQ(listing(), Names{"out.safetensors"});
  EXPECT_EQ(r.removed, (Names{file("out-00001-of-00002.safetensors"), file("out-00002-of-00002.safetensors"),
                              file("out.safetensors.index.json")}));

  // Another tool's index (Hugging Face's json.dumps), and a shard name
  // holding something else: refused, naming the file, with nothing written
  // or removed.
  const std::string before = [&] {
    std::ifstream in(out, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  for (const auto& [name, text] :
       {std::pair<std::string, std::string>{"out.safetensors.index.json",
                                            "{\n  \"metadata\": {\n    \"total_size\": 5228\n  }\n}\n"},
        {"out-00001-of-00009.safetensors", "not a tensor"}}) {
    std::ofstream(file(name)) << text;
    for (uint64_t max_shard_bytes : {uint64_t{0}, uint64_t{2000}}) {
      // A name a sharded export writes itself: AnExportReplacesOnlyAnEarlierExport.
      if (name == "out.safetensors.index.json" && max_shard_bytes != 0) continue;
      try {
        export_to(max_shard_bytes);
        ADD_FAILURE() << name << ": exported beside it";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ZD_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(e.what()).find(file(name) + " lies beside " + out), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("zerod's export did not write it"), std::string::npos) << e.what();
      }
      Names want{name, "out.safetensors"};
      std::sort(want.begin(), want.end());
      EXPECT_EQ(listing(), want) << name << ": nothing written or removed";
    }
    fs::remove(file(name));
  }
  std::ifstream in(out, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), before) << "the last export stays as it was";
}

// A sharded export over an earlier one of the same count renamed its shards
// over the earlier one's one by one, then wrote the index: one that failed
// part way (here the index cannot be written) left the earlier index naming
// shards of the new step beside shards of the old. It writes the other set
// of names (-b before the extension) and removes them again where it fails,
// so the earlier export stays as it was until the new index replaces it.
TEST(CheckpointExport, AFailedExportOverAnEarlierOneLeavesItAsItWas) {
  TempDir at2, at3, out_dir;
  auto a = make_model(job(1), 2);
  train_and_save(*a, 2, at2.path);
  auto b = make_model(job(1), 2);
  train_and_save(*b, 3, at3.path);
  const std::string out = out_dir.path + "/out.safetensors";
  auto export_of = [&](const std::string& ck) {
    ckpt::ExportOptions o;
    o.out = out;
    o.max_shard_bytes = 2000;  // 3 shards
    return ckpt::export_safetensors(ckpt::Source(ck), o);
  };
  auto files = [&] {
    std::map<std::string, std::string> bytes;
    for (const auto& e : fs::directory_iterator(out_dir.path)) {
      std::ifstream in(e.path(), std::ios::binary);
      bytes[e.path().filename().string()] = std::string(std::istreambuf_iterator<char>(in), {});
    }
    return bytes;
  };
  export_of(at2.path);
  const auto earlier = files();
  ASSERT_EQ(earlier.size(), 4u) << "3 shards and their index";

  const std::string index_tmp = out_dir.path + "/out.safetensors.index.json.tmp";
  fs::create_directory(index_tmp);  // the index cannot be written
  EXPECT_THROW(export_of(at3.path), Error);
  fs::remove(index_tmp);
  EXPECT_EQ(files(), earlier) << "the earlier export as it was, and nothing of the failed one";

  const ckpt::ExportResult r = export_of(at3.path);
  std::vector<std::string> names;
  for (const auto& [name, bytes] : files()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"out-00001-of-00003-b.safetensors", "out-00002-of-00003-b.safetensors",
                                             "out-00003-of-00003-b.safetensors", "out.safetensors.index.json"}));
  EXPECT_EQ(r.removed.size(), 3u) << "the earlier shards, once the new index names the new ones";
}

// `zerod ckpt reshard` carries zerod.torch's files along (without them a
// resharded checkpoint loaded with client_state {} and fresh buffers): the
// pickle and tensors of the manifest's step, whichever names a save killed
// part way left them under, committed as save_checkpoint commits them; an
// earlier checkpoint's in the output directory do not stay beside it.
TEST(CheckpointTorchState, ReshardCarriesThePairOfTheManifestsStep) {
  auto write = [](const std::string& path, const std::string& text) { std::ofstream(path) << text; };
  auto tensors_of_step = [&](const std::string& path, int step) {
    std::string header = "{\"__metadata__\":{\"format\":\"pt\",\"zerod_step\":\"" + std::to_string(step) + "\"}}";
    header.append((8 - header.size() % 8) % 8, ' ');
    const uint64_t len = header.size();
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(&len), 8) << header;
  };
  auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  auto listing = [](const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  const std::vector<std::string> both{ckpt::kTorchStatePickle, ckpt::kTorchStateTensors};
  struct ReshardCase {
    const char* what;
    int step;  // the manifest's
    std::vector<std::pair<const char*, int>> files;  // name, the step it is of (the pickle's text says it)
    const char* pickle;                              // what the output's torch_state.pt holds
  };
  const ReshardCase cases[] = {
      {"a save that failed before its manifest", 3,
       {{ckpt::kTorchStatePickle, 3}, {ckpt::kTorchStateTensors, 3}, {ckpt::kTorchStatePickleStaged, 4},
        {ckpt::kTorchStateTensorsStaged, 4}},
       "pickle 3"},
      {"killed after the manifest, before the renames", 4,
       {{ckpt::kTorchStatePickle, 3}, {ckpt::kTorchStateTensors, 3}, {ckpt::kTorchStatePickleStaged, 4},
        {ckpt::kTorchStateTensorsStaged, 4}},
       "pickle 4"},
      {"killed between the renames", 4,
       {{ckpt::kTorchStatePickle, 4}, {ckpt::kTorchStateTensors, 3}, {ckpt::kTorchStateTensorsStaged, 4}},
       "pickle 4"},
  };
  for (const ReshardCase& c : cases) {
    TempDir from, out;
    for (const auto& [name, step] : c.files) {
      if (std::string(name).ends_with(".pt")) write(from.path + "/" + name, "pickle " + std::to_string(step));
      else tensors_of_step(from.path + "/" + name, step);
    }
    write(out.path + "/" + ckpt::kTorchStatePickleStaged, "an earlier save's");
    ckpt::commit_torch_state(out.path, ckpt::stage_torch_state(from.path, c.step, out.path));
    EXPECT_EQ(listing(out.path), both) << c.what;
    EXPECT_EQ(read(out.path + "/" + ckpt::kTorchStatePickle), c.pickle) << c.what;
    EXPECT_EQ(ckpt::read_torch_tensors(out.path + "/" + ckpt::kTorchStateTensors).step, c.step) << c.what;
  }
  // Before torch_state.safetensors (or `zerod ckpt import`'s): the pickle
  // alone; an earlier checkpoint's tensors file in the output goes.
  TempDir old_style, out;
  write(old_style.path + "/" + ckpt::kTorchStatePickle, "pickle 2");
  tensors_of_step(out.path + "/" + ckpt::kTorchStateTensors, 9);
  ckpt::commit_torch_state(out.path, ckpt::stage_torch_state(old_style.path, 2, out.path));
  EXPECT_EQ(listing(out.path), std::vector<std::string>{ckpt::kTorchStatePickle});
  // None (zd_model_save without zerod.torch): none left in the output.
  TempDir none;
  ckpt::commit_torch_state(out.path, ckpt::stage_torch_state(none.path, 2, out.path));
  EXPECT_TRUE(listing(out.path).empty());
}

// An export replaces only an earlier export: a file at its output that
// zerod's export did not write (a user's notes, the checkpoint's own
// manifest or shard, another tool's index where shards go) refuses it with
// nothing changed, and so does an output in the checkpoint's own directory
// (the single-file --to was renamed over whatever was there).
TEST(CheckpointExport, AnExportReplacesOnlyAnEarlierExport) {
  TempDir ck, out_dir;
  auto a = make_model(job(1), 2);
  train_and_save(*a, 2, ck.path);
  const ckpt::Source src(ck.path);
  auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  auto export_to = [&](const std::string& out, uint64_t max_shard_bytes = 0) {
    ckpt::ExportOptions o;
    o.out = out;
    o.max_shard_bytes = max_shard_bytes;
    return ckpt::export_safetensors(src, o);
  };
  auto refused = [&](const std::string& out, uint64_t max_shard_bytes, const std::string& why) {
    try {
      export_to(out, max_shard_bytes);
      ADD_FAILURE() << out << ": exported";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ZD_ERR_INVALID_ARGUMENT) << e.what();
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  std::vector<std::string> ck_files;
  for (const auto& e : fs::directory_iterator(ck.path)) ck_files.push_back(e.path().string());
  std::sort(ck_files.begin(), ck_files.end());
  std::vector<std::string> ck_bytes;
  for (const auto& f : ck_files) ck_bytes.push_back(read(f));

  // The checkpoint's own files, by any spelling, and a new name beside them.
  for (const std::string& out : {ck.path + "/" + ckpt::kManifestName, ck.path + "/./" + ckpt::shard_name(0, 1),
                                 ck.path + "/model.safetensors"})
    refused(out, 0, "is in the checkpoint's own directory");
  std::vector<std::string> after;
  for (const auto& e : fs::directory_iterator(ck.path)) after.push_back(e.path().string());
  std::sort(after.begin(), after.end());
  EXPECT_EQ(after, ck_files) << "nothing written there";
  for (size_t i = 0; i < ck_files.size(); ++i) EXPECT_EQ(read(ck_files[i]), ck_bytes[i]) << ck_files[i];
  EXPECT_NO_THROW(ckpt::Source again(ck.path)) << "the checkpoint still reads";

  // A user's file at the output, as one file and as a shard name; another
  // tool's index where a sharded export writes its own.
  const std::string notes = out_dir.path + "/notes.txt";
  std::ofstream(notes) << "important\n";
  refused(notes, 0, notes + " is there already and zerod's export did not write it");
  EXPECT_EQ(read(notes), "important\n");
  const std::string shard = out_dir.path + "/out-00001-of-00003.safetensors";
  std::ofstream(shard) << "not a tensor";
  refused(out_dir.path + "/out.safetensors", 2000, shard + " is there already");
  EXPECT_EQ(read(shard), "not a tensor");
  fs::remove(shard);
  const std::string index = out_dir.path + "/out.safetensors.index.json";
  std::ofstream(index) << "{\n  \"metadata\": {\n    \"total_size\": 5228\n  }\n}\n";
  refused(out_dir.path + "/out.safetensors", 2000, index + " is there already");
  fs::remove(index);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(out_dir.path)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"notes.txt"}) << "nothing written";

  // Over an earlier export, one file or shards: still done.
  const std::string out = out_dir.path + "/model.safetensors";
  EXPECT_NO_THROW(export_to(out));
  EXPECT_NO_THROW(export_to(out));
  EXPECT_NO_THROW(export_to(out, 2000));
  EXPECT_NO_THROW(export_to(out, 2000));
}

// One byte of a shard's records flipped: its checksum fails.
void flip(const std::string& file) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(40);
  const char c = static_cast<char>(f.get());
  f.seekp(40);
  f.put(static_cast<char>(c ^ 0x5a));
}

// A damaged newest snapshot is not the end: the job resumes from the newest
// one every rank can read and verify, says which it skipped and why, and
// ends where an uninterrupted run ends. Only when none verifies does
// finalize refuse, naming each.
TEST(Snapshots, ADamagedNewestFallsBackToTheNewestThatVerifies) {
  TempDir snaps;
  JobOptions o = job(1);
  o.snapshot.path = snaps.path;
  o.snapshot.every = 2;
  o.snapshot.keep = 3;
  auto ref = make_model(job(1), 2);
  train_both(*ref, 0, 9);
  {
    auto a = make_model(o, 2);
    train_both(*a, 0, 7);  // snapshots of steps 2, 4, 6; the process dies at 7
  }
  struct Damage {
    const char* what;
    std::function<void(const std::string& dir)> apply;
    const char* why;  // in the warning
  };
  const std::vector<Damage> damages = {
      // Only rank 1 reads that record: rank 0 would resume, and must not.
      {"a flipped byte in rank 1's shard", [&](const std::string& d) { flip(d + "/rank-00001-of-00002.zdshard"); },
       "rank 1: "},
      {"a shard cut short", [](const std::string& d) { fs::resize_file(d + "/rank-00000-of-00002.zdshard", 100); },
       "rank-00000-of-00002.zdshard"},
      {"a shard deleted", [](const std::string& d) { fs::remove(d + "/rank-00001-of-00002.zdshard"); },
       "rank-00001-of-00002.zdshard"},
      {"a garbled manifest",
       [](const std::string& d) { std::ofstream(d + "/zerod-checkpoint.txt") << "zerod-checkpoint 1\nstep x\n"; },
       "zerod-checkpoint.txt:2"},
  };
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.what);
    TempDir copy;
    fs::copy(snaps.path, copy.path, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
    const std::string newest = copy.path + "/step-000000000006";
    d.apply(newest);
    JobOptions oc = o;
    oc.snapshot.path = copy.path;
    auto b = make_model(oc, 2);
    ::testing::internal::CaptureStderr();
    run_ranks(2, [&](int rank) {
      std::vector<zd_param_id> ids;
      register_all(*b, rank, &ids);  // finalize resumes
    });
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(b->applied_steps(0), 4);
    EXPECT_EQ(b->applied_steps(1), 4);
    EXPECT_NE(err.find("snapshot " + newest + " skipped: "), std::string::npos) << err;
    EXPECT_NE(err.find(d.why), std::string::npos) << err;
    EXPECT_NE(err.find("resuming from " + copy.path + "/step-000000000004 at step 4"), std::string::npos) << err;
    run_ranks(2, [&](int rank) {
      std::vector<zd_param_id> ids = {0, 1, 2};
      train(*b, rank, ids, 4, 9);
    });
    EXPECT_EQ(whole(*b, 2).params, whole(*ref, 2).params);
    EXPECT_EQ(whole(*b, 2).slots, whole(*ref, 2).slots);
  }
  // None verifies: finalize refuses on every rank, naming each and why.
  for (const char* step : {"2", "4", "6"})
    flip(snaps.path + "/step-00000000000" + step + "/rank-00001-of-00002.zdshard");
  auto c = make_model(o, 2);
  std::vector<std::string> errors(2);
  ::testing::internal::CaptureStderr();
  run_ranks(2, [&](int rank) {
    try {
      std::vector<zd_param_id> ids;
      register_all(*c, rank, &ids);
      errors[static_cast<size_t>(rank)] = "finalize resumed";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ZD_ERR_IO) << e.what();
      errors[static_cast<size_t>(rank)] = e.what();
    }
  });
  ::testing::internal::GetCapturedStderr();
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("no snapshot under " + snaps.path + " can be resumed from"), std::string::npos) << e;
    for (const char* step : {"2", "4", "6"})
      EXPECT_NE(e.find(snaps.path + "/step-00000000000" + step + " (rank 1: "), std::string::npos) << e;
    EXPECT_NE(e.find("fails its checksum"), std::string::npos) << e;
  }
}

// What a rank's ledger holds, by tier and kind.
std::vector<uint64_t> held(const Model& m, int rank) {
  std::vector<uint64_t> bytes;
  for (int t = 0; t < ZD_TIER_COUNT; ++t)
    for (int kind = 0; kind < ZD_MEM_KIND_COUNT; ++kind)
      bytes.push_back(m.ledger(rank).current(static_cast<zd_tier>(t), static_cast<zd_mem_kind>(kind)));
  return bytes;
}

// finalize's error (its code ZD_ERR_IO), or "finalized".
std::string finalize_error(const std::function<void()>& finalize) {
  try {
    finalize();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ZD_ERR_IO) << e.what();
    return e.what();
  }
  return "finalized";
}

// A job of one rank whose snapshots cannot be resumed from: its finalize
// fails after the rank's state was placed, and gives back all it took, so
// the trainer may move them aside and finalize the same model again. The
// retry holds the state once (before, it allocated all of it again beside
// what the failed attempt kept: twice the ledger, and the node's memory
// charged twice), starts from the registered values and trains as a model
// that never failed. A retry refused again names its own reasons, not the
// earlier attempt's.
TEST(Snapshots, AFinalizeThatCannotResumeIsRetriedHoldingTheStateOnce) {
  TempDir snaps;
  JobOptions o = job(3);
  o.snapshot.path = snaps.path;
  o.snapshot.every = 2;
  {
    auto a = make_model(o, 1);
    std::vector<zd_param_id> ids;
    register_all(*a, 0, &ids);
    train(*a, 0, ids, 0, 5);  // snapshots of steps 2 and 4; the process dies at 5
  }
  const std::vector<std::string> steps = {snaps.path + "/step-000000000002", snaps.path + "/step-000000000004"};
  for (const std::string& d : steps) flip(d + "/rank-00000-of-00001.zdshard");
  auto ref = make_model(job(3), 1);
  const std::vector<uint64_t> nothing = held(*ref, 0);
  std::vector<zd_param_id> ref_ids;
  register_all(*ref, 0, &ref_ids);
  const Saved initial = whole(*ref, 1);

  auto b = make_model(o, 1);
  std::vector<zd_param_id> ids;
  ::testing::internal::CaptureStderr();
  const std::string damaged = finalize_error([&] { register_all(*b, 0, &ids); });
  EXPECT_NE(damaged.find("no snapshot under " + snaps.path + " can be resumed from"), std::string::npos) << damaged;
  EXPECT_NE(damaged.find("fails its checksum"), std::string::npos) << damaged;
  EXPECT_EQ(held(*b, 0), nothing) << "the failed finalize kept what it allocated";
  for (const std::string& d : steps) std::ofstream(d + "/zerod-checkpoint.txt") << "zerod-checkpoint 1\nstep x\n";
  const std::string garbled = finalize_error([&] { b->finalize(0); });
  EXPECT_NE(garbled.find("zerod-checkpoint.txt:2"), std::string::npos) << garbled;
  EXPECT_EQ(garbled.find("fails its checksum"), std::string::npos) << "the earlier attempt's reason: " << garbled;
  EXPECT_EQ(held(*b, 0), nothing);
  ::testing::internal::GetCapturedStderr();

  for (const std::string& d : steps) fs::remove_all(d);
  ASSERT_EQ(finalize_error([&] { b->finalize(0); }), "finalized");
  EXPECT_EQ(b->applied_steps(0), 0);
  EXPECT_EQ(held(*b, 0), held(*ref, 0)) << "the retry holds the state twice";
  EXPECT_EQ(whole(*b, 1).params, initial.params);
  train(*b, 0, ids, 0, 3);
  train(*ref, 0, ref_ids, 0, 3);
  EXPECT_EQ(whole(*b, 1).params, whole(*ref, 1).params);
  EXPECT_EQ(whole(*b, 1).slots, whole(*ref, 1).slots);
}

// Every rank of a job of several fails the resume together (the ranks
// agree on it), and each gives back what it took; their retry is refused,
// as no rank holds the dropped initial values whole.
TEST(Snapshots, AFinalizeThatCannotResumeGivesBackWhatEveryRankTook) {
  TempDir snaps;
  JobOptions o = job(1);
  o.snapshot.path = snaps.path;
  o.snapshot.every = 2;
  {
    auto a = make_model(o, 2);
    train_both(*a, 0, 3);  // the snapshot of step 2; the process dies at 3
  }
  flip(snaps.path + "/step-000000000002/rank-00001-of-00002.zdshard");
  auto b = make_model(o, 2);
  const std::vector<std::vector<uint64_t>> nothing = {held(*b, 0), held(*b, 1)};
  std::vector<std::string> errors(2);
  ::testing::internal::CaptureStderr();
  run_ranks(2, [&](int rank) {
    std::vector<zd_param_id> ids;
    errors[static_cast<size_t>(rank)] = finalize_error([&] { register_all(*b, rank, &ids); });
  });
  ::testing::internal::GetCapturedStderr();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NE(errors[static_cast<size_t>(rank)].find("can be resumed from"), std::string::npos)
        << errors[static_cast<size_t>(rank)];
    EXPECT_EQ(held(*b, rank), nothing[static_cast<size_t>(rank)]) << "rank " << rank << " kept what it allocated";
  }
  run_ranks(2, [&](int rank) {
    try {
      b->finalize(rank);
      ADD_FAILURE() << "rank " << rank << " finalized without its initial values";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ZD_ERR_INVALID_STATE) << e.what();
      EXPECT_NE(std::string(e.what()).find("cannot put them back"), std::string::npos) << e.what();
    }
  });
}

// The cpu device of one rank whose copies into its pool fail from the
// `fail_at`-th on (0: none fails), as a write to a device that broke would;
// it counts them, so that a test finds the copy it fails.
class FailingCopiesIn final : public Device {
 public:
  FailingCopiesIn(std::unique_ptr<Device> inner, uint64_t fail_at, std::atomic<uint64_t>* copies)
      : d_(std::move(inner)), fail_at_(fail_at), copies_(copies) {}

  void copy_to_device(void* dst, const void* src, uint64_t bytes) override {
    const uint64_t n = ++*copies_;
    if (fail_at_ != 0 && n >= fail_at_)
      throw Error(ZD_ERR_IO, "the injected failure of copy #" + std::to_string(n) + " into the pool");
    d_->copy_to_device(dst, src, bytes);
  }
  uint64_t upload(void* dst, const void* src, uint64_t bytes) override {
    copy_to_device(dst, src, bytes);
    return 0;
  }

  const char* name() const override { return d_->name(); }
  int32_t dlpack_type() const override { return d_->dlpack_type(); }
  int32_t ordinal() const override { return d_->ordinal(); }
  std::string describe() const override { return d_->describe(); }
  bool host_addressable() const override { return d_->host_addressable(); }
  bool has_streams() const override { return d_->has_streams(); }
  Block allocate(uint64_t bytes, zd_mem_kind kind, const std::string& what) override {
    return d_->allocate(bytes, kind, what);
  }
  Block allocate_for_overwrite(uint64_t bytes, zd_mem_kind kind, const std::string& what) override {
    return d_->allocate_for_overwrite(bytes, kind, what);
  }
  void release(const Block& block, zd_mem_kind kind) override { d_->release(block, kind); }
  void step_ended() override { d_->step_ended(); }
  uint64_t pool_resident_bytes() const override { return d_->pool_resident_bytes(); }
  uint64_t block_align() const override { return d_->block_align(); }
  std::vector<PoolExport> exports() const override { return d_->exports(); }
  void register_host(void* ptr, uint64_t bytes) override { d_->register_host(ptr, bytes); }
  void unregister_host(void* ptr) override { d_->unregister_host(ptr); }
  void copy_to_host(void* dst, const void* src, uint64_t bytes) override { d_->copy_to_host(dst, src, bytes); }
  void copy_within(void* dst, const void* src, uint64_t bytes) override { d_->copy_within(dst, src, bytes); }
  void zero(void* dst, uint64_t bytes) override { d_->zero(dst, bytes); }
  void accumulate(const void* src, zd_dtype src_dt, void* dst, zd_dtype dst_dt, uint64_t n) override {
    d_->accumulate(src, src_dt, dst, dst_dt, n);
  }
  void accumulate_scaled(const void* src, zd_dtype src_dt, void* dst, zd_dtype dst_dt, uint64_t n,
                         float factor) override {
    d_->accumulate_scaled(src, src_dt, dst, dst_dt, n, factor);
  }
  void scale(void* p, zd_dtype dt, uint64_t n, float factor) override { d_->scale(p, dt, n, factor); }
  GradStats grad_stats(const std::vector<GradSpan>& spans) override { return d_->grad_stats(spans); }
  bool runs(const OptimizerInstance& opt) const override { return d_->runs(opt); }
  void optimizer_update(const OptimizerInstance& opt, const zd_optimizer_update& u, bool zero_grad) override {
    d_->optimizer_update(opt, u, zero_grad);
  }
  uint64_t download(void* dst, const void* src, uint64_t bytes, uint64_t after) override {
    return d_->download(dst, src, bytes, after);
  }
  uint64_t mark() override { return d_->mark(); }
  void upload_after_stream() override { d_->upload_after_stream(); }
  void transfer_wait(uint64_t ticket) override { d_->transfer_wait(ticket); }
  void stream_waits(uint64_t ticket) override { d_->stream_waits(ticket); }
  void wait_peer_mark(const Device& peer, uint64_t mark) override { d_->wait_peer_mark(peer, mark); }
  void copy_peer(void* dst, const Device& peer, const void* src, uint64_t bytes) override {
    d_->copy_peer(dst, peer, src, bytes);
  }
  void sum_peers(void* dst, zd_dtype dt, uint64_t n, const std::vector<PeerSpan>& srcs) override {
    d_->sum_peers(dst, dt, n, srcs);
  }
  const Device& unwrapped() const override { return d_->unwrapped(); }
  void set_trainer_stream(void* stream) override { d_->set_trainer_stream(stream); }
  void trainer_waits() override { d_->trainer_waits(); }
  void wait_for_trainer() override { d_->wait_for_trainer(); }
  void synchronize() override { d_->synchronize(); }

 private:
  std::unique_ptr<Device> d_;
  const uint64_t fail_at_;
  std::atomic<uint64_t>* copies_;
};

// Rank 1 on a FailingCopiesIn (failing from its fail_at-th copy in) that
// counts in *copies; rank 0 on the plain cpu device.
JobOptions with_rank_1_failing_copies(JobOptions o, uint64_t fail_at, std::atomic<uint64_t>* copies) {
  o.device_factory = [fail_at, copies](const std::string& kind, MemoryLedger& ledger, Workers& workers,
                                       int local_rank, const std::string& name) {
    std::unique_ptr<Device> d = open_device(kind, ledger, workers, local_rank, name);
    if (local_rank != 1) return d;
    return std::unique_ptr<Device>(std::make_unique<FailingCopiesIn>(std::move(d), fail_at, copies));
  };
  return o;
}

// A stage-3 job taking snapshots into `snaps` every 2 steps, whose process
// died at step 3 (its snapshot of step 2 is there).
JobOptions died_after_a_snapshot(const std::string& snaps) {
  JobOptions o = job(3);
  o.snapshot.path = snaps;
  o.snapshot.every = 2;
  auto a = make_model(o, 2);
  train_both(*a, 0, 3);
  return o;
}

// The copies into rank 1's pool a finalize of job o makes before any resume
// (over `none`, a path with no snapshot): the next one is the resume's
// first write.
uint64_t copies_before_resume(JobOptions o, const std::string& none) {
  std::atomic<uint64_t> copies{0};
  o.snapshot.path = none;
  auto counted = make_model(with_rank_1_failing_copies(o, 0, &copies), 2);
  train_both(*counted, 0, 0);
  return copies.load();
}

// Stage 3 with both ranks in this process on the local comm plugin: a
// rank's gathers copy the other's shards themselves (the shard board). Rank
// 1's resume fails after the ranks agreed on the snapshot, while it writes
// it into its state; rank 0's resume ends well, and nothing collective is
// left in its finalize to tell it. Rank 1 released its state when it gave
// up, so rank 0's next gather copied rank 1's shards out of freed memory.
// Now rank 1 breaks the job first and keeps its state (which the other
// ranks' gathers still point at) until the model goes: rank 0's next call
// fails, naming rank 1's finalize and why.
TEST(Snapshots, ARankWhoseResumeFailsAloneBreaksTheJobBeforeItsShardsGo) {
  TempDir snaps, none;
  const JobOptions o = died_after_a_snapshot(snaps.path);
  ASSERT_EQ(o.zero_hparams, (std::vector<std::pair<std::string, double>>{{"param_persistence_threshold", 0}}));
  const uint64_t before_resume = copies_before_resume(o, none.path);
  std::atomic<uint64_t> copies{0};
  auto b = make_model(with_rank_1_failing_copies(o, before_resume + 1, &copies), 2);
  const std::vector<uint64_t> nothing = held(*b, 1);
  std::atomic<bool> rank_1_returned{false};
  std::vector<std::string> errors(2, "no error");
  ::testing::internal::CaptureStderr();
  run_ranks(2, [&](int rank) {
    std::string& error = errors[static_cast<size_t>(rank)];
    std::vector<zd_param_id> ids;
    try {
      register_all(*b, rank, &ids);
      if (rank == 0) {
        // Once rank 1's finalize has returned: all it gave back is gone.
        while (!rank_1_returned.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        b->forward_begin(rank, 0);
      }
    } catch (const Error& e) {
      error = e.what();
    }
    if (rank == 1) rank_1_returned.store(true);
  });
  ::testing::internal::GetCapturedStderr();
  ASSERT_NE(errors[1].find("the injected failure of copy #" + std::to_string(before_resume + 1)),
            std::string::npos)
      << errors[1];
  EXPECT_NE(errors[0].find("rank 1's zd_model_finalize failed"), std::string::npos)
      << "rank 0 went on over the shards rank 1 released: " << errors[0];
  EXPECT_NE(errors[0].find("the injected failure"), std::string::npos) << errors[0];
  EXPECT_NE(held(*b, 1), nothing) << "rank 1 gave back the state rank 0's gathers are pointed at";
}

std::unique_ptr<CommInstance> local_comm(int world) {
  auto plugin = Plugin::load(ZD_PLUGIN_COMM, "local", {ZEROD_PLUGIN_DIR});
  return CommInstance::create(plugin, plugin->default_values(), world);
}

// What daemon.keep_state resumed after such a finalize: rank 0's ended
// well, so the model was finalized, and a lost rank left it for a restart,
// which rebuilt the working copies from rank 1's masters, part the
// snapshot's and part its initial values, and trained on. (Where nothing
// points other ranks at its state it had given it back, and the rebuild
// read released buffers.) The resume stopped part-way like a load: no
// restart resumes it, and the daemon keeps no such model.
TEST(Snapshots, AResumeThatFailedPartWayOnOneRankIsNotResumedByARestart) {
  TempDir snaps, none;
  const JobOptions o = died_after_a_snapshot(snaps.path);
  const uint64_t before_resume = copies_before_resume(o, none.path);
  std::atomic<uint64_t> copies{0};
  auto b = make_model(with_rank_1_failing_copies(o, before_resume + 1, &copies), 2);
  std::vector<std::string> errors(2, "no error");
  ::testing::internal::CaptureStderr();
  run_ranks(2, [&](int rank) {
    std::vector<zd_param_id> ids;
    try {
      register_all(*b, rank, &ids);
    } catch (const Error& e) {
      errors[static_cast<size_t>(rank)] = e.what();
    }
  });
  ::testing::internal::GetCapturedStderr();
  ASSERT_NE(errors[1].find("the injected failure"), std::string::npos) << errors[1];
  const std::optional<Error> half = b->half_applied_step();
  ASSERT_TRUE(half.has_value()) << "a restart may resume rank 1's half-resumed state";
  EXPECT_NE(std::string(half->what()).find("rank 1's zd_model_finalize failed part-way"), std::string::npos)
      << half->what();
  try {
    b->recover(local_comm(2));
    FAIL() << "the half-resumed model was recovered";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be resumed"), std::string::npos) << e.what();
  }
}

}  // namespace

namespace {

// A checkpoint of NVMe-resident state streams from its files: the process
// does not grow by anything like the state it writes.
TEST(CheckpointMemory, NvmeStateIsNotStagedInRam) {
#if defined(__SANITIZE_ADDRESS__)
  // ASan holds freed blocks in its quarantine (256 MiB by default), so the
  // peak RSS counts every streaming buffer ever freed, not what the engine
  // holds at once. The default build runs the measurement.
  GTEST_SKIP() << "peak RSS is not a measure of live memory under AddressSanitizer (its quarantine)";
#endif
  TempDir nvme, out;
  JobOptions o = job(0);
  o.offload.optimizer = ZD_TIER_NVME;
  o.offload.nvme_paths = {nvme.path};
  auto m = make_model(o, 1);
  const int64_t n = int64_t{24} << 20;  // 24M parameters: 288 MiB of master and moments on disk
  m->register_param(0, "big", "m", ZD_DTYPE_F32, {n}, nullptr, 0);
  m->finalize(0);
  auto rss_kib = [] {
    struct rusage u {};
    getrusage(RUSAGE_SELF, &u);
    return u.ru_maxrss;
  };
  const long before = rss_kib();
  m->save_checkpoint(0, out.path);
  const long grew_mib = (rss_kib() - before) / 1024;
  std::printf("peak RSS grew by %ld MiB writing 288 MiB of NVMe-resident state\n", grew_mib);
  EXPECT_LT(grew_mib, 48) << "the state was staged in memory";
  EXPECT_TRUE(fs::exists(out.path + "/zerod-checkpoint.txt"));
}

}  // namespace

namespace {

// Stage 3 with both ranks in this process on the local comm plugin: a
// rank's gathers copy the other's shards themselves (the shard board). Rank
// 1's zd_model_load fails part-way, after the ranks agreed that every rank
// can read the checkpoint, while it writes it into its state (a copy into
// its pool fails); rank 0's load ends well. Rank 1's write phase ended all
// the same and nothing collective was left in rank 0's load: rank 0's load
// succeeded and its next forward gathered rank 1's shards, part the
// checkpoint's and part the trained step's, with the job healthy. Now rank
// 1 breaks the job before its write phase ends, and every rank's load fails
// with rank 1's reason.
TEST(CheckpointDamage, ALoadThatFailsPartWayOnOneRankFailsOnEveryRank) {
  TempDir dir;
  JobOptions o = job(3);
  ASSERT_EQ(o.zero_hparams, (std::vector<std::pair<std::string, double>>{{"param_persistence_threshold", 0}}));
  // No copy fails until rank 1's counter is moved up to it, just before its load.
  constexpr uint64_t kArmed = uint64_t{1} << 40;
  std::atomic<uint64_t> copies{0};
  auto a = make_model(with_rank_1_failing_copies(o, kArmed, &copies), 2);
  std::vector<std::string> load_errors(2, "no error");
  std::string forward_error = "no error";
  std::atomic<int> loads_returned{0};
  ::testing::internal::CaptureStderr();
  run_ranks(2, [&](int rank) {
    std::vector<zd_param_id> ids;
    register_all(*a, rank, &ids);
    train(*a, rank, ids, 0, 2);
    a->save_checkpoint(rank, dir.path);
    train(*a, rank, ids, 2, 3);
    if (rank == 1) copies.store(kArmed - 1);  // the load's first copy into rank 1's pool fails
    try {
      a->load_checkpoint(rank, dir.path);
    } catch (const Error& e) {
      load_errors[static_cast<size_t>(rank)] = e.what();
    }
    loads_returned.fetch_add(1);
    if (rank != 0) return;
    // Once rank 1's load has returned (its write phase over, one way or
    // the other): a forward's begin copies rank 1's shards at once.
    while (loads_returned.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    try {
      a->forward_begin(rank, 0);
    } catch (const Error& e) {
      forward_error = e.what();
    }
  });
  ::testing::internal::GetCapturedStderr();
  ASSERT_NE(load_errors[1].find("the injected failure"), std::string::npos) << load_errors[1];
  EXPECT_NE(load_errors[1].find("rank 1's zd_model_load failed part-way"), std::string::npos) << load_errors[1];
  EXPECT_NE(load_errors[0].find("rank 1's zd_model_load failed part-way"), std::string::npos)
      << "rank 0's load succeeded while rank 1's failed: " << load_errors[0];
  EXPECT_NE(load_errors[0].find("the injected failure"), std::string::npos) << load_errors[0];
  EXPECT_NE(forward_error.find("rank 1's zd_model_load failed part-way"), std::string::npos)
      << "rank 0 ran a forward on rank 1's half-loaded shards: " << forward_error;
  // No restart may resume the mix either (Model::recover refuses it).
  EXPECT_TRUE(a->half_applied_step().has_value());
}

// Stage 3 on the shard board, as above: rank 1's zd_param_write fails
// part-way (a copy into its pool), rank 0's ends well, and nothing
// collective follows a write. Rank 1's write phase ended all the same, so
// rank 0's next forward gathered rank 1's shard of the old value beside
// its own of the new one, with the job healthy. Now rank 1 breaks the job
// before its phase ends: rank 0's next call fails with rank 1's reason,
// and no restart resumes the mix.
TEST(CheckpointDamage, AParamWriteThatFailsPartWayOnOneRankFailsTheOthersNextCall) {
  constexpr uint64_t kArmed = uint64_t{1} << 40;
  std::atomic<uint64_t> copies{0};
  auto a = make_model(with_rank_1_failing_copies(job(3), kArmed, &copies), 2);
  std::vector<std::string> write_errors(2, "no error");
  std::string forward_error = "no error";
  std::atomic<int> writes_returned{0};
  ::testing::internal::CaptureStderr();
  run_ranks(2, [&](int rank) {
    std::vector<zd_param_id> ids;
    register_all(*a, rank, &ids);
    train(*a, rank, ids, 0, 1);
    const std::vector<float> value(static_cast<size_t>(kSizes[0]), 0.25f);
    if (rank == 1) copies.store(kArmed - 1);  // the write's first copy into rank 1's pool fails
    try {
      a->write_param(rank, ids[0], ZD_DTYPE_F32, value.data(), value.size() * 4);
    } catch (const Error& e) {
      write_errors[static_cast<size_t>(rank)] = e.what();
    }
    writes_returned.fetch_add(1);
    if (rank != 0) return;
    // Once rank 1's write has returned: a forward's begin copies its shard at once.
    while (writes_returned.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    try {
      a->forward_begin(rank, 0);
    } catch (const Error& e) {
      forward_error = e.what();
    }
  });
  ::testing::internal::GetCapturedStderr();
  ASSERT_NE(write_errors[1].find("the injected failure"), std::string::npos) << write_errors[1];
  EXPECT_NE(write_errors[1].find("rank 1's zd_param_write of 'w0' stopped part-way"), std::string::npos)
      << write_errors[1];
  EXPECT_NE(forward_error.find("rank 1's zd_param_write of 'w0' stopped part-way"), std::string::npos)
      << "rank 0 gathered rank 1's shard of a write that failed: " << forward_error;
  EXPECT_NE(forward_error.find("the injected failure"), std::string::npos) << forward_error;
  EXPECT_TRUE(a->half_applied_step().has_value());
}

// A restart's rebuild of the working copies from the masters (what the
// re-attached ranks' zd_model_finalize does in a daemon that kept the
// model) fails on rank 1 (a copy into its pool). At stage 1 rank 0 waited
// for it in the all-gather after the rebuild until comm.timeout; at stage
// 3 on the shard board nothing collective follows, and rank 0's next
// forward gathered rank 1's half-rebuilt shards with the job healthy. Now
// rank 1 breaks the job before its write phase ends, and rank 0 fails at
// once with its reason. The masters were only read: the model is not half
// applied, and the next restart rebuilds it and trains on.
TEST(CheckpointDamage, ARebuildThatFailsOnOneRankFailsTheOthersAtOnceAndTheNextRestartRebuilds) {
  for (const int stage : {1, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    JobOptions o = job(stage);
    o.timeout_s = 20;
    constexpr uint64_t kArmed = uint64_t{1} << 40;
    std::atomic<uint64_t> copies{0};
    auto a = make_model(with_rank_1_failing_copies(o, kArmed, &copies), 2);
    std::vector<std::vector<zd_param_id>> ids(2);
    run_ranks(2, [&](int rank) {
      register_all(*a, rank, &ids[static_cast<size_t>(rank)]);
      train(*a, rank, ids[static_cast<size_t>(rank)], 0, 2);
    });
    const Saved trained = whole(*a, 2);
    a->rank_lost(1, "its process exited (signal 9)");
    a->recover(local_comm(2));
    copies.store(kArmed - 1);  // the rebuild's first copy into rank 1's pool fails
    std::vector<std::string> errors(2, "no error");
    std::vector<double> took(2, 0.0);
    ::testing::internal::CaptureStderr();
    run_ranks(2, [&](int rank) {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        a->rebuild_working_copies(rank);
        a->forward_begin(rank, 0);
      } catch (const Error& e) {
        errors[static_cast<size_t>(rank)] = e.what();
      }
      took[static_cast<size_t>(rank)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
    ::testing::internal::GetCapturedStderr();
    for (size_t r = 0; r < 2; ++r) {
      EXPECT_NE(errors[r].find("rank 1's rebuild of its working copies"), std::string::npos)
          << "rank " << r << ": " << errors[r];
      EXPECT_NE(errors[r].find("the injected failure"), std::string::npos) << "rank " << r << ": " << errors[r];
      EXPECT_LT(took[r], 10.0) << "rank " << r << " waited for the comm timeout: " << errors[r];
    }
    EXPECT_FALSE(a->half_applied_step().has_value());
    copies.store(0);  // rank 1's device works again
    a->recover(local_comm(2));
    run_ranks(2, [&](int rank) { a->rebuild_working_copies(rank); });
    EXPECT_EQ(whole(*a, 2).params, trained.params) << "the masters changed";
    run_ranks(2, [&](int rank) { train(*a, rank, ids[static_cast<size_t>(rank)], 2, 3); });
    EXPECT_EQ(a->broken_reason(), "");
  }
}

}  // namespace
