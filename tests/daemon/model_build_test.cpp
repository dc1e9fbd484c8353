// A job's model is built by its first rank's zd_model_create: the job script
// loaded (Lua, plugins), then the engine's model, with a device and a comm
// stream per rank and the comm instance, which across nodes waits for the
// other daemons up to comm.timeout. The server once did that holding its
// one lock, so every other client waited as long: a status, another job's
// hello or create, a new connection's turn. Here the build is held slow by a
// plugin whose create() sleeps 1.5 s (tests/fake_plugins, fakeslow; loading
// the script creates it twice more to check it), while the daemon must
// answer everyone else promptly; the job's own ranks racing to create get
// the one model. And `zerod serve --jobs` bounds a job's claimed ranks
// before it builds a model for that many.
#include "daemon_client.h"
#include "server.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>

using namespace zerod;

namespace {

using Clock = std::chrono::steady_clock;

const std::string kSlowScript = std::string("return { optimizer = { type = 'fakeslow' }, plugin_path = { '") +
                                ZEROD_FAKE_PLUGIN_DIR + "' } }";
const std::string kQuickScript = "return { optimizer = { type = 'sgd' } }";
constexpr double kSleep = 1.5;  // the fakeslow create's, in seconds
// What a status or another job's call may take while a build runs: far
// above what one takes (milliseconds, more under a sanitizer), far below the
// build's sleep, which each of them waited out before.
constexpr double kPrompt = 0.75;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

v1::Request create_request(const std::string& script) {
  v1::Request r;
  r.mutable_create_model()->set_script_text(script);
  r.mutable_create_model()->set_script_name("build.lua");
  return r;
}

struct ModelBuild : ::testing::Test {
  void SetUp() override {
    server::ServerOptions o;
    o.multi_job = true;
    o.host_memory = uint64_t{1} << 30;
    o.reclaim_wait_ms = 100;
    srv = std::make_unique<server::Server>(o);
    srv->start();
  }
  void TearDown() override { srv->stop(); }
  std::unique_ptr<server::Server> srv;
};

}  // namespace

TEST_F(ModelBuild, EveryoneElseIsAnsweredWhileAJobsModelIsBuilt) {
  test::DaemonClient slow(srv->socket_path());
  ASSERT_FALSE(slow.hello("rank", 0, 1, "slow;").has_error());
  std::atomic<bool> built{false};
  double build_s = 0;
  v1::Reply slow_reply;
  std::thread builder([&] {
    const Clock::time_point t0 = Clock::now();
    slow_reply = slow.rpc(create_request(kSlowScript));
    build_s = seconds_since(t0);
    built.store(true);
  });

  // Without a pause until the build ends: a status, and another job's whole
  // life (a new connection, its hello, its model's create and destroy).
  double slowest_status = 0, slowest_other = 0;
  int statuses = 0, others = 0;
  std::string failure;
  std::thread observer([&] {
    try {
      test::DaemonClient obs(srv->socket_path());
      if (obs.hello("observer").has_error()) throw std::runtime_error("the observer's hello failed");
      while (!built.load()) {
        const Clock::time_point t0 = Clock::now();
        const v1::Reply r = obs.status();
        slowest_status = std::max(slowest_status, seconds_since(t0));
        if (r.has_error()) throw std::runtime_error("status: " + r.error().message());
        ++statuses;
      }
    } catch (const std::exception& e) {
      failure = e.what();
    }
  });
  std::string other_failure;
  while (!built.load() && other_failure.empty()) {
    const Clock::time_point t0 = Clock::now();
    test::DaemonClient other(srv->socket_path());
    const v1::Reply h = other.hello("rank", 0, 1, "other;");
    if (h.has_error()) other_failure = "hello: " + h.error().message();
    const int model = h.has_error() ? -1 : other.create(kQuickScript);
    if (model >= 0 && other.destroy(model).has_error()) other_failure = "destroy failed";
    if (model < 0 && other_failure.empty()) other_failure = "create failed";
    slowest_other = std::max(slowest_other, seconds_since(t0));
    ++others;
  }
  builder.join();
  observer.join();
  EXPECT_EQ(other_failure, "");

  ASSERT_FALSE(slow_reply.has_error()) << slow_reply.error().message();
  EXPECT_GE(build_s, kSleep) << "the slow plugin did not hold the build";
  EXPECT_EQ(failure, "");
  EXPECT_GT(statuses, 0);
  EXPECT_GT(others, 0);
  EXPECT_LT(slowest_status, kPrompt) << "a status waited for another job's model build (" << statuses << " asked)";
  EXPECT_LT(slowest_other, kPrompt) << "another job waited for this job's model build (" << others << " ran)";
  EXPECT_FALSE(slow.destroy(slow_reply.create_model().model()).has_error());
}

