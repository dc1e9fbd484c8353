// Which models a daemon keeps for a restart (daemon.keep_state): a model
// whose rank was lost (its connection ended without zd_model_destroy) after
// finalize, so that the restarted ranks resume it; never one every rank
// destroyed (a new run of the same script starts from its own initial
// values, not from the last run's weights), never one that was not
// finalized, never one whose optimizer step stopped part-way (its restart
// is told why, once), and under `zerod serve --jobs` never one whose job
// key names a single launch, which no restart can name again. What is not
// kept gives its host memory back.
#include "daemon_client.h"
#include "server.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace zerod;

namespace {

const char* const kKeepingJob = "return { optimizer = { type = 'sgd' }, daemon = { keep_state = true } }";
const std::vector<float> kInitial{1, 2, 3, 4};
const std::vector<float> kWritten{7, 7, 7, 7};

bool eventually(const std::function<bool()>& what) {
  for (int i = 0; i < 250; ++i) {
    if (what()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return what();
}

struct KeptModels : ::testing::Test {
  void start(bool multi_job) {
    server::ServerOptions o;
    o.world_size = 1;
    o.multi_job = multi_job;
    o.host_memory = uint64_t{1} << 30;
    o.reclaim_wait_ms = 5000;  // a rank's next connection waits for its last one's end
    srv = std::make_unique<server::Server>(o);
    srv->start();
  }
  void SetUp() override { start(false); }
  void TearDown() override { srv->stop(); }

  // One run of the job on a new connection: registers p0 with kInitial,
  // finalizes, and returns p0's values then; writes kWritten when asked.
  // `end` says how the run ends: "destroy", or "" (the connection closes
  // with the model in it: the rank is lost).
  std::vector<float> run(const std::string& end, bool write = true, const std::string& key = "",
                         const std::string& launch_id = "") {
    test::DaemonClient c(srv->socket_path());
    v1::Reply r = c.hello("rank", 0, 1, key, launch_id);
    EXPECT_FALSE(r.has_error()) << r.error().message();
    const int model = c.create(kKeepingJob);
    r = c.register_param(model, "p0", "m0", 4, &kInitial);
    EXPECT_FALSE(r.has_error()) << r.error().message();
    r = c.finalize(model);
    EXPECT_FALSE(r.has_error()) << r.error().message();
    std::vector<float> got = c.read(model, 0, 4);
    if (write) {
      r = c.write(model, 0, kWritten);
      EXPECT_FALSE(r.has_error()) << r.error().message();
    }
    if (end == "destroy") {
      r = c.destroy(model);
      EXPECT_FALSE(r.has_error()) << r.error().message();
    }
    return got;
  }
  // Every rank's connection is seen closed.
  bool nobody_attached() {
    for (const auto& m : srv->models())
      if (m->anyone_attached()) return false;
    return true;
  }

  std::unique_ptr<server::Server> srv;
};

}  // namespace

TEST_F(KeptModels, AModelEveryRankDestroyedIsForgottenAndTheNextRunStartsFromItsOwnValues) {
  EXPECT_EQ(run("destroy"), kInitial);
  EXPECT_TRUE(srv->models().empty()) << "a model its ranks destroyed was kept";
  // Before, this run re-attached to the last one's model and read 7 7 7 7.
  EXPECT_EQ(run("destroy"), kInitial);
}

TEST_F(KeptModels, ALostRankLeavesTheModelForARestartThatResumesIt) {
  EXPECT_EQ(run(""), kInitial);
  ASSERT_TRUE(eventually([&] { return nobody_attached(); }));
  ASSERT_EQ(srv->models().size(), 1u) << "the model of a lost rank was not kept";
  // The restart re-attaches (its initial values are not applied) and ends
  // by destroying the model: nothing is kept after that.
  EXPECT_EQ(run("destroy", false), kWritten);
  EXPECT_TRUE(srv->models().empty());
  EXPECT_EQ(run("destroy"), kInitial);
}

// The lr the trainer set (zd_model_set_lr) is kept with the model, as the
// step is: the restart that resumes it trains on at that lr, not the job's,
// until it sets another.
TEST_F(KeptModels, ARestartResumesTheLrTheTrainerSet) {
  {
    test::DaemonClient c(srv->socket_path());
    ASSERT_FALSE(c.hello().has_error());
    const int model = c.create(kKeepingJob);
    ASSERT_FALSE(c.register_param(model, "p0", "m0", 4, &kInitial).has_error());
    ASSERT_FALSE(c.finalize(model).has_error());
    calls::Args a;
    a.op = calls::Op::set_lr;
    a.value = 0.25;
    ASSERT_EQ(c.call_record(model, a).status, ZD_OK);
  }  // the rank is lost: the model is kept
  ASSERT_TRUE(eventually([&] { return nobody_attached(); }));
  ASSERT_EQ(srv->models().size(), 1u);
  test::DaemonClient c(srv->socket_path());
  ASSERT_FALSE(c.hello().has_error());
  const int model = c.create(kKeepingJob);
  ASSERT_FALSE(c.register_param(model, "p0", "m0", 4, &kInitial).has_error());
  ASSERT_FALSE(c.finalize(model).has_error());
  ASSERT_FALSE(c.call(model, v1::ModelCall::BACKWARD_BEGIN).has_error());
  ASSERT_FALSE(c.call(model, v1::ModelCall::BACKWARD_END).has_error());
  const v1::Reply r = c.call(model, v1::ModelCall::STEP);
  ASSERT_FALSE(r.has_error()) << r.error().message();
  EXPECT_EQ(r.call().step().lr(), 0.25) << "the restart applied the job's lr";
  ASSERT_FALSE(c.destroy(model).has_error());
}

TEST_F(KeptModels, AModelNeverFinalizedIsNotKept) {
  {
    test::DaemonClient c(srv->socket_path());
    ASSERT_FALSE(c.hello().has_error());
    const int model = c.create(kKeepingJob);
    ASSERT_FALSE(c.register_param(model, "p0", "m0", 4, &kInitial).has_error());
  }  // lost before finalize: nothing a restart could resume
  EXPECT_TRUE(eventually([&] { return srv->models().empty(); })) << "a model never finalized was kept";
}

// The kept model's comm is replaced when the restarted ranks resume it
// (Model::recover), while an observer's status reads its figures on
// another thread: they must not read the comm being replaced.
TEST_F(KeptModels, RestartsWhileAnObserverReadsTheStatus) {
  std::atomic<bool> done{false};
  std::string observer_error;
  std::thread observer([&] {
    try {
      test::DaemonClient obs(srv->socket_path());
      if (obs.hello("observer").has_error()) throw std::runtime_error("the observer's hello failed");
      while (!done.load())
        if (const v1::Reply r = obs.status(); r.has_error()) throw std::runtime_error(r.error().message());
    } catch (const std::exception& e) {
      observer_error = e.what();
    }
  });
  EXPECT_EQ(run(""), kInitial);
  for (int i = 0; i < 20 && !HasFailure(); ++i) {
    ASSERT_TRUE(eventually([&] { return nobody_attached(); }));
    EXPECT_EQ(run("", false), kWritten) << "restart " << i;
  }
  done.store(true);
  observer.join();
  EXPECT_EQ(observer_error, "");
}

// A step whose NVMe read came back short stopped part-way: some of the
// state has the update, the rest not. Its trainer dies of the error (lost),
// but the model is not kept: a restart that resumed it would apply the
// update twice to what it reached. The restarted rank is told so, with the
// step's error, once; its next create starts afresh.
namespace {

// A keeping job with its masters and optimizer state on NVMe, in a scratch
// directory removed with everything in it.
struct NvmeJob {
  NvmeJob() {
    char tmpl[] = "/tmp/zerod-kept-nvme-XXXXXX";
    dir = mkdtemp(tmpl);
    script = "return { optimizer = { type = 'adamw' }, offload = { optimizer = 'nvme', nvme_path = '" + dir +
             "' }, daemon = { keep_state = true } }";
  }
  ~NvmeJob() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  // The disk goes bad under the store (the daemon's, in this process): its
  // reads come back short, and so does every write, which reads its aligned
  // blocks first.
  void cut_the_stores_short() const {
    int stores = 0;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
      std::error_code ec;
      if (std::filesystem::read_symlink(e.path(), ec).string().rfind(dir + "/", 0) != 0 || ec) continue;
      ASSERT_EQ(ftruncate(std::stoi(e.path().filename().string()), 0), 0);
      ++stores;
    }
    ASSERT_GT(stores, 0) << "found no store under " << dir;
  }
  std::string dir;
  std::string script;
};

// A model of `job` whose state stopped part-way (the run's last call
// failed so) was not kept: the restart's create (on the daemon at `socket`) fails, once, saying why
// (`what` stopped part-way, the disk's short read, how to resume), and the
// create after it makes a new model from the trainer's own values.
void expect_the_restart_told_why(const std::string& socket, const std::string& job, const std::string& what) {
  test::DaemonClient c(socket);
  ASSERT_FALSE(c.hello().has_error());
  const v1::Reply r = c.create_reply(job);
  ASSERT_TRUE(r.has_error()) << "the restart was not told that the model it expects is gone";
  const std::string& m = r.error().message();
  EXPECT_EQ(r.error().status(), ZD_ERR_IO) << m;
  EXPECT_NE(m.find("short read"), std::string::npos) << m;
  EXPECT_NE(m.find(what + " stopped part-way"), std::string::npos) << m;
  EXPECT_NE(m.find("resume from a checkpoint"), std::string::npos) << m;
  EXPECT_NE(m.find("snapshot"), std::string::npos) << m;
  // Told once: the next create of the script makes a new model, from the
  // trainer's own values.
  const int model = c.create(job);
  ASSERT_GE(model, 0) << "the refusal was given twice";
  ASSERT_FALSE(c.register_param(model, "p0", "m0", 4, &kInitial).has_error());
  ASSERT_FALSE(c.finalize(model).has_error());
  EXPECT_EQ(c.read(model, 0, 4), kInitial);
  ASSERT_FALSE(c.destroy(model).has_error());
}

}  // namespace

TEST_F(KeptModels, AModelWhoseStepStoppedPartWayIsNotKeptAndTheRestartIsToldWhy) {
  const NvmeJob job;
  {
    test::DaemonClient c(srv->socket_path());
    ASSERT_FALSE(c.hello().has_error());
    const int model = c.create(job.script);
    ASSERT_FALSE(c.register_param(model, "p0", "m0", 1 << 14, nullptr).has_error());
    ASSERT_FALSE(c.finalize(model).has_error());
    job.cut_the_stores_short();
    ASSERT_FALSE(c.call(model, v1::ModelCall::BACKWARD_BEGIN).has_error());
    ASSERT_FALSE(c.call(model, v1::ModelCall::BACKWARD_END).has_error());
    const v1::Reply r = c.call(model, v1::ModelCall::STEP);
    ASSERT_TRUE(r.has_error()) << "the step read a store cut short";
    EXPECT_NE(r.error().message().find("stopped part-way"), std::string::npos) << r.error().message();
  }  // the trainer dies of it: the rank is lost
  ASSERT_TRUE(eventually([&] { return nobody_attached(); }));
  EXPECT_TRUE(eventually([&] { return srv->models().empty(); })) << "a model with a half-applied step was kept";
  expect_the_restart_told_why(srv->socket_path(), job.script, "the optimizer step 1");
}

// A zd_param_write whose disk failed part-way left the parameter part the
// value written, part what it was; the call failed, the model stayed
// healthy, and a lost rank left it for a restart, which re-attached to
// the mix. Now the write stops like a step: the model is not kept.
TEST_F(KeptModels, AModelWhoseParamWriteStoppedPartWayIsNotKeptAndTheRestartIsToldWhy) {
  const NvmeJob job;
  {
    test::DaemonClient c(srv->socket_path());
    ASSERT_FALSE(c.hello().has_error());
    const int model = c.create(job.script);
    ASSERT_FALSE(c.register_param(model, "p0", "m0", 1 << 14, nullptr).has_error());
    ASSERT_FALSE(c.finalize(model).has_error());
    job.cut_the_stores_short();
    const v1::Reply r = c.write(model, 0, std::vector<float>(1 << 14, 0.5f));
    ASSERT_TRUE(r.has_error()) << "the write read a store cut short";
    EXPECT_EQ(r.error().status(), ZD_ERR_IO) << r.error().message();
    EXPECT_NE(r.error().message().find("rank 0's zd_param_write of 'p0' stopped part-way"), std::string::npos)
        << r.error().message();
  }  // the trainer dies of it: the rank is lost
  ASSERT_TRUE(eventually([&] { return nobody_attached(); }));
  EXPECT_TRUE(eventually([&] { return srv->models().empty(); })) << "a model with a half-written parameter was kept";
  expect_the_restart_told_why(srv->socket_path(), job.script, "rank 0's zd_param_write of 'p0'");
}

namespace {

// A scratch directory under /tmp, removed with everything in it.
struct ScratchDir {
  ScratchDir() {
    char tmpl[] = "/tmp/zerod-kept-snaps-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string path;
};

// A keeping job that takes snapshots into `path` (only at its end); `lr`
// tells an edited script from the first. comm.timeout bounds the wait for
// the path's lock (the default is 300 s).
std::string snapshot_job(const std::string& path, const char* lr) {
  return std::string("return { optimizer = { type = 'sgd', lr = ") + lr +
         " }, daemon = { keep_state = true }, comm = { timeout = 20 }, snapshot = { path = '" + path +
         "', every = 0 } }";
}

// This process's descriptors open on `file` (the daemon is in it).
int fds_on(const std::string& file) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    if (std::filesystem::read_symlink(e.path(), ec).string() == file && !ec) ++n;
  }
  return n;
}

}  // namespace

