// `zerod status`, `zerod top` and a metrics scrape read every hosted model
// from their own connection's thread while the ranks' threads change the
// models. A rank registering its parameters grows the registry (a deque,
// whose map is reallocated as it grows): the status once read its size and
// summed its elements without the registry's lock, and the daemon crashed
// (SIGSEGV at parameter 40959 or 81918, 4 tries in 4). Here a rank
// registers 90,000 parameters (past both places it crashed; fewer than
// before, for a sanitizer build on two cores) while
// two observers ask for the status without a pause; the daemon must answer
// them throughout and count every parameter at the end. Before the fix
// this test crashed the process in 9 runs of 10.
#include "daemon_client.h"
#include "server.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>

using namespace zerod;

TEST(StatusWhileRegistering, TheDaemonCountsEveryParameterWithoutCrashing) {
  server::ServerOptions o;
  o.world_size = 1;
  server::Server srv(o);
  srv.start();

  test::DaemonClient rank(srv.socket_path());
  ASSERT_FALSE(rank.hello().has_error());
  const int model = rank.create("return { optimizer = { type = 'sgd' } }");
  ASSERT_GE(model, 0);

  std::atomic<bool> done{false};
  std::atomic<int> answered{0};
  std::string observer_error[2];
  std::thread observers[2];
  for (int k = 0; k < 2; ++k)
    observers[k] = std::thread([&, k] {
      try {
        test::DaemonClient obs(srv.socket_path());
        if (obs.hello("observer").has_error()) throw std::runtime_error("the observer's hello failed");
        while (!done.load()) {
          const v1::Reply r = obs.status();
          if (r.has_error()) throw std::runtime_error("status failed: " + r.error().message());
          answered.fetch_add(1);
        }
      } catch (const std::exception& e) {
        observer_error[k] = e.what();
      }
    });

  constexpr int kParams = 90000;
  for (int i = 0; i < kParams; ++i) {
    // A new module every 100 parameters: the module deque grows too.
    const v1::Reply r = rank.register_param(model, "p" + std::to_string(i), "m" + std::to_string(i / 100), 4);
    if (r.has_error()) {
      ADD_FAILURE() << "parameter " << i << ": " << r.error().message();
      break;
    }
  }
  done.store(true);
  for (std::thread& t : observers) t.join();
  EXPECT_EQ(observer_error[0], "");
  EXPECT_EQ(observer_error[1], "");
  EXPECT_GT(answered.load(), 10) << "the observer was hardly served while the rank registered";

  test::DaemonClient after(srv.socket_path());
  ASSERT_FALSE(after.hello("observer").has_error());
  const v1::Reply r = after.status();
  ASSERT_TRUE(r.has_status()) << r.error().message();
  ASSERT_EQ(r.status().models_size(), 1);
  EXPECT_EQ(r.status().models(0).params(), kParams);
  EXPECT_EQ(r.status().models(0).modules(), kParams / 100);
  EXPECT_EQ(r.status().models(0).numel(), int64_t{4} * kParams);
  EXPECT_FALSE(rank.destroy(model).has_error());
  srv.stop();
}
