// Connecting, versions, status names, option structs.
#include "abi_fixture.h"

#include <cstdlib>
#include <cstring>
#include <string>

using namespace zerod_test;

TEST(Connect, EmbeddedWorksAndReportsOneRank) {
  zd_client* c = nullptr;
  ASSERT_EQ(zd_connect("embedded:", nullptr, &c), ZD_OK) << last();
  zd_client_info info = ZD_CLIENT_INFO_INIT;
  ASSERT_EQ(zd_client_get_info(c, &info), ZD_OK) << last();
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.embedded, 1);
  zd_disconnect(c);
}

TEST(Connect, NoUriReadsTheEnvironmentThenFallsBackToEmbedded) {
  zd_client* c = nullptr;
  {
    ScopedEnv none("ZEROD_ENDPOINT", nullptr);
    ASSERT_EQ(zd_connect(nullptr, nullptr, &c), ZD_OK) << last();
    zd_client_info info = ZD_CLIENT_INFO_INIT;
    ASSERT_EQ(zd_client_get_info(c, &info), ZD_OK);
    EXPECT_EQ(info.embedded, 1);
    zd_disconnect(c);
  }
  ScopedEnv bogus("ZEROD_ENDPOINT", "bogus:thing");
  EXPECT_EQ(zd_connect(nullptr, nullptr, &c), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("bogus:thing"), std::string::npos) << last();
  EXPECT_EQ(c, nullptr);
}