// A kept model holds its snapshot path's lock for as long as it is kept. A
// restart with an edited script does not re-attach: it makes a new model
// over the same path, which waited comm.timeout for the lock and was then
// refused, naming the daemon's own pid as the holder. It is refused at once
// (no wait ends a kept model), saying which kept model holds the path, since
// when, and what to do; and the kept state stays, for the unchanged script.
TEST_F(KeptModels, AnEditedScriptOverAKeptModelsSnapshotPathIsRefusedAtOnceSayingWhy) {
  ScratchDir snaps;
  const std::string job = snapshot_job(snaps.path, "0.1"), edited = snapshot_job(snaps.path, "0.2");
  {
    test::DaemonClient c(srv->socket_path());
    ASSERT_FALSE(c.hello().has_error());
    const int model = c.create(job);
    ASSERT_FALSE(c.register_param(model, "p0", "m0", 4, &kInitial).has_error());
    ASSERT_FALSE(c.finalize(model).has_error());
    ASSERT_FALSE(c.call(model, v1::ModelCall::BACKWARD_BEGIN).has_error());
    ASSERT_FALSE(c.call(model, v1::ModelCall::BACKWARD_END).has_error());
    ASSERT_FALSE(c.call(model, v1::ModelCall::STEP).has_error());
    ASSERT_FALSE(c.write(model, 0, kWritten).has_error());
  }  // the trainer crashes: the rank is lost, the model kept
  ASSERT_TRUE(eventually([&] { return nobody_attached(); }));
  ASSERT_EQ(srv->models().size(), 1u);
  {
    test::DaemonClient c(srv->socket_path());
    ASSERT_FALSE(c.hello().has_error());
    const auto t0 = std::chrono::steady_clock::now();
    const v1::Reply r = c.create_reply(edited);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(r.has_error()) << "a second model over the kept model's snapshot path was made";
    const std::string& m = r.error().message();
    EXPECT_EQ(r.error().status(), ZD_ERR_CONFIG) << m;
    EXPECT_LT(waited, 5.0) << "refused after waiting for a lock a kept model never lets go of: " << m;
    EXPECT_NE(m.find("snapshot.path " + snaps.path + " is in use by "), std::string::npos) << m;
    EXPECT_NE(m.find("it is the path of model 0 (kept.lua) of the job, which daemon.keep_state keeps for a restart "
                     "since rank 0 (pid "),
              std::string::npos)
        << m;
    EXPECT_NE(m.find(", at step 1. A kept model is re-attached only by a restart of the same job with its job "
                     "script unchanged; this model's script differs"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("Restart the job with the unchanged script to resume the kept model, or stop this daemon"),
              std::string::npos)
        << m;
  }
  // Nothing of the kept state went: the unchanged script resumes it.
  ASSERT_TRUE(eventually([&] { return nobody_attached(); }));
  ASSERT_EQ(srv->models().size(), 1u) << "the refusal dropped the kept model";
  test::DaemonClient c(srv->socket_path());
  ASSERT_FALSE(c.hello().has_error());
  const int model = c.create(job);
  ASSERT_GE(model, 0);
  ASSERT_FALSE(c.register_param(model, "p0", "m0", 4, &kInitial).has_error());
  ASSERT_FALSE(c.finalize(model).has_error());
  EXPECT_EQ(c.read(model, 0, 4), kWritten);
  ASSERT_FALSE(c.destroy(model).has_error());
}

// A daemon stopped while a model waits for its snapshot path's lock (another
// process holds it) waited on until comm.timeout: its stop joins the
// session building the model. The wait ends at the stop, and the log says
// why the model was not made (its reply may not reach the rank).
TEST_F(KeptModels, AStopEndsAModelsWaitForItsSnapshotPathAtOnce) {
  ScratchDir snaps;
  const std::string lock_file = snaps.path + "/.zerod.lock";
  // Another holder: a lock of another open file description, which the
  // daemon's model (in this process too) does not get.
  const int held = ::open(lock_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX | LOCK_NB), 0);
  const std::string holder = "pid 4242 on host elsewhere (other.lua, ranks 0-0)";  // as a holder names itself
  ASSERT_EQ(::write(held, (holder + "\n").data(), holder.size() + 1), static_cast<ssize_t>(holder.size() + 1));
  std::string reply;
  std::thread rank([&] {
    try {
      test::DaemonClient c(srv->socket_path());
      c.hello();
      const v1::Reply r = c.create_reply(snapshot_job(snaps.path, "0.1"));
      reply = r.has_error() ? r.error().message() : "made";
    } catch (const std::exception& e) {
      reply = std::string("the connection ended: ") + e.what();
    }
  });
  ::testing::internal::CaptureStderr();
  // The daemon's model has the lock file open: it waits for the lock.
  const bool waiting = eventually([&] { return fds_on(lock_file) >= 2; });
  const auto t0 = std::chrono::steady_clock::now();
  srv->stop();
  const double stopped_in = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  rank.join();
  const std::string err = ::testing::internal::GetCapturedStderr();
  ::close(held);
  ASSERT_TRUE(waiting) << "the model never opened " << lock_file;
  EXPECT_LT(stopped_in, 5.0) << "the stop waited for the model's wait (comm.timeout = 20 s)";
  EXPECT_NE(err.find("rank 0's zd_model_create: kept.lua: snapshot.path " + snaps.path +
                     " is in use by " + holder + ", which holds " + lock_file +
                     ": the daemon is stopping, so this model no longer waits for it and is not made"),
            std::string::npos)
      << err;
  EXPECT_NE(reply, "made");
  if (reply.rfind("the connection ended", 0) != 0) {
    EXPECT_NE(reply.find("the daemon is stopping"), std::string::npos) << reply;
  }
}

