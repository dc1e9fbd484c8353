// The descriptors, create() and its checks, and the figures() of each
// collective.
#include <gmock/gmock.h>

#include <cmath>
#include <cstddef>

#include "comm_test_util.h"

namespace zerod::comm::test {
namespace {

using ::testing::HasSubstr;

TEST(Descriptor, LocalCommV2First) {
  std::string error;
  const zd_comm_v2* d = local_plugin(&error);
  ASSERT_NE(d, nullptr) << error;
  EXPECT_EQ(d->header.kind, ZD_PLUGIN_COMM);
  // v2, the newest it offers: its collectives take host memory, and the
  // engine lifts it to the current table (comm_v2_adapter.cpp).
  EXPECT_EQ(d->header.abi_version, 2u);
  EXPECT_EQ(d->header.struct_size, sizeof(zd_comm_v2));
  EXPECT_STREQ(d->header.name, "local");
  ASSERT_NE(d->header.description, nullptr);
  EXPECT_GT(std::strlen(d->header.description), 10u);
  ASSERT_EQ(d->hparam_count, 1u);
  EXPECT_STREQ(d->hparams[0].name, "spin_us");
  EXPECT_EQ(d->hparams[0].type, ZD_HPARAM_NUMBER);
  EXPECT_EQ(d->hparams[0].count, 1);
  EXPECT_EQ(d->hparams[0].defaults[0], 50.0);
  EXPECT_EQ(d->hparams[0].min, 0.0);
  for (auto fn : {reinterpret_cast<const void*>(d->create), reinterpret_cast<const void*>(d->destroy),
                  reinterpret_cast<const void*>(d->all_reduce), reinterpret_cast<const void*>(d->reduce_scatter),
                  reinterpret_cast<const void*>(d->all_gather), reinterpret_cast<const void*>(d->broadcast),
                  reinterpret_cast<const void*>(d->barrier), reinterpret_cast<const void*>(d->abort),
                  reinterpret_cast<const void*>(d->last_error), reinterpret_cast<const void*>(d->all_to_all),
                  reinterpret_cast<const void*>(d->compressed_all_reduce),
                  reinterpret_cast<const void*>(d->figures)}) {
    EXPECT_NE(fn, nullptr);
  }
}

// The descriptors come newest first, so that a host taking the first it
// understands gets v2; v1 stays for hosts that know only v1.
TEST(Descriptor, ListsV2ThenV1) {
  std::string error;
  ASSERT_NE(local_plugin(&error), nullptr) << error;
  void* handle = dlopen((std::string(ZEROD_TEST_PLUGIN_DIR) + "/zd_comm_local.so").c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr);
  auto entry = reinterpret_cast<zd_plugin_entry_fn>(dlsym(handle, ZD_PLUGIN_ENTRY_SYMBOL));
  ASSERT_NE(entry, nullptr);
  std::vector<uint32_t> versions;
  for (const zd_plugin_header* const* h = entry(); *h != nullptr; ++h) versions.push_back((*h)->abi_version);
  EXPECT_EQ(versions, (std::vector<uint32_t>{2, 1}));
  dlclose(handle);
}

// A host of plugin ABI v1 still loads the plugin and runs collectives
// through the v1 table, bytes_sent() included.
TEST(Descriptor, V1StillLoadsAndRuns) {
  std::string error;
  const zd_comm_v1* d = local_plugin_v1(&error);
  ASSERT_NE(d, nullptr) << error;
  EXPECT_EQ(d->header.struct_size, sizeof(zd_comm_v1));
  EXPECT_STREQ(d->header.name, "local");
  ASSERT_NE(d->bytes_sent, nullptr);
  void* inst = nullptr;
  char err[256] = "";
  const double values[] = {50};
  ASSERT_EQ(d->create(nullptr, values, 1, 2, &inst, err, sizeof err), ZD_OK) << err;
  float x[2] = {1.5f, 2.25f};
  on_ranks(2, [&](int r) {
    const zd_comm_call c = call_for(r, 1, "v1 sum");
    EXPECT_EQ(d->all_reduce(inst, &c, &x[r], 1, ZD_COMM_F32, ZD_REDUCE_SUM), ZD_OK) << d->last_error(inst, r);
  });
  EXPECT_EQ(x[0], 3.75f);
  EXPECT_EQ(x[1], 3.75f);
  EXPECT_EQ(d->bytes_sent(inst, 0), 4u);  // 2 (N-1)/N of 4 bytes
  d->destroy(inst);
}

zd_status try_create(double spin_us, const zd_comm_config& cfg, std::string* err, size_t value_count = 1) {
  const zd_comm_v2* d = local_plugin();
  char buf[512] = "";
  void* inst = nullptr;
  const double values[] = {spin_us};
  const zd_status st = d->create(nullptr, values, value_count, &cfg, &inst, buf, sizeof buf);
  *err = buf;
  if (st != ZD_OK) {
    EXPECT_EQ(inst, nullptr);
  }
  d->destroy(inst);
  return st;
}

zd_status try_create(double spin_us, int world, std::string* err, size_t value_count = 1) {
  return try_create(spin_us, config_of(world), err, value_count);
}

TEST(Create, RefusesBadValuesNamingThem) {
  ASSERT_NE(local_plugin(), nullptr);
  std::string err;
  EXPECT_EQ(try_create(50, 4, &err), ZD_OK) << err;
  EXPECT_EQ(try_create(0, 1, &err), ZD_OK) << err;
  EXPECT_EQ(try_create(-1, 2, &err), ZD_ERR_CONFIG);
  EXPECT_THAT(err, HasSubstr("spin_us = -1"));
  EXPECT_EQ(try_create(NAN, 2, &err), ZD_ERR_CONFIG);
  EXPECT_THAT(err, HasSubstr("spin_us"));
  EXPECT_EQ(try_create(50, 0, &err), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(err, HasSubstr("world_size = 0"));
  EXPECT_EQ(try_create(50, 2, &err, 2), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(err, HasSubstr("expected 1 hyperparameter values, got 2"));
}

// One daemon only: a daemon that serves part of the job is told which
// backend spans daemons.
TEST(Create, RefusesPartOfTheJobNamingTheMpiBackend) {
  ASSERT_NE(local_plugin(), nullptr);
  std::string err;
  EXPECT_EQ(try_create(50, config_of(4, 0, 2), &err), ZD_ERR_CONFIG);
  EXPECT_THAT(err, HasSubstr("serves 2 of the job's 4 ranks (ranks 0-1)"));
  EXPECT_THAT(err, HasSubstr("comm = { backend = \"mpi\" }"));
  EXPECT_EQ(try_create(50, config_of(4, 2, 2), &err), ZD_ERR_CONFIG);
  EXPECT_THAT(err, HasSubstr("(ranks 2-3)"));
  EXPECT_EQ(try_create(50, config_of(4, 3, 2), &err), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(err, HasSubstr("not a block of ranks in 0..3"));
  zd_comm_config short_cfg = config_of(2);
  short_cfg.struct_size = 8;
  EXPECT_EQ(try_create(50, short_cfg, &err), ZD_ERR_INVALID_ARGUMENT);
  const zd_comm_v2* d = local_plugin();
  void* inst = reinterpret_cast<void*>(1);
  const double values[] = {50};
  EXPECT_EQ(d->create(nullptr, values, 1, nullptr, &inst, nullptr, 0), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(inst, nullptr);
}

TEST(Create, LogsThroughTheHost) {
  struct Log {
    int calls = 0;
    std::string plugin, message;
  } log;
  zd_host_services host{};
  host.struct_size = sizeof host;
  host.abi_version = 1;
  host.host = &log;
  host.log = [](void* h, zd_log_level, const char* plugin, const char* message) {
    auto* l = static_cast<Log*>(h);
    ++l->calls;
    l->plugin = plugin;
    l->message = message;
  };
  const zd_comm_v2* d = local_plugin();
  ASSERT_NE(d, nullptr);
  void* inst = nullptr;
  const double values[] = {25};
  const zd_comm_config cfg = config_of(3);
  ASSERT_EQ(d->create(&host, values, 1, &cfg, &inst, nullptr, 0), ZD_OK);
  d->destroy(inst);
  EXPECT_EQ(log.calls, 1);
  EXPECT_EQ(log.plugin, "local");
  EXPECT_THAT(log.message, HasSubstr("3 ranks, spin 25 us"));
}

// bytes_sent after one collective of each kind, against the ring figures.
TEST(Figures, RingBytesAndCollectivesPerCollective) {
  for (int world = 1; world <= 4; ++world) {
    const uint64_t n = static_cast<uint64_t>(world);
    Comm comm(world);
    std::vector<std::vector<float>> big(world, std::vector<float>(1001 * n));
    std::vector<std::vector<uint16_t>> half(world, std::vector<uint16_t>(1001 * n));
    std::vector<std::vector<uint8_t>> bytes(world, std::vector<uint8_t>(333 * n)), got(bytes);
    on_ranks(world, [&](int r) {
      const zd_comm_call c = call_for(r);
      auto& d = comm.d();
      ASSERT_EQ(d.all_reduce(comm.inst(), &c, half[r].data(), 1001, ZD_COMM_BF16, ZD_REDUCE_SUM), ZD_OK);
      ASSERT_EQ(d.reduce_scatter(comm.inst(), &c, big[r].data(), big[r].data() + r * 1001, 1001, ZD_COMM_F32,
                                 ZD_REDUCE_SUM),
                ZD_OK);
      ASSERT_EQ(d.all_gather(comm.inst(), &c, half[r].data() + r * 1000, half[r].data(), 1000, ZD_COMM_F16), ZD_OK);
      ASSERT_EQ(d.broadcast(comm.inst(), &c, big[r].data(), 1000, ZD_COMM_F32, world - 1), ZD_OK);
      ASSERT_EQ(d.barrier(comm.inst(), &c), ZD_OK);
      ASSERT_EQ(d.all_to_all(comm.inst(), &c, bytes[r].data(), got[r].data(), 333, ZD_COMM_U8), ZD_OK);
    });
    for (int r = 0; r < world; ++r) {
      const uint64_t all_to_all = (n - 1) * 333;
      const uint64_t all_reduce = 2 * (n - 1) * 2002 / n;  // rounded down
      const uint64_t reduce_scatter = (n - 1) * 1001 * 4;
      const uint64_t all_gather = (n - 1) * 1000 * 2;
      // The ring runs root -> root+1 -> ...; the rank before the root sends nothing.
      const uint64_t broadcast = (world == 1 || r == world - 2) ? 0 : 4000;
      const zd_comm_figures f = comm.figures(r);
      EXPECT_EQ(f.bytes_sent, all_reduce + reduce_scatter + all_gather + broadcast + all_to_all)
          << "world " << world << ", rank " << r;
      EXPECT_EQ(f.network_bytes_sent, 0u) << "one daemon";
      EXPECT_EQ(f.collectives, 6u);
      EXPECT_EQ(f.struct_size, sizeof f);
    }
  }
}

// A caller built against an older, shorter zd_comm_figures gets the fields
// it knows and nothing past them.
TEST(Figures, WritesNoFurtherThanStructSize) {
  Comm comm(1);
  float x = 1;
  const zd_comm_call c = call_for(0);
  ASSERT_EQ(comm.d().all_reduce(comm.inst(), &c, &x, 1, ZD_COMM_F32, ZD_REDUCE_SUM), ZD_OK);
  zd_comm_figures f{};
  f.struct_size = offsetof(zd_comm_figures, network_bytes_sent);
  f.network_bytes_sent = 77;
  f.collectives = 88;
  comm.d().figures(comm.inst(), 0, &f);
  EXPECT_EQ(f.struct_size, offsetof(zd_comm_figures, network_bytes_sent));
  EXPECT_EQ(f.bytes_sent, 0u);
  EXPECT_EQ(f.network_bytes_sent, 77u);
  EXPECT_EQ(f.collectives, 88u);
  f.struct_size = sizeof f;
  comm.d().figures(comm.inst(), 0, &f);
  EXPECT_EQ(f.collectives, 1u);
  EXPECT_EQ(f.network_bytes_sent, 0u);
}

TEST(Figures, FailedCollectivesSendNothing) {
  Comm comm(2);
  float x = 1;
  const zd_comm_call c = call_for(0, 1, "alone", 10);
  EXPECT_EQ(comm.d().all_reduce(comm.inst(), &c, &x, 1, ZD_COMM_F32, ZD_REDUCE_SUM), ZD_ERR_TIMEOUT);
  EXPECT_EQ(comm.sent(0), 0u);
  EXPECT_EQ(comm.sent(1), 0u);
  EXPECT_EQ(comm.sent(5), 0u);
  EXPECT_EQ(comm.figures(0).collectives, 0u);
}

}  // namespace
}  // namespace zerod::comm::test
