// A comm plugin of ABI version 1 through the engine: CommInstance lifts it to
// the current table once (engine/comm/comm_v1_adapter.cpp) and runs the same
// collectives with the same results and traffic figures as the plugin's own
// v2 table (the local plugin built twice: zd_comm_local offers v2 and v1,
// tests/fake_plugins' zd_comm_local_v1 only v1). What v1 lacks is refused
// with the messages the engine gave before the adapter. Version 2 is lifted
// to version 3 (comm_v2_adapter.cpp) with its functions as they are and
// host memory only, so that a device pool's collectives bounce for it; the
// nccl plugin (v3) says it takes CUDA memory.
#include "runtime/plugin_host.h"

#include "comm/comm_adapters.h"
#include "error.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <sys/stat.h>
#include <thread>
#include <vector>

using namespace zerod;

namespace {

constexpr int kWorld = 2;

std::shared_ptr<const Plugin> load(const std::string& name) {
  const std::string dir = name == "local" ? ZEROD_PLUGIN_DIR : ZEROD_FAKE_PLUGIN_DIR;
  return Plugin::load(ZD_PLUGIN_COMM, name, {dir});
}

zd_comm_call call(int rank, const char* what) {
  zd_comm_call c{};
  c.struct_size = sizeof c;
  c.rank = rank;
  c.what = what;
  return c;
}

void on_ranks(const std::function<void(int)>& fn) {
  std::vector<std::thread> t;
  for (int r = 0; r < kWorld; ++r) t.emplace_back(fn, r);
  for (auto& th : t) th.join();
}

struct Results {
  std::vector<std::vector<float>> reduced, gathered, broadcast, scattered;
  std::vector<uint64_t> bytes_sent;
  bool compression = false;
};

Results run(const std::string& name) {
  auto plugin = load(name);
  auto comm = CommInstance::create(plugin, plugin->default_values(), kWorld);
  Results out;
  out.compression = comm->has_compression();
  out.reduced.assign(kWorld, std::vector<float>(5));
  out.gathered.assign(kWorld, std::vector<float>(2 * kWorld));
  out.broadcast.assign(kWorld, std::vector<float>(3));
  out.scattered.assign(kWorld, std::vector<float>(2));
  on_ranks([&](int r) {
    for (int i = 0; i < 5; ++i) out.reduced[r][i] = static_cast<float>(r * 10 + i);
    comm->all_reduce(call(r, "sum"), out.reduced[r].data(), 5, ZD_COMM_F32, ZD_REDUCE_SUM);
    const float mine[2] = {static_cast<float>(r), static_cast<float>(r + 100)};
    comm->all_gather(call(r, "gather"), mine, out.gathered[r].data(), 2, ZD_COMM_F32);
    for (int i = 0; i < 3; ++i) out.broadcast[r][i] = r == 1 ? static_cast<float>(7 + i) : 0.0f;
    comm->broadcast(call(r, "broadcast"), out.broadcast[r].data(), 3, ZD_COMM_F32, 1);
    const float send[4] = {1.0f + static_cast<float>(r), 2.0f, 3.0f * static_cast<float>(r), 4.0f};
    comm->reduce_scatter(call(r, "scatter"), send, out.scattered[r].data(), 2, ZD_COMM_F32, ZD_REDUCE_SUM);
    comm->barrier(call(r, "barrier"));
  });
  for (int r = 0; r < kWorld; ++r) out.bytes_sent.push_back(comm->figures(r).bytes_sent);
  return out;
}

TEST(CommV1Adapter, RunsTheCollectivesAsTheV2TableDoes) {
  auto v1 = load("local_v1");
  ASSERT_EQ(v1->header().abi_version, 1u) << "the fake plugin must offer v1 alone";
  ASSERT_EQ(load("local")->header().abi_version, 2u);
  const Results a = run("local_v1"), b = run("local");
  EXPECT_EQ(a.reduced, b.reduced);
  EXPECT_EQ(a.reduced[0], (std::vector<float>{10, 12, 14, 16, 18}));
  EXPECT_EQ(a.gathered, b.gathered);
  EXPECT_EQ(a.gathered[1], (std::vector<float>{0, 100, 1, 101}));
  EXPECT_EQ(a.broadcast, b.broadcast);
  EXPECT_EQ(a.broadcast[0], (std::vector<float>{7, 8, 9}));
  EXPECT_EQ(a.scattered, b.scattered);
  EXPECT_EQ(a.scattered[1], (std::vector<float>{3, 8}));
  EXPECT_EQ(a.bytes_sent, b.bytes_sent) << "figures() of a v1 plugin come from its bytes_sent()";
  EXPECT_GT(a.bytes_sent[0], 0u);
  EXPECT_FALSE(a.compression);
  EXPECT_TRUE(b.compression);
}

TEST(CommV1Adapter, RefusesWhatVersion1Lacks) {
  auto plugin = load("local_v1");
  auto comm = CommInstance::create(plugin, plugin->default_values(), 1);
  std::vector<float> buf(8, 1.0f), we(8, 0.0f), se(8, 0.0f);
  try {
    comm->compressed_all_reduce(call(0, "compressed"), buf.data(), buf.size(), we.data(), se.data());
    FAIL() << "a v1 plugin ran a compressed all-reduce";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ZD_ERR_NOT_IMPLEMENTED);
    EXPECT_STREQ(e.what(), "comm plugin 'local_v1' (plugin ABI version 1) has no compressed all-reduce");
  }
  try {
    CommInstance::create(plugin, plugin->default_values(), 4, 0, 2);
    FAIL() << "a v1 plugin was given half of the ranks";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ZD_ERR_CONFIG);
    EXPECT_NE(std::string(e.what()).find("comm plugin 'local_v1' (plugin ABI version 1) serves the ranks of one "
                                         "daemon only, but this daemon serves 2 of 4 ranks"),
              std::string::npos)
        << e.what();
  }
}