namespace {

struct KeptModelsOfSeveralJobs : KeptModels {
  void SetUp() override { start(true); }
  // The daemon serves no job and holds no memory.
  bool nothing_held() { return srv->jobs().empty() && srv->node_memory()->held() == 0; }
};

}  // namespace

TEST_F(KeptModelsOfSeveralJobs, ADestroyedModelGivesItsMemoryBack) {
  EXPECT_EQ(run("destroy", true, "ZEROD_JOB_KEY=a;"), kInitial);
  EXPECT_TRUE(eventually([&] { return nothing_held(); }))
      << srv->jobs().size() << " jobs, " << srv->node_memory()->held() << " bytes held";
  test::DaemonClient obs(srv->socket_path());
  ASSERT_FALSE(obs.hello("observer").has_error());
  const v1::Reply r = obs.status();
  ASSERT_TRUE(r.has_status()) << r.error().message();
  EXPECT_EQ(r.status().jobs(), 0);
  EXPECT_EQ(r.status().host_memory_held(), 0u);
  EXPECT_EQ(r.status().models_size(), 0);
}

TEST_F(KeptModelsOfSeveralJobs, AJobKeyThatCanRecurKeepsALostRanksModel) {
  EXPECT_EQ(run("", true, "ZEROD_JOB_KEY=b;"), kInitial);
  ASSERT_TRUE(eventually([&] { return nobody_attached(); }));
  ASSERT_EQ(srv->models().size(), 1u);
  EXPECT_GT(srv->node_memory()->held(), 0u);
  EXPECT_EQ(run("destroy", false, "ZEROD_JOB_KEY=b;"), kWritten);
  EXPECT_TRUE(eventually([&] { return nothing_held(); }));
}

