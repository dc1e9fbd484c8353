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

// A struct_size must end on a field boundary of its struct: the end of a
// field a caller's older, shorter struct had (or the padding after it), or
// sizeof and more. One that ends inside a field is refused naming the
// struct, the size and the sizes taken: copied as given it made half a
// pointer the caller's and half the default (zd_model_options with
// struct_size 20 crashed zd_model_create).
class StructSizeTest : public AbiTest {
 protected:
  // Where each field ends or begins, from the header's layout: the sizes a
  // caller's struct may have below sizeof.
  static bool on_boundary(const std::vector<std::pair<size_t, size_t>>& fields, size_t size) {
    for (const auto& [at, n] : fields)
      if (size == at || size == at + n) return true;
    return false;
  }
  static bool refused_for_size(zd_status st, const char* what, size_t size) {
    const std::string m = last();
    return st == ZD_ERR_INVALID_ARGUMENT &&
           m.find(std::string(what) + ".struct_size is " + std::to_string(size) + ", which ends inside its field") !=
               std::string::npos &&
           m.find("it must end on a field boundary (") != std::string::npos;
  }
};

#define FIELD(T, f) std::pair<size_t, size_t>{offsetof(T, f), sizeof(T::f)}

TEST_F(StructSizeTest, EverySizeOfTheModelOptionsIsTakenOrRefusedByName) {
  const std::vector<std::pair<size_t, size_t>> fields = {
      FIELD(zd_model_options, struct_size), FIELD(zd_model_options, flags),       FIELD(zd_model_options, script_path),
      FIELD(zd_model_options, script_text), FIELD(zd_model_options, script_name), FIELD(zd_model_options, device)};
  ScopedEnv no_job("ZEROD_JOB", nullptr);  // `zerod run --job` sets it: a struct without the script's fields would use it
  const std::string job = sgd_job();
  for (uint32_t size = 4; size <= sizeof(zd_model_options) + 8; ++size) {
    SCOPED_TRACE("struct_size " + std::to_string(size));
    zd_model_options o = ZD_MODEL_OPTIONS_INIT;
    o.struct_size = size;
    o.script_text = job.c_str();
    zd_model* m = nullptr;
    const zd_status st = zd_model_create(client_, &o, &m);
    if (size >= sizeof(zd_model_options) ||
        (on_boundary(fields, size) && size >= offsetof(zd_model_options, script_text) + sizeof(o.script_text))) {
      EXPECT_EQ(st, ZD_OK) << last();
    } else if (on_boundary(fields, size)) {
      // It stops before script_text: as if none were given.
      EXPECT_EQ(st, ZD_ERR_INVALID_ARGUMENT);
      EXPECT_NE(last().find("options.struct_size is " + std::to_string(size) + ", which ends before"),
                std::string::npos)
          << last();
    } else {
      EXPECT_TRUE(refused_for_size(st, "zd_model_options", size)) << last();
      EXPECT_EQ(m, nullptr);
    }
    zd_model_destroy(m);
  }
  // The crash case, in full.
  zd_model_options o = ZD_MODEL_OPTIONS_INIT;
  o.struct_size = 20;
  o.script_text = job.c_str();
  zd_model* m = nullptr;
  EXPECT_EQ(zd_model_create(client_, &o, &m), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("zd_model_options.struct_size is 20, which ends inside its field 'script_text' (bytes 16..23); "
                        "it must end on a field boundary (4, 8, 16, 24 or 32"),
            std::string::npos)
      << last();
  EXPECT_NE(last().find("or be at least sizeof(zd_model_options) = 40"), std::string::npos) << last();
  // 1.0's struct (no `device`) is a boundary: still taken.
  o.struct_size = offsetof(zd_model_options, device);
  o.device = "not read";
  ASSERT_EQ(zd_model_create(client_, &o, &m), ZD_OK) << last();
  zd_model_destroy(m);
}