// Comm ABI v3's memory(): plugins of v1 and v2 take host memory only, so
// the engine bounces a device pool's collectives through host memory for
// them (device_comm.cpp hands the pool only to a plugin that takes it).
TEST(CommV2Adapter, OlderPluginsTakeHostMemoryOnly) {
  for (const char* name : {"local", "local_v1"}) {
    auto plugin = load(name);
    auto comm = CommInstance::create(plugin, plugin->default_values(), kWorld);
    EXPECT_EQ(comm->memory(), static_cast<zd_comm_memory>(ZD_COMM_MEMORY_HOST)) << name;
  }
}

TEST(CommV2Adapter, LiftsEveryFunctionAsItIs) {
  auto plugin = load("local");
  ASSERT_EQ(plugin->header().abi_version, 2u) << "local offers v2 as its newest: the adapter's case";
  const zd_comm_v2& d = plugin->descriptor<zd_comm_v2>();
  const zd_comm_v3 t = lift_comm_v2(d);
  EXPECT_EQ(t.header.name, d.header.name);
  EXPECT_EQ(t.hparams, d.hparams);
  EXPECT_EQ(t.hparam_count, d.hparam_count);
  EXPECT_EQ(t.create, d.create);
  EXPECT_EQ(t.destroy, d.destroy);
  EXPECT_EQ(t.all_reduce, d.all_reduce);
  EXPECT_EQ(t.reduce_scatter, d.reduce_scatter);
  EXPECT_EQ(t.all_gather, d.all_gather);
  EXPECT_EQ(t.broadcast, d.broadcast);
  EXPECT_EQ(t.barrier, d.barrier);
  EXPECT_EQ(t.abort, d.abort);
  EXPECT_EQ(t.last_error, d.last_error);
  EXPECT_EQ(t.all_to_all, d.all_to_all);
  EXPECT_EQ(t.compressed_all_reduce, d.compressed_all_reduce);
  EXPECT_EQ(t.figures, d.figures);
  ASSERT_NE(t.memory, nullptr);
  EXPECT_EQ(t.memory(nullptr), static_cast<zd_comm_memory>(ZD_COMM_MEMORY_HOST));
}

// The loader takes the nccl plugin's v3 descriptor (where it is built: it
// needs CUDA and NCCL); it cannot be instantiated without a GPU.
TEST(CommV3, TheNcclPluginLoadsAsVersion3) {
  struct stat st {};
  if (stat((std::string(ZEROD_PLUGIN_DIR) + "/zd_comm_nccl.so").c_str(), &st) != 0)
    GTEST_SKIP() << "the nccl plugin is not built here";
  auto plugin = Plugin::load(ZD_PLUGIN_COMM, "nccl", {ZEROD_PLUGIN_DIR});
  EXPECT_EQ(plugin->header().abi_version, 3u);
  EXPECT_EQ(plugin->header().struct_size, sizeof(zd_comm_v3));
  EXPECT_NE(plugin->descriptor<zd_comm_v3>().memory, nullptr);
}

}  // namespace
