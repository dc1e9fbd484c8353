// A call that grows a rank's device pool by more arenas than one socket
// frame has fds for (transport::kMaxFdsPerFrame, 253: the kernel's
// SCM_MAX_FD) still answers: a GPU pool grows in 256 MiB chunks, one fd
// each, so past 63 GiB in one call, or a kept model's whole pool when its
// restarted rank re-attaches. The daemon sends the arenas in several frames
// (wire::send_arenas) and libzerod maps every one. Before, the daemon could
// not send its answer: on the socket carrier it closed the connection (the
// trainer saw the daemon gone), on the ring the call failed and the arenas
// counted as sent, so later views pointed into memory the client never got.
// A client that takes one frame only (an older libzerod) is told so by an
// error, and keeps its connection.
//
// The daemon runs in this process and the trainer is libzerod itself
// (zd_connect to the daemon's socket). The pool grows the way a large
// model's does, by blocks that each need a new arena, taken from the rank's
// device directly: the cpu device's 64 MiB arenas are sparse memfds, and
// nothing touches those blocks, so 300 of them cost address space only.
#include "daemon_client.h"
#include "model_host.h"
#include "server.h"

#include "device/device.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <zerod/zerod.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

using namespace zerod;

namespace {

constexpr size_t kNewArenas = 300;  // more than one frame's 253 fds
constexpr uint64_t kBlockBytes = uint64_t{64} << 20;  // the cpu device's arena: each block needs a new one
const char* const kJob =
    "return { optimizer = { type = 'sgd', lr = 0.1 }, zero = { stage = 0 }, device = 'cpu', "
    "budgets = { device = '64GiB' } }";

std::string last_error() { return zd_last_error(); }

// How many mappings of this process are of memfd inodes in `inodes`.
size_t mappings_of(const std::set<ino_t>& inodes) {
  std::ifstream maps("/proc/self/maps");
  size_t n = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/memfd:") == std::string::npos) continue;
    std::istringstream fields(line);
    std::string range, perms, offset, dev;
    ino_t inode = 0;
    fields >> range >> perms >> offset >> dev >> inode;
    n += inodes.count(inode);
  }
  return n;
}

struct GrownPool : ::testing::Test {
  void SetUp() override {
    server::ServerOptions o;
    o.world_size = 1;
    srv = std::make_unique<server::Server>(o);
    srv->start();
  }
  void TearDown() override {
    release_blocks();
    host.reset();
    srv->stop();
  }

  // The rank's device pool, as its model's calls grow it. Only this test
  // reaches in to grow it itself; `host` keeps the model, and so the pool
  // its blocks are in, until they are given back, however the client ends.
  Device& pool() { return const_cast<Device&>(host->model().device(0)); }
  // Grows the pool of the daemon's one model by kNewArenas arenas; returns
  // their memfds' inodes.
  std::set<ino_t> grow_pool() {
    const auto models = srv->models();
    EXPECT_EQ(models.size(), 1u);
    if (models.empty()) return {};
    host = models[0];
    Device& d = pool();
    const size_t before = d.exports().size();
    while (d.exports().size() < before + kNewArenas && blocks.size() < 2 * kNewArenas)
      blocks.push_back(d.allocate_for_overwrite(kBlockBytes, ZD_MEM_BUFFERS, "the test's block"));
    const std::vector<PoolExport> arenas = d.exports();
    EXPECT_EQ(arenas.size(), before + kNewArenas);
    std::set<ino_t> inodes;
    for (size_t i = before; i < arenas.size(); ++i) {
      struct stat st {};
      EXPECT_EQ(fstat(arenas[i].fd, &st), 0);
      inodes.insert(st.st_ino);
    }
    return inodes;
  }
  void release_blocks() {
    if (blocks.empty()) return;
    Device& d = pool();
    for (const Block& b : blocks) d.release(b, ZD_MEM_BUFFERS);
    blocks.clear();
  }

  std::unique_ptr<server::Server> srv;
  std::shared_ptr<server::ModelHost> host;
  std::vector<Block> blocks;
};

// libzerod on either carrier. true: the call ring; false: socket frames (ZEROD_NO_RING=1).
struct ArenaBatches : GrownPool, ::testing::WithParamInterface<bool> {};
// A client that takes a call's new arenas in one frame only.
using OneFrameClient = GrownPool;

}  // namespace