TEST_F(StructSizeTest, TheConnectOptionsAndTheProgress) {
  zd_connect_options co = ZD_CONNECT_OPTIONS_INIT;
  zd_client* c = nullptr;
  for (const uint32_t size : {5u, 6u, 7u, 9u, 15u}) {
    co.struct_size = size;
    EXPECT_TRUE(refused_for_size(zd_connect("embedded:", &co, &c), "zd_connect_options", size)) << last();
    EXPECT_EQ(c, nullptr);
  }
  EXPECT_NE(last().find("(4, 8 or 12: "), std::string::npos) << last();
  for (const uint32_t size : {4u, 8u, 12u, 16u, 24u}) {
    co.struct_size = size;
    ASSERT_EQ(zd_connect("embedded:", &co, &c), ZD_OK) << size << ": " << last();
    zd_disconnect(c);
  }
  zd_model* m = model(sgd_job());
  zd_progress p = ZD_PROGRESS_INIT;
  for (const uint32_t size : {6u, 12u, 20u, 28u, 36u}) {
    p.struct_size = size;
    EXPECT_TRUE(refused_for_size(zd_model_report(m, &p), "zd_progress", size)) << last();
  }
  p.reserved = 7;  // past a struct_size of 32: not read
  p.struct_size = offsetof(zd_progress, reserved);
  EXPECT_EQ(zd_model_report(m, &p), ZD_OK) << last();
  zd_model_destroy(m);
}

TEST_F(StructSizeTest, AParameterDescWithoutAFieldEveryParameterNeedsSaysSo) {
  zd_model* m = model(sgd_job());
  const int64_t shape[1] = {4};
  zd_param_desc d = ZD_PARAM_DESC_INIT;
  d.name = "w";
  d.module = "l";
  d.ndim = 1;
  d.shape = shape;
  zd_param_id id = -1;
  for (const auto& [size, field] : {std::pair{8u, "name"}, std::pair{16u, "module"}, std::pair{24u, "ndim"},
                                    std::pair{28u, "shape"}, std::pair{32u, "shape"}}) {
    d.struct_size = size;
    EXPECT_EQ(zd_model_register_param(m, &d, &id), ZD_ERR_INVALID_ARGUMENT);
    EXPECT_NE(last().find("zd_param_desc.struct_size is " + std::to_string(size) + ", which ends before desc." +
                          field + ", a field every parameter needs"),
              std::string::npos)
        << last();
  }
  for (const uint32_t size : {12u, 20u, 26u, 36u, 44u, 50u}) {
    d.struct_size = size;
    EXPECT_TRUE(refused_for_size(zd_model_register_param(m, &d, &id), "zd_param_desc", size)) << last();
  }
  // Without init (40) or init_dtype (48, 52): zeros, the parameter's dtype.
  const float ones[4] = {1, 1, 1, 1};
  d.init = ones;
  const char* names[] = {"a", "b", "c"};
  int k = 0;
  for (const uint32_t size : {40u, 48u, 52u}) {
    d.struct_size = size;
    d.name = names[k++];
    EXPECT_EQ(zd_model_register_param(m, &d, &id), ZD_OK) << size << ": " << last();
  }
  ASSERT_EQ(zd_model_finalize(m), ZD_OK) << last();
  EXPECT_EQ(read(m, 0, 4), std::vector<float>(4, 0.0f)) << "init lies past struct_size 40";
  EXPECT_EQ(read(m, 1, 4), std::vector<float>(4, 1.0f));
  zd_model_destroy(m);
}