// A relaunch under mpirun or srun names the job as its last launch did
// (ZEROD_JOB_KEY) but comes with the launcher's new ids: once the last
// launch's ranks are gone it takes the job, and resumes its kept model.
TEST_F(KeptModelsOfSeveralJobs, ARelaunchOfAnotherLaunchIdResumesTheKeptModel) {
  const std::string key = "ZEROD_JOB_KEY=b;world=1/1;";
  EXPECT_EQ(run("", true, key, "PMIX_NAMESPACE=prterun-a@1;"), kInitial);
  ASSERT_TRUE(eventually([&] { return nobody_attached(); }));
  ASSERT_EQ(srv->models().size(), 1u);
  EXPECT_EQ(run("destroy", false, key, "PMIX_NAMESPACE=prterun-b@1;"), kWritten);
  EXPECT_TRUE(eventually([&] { return nothing_held(); }));
}

// Two launches running at once under one ZEROD_JOB_KEY (two srun steps of
// one allocation given ZEROD_JOB_KEY=$SLURM_JOB_ID, a key exported in the
// shell of a sweep): the second's ranks are refused, saying why, while the
// first's are connected. Before, a claimed rank refused the other's as
// "already connected", and interleaved ranks (rank 0 of one, rank 1 of the
// other) made one job, reducing gradients across two experiments.
TEST_F(KeptModelsOfSeveralJobs, ASecondLaunchAtOnceUnderTheSameJobKeyIsRefusedSayingWhy) {
  const std::string key = "ZEROD_JOB_KEY=7;world=2/2;";
  const std::string step0 = "SLURM_JOB_ID=7;SLURM_STEP_ID=0;", step1 = "SLURM_JOB_ID=7;SLURM_STEP_ID=1;";
  test::DaemonClient a0(srv->socket_path());
  ASSERT_FALSE(a0.hello("rank", 0, 2, key, step0).has_error());
  for (int rank : {1, 0}) {
    test::DaemonClient b(srv->socket_path());
    const v1::Reply r = b.hello("rank", rank, 2, key, step1);
    ASSERT_TRUE(r.has_error()) << "rank " << rank << " of the second launch joined the first's job";
    const std::string& m = r.error().message();
    EXPECT_EQ(r.error().status(), ZD_ERR_INVALID_STATE);
    EXPECT_NE(m.find("need different ZEROD_JOB_KEYs"), std::string::npos) << m;
    EXPECT_NE(m.find("(launch " + step1 + ")"), std::string::npos) << m;
    EXPECT_NE(m.find("another launch of it (" + step0 + ")"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 0 (pid " + std::to_string(::getpid()) + ")"), std::string::npos) << m;
  }
  // A rank that says no launch (an older libzerod) joins, as before.
  test::DaemonClient older(srv->socket_path());
  const v1::Reply r = older.hello("rank", 1, 2, key);
  EXPECT_FALSE(r.has_error()) << r.error().message();
}

// A relaunch's ranks often come before the daemon has seen the last
// launch's hangups: a rank whose client closed its connection is no longer
// live, so the relaunch is not refused in that window.
TEST_F(KeptModelsOfSeveralJobs, ARelaunchRightAfterTheLastLaunchHungUpJoins) {
  const std::string key = "ZEROD_JOB_KEY=r;world=2/2;";
  std::vector<std::unique_ptr<test::DaemonClient>> ranks;
  for (int launch = 0; launch < 30; ++launch) {
    ranks.clear();  // the last launch's ranks exit
    for (int rank : {0, 1}) {
      ranks.push_back(std::make_unique<test::DaemonClient>(srv->socket_path()));
      const v1::Reply r = ranks.back()->hello("rank", rank, 2, key, "launch=" + std::to_string(launch) + ";");
      ASSERT_FALSE(r.has_error()) << "launch " << launch << ", rank " << rank << ": " << r.error().message();
    }
  }
}

// A process alone that names no job is keyed by its connection, a
// torchrun rank's key carries torchrun's restart count, the ranks of mpirun,
// srun or a PMI launcher carry the ids their launcher gives every launch
// anew, and ranks started by hand without an id their parent process: none
// of those keys comes again, so a model kept under it would hold its memory
// (and its snapshot path) until the daemon stops. The log says why it is
// not kept.
TEST_F(KeptModelsOfSeveralJobs, AJobKeyOfOneLaunchKeepsNothing) {
  struct Case {
    std::string key, why;
  };
  for (const Case& c : {Case{"", "it names no job"},
                        Case{"MASTER_ADDR=127.0.0.1;MASTER_PORT=29500;restart=0;world=1/1;", "restart count"},
                        Case{"PMIX_NAMESPACE=prterun-x@1;world=1/1;", "carries PMIX_NAMESPACE"},
                        // An older libzerod sent the launcher's ids beside ZEROD_JOB_KEY.
                        Case{"ZEROD_JOB_KEY=b;PMIX_NAMESPACE=prterun-x@1;world=1/1;", "older than this daemon"},
                        Case{"OMPI_MCA_ess_base_jobid=4242;world=1/1;", "carries OMPI_MCA_ess_base_jobid"},
                        Case{"SLURM_JOB_ID=7;SLURM_STEP_ID=0;world=1/1;", "carries SLURM_STEP_ID"},
                        Case{"PMI_JOBID=99;world=1/1;", "carries PMI_JOBID"},
                        Case{"world=1/1;parent=123;", "keyed by their parent process"}}) {
    ::testing::internal::CaptureStderr();
    EXPECT_EQ(run("", true, c.key), kInitial);
    EXPECT_TRUE(eventually([&] { return nothing_held(); }))
        << "key '" << c.key << "': " << srv->jobs().size() << " jobs, " << srv->node_memory()->held()
        << " bytes held";
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("is not kept for a restart"), std::string::npos) << c.key << ": " << err;
    EXPECT_NE(err.find(c.why), std::string::npos) << c.key << ": " << err;
  }
}