// Two ranks of one job ask for their model at once: one builds it, the
// other waits for that build (not for the server) and attaches to the same
// model; the job's status is answered meanwhile and shows it once built.
TEST_F(ModelBuild, TheJobsRanksRacingToCreateGetTheOneModel) {
  test::DaemonClient r0(srv->socket_path()), r1(srv->socket_path());
  ASSERT_FALSE(r0.hello("rank", 0, 2, "pair;").has_error());
  ASSERT_FALSE(r1.hello("rank", 1, 2, "pair;").has_error());
  v1::Reply reply[2];
  std::thread ranks[2];
  test::DaemonClient* client[2] = {&r0, &r1};
  for (int r = 0; r < 2; ++r)
    ranks[r] = std::thread([&, r] { reply[r] = client[r]->rpc(create_request(kSlowScript)); });
  test::DaemonClient obs(srv->socket_path());
  ASSERT_FALSE(obs.hello("observer").has_error());
  const Clock::time_point t0 = Clock::now();
  const v1::Reply during = obs.status();
  EXPECT_LT(seconds_since(t0), kPrompt);
  ASSERT_TRUE(during.has_status()) << during.error().message();
  EXPECT_EQ(srv->jobs().size(), 1u) << "the job is kept while its model is built";
  for (std::thread& t : ranks) t.join();

  ASSERT_FALSE(reply[0].has_error()) << reply[0].error().message();
  ASSERT_FALSE(reply[1].has_error()) << reply[1].error().message();
  EXPECT_EQ(reply[0].create_model().model(), reply[1].create_model().model());
  ASSERT_EQ(srv->models().size(), 1u) << "one model for the job's two ranks";
  const v1::Reply after = obs.status();
  ASSERT_EQ(after.status().models_size(), 1);
  EXPECT_EQ(after.status().models(0).ranks_size(), 2);
  EXPECT_TRUE(after.status().models(0).ranks(0).connected());
  EXPECT_TRUE(after.status().models(0).ranks(1).connected());
  EXPECT_FALSE(r0.destroy(reply[0].create_model().model()).has_error());
  EXPECT_FALSE(r1.destroy(reply[1].create_model().model()).has_error());
}

// A hello claims its job's world size; all of a `zerod serve --jobs` job's
// ranks are this node's, and its first create builds a device and a comm
// stream for every one of them (4096 claimed ranks once took 0.6 s under
// the server's lock and 430 MB; 2^20 with comm = mpi, 2.5 GB). The claim is
// bounded by ServerOptions::max_job_ranks at the hello, before anything is
// built.
TEST_F(ModelBuild, AJobsClaimedRanksAreBoundedBeforeItsModelIsBuilt) {
  const int most = server::ServerOptions{}.max_job_ranks;
  test::DaemonClient c(srv->socket_path());
  const v1::Reply r = c.hello("rank", 0, most + 1, "wide;");
  EXPECT_EQ(r.error().status(), ZD_ERR_CONFIG);
  EXPECT_NE(r.error().message().find("says its job has " + std::to_string(most + 1) +
                                     " ranks; `zerod serve --jobs` serves jobs of at most " + std::to_string(most)),
            std::string::npos)
      << r.error().message();
  EXPECT_TRUE(srv->jobs().empty());
  // A job of that many ranks is served, and its model built for them all.
  const v1::Reply ok = c.hello("rank", 0, most, "wide;");
  ASSERT_FALSE(ok.has_error()) << ok.error().message();
  const int model = c.create(kQuickScript);
  ASSERT_GE(model, 0);
  ASSERT_EQ(srv->models().size(), 1u);
  EXPECT_EQ(srv->models()[0]->model().local_ranks(), most);
  EXPECT_FALSE(c.destroy(model).has_error());
}