TEST_P(ArenaBatches, ACallThatGrowsThePoolByMoreArenasThanAFrameCarriesAnswersAndTheClientMapsThemAll) {
  if (!GetParam()) setenv("ZEROD_NO_RING", "1", 1);
  zd_client* c = nullptr;
  const zd_status connected = zd_connect(("unix:" + srv->socket_path()).c_str(), nullptr, &c);
  unsetenv("ZEROD_NO_RING");
  ASSERT_EQ(connected, ZD_OK) << last_error();
  zd_model_options mo = ZD_MODEL_OPTIONS_INIT;
  mo.script_text = kJob;
  zd_model* m = nullptr;
  ASSERT_EQ(zd_model_create(c, &mo, &m), ZD_OK) << last_error();
  const std::vector<float> init{1, 2, 3, 4};
  const int64_t shape[1] = {4};
  zd_param_desc d = ZD_PARAM_DESC_INIT;
  d.name = "w";
  d.module = "m0";
  d.ndim = 1;
  d.shape = shape;
  d.init = init.data();
  d.init_dtype = ZD_DTYPE_F32;
  zd_param_id p = 0;
  ASSERT_EQ(zd_model_register_param(m, &d, &p), ZD_OK) << last_error();
  ASSERT_EQ(zd_model_finalize(m), ZD_OK) << last_error();

  const std::set<ino_t> grown = grow_pool();
  ASSERT_EQ(grown.size(), kNewArenas);
  EXPECT_EQ(mappings_of(grown), kNewArenas) << "the daemon maps each arena once; the client none yet";

  // The begin's answer announces the 300 arenas (two frames), then its view.
  ASSERT_EQ(zd_forward_begin(m, 0), ZD_OK) << last_error();
  EXPECT_EQ(mappings_of(grown), 2 * kNewArenas) << "the client did not map every new arena";
  zd_view v = ZD_VIEW_INIT;
  ASSERT_EQ(zd_param_view(m, p, &v), ZD_OK) << last_error();
  ASSERT_EQ(v.nbytes, init.size() * sizeof(float));
  EXPECT_EQ(std::vector<float>(static_cast<const float*>(v.data), static_cast<const float*>(v.data) + 4), init);
  ASSERT_EQ(zd_forward_end(m, 0), ZD_OK) << last_error();
  // The connection is still in step: the next call answers as usual.
  zd_memory_figures mem = ZD_MEMORY_FIGURES_INIT;
  EXPECT_EQ(zd_model_memory(m, -1, ZD_TIER_DEVICE, ZD_MEM_ALL, &mem), ZD_OK) << last_error();
  EXPECT_GE(mem.current, kNewArenas * kBlockBytes);

  release_blocks();
  zd_model_destroy(m);
  zd_disconnect(c);
}

INSTANTIATE_TEST_SUITE_P(Carriers, ArenaBatches, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& carrier) {
                           return carrier.param ? "Ring" : "SocketFrames";
                         });

// A client whose hello does not say arena_batches takes a call's new arenas
// in one frame: a call that grew the pool by more gets ZD_ERR_VERSION that
// says why, on the call-record carrier and on an older libzerod's protobuf
// model calls, and the connection goes on answering.
TEST_F(OneFrameClient, IsToldWhyACallThatGrewThePoolByMoreArenasThanAFrameCarriesFailsAndKeepsItsConnection) {
  test::DaemonClient c(srv->socket_path());
  ASSERT_FALSE(c.hello().has_error());
  const int model = c.create(kJob);
  const std::vector<float> init{1, 2, 3, 4};
  ASSERT_FALSE(c.register_param(model, "w", "m0", 4, &init).has_error());
  ASSERT_FALSE(c.finalize(model).has_error());
  grow_pool();

  calls::Args a{};
  a.op = calls::Op::loss_scale;
  EXPECT_EQ(c.call_record(model, a).status, ZD_ERR_VERSION);
  const v1::Reply old = c.call(model, v1::ModelCall::LOSS_SCALE);
  ASSERT_TRUE(old.has_error());
  EXPECT_EQ(old.error().status(), ZD_ERR_VERSION);
  EXPECT_NE(old.error().message().find("more than the 253 fds one socket frame carries"), std::string::npos)
      << old.error().message();
  EXPECT_NE(old.error().message().find("use the daemon's own libzerod"), std::string::npos) << old.error().message();
  EXPECT_FALSE(c.status().has_error());
  release_blocks();
  EXPECT_FALSE(c.destroy(model).has_error());
}