TEST_F(StructSizeTest, AnOutputStructIsWrittenUpToAFieldBoundaryOrRefusedWhole) {
  zd_client_info ci{};
  ci.struct_size = 6;
  EXPECT_TRUE(refused_for_size(zd_client_get_info(client_, &ci), "zd_client_info", 6)) << last();
  ci = {};
  ci.struct_size = offsetof(zd_client_info, local_rank);
  ci.local_rank = 77;
  ci.embedded = 77;
  ASSERT_EQ(zd_client_get_info(client_, &ci), ZD_OK) << last();
  EXPECT_EQ(ci.world_size, 1);
  EXPECT_EQ(ci.local_rank, 77) << "past struct_size: not written";

  zd_model* m = model(sgd_job());
  const zd_param_id p = add(m, "w", "l", {3});
  ASSERT_EQ(zd_model_finalize(m), ZD_OK) << last();
  const zd_module_id mod = module_id(m, "l");

  zd_param_info pi = ZD_PARAM_INFO_INIT;
  for (const uint32_t size : {12u, 40u, 90u}) {  // inside name, shape, numel
    pi.struct_size = size;
    EXPECT_TRUE(refused_for_size(zd_model_param_info(m, p, &pi), "zd_param_info", size)) << last();
  }
  zd_memory_figures mf{};
  mf.struct_size = 12;
  EXPECT_TRUE(refused_for_size(zd_model_memory(m, -1, ZD_TIER_DEVICE, ZD_MEM_ALL, &mf), "zd_memory_figures", 12))
      << last();
  mf.struct_size = offsetof(zd_memory_figures, peak);
  mf.peak = 5;
  ASSERT_EQ(zd_model_memory(m, -1, ZD_TIER_DEVICE, ZD_MEM_ALL, &mf), ZD_OK) << last();
  EXPECT_GT(mf.current, 0u);
  EXPECT_EQ(mf.peak, 5u) << "past struct_size: not written";
  zd_comm_figures cf{};
  cf.struct_size = 20;
  EXPECT_TRUE(refused_for_size(zd_model_comm_figures(m, -1, &cf), "zd_comm_figures", 20)) << last();
  zd_optimizer_info oi{};
  oi.struct_size = 20;
  EXPECT_TRUE(refused_for_size(zd_model_optimizer_info(m, &oi), "zd_optimizer_info", 20)) << last();

  ASSERT_EQ(zd_forward_begin(m, mod), ZD_OK) << last();
  zd_view v{};
  for (const uint32_t size : {12u, 50u, 116u}) {  // inside data, shape, offset
    v.struct_size = size;
    EXPECT_TRUE(refused_for_size(zd_param_view(m, p, &v), "zd_view", size)) << last();
  }
  ASSERT_EQ(zd_forward_end(m, mod), ZD_OK) << last();
  // zd_step checks its output before it steps: refused, nothing ran.
  zd_step_result r{};
  r.struct_size = 12;
  EXPECT_TRUE(refused_for_size(zd_step(m, &r), "zd_step_result", 12)) << last();
  r = ZD_STEP_RESULT_INIT;
  ASSERT_EQ(zd_step(m, &r), ZD_OK) << last();
  EXPECT_EQ(r.micro_step, 1);
  zd_model_destroy(m);
}

#undef FIELD

// The message says which argument is NULL, and where an endpoint came from.
TEST_F(ModeTest, ArgumentErrorsNameTheCulprit) {
  zd_model* m = model(sgd_job());
  add(m, "w", "l", {2});
  zd_module_id id = -1;
  EXPECT_EQ(zd_model_find_module(m, nullptr, &id), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(last(), "zd_model_find_module: name is NULL");
  EXPECT_EQ(zd_model_find_module(m, "l", nullptr), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(last(), "zd_model_find_module: out_id is NULL");
  EXPECT_EQ(zd_model_find_param(nullptr, "w", &id), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(last(), "zd_model_find_param: model is NULL");
  EXPECT_EQ(zd_model_find_param(m, nullptr, &id), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(last(), "zd_model_find_param: name is NULL");
  // A check that names its call is not prefixed with it again.
  ASSERT_EQ(zd_model_finalize(m), ZD_OK) << last();
  float buf[2];
  EXPECT_EQ(zd_param_read(m, 0, ZD_DTYPE_F32, buf, 4), ZD_ERR_SHAPE_MISMATCH);
  EXPECT_EQ(last().rfind("zd_param_read of 'w': it has 2 elements", 0), 0u) << last();
  EXPECT_EQ(zd_optimizer_state_read(m, 0, 0, ZD_DTYPE_F32, buf, 8), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(last(), "zd_optimizer_state_read: optimizer 'sgd' keeps no state, so it has no state slot 0");
  zd_model_destroy(m);
  zd_client* c = nullptr;
  ScopedEnv bogus("ZEROD_ENDPOINT", "bogus:thing");
  EXPECT_EQ(zd_connect(nullptr, nullptr, &c), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("unknown endpoint 'bogus:thing' (from ZEROD_ENDPOINT)"), std::string::npos) << last();
  EXPECT_EQ(zd_connect("bogus:other", nullptr, &c), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(last().find("ZEROD_ENDPOINT"), std::string::npos) << "named by the caller: " << last();
}
