// The descriptor, create() and its hyperparameter checks, and the
// bytes_sent() figures of each collective.
#include <gmock/gmock.h>

#include <cmath>

#include "comm_test_util.h"

namespace zerod::comm::test {
namespace {

using ::testing::HasSubstr;

TEST(Descriptor, OneLocalCommV1) {
  std::string error;
  const zd_comm_v1* d = local_plugin(&error);
  ASSERT_NE(d, nullptr) << error;
  EXPECT_EQ(d->header.kind, ZD_PLUGIN_COMM);
  EXPECT_EQ(d->header.abi_version, static_cast<uint32_t>(ZD_COMM_ABI_VERSION));
  EXPECT_EQ(d->header.struct_size, sizeof(zd_comm_v1));
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
                  reinterpret_cast<const void*>(d->last_error), reinterpret_cast<const void*>(d->bytes_sent)}) {
    EXPECT_NE(fn, nullptr);
  }
}

zd_status try_create(double spin_us, int world, std::string* err, size_t value_count = 1) {
  const zd_comm_v1* d = local_plugin();
  char buf[256] = "";
  void* inst = nullptr;
  const double values[] = {spin_us};
  const zd_status st = d->create(nullptr, values, value_count, world, &inst, buf, sizeof buf);
  *err = buf;
  d->destroy(inst);
  return st;
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
  const zd_comm_v1* d = local_plugin();
  ASSERT_NE(d, nullptr);
  void* inst = nullptr;
  const double values[] = {25};
  ASSERT_EQ(d->create(&host, values, 1, 3, &inst, nullptr, 0), ZD_OK);
  d->destroy(inst);
  EXPECT_EQ(log.calls, 1);
  EXPECT_EQ(log.plugin, "local");
  EXPECT_THAT(log.message, HasSubstr("3 ranks, spin 25 us"));
}

// bytes_sent after one collective of each kind, against the ring figures.
TEST(BytesSent, RingFiguresPerCollective) {
  for (int world = 1; world <= 4; ++world) {
    const uint64_t n = static_cast<uint64_t>(world);
    Comm comm(world);
    std::vector<std::vector<float>> big(world, std::vector<float>(1001 * n));
    std::vector<std::vector<uint16_t>> half(world, std::vector<uint16_t>(1001 * n));
    std::vector<uint64_t> after[5];
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
    });
    for (int r = 0; r < world; ++r) {
      const uint64_t all_reduce = 2 * (n - 1) * 2002 / n;  // rounded down
      const uint64_t reduce_scatter = (n - 1) * 1001 * 4;
      const uint64_t all_gather = (n - 1) * 1000 * 2;
      // The ring runs root -> root+1 -> ...; the rank before the root sends nothing.
      const uint64_t broadcast = (world == 1 || r == world - 2) ? 0 : 4000;
      EXPECT_EQ(comm.sent(r), all_reduce + reduce_scatter + all_gather + broadcast)
          << "world " << world << ", rank " << r;
    }
  }
}

TEST(BytesSent, FailedCollectivesSendNothing) {
  Comm comm(2);
  float x = 1;
  const zd_comm_call c = call_for(0, 1, "alone", 10);
  EXPECT_EQ(comm.d().all_reduce(comm.inst(), &c, &x, 1, ZD_COMM_F32, ZD_REDUCE_SUM), ZD_ERR_TIMEOUT);
  EXPECT_EQ(comm.sent(0), 0u);
  EXPECT_EQ(comm.sent(1), 0u);
  EXPECT_EQ(comm.sent(5), 0u);
}

}  // namespace
}  // namespace zerod::comm::test