// torchrun, mpirun or srun made this process one of several: with no
// daemon named it would train alone as rank 0 of 1 while its siblings do the
// same. Where the launcher's variables do not say how many ranks run on
// this node, no daemon can be started for them (node_daemon.h;
// python.launchers starts them): refused by name; "embedded:" asked for
// explicitly still works.
TEST(Connect, AnotherLaunchersSeveralRanksWithoutADaemonAreRefusedByName) {
  ScopedEnv none("ZEROD_ENDPOINT", nullptr);
  struct Case {
    const char *size_var, *rank_var, *launcher;
  };
  for (const Case& k : {Case{"WORLD_SIZE", "RANK", "torchrun"}, Case{"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "mpirun"},
                        Case{"SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "srun"}}) {
    ScopedEnv size(k.size_var, "2"), rank(k.rank_var, "1");
    zd_client* c = reinterpret_cast<zd_client*>(0x1);
    EXPECT_EQ(zd_connect(nullptr, nullptr, &c), ZD_ERR_CONFIG) << k.launcher;
    EXPECT_EQ(c, nullptr);
    const std::string msg = last();
    EXPECT_NE(msg.find(k.launcher), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::string(k.size_var) + "=2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 1 of 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("zerod run --nproc N"), std::string::npos) << msg;
    ASSERT_EQ(zd_connect("embedded:", nullptr, &c), ZD_OK) << last();
    zd_disconnect(c);
    ScopedEnv explicit_embedded("ZEROD_ENDPOINT", "embedded:");
    ASSERT_EQ(zd_connect(nullptr, nullptr, &c), ZD_OK) << last();
    zd_disconnect(c);
  }
  // Several nodes: the nodes' daemons join through a name server that node
  // 0 hands out at MASTER_ADDR:MASTER_PORT+1; with neither that nor a
  // server of the user's, refused saying what to set.
  {
    ScopedEnv size("WORLD_SIZE", "4"), rank("RANK", "3"), local("LOCAL_WORLD_SIZE", "2"), job("ZEROD_JOB", "j.lua");
    ScopedEnv addr("MASTER_ADDR", nullptr), port("MASTER_PORT", nullptr), rdv("ZEROD_RENDEZVOUS", nullptr),
        server("ZEROD_OMPI_SERVER", nullptr);
    zd_client* c = nullptr;
    EXPECT_EQ(zd_connect(nullptr, nullptr, &c), ZD_ERR_CONFIG);
    EXPECT_NE(last().find("MASTER_ADDR and MASTER_PORT are not both set"), std::string::npos) << last();
    EXPECT_NE(last().find("ZEROD_RENDEZVOUS=<node 0's host>:<a free port>"), std::string::npos) << last();
    EXPECT_NE(last().find("ZEROD_OMPI_SERVER=file:"), std::string::npos) << last();
    EXPECT_NE(last().find("zerod run --nproc 2"), std::string::npos) << last();
  }
  // A world of one is one process.
  ScopedEnv one("WORLD_SIZE", "1");
  zd_client* c = nullptr;
  ASSERT_EQ(zd_connect(nullptr, nullptr, &c), ZD_OK) << last();
  zd_disconnect(c);
}

TEST(Connect, ADaemonThatIsNotThereIsAClearError) {
  zd_client* c = reinterpret_cast<zd_client*>(0x1);
  EXPECT_EQ(zd_connect("unix:/tmp/zerod-no-such-daemon/zerod.sock", nullptr, &c), ZD_ERR_IO);
  EXPECT_EQ(c, nullptr);
  EXPECT_NE(last().find("/tmp/zerod-no-such-daemon/zerod.sock"), std::string::npos) << last();
  EXPECT_NE(last().find("is the daemon running?"), std::string::npos) << last();
}

TEST(Connect, UnknownSchemeIsRefusedByName) {
  zd_client* c = nullptr;
  EXPECT_EQ(zd_connect("tcp://host:1", nullptr, &c), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("tcp://host:1"), std::string::npos) << last();
}

TEST(Connect, RefusesACallerBuiltAgainstANewerMajor) {
  zd_connect_options o = ZD_CONNECT_OPTIONS_INIT;
  o.abi_version = (ZD_ABI_VERSION_MAJOR + 1) << 16;
  zd_client* c = nullptr;
  EXPECT_EQ(zd_connect("embedded:", &o, &c), ZD_ERR_VERSION);
  EXPECT_NE(last().find("ABI 2.0"), std::string::npos) << last();
  // An older minor of the same major is fine.
  o.abi_version = ZD_ABI_VERSION_MAJOR << 16;
  ASSERT_EQ(zd_connect("embedded:", &o, &c), ZD_OK) << last();
  zd_disconnect(c);
}

TEST(Connect, AnOptionsStructWithoutItsSizeIsRefused) {
  zd_connect_options o{};
  zd_client* c = nullptr;
  EXPECT_EQ(zd_connect("embedded:", &o, &c), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("struct_size"), std::string::npos) << last();
}

TEST(Connect, AShorterOptionsStructFromAnOlderCallerIsAccepted) {
  // A caller that knew only the first two fields.
  zd_connect_options o = ZD_CONNECT_OPTIONS_INIT;
  o.struct_size = 8;
  o.timeout_ms = 0xdeadbeef;  // beyond its size: must be ignored
  zd_client* c = nullptr;
  ASSERT_EQ(zd_connect("embedded:", &o, &c), ZD_OK) << last();
  zd_disconnect(c);
}

TEST(Versions, LibraryReportsItsAbiAndVersion) {
  EXPECT_EQ(zd_abi_version(), static_cast<uint32_t>(ZD_ABI_VERSION));
  EXPECT_GT(std::strlen(zd_version()), 0u);
}

TEST(Versions, EveryStatusHasAName) {
  EXPECT_STREQ(zd_status_str(ZD_OK), "ZD_OK");
  EXPECT_STREQ(zd_status_str(ZD_ERR_CONFIG), "ZD_ERR_CONFIG");
  EXPECT_STREQ(zd_status_str(ZD_ERR_INTERNAL), "ZD_ERR_INTERNAL");
  for (zd_status s = ZD_OK; s <= ZD_ERR_INTERNAL; ++s)
    EXPECT_EQ(std::strncmp(zd_status_str(s), "ZD_", 3), 0) << s;
  EXPECT_STREQ(zd_status_str(12345), "ZD_ERR_UNKNOWN");
}

TEST(Versions, DestroyingNullIsANoOp) {
  zd_disconnect(nullptr);
  zd_model_destroy(nullptr);
  EXPECT_STREQ(zd_model_last_error(nullptr), "");
}

class ModeTest : public AbiTest {};

TEST_F(ModeTest, ClientInfoSaysWhichModeThisIs) {
  zd_client_info info = ZD_CLIENT_INFO_INIT;
  ASSERT_EQ(zd_client_get_info(client_, &info), ZD_OK) << last();
  EXPECT_EQ(info.embedded, daemon_mode() ? 0 : 1);
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
}
