// The nccl plugin's conformance on a GPU: two daemons (processes) on one
// GPU, one rank each, the way issue 32 runs them. NCCL 2.28 refuses two
// ranks of one communicator on one GPU unless they look like two hosts, so
// each daemon gets its own NCCL_HOSTID (NCCL then joins them over loopback
// sockets). The same checks as comm_mpi's ops, failure and compressed
// tests, on device buffers (cudaMalloc'ed on the rank's GPU, handed to
// NCCL as they are) and on host buffers (staged through the rank's GPU):
// values against the plain reference, every collective, mismatched calls,
// a timeout told to the other daemon, a lost daemon named, the traffic
// figures, and a timed all-reduce that bench/gpu/run.sh prints.
//
// Run without arguments it is the launcher: it starts itself twice as
// node 0 and node 1 (ZEROD_NCCL_TEST_NODE), with ZEROD_NCCL_ROOT on a free
// loopback port, and passes when both pass. Without a CUDA device it exits
// 77 (ctest: Skipped) and says why. Never run yet: written without a GPU.
#include <gmock/gmock.h>

#include <cuda_runtime.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm_test_util.h"
#include "onebit_reference.h"

namespace zerod::comm::test {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

int env_int(const char* k, int def) {
  const char* v = std::getenv(k);
  return v != nullptr && *v != '\0' ? std::atoi(v) : def;
}
int node() { return env_int("ZEROD_NCCL_TEST_NODE", 0); }
int nodes() { return env_int("ZEROD_NCCL_TEST_NODES", 1); }

const zd_comm_v3* nccl_plugin() {
  static std::string why;
  static const auto* d = reinterpret_cast<const zd_comm_v3*>(comm_descriptor("zd_comm_nccl.so", 3, &why));
  if (d == nullptr) ADD_FAILURE() << why;
  return d;
}

// One rank per daemon: rank = node.
class NcclComm {
 public:
  explicit NcclComm(double timeout_s = 60, bool check = true) : d_(nccl_plugin()) {
    if (d_ == nullptr) return;
    const double values[] = {timeout_s, 0, check ? 1.0 : 0.0, 0};
    const zd_comm_config cfg = config_of(nodes(), node(), 1);
    char buf[1024] = "";
    const zd_status st = d_->create(nullptr, values, 4, &cfg, &inst_, buf, sizeof buf);
    EXPECT_EQ(st, ZD_OK) << buf;
  }
  ~NcclComm() {
    if (inst_ != nullptr) d_->destroy(inst_);
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  bool ok() const { return inst_ != nullptr; }
  const zd_comm_v3& d() const { return *d_; }
  void* inst() const { return inst_; }
  int rank() const { return node(); }
  int world() const { return nodes(); }
  std::string error() const { return d_->last_error(inst_, rank()); }

 private:
  const zd_comm_v3* d_;
  void* inst_ = nullptr;
};

zd_comm_call call(uint64_t tag, const char* what, uint32_t timeout_ms = 60000) {
  return call_for(node(), tag, what, timeout_ms);
}

// A buffer on the GPU with the bytes of a host Buffer.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    EXPECT_EQ(cudaMalloc(&p_, bytes ? bytes : 1), cudaSuccess);
  }
  explicit DeviceBuffer(const Buffer& b) : DeviceBuffer(b.bytes.size()) { upload(b); }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }
  void* at(size_t byte) const { return static_cast<char*>(p_) + byte; }
  void upload(const Buffer& b) {
    if (!b.bytes.empty()) {
      EXPECT_EQ(cudaMemcpy(p_, b.data(), b.bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
      // From pageable memory cudaMemcpy may return before the bytes land,
      // and the plugin's stream does not wait for the default stream.
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
  }
  void download(Buffer* b) const {
    if (!b->bytes.empty()) {
      EXPECT_EQ(cudaMemcpy(b->data(), p_, b->bytes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    }
  }

 private:
  void* p_ = nullptr;
};

uint64_t seed_of(int rank, size_t count, int salt) {
  return (static_cast<uint64_t>(rank) << 40) ^ (static_cast<uint64_t>(count) << 8) ^ static_cast<uint64_t>(salt);
}

std::vector<Buffer> inputs(zd_comm_dtype dt, size_t count, int salt, bool specials) {
  std::vector<Buffer> in;
  for (int r = 0; r < nodes(); ++r) in.push_back(random_buffer(dt, count, seed_of(r, count, salt), specials));
  return in;
}

// NCCL's 16-bit sums may round differently from the reference's (fp32 add
// rounded once) in the last place; everything else is exact (two ranks:
// a + b is b + a).
::testing::AssertionResult matches(const Buffer& want, const Buffer& got, zd_reduce_op op) {
  if (op == ZD_REDUCE_MAX || want.dtype == ZD_COMM_F32 || want.dtype == ZD_COMM_F64 || want.dtype == ZD_COMM_U8)
    return same_values(want, got);
  const double ulp = want.dtype == ZD_COMM_BF16 ? 0x1p-7 : 0x1p-10;
  for (size_t i = 0; i < want.count(); ++i) {
    const double w = want.get(i), g = got.get(i);
    if (w == g || (std::isnan(w) && std::isnan(g))) continue;
    if (std::fabs(w - g) <= ulp * std::fabs(w)) continue;
    return ::testing::AssertionFailure() << name_of(want.dtype) << " element " << i << ": want " << w << ", got " << g;
  }
  return ::testing::AssertionSuccess();
}

const size_t kCounts[] = {0, 1, 3, 1000, 5003, size_t{1} << 20};
const zd_comm_dtype kDtypes[] = {ZD_COMM_F32, ZD_COMM_BF16, ZD_COMM_F16, ZD_COMM_F64};

class NcclOps : public ::testing::TestWithParam<bool> {  // true: device buffers
 protected:
  bool device() const { return GetParam(); }
};

TEST_P(NcclOps, AllReduceMatchesTheReference) {
  NcclComm comm;
  ASSERT_TRUE(comm.ok());
  int salt = 0;
  for (zd_comm_dtype dt : kDtypes) {
    for (size_t count : kCounts) {
      for (zd_reduce_op op : {ZD_REDUCE_SUM, ZD_REDUCE_MAX}) {
        // NaN, infinities, signed zeros and subnormals in fp32 and fp64
        // sums only: NCCL's max is fmax (a NaN loses, where the contract
        // and the reference keep it: docs/nccl.md), and whether its 16-bit
        // sums keep subnormals is not the contract's to say.
        ++salt;
        const bool specials = op == ZD_REDUCE_SUM && (dt == ZD_COMM_F32 || dt == ZD_COMM_F64) && salt % 4 == 1;
        const std::vector<Buffer> in = inputs(dt, count, salt, specials);
        std::vector<const Buffer*> all;
        for (const auto& b : in) all.push_back(&b);
        Buffer want(dt, count);
        reference_reduce(op, all, 0, count, &want, 0);
        Buffer got = in[static_cast<size_t>(comm.rank())];
        DeviceBuffer dev(got);
        const zd_comm_call c = call(7, "all_reduce test");
        ASSERT_EQ(comm.d().all_reduce(comm.inst(), &c, device() ? dev.get() : got.data(), count, dt, op), ZD_OK)
            << comm.error();
        if (device()) dev.download(&got);
        ASSERT_TRUE(matches(want, got, op)) << name_of(dt) << " count " << count << " op " << op;
      }
    }
  }
}

TEST_P(NcclOps, ReduceScatterGivesEveryRankItsChunk) {
  NcclComm comm;
  ASSERT_TRUE(comm.ok());
  const int world = comm.world(), r = comm.rank();
  int salt = 100;
  for (zd_comm_dtype dt : kDtypes) {
    for (size_t count : kCounts) {
      for (bool in_place : {false, true}) {
        const zd_reduce_op op = ++salt % 2 ? ZD_REDUCE_SUM : ZD_REDUCE_MAX;
        const std::vector<Buffer> in = inputs(dt, count * world, salt, false);
        std::vector<const Buffer*> all;
        for (const auto& b : in) all.push_back(&b);
        Buffer want(dt, count);
        reference_reduce(op, all, r * count, count, &want, 0);
        Buffer send = in[static_cast<size_t>(r)];
        Buffer got(dt, count);
        DeviceBuffer dsend(send), drecv(got.bytes.size());
        const size_t off = r * count * size_of(dt);
        void* s = device() ? dsend.get() : send.data();
        void* out = in_place ? (device() ? dsend.at(off) : send.at(r * count)) : (device() ? drecv.get() : got.data());
        const zd_comm_call c = call(8, "reduce_scatter test");
        ASSERT_EQ(comm.d().reduce_scatter(comm.inst(), &c, s, out, count, dt, op), ZD_OK) << comm.error();
        if (count > 0) {
          if (device()) {
            EXPECT_EQ(cudaMemcpy(got.data(), out, count * size_of(dt), cudaMemcpyDeviceToHost), cudaSuccess);
          } else if (in_place) {
            std::memcpy(got.data(), out, count * size_of(dt));
          }
        }
        ASSERT_TRUE(matches(want, got, op)) << name_of(dt) << " count " << count << " in place " << in_place;
      }
    }
  }
}

TEST_P(NcclOps, AllGatherPutsChunkKFromRankK) {
  NcclComm comm;
  ASSERT_TRUE(comm.ok());
  const int world = comm.world(), r = comm.rank();
  int salt = 200;
  for (zd_comm_dtype dt : {ZD_COMM_F32, ZD_COMM_BF16, ZD_COMM_U8, ZD_COMM_F64}) {
    for (size_t count : kCounts) {
      for (bool in_place : {false, true}) {
        const std::vector<Buffer> in = inputs(dt, count, ++salt, true);
        Buffer want(dt, count * world);
        for (int k = 0; k < world; ++k)
          if (count) std::memcpy(want.at(k * count), in[static_cast<size_t>(k)].data(), count * size_of(dt));
        Buffer got(dt, count * world);
        if (in_place && count) std::memcpy(got.at(r * count), in[static_cast<size_t>(r)].data(), count * size_of(dt));
        DeviceBuffer dsend(in[static_cast<size_t>(r)]), drecv(got);
        const void* s = in_place ? (device() ? drecv.at(r * count * size_of(dt)) : got.at(r * count))
                                 : (device() ? dsend.get() : in[static_cast<size_t>(r)].data());
        const zd_comm_call c = call(9, "all_gather test");
        ASSERT_EQ(comm.d().all_gather(comm.inst(), &c, s, device() ? drecv.get() : got.data(), count, dt), ZD_OK)
            << comm.error();
        if (device()) drecv.download(&got);
        ASSERT_TRUE(same_values(want, got)) << name_of(dt) << " count " << count << " in place " << in_place;
      }
    }
  }
}

TEST_P(NcclOps, BroadcastFromEveryRoot) {
  NcclComm comm;
  ASSERT_TRUE(comm.ok());
  int salt = 300;
  for (int root = 0; root < comm.world(); ++root) {
    for (size_t count : kCounts) {
      const std::vector<Buffer> in = inputs(ZD_COMM_BF16, count, ++salt, true);
      Buffer got = in[static_cast<size_t>(comm.rank())];
      DeviceBuffer dev(got);
      const zd_comm_call c = call(10, "broadcast test");
      ASSERT_EQ(comm.d().broadcast(comm.inst(), &c, device() ? dev.get() : got.data(), count, ZD_COMM_BF16, root),
                ZD_OK)
          << comm.error();
      if (device()) dev.download(&got);
      ASSERT_TRUE(same_values(in[static_cast<size_t>(root)], got)) << "root " << root << " count " << count;
    }
  }
}

TEST_P(NcclOps, AllToAllSendsBlockKToRankK) {
  NcclComm comm;
  ASSERT_TRUE(comm.ok());
  const int world = comm.world(), r = comm.rank();
  int salt = 400;
  for (zd_comm_dtype dt : {ZD_COMM_U8, ZD_COMM_F32}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{1000}, size_t{65537}}) {
      const std::vector<Buffer> in = inputs(dt, count * world, ++salt, false);
      Buffer want(dt, count * world);
      for (int k = 0; k < world; ++k)
        if (count)
          std::memcpy(want.at(k * count), in[static_cast<size_t>(k)].bytes.data() + r * count * size_of(dt),
                      count * size_of(dt));
      Buffer send = in[static_cast<size_t>(r)], got(dt, count * world);
      DeviceBuffer dsend(send), drecv(got);
      const zd_comm_call c = call(11, "all_to_all test");
      ASSERT_EQ(comm.d().all_to_all(comm.inst(), &c, device() ? dsend.get() : send.data(),
                                    device() ? drecv.get() : got.data(), count, dt),
                ZD_OK)
          << comm.error();
      if (device()) drecv.download(&got);
      ASSERT_TRUE(same_values(want, got)) << name_of(dt) << " count " << count;
    }
  }
}

TEST_P(NcclOps, BarriersAndFiguresCount) {
  NcclComm comm(60, /*check=*/!device());  // both ways of meeting
  ASSERT_TRUE(comm.ok());
  for (int i = 0; i < 3; ++i) {
    const zd_comm_call c = call(12, "barrier test");
    ASSERT_EQ(comm.d().barrier(comm.inst(), &c), ZD_OK) << comm.error();
  }
  const size_t count = size_t{1} << 20;
  Buffer b = random_buffer(ZD_COMM_F32, count, 5);
  DeviceBuffer dev(b);
  const zd_comm_call c = call(13, "figures test");
  ASSERT_EQ(comm.d().all_reduce(comm.inst(), &c, device() ? dev.get() : b.data(), count, ZD_COMM_F32, ZD_REDUCE_SUM),
            ZD_OK)
      << comm.error();
  zd_comm_figures f = ZD_COMM_FIGURES_INIT;
  comm.d().figures(comm.inst(), comm.rank(), &f);
  // A ring of 2: 2 (N-1)/N of the buffer.
  EXPECT_EQ(f.bytes_sent, count * 4);
  EXPECT_EQ(f.network_bytes_sent, count * 4) << "each daemon is a node: its rank's sends leave it";
  EXPECT_EQ(f.collectives, 4u);
}

INSTANTIATE_TEST_SUITE_P(Buffers, NcclOps, ::testing::Values(true, false),
                         [](const auto& p) { return p.param ? std::string("Device") : std::string("Host"); });

TEST(NcclCompressed, MatchesTheReferenceOverSteps) {
  NcclComm comm;
  ASSERT_TRUE(comm.ok());
  const int world = comm.world(), me = comm.rank();
  for (uint64_t count : {uint64_t{4096}, uint64_t{1003}, uint64_t{13}}) {
    const uint64_t c = ref_chunk(count, world);
    std::vector<OnebitRank> ref(static_cast<size_t>(world)), got(static_cast<size_t>(world));
    for (auto* v : {&ref, &got})
      for (auto& r : *v) {
        r.worker_error.assign(count, 0.0f);
        r.server_error.assign(c, 0.0f);
      }
    std::mt19937 rng(static_cast<unsigned>(count));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int step = 0; step < 4; ++step) {
      for (int r = 0; r < world; ++r) {
        ref[r].buf.resize(count);
        for (auto& v : ref[r].buf) v = u(rng);
        got[r].buf = ref[r].buf;
      }
      onebit_reference(ref, count);
      const zd_comm_call cl = call(40, "step: compressed momentum");
      ASSERT_EQ(comm.d().compressed_all_reduce(comm.inst(), &cl, got[me].buf.data(), count,
                                               got[me].worker_error.data(), got[me].server_error.data()),
                ZD_OK)
          << comm.error();
      for (uint64_t i = 0; i < count; ++i) ASSERT_NEAR(got[me].worker_error[i], ref[me].worker_error[i], 1e-6);
      for (int k = 0; k < world; ++k) {
        const uint64_t b = std::min<uint64_t>(k * c, count);
        for (uint64_t i = 0; i < ref[k].server_value.size(); ++i) {
          if (std::fabs(ref[k].server_value[i]) < 1e-6f) {
            ref[me].buf[b + i] = got[me].buf[b + i];
            continue;
          }
          ASSERT_NEAR(got[me].buf[b + i], ref[me].buf[b + i], 1e-6) << "step " << step;
        }
      }
      for (uint64_t i = 0; i < ref[me].server_value.size(); ++i) {
        if (std::fabs(ref[me].server_value[i]) < 1e-6f) {
          ref[me].server_error[i] = got[me].server_error[i];
          continue;
        }
        ASSERT_NEAR(got[me].server_error[i], ref[me].server_error[i], 1e-6);
      }
      for (int r = 0; r < world; ++r)
        if (r != me) got[r] = ref[r];
    }
  }
}

// Ranks in different collectives: every rank fails with the same message,
// naming both calls, and the instance stays broken.
TEST(NcclFailures, MismatchedCallsFailEveryRankNamingThem) {
  NcclComm comm;
  ASSERT_TRUE(comm.ok());
  DeviceBuffer dev(64 * 4);
  const zd_comm_call c = call(20, comm.rank() == 0 ? "fc1 grads" : "fc2 grads");
  const uint64_t count = comm.rank() == 0 ? 10 : 11;
  EXPECT_EQ(comm.d().all_reduce(comm.inst(), &c, dev.get(), count, ZD_COMM_F32, ZD_REDUCE_SUM), ZD_ERR_INVALID_STATE);
  EXPECT_THAT(comm.error(), HasSubstr("different collectives"));
  EXPECT_THAT(comm.error(), HasSubstr("\"fc1 grads\""));
  EXPECT_THAT(comm.error(), HasSubstr("\"fc2 grads\""));
  const zd_comm_call b = call(21, "after");
  EXPECT_EQ(comm.d().barrier(comm.inst(), &b), ZD_ERR_INVALID_STATE);
}

// Node 1 arrives late: node 0's call times out, and node 1 is told, with
// node 0's message, instead of waiting for its own timeout.
TEST(NcclFailures, ATimeoutIsToldToTheOtherDaemon) {
  NcclComm comm(60);
  ASSERT_TRUE(comm.ok());
  DeviceBuffer dev(1024 * 4);
  if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(4));
  const auto t0 = std::chrono::steady_clock::now();
  const zd_comm_call c = call(22, "late", 2000);
  EXPECT_EQ(comm.d().all_reduce(comm.inst(), &c, dev.get(), 1024, ZD_COMM_F32, ZD_REDUCE_SUM), ZD_ERR_TIMEOUT);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_THAT(comm.error(), HasSubstr("node 0"));
  EXPECT_THAT(comm.error(), HasSubstr("did not complete within 2 s"));
  EXPECT_LT(s, comm.rank() == 0 ? 10.0 : 1.0);
}

// Node 1 calls with no zd_comm_call, then with a rank it does not serve:
// node 0, waiting in the collective, fails at once with node 1's reason
// instead of waiting out its 60 s (the plugin used to return without a
// word to anyone).
TEST(NcclFailures, ABadCallFailsTheOtherDaemonAtOnce) {
  for (bool null_call : {true, false}) {
    NcclComm comm(60);
    ASSERT_TRUE(comm.ok());
    DeviceBuffer dev(1024 * 4);
    const std::string why = null_call ? "node 1: a collective was called with a NULL zd_comm_call"
                                      : "node 1: a collective (\"stray\") was called with rank 5, outside 1..1 (the "
                                        "ranks this daemon serves)";
    const auto t0 = std::chrono::steady_clock::now();
    if (comm.rank() == 1) {
      const zd_comm_call stray = call_for(5, 24, "stray");
      EXPECT_EQ(comm.d().all_reduce(comm.inst(), null_call ? nullptr : &stray, dev.get(), 1024, ZD_COMM_F32,
                                    ZD_REDUCE_SUM),
                ZD_ERR_INVALID_ARGUMENT);
      const zd_comm_call after = call(25, "after");
      EXPECT_EQ(comm.d().barrier(comm.inst(), &after), ZD_ERR_INVALID_ARGUMENT);
    } else {
      const zd_comm_call c = call(24, "waiting", 60000);
      EXPECT_EQ(comm.d().all_reduce(comm.inst(), &c, dev.get(), 1024, ZD_COMM_F32, ZD_REDUCE_SUM),
                ZD_ERR_INVALID_ARGUMENT);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_THAT(comm.error(), HasSubstr(why));
    EXPECT_LT(s, 10.0);
  }
}

// Node 1's reduce_scatter writes where its send is read (recv = send, not
// send + 1 * recv_count): refused on both daemons before NCCL runs it.
TEST(NcclFailures, AnOverlapOtherThanInPlaceFailsEveryRank) {
  NcclComm comm;
  ASSERT_TRUE(comm.ok());
  constexpr size_t n = 256;
  DeviceBuffer send(2 * n * 4), recv(n * 4);
  const zd_comm_call c = call(26, comm.rank() == 1 ? "overlapping" : "good");
  void* to = comm.rank() == 1 ? send.get() : recv.get();
  EXPECT_EQ(comm.d().reduce_scatter(comm.inst(), &c, send.get(), to, n, ZD_COMM_F32, ZD_REDUCE_SUM),
            ZD_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(comm.error(), HasSubstr("send and recv overlap, not in place (recv = send + rank * recv_count)"));
  EXPECT_THAT(comm.error(), HasSubstr("\"overlapping\""));
}

// Node 1's create fails before the exchange (no root address): the next
// create on both daemons still meets as the same instance. (The failed one
// used to count on node 1, whose next create then claimed a later instance
// than node 0's, refused as a daemon restarted alone.)
TEST(NcclCreate, AFailedCreateBeforeTheExchangeKeepsTheDaemonsInStep) {
  if (node() == 1) {
    const zd_comm_v3* d = nccl_plugin();
    ASSERT_NE(d, nullptr);
    const std::string root = std::getenv("ZEROD_NCCL_ROOT");
    const char* master = std::getenv("MASTER_ADDR");
    const std::string master_addr = master != nullptr ? master : "";
    unsetenv("ZEROD_NCCL_ROOT");
    unsetenv("MASTER_ADDR");
    const double values[] = {60, 0, 1.0, 0};
    const zd_comm_config cfg = config_of(nodes(), node(), 1);
    char buf[1024] = "";
    void* inst = nullptr;
    EXPECT_EQ(d->create(nullptr, values, 4, &cfg, &inst, buf, sizeof buf), ZD_ERR_CONFIG);
    EXPECT_THAT(buf, HasSubstr("needs the address of its root daemon"));
    setenv("ZEROD_NCCL_ROOT", root.c_str(), 1);
    if (master != nullptr) setenv("MASTER_ADDR", master_addr.c_str(), 1);
  }
  NcclComm comm;
  EXPECT_TRUE(comm.ok()) << "the failed create put node 1 out of step";
}

// Last: node 1 leaves without a word (as a daemon that dies would, its
// sockets closed by the kernel); node 0 is told which node went.
TEST(NcclFailures, ALostDaemonIsNamed) {
  NcclComm comm(60);
  ASSERT_TRUE(comm.ok());
  if (comm.rank() == 1) {
    std::fflush(nullptr);
    _exit(0);  // the launcher takes node 1's exit status as its result
  }
  DeviceBuffer dev(1024 * 4);
  const auto t0 = std::chrono::steady_clock::now();
  const zd_comm_call c = call(23, "after a loss", 60000);
  const zd_status st = comm.d().all_reduce(comm.inst(), &c, dev.get(), 1024, ZD_COMM_F32, ZD_REDUCE_SUM);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(st, ZD_ERR_PEER_LOST) << comm.error();
  EXPECT_THAT(comm.error(), HasSubstr("node 1 (host "));
  EXPECT_THAT(comm.error(), HasSubstr("was lost"));
  EXPECT_LT(s, 30.0);
}

// Timed (for bench/gpu/run.sh nccl): all-reduce of 256 MiB of fp32 on
// device buffers, the bus bandwidth NCCL reports as busbw, and the bytes
// counted.
TEST(NcclBench, AllReduceOnDeviceBuffers) {
  NcclComm comm(120, /*check=*/true);
  ASSERT_TRUE(comm.ok());
  const size_t count = size_t{64} << 20;
  DeviceBuffer dev(count * 4);
  ASSERT_EQ(cudaMemset(dev.get(), 0, count * 4), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the plugin's stream does not wait for the default one
  for (int warm = 0; warm < 2; ++warm) {
    const zd_comm_call c = call(30, "warm-up");
    ASSERT_EQ(comm.d().all_reduce(comm.inst(), &c, dev.get(), count, ZD_COMM_F32, ZD_REDUCE_SUM), ZD_OK)
        << comm.error();
  }
  const int iters = 10;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    const zd_comm_call c = call(31, "timed");
    ASSERT_EQ(comm.d().all_reduce(comm.inst(), &c, dev.get(), count, ZD_COMM_F32, ZD_REDUCE_SUM), ZD_OK)
        << comm.error();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  zd_comm_figures f = ZD_COMM_FIGURES_INIT;
  comm.d().figures(comm.inst(), comm.rank(), &f);
  const double bus = 2.0 * (comm.world() - 1) / comm.world() * count * 4 / s / 1e9;
  std::printf("nccl bench: node %d: all_reduce of %zu MiB fp32 on device buffers, 2 daemons on one GPU: %.2f ms, "
              "busbw %.2f GB/s; bytes_sent %llu, network_bytes_sent %llu over %llu collectives\n",
              comm.rank(), count * 4 >> 20, s * 1e3, bus, static_cast<unsigned long long>(f.bytes_sent),
              static_cast<unsigned long long>(f.network_bytes_sent), static_cast<unsigned long long>(f.collectives));
}

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return 29512;
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// Starts this program as node 0 and node 1 with `filter`; true when both pass.
bool run_pair(char* self, const std::string& filter) {
  const int port = free_port();
  std::vector<pid_t> kids;
  for (int n = 0; n < 2; ++n) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      return false;
    }
    if (pid == 0) {
      setenv("ZEROD_NCCL_TEST_NODE", std::to_string(n).c_str(), 1);
      setenv("ZEROD_NCCL_TEST_NODES", "2", 1);
      setenv("ZEROD_NCCL_ROOT", ("127.0.0.1:" + std::to_string(port)).c_str(), 1);
      // Two hosts to NCCL, so that it puts two ranks on one GPU; joined
      // over the loopback (no other interface is needed, or wanted).
      setenv("NCCL_HOSTID", ("zerod-nccl-test-node-" + std::to_string(n)).c_str(), 1);
      setenv("NCCL_SOCKET_IFNAME", "lo", 0);
      setenv("NCCL_IB_DISABLE", "1", 0);
      // NCCL's own sockets even where the image has a network plugin, no
      // multi-node NVLink grouping of the two "hosts", and NCCL's warnings.
      setenv("NCCL_NET", "Socket", 0);
      setenv("NCCL_MNNVL_ENABLE", "0", 0);
      setenv("NCCL_DEBUG", "WARN", 0);
      const std::string f = "--gtest_filter=" + filter;
      char* args[] = {self, const_cast<char*>(f.c_str()), nullptr};
      execv("/proc/self/exe", args);
      std::perror("execv");
      _exit(127);
    }
    kids.push_back(pid);
  }
  bool ok = true;
  for (size_t n = 0; n < kids.size(); ++n) {
    int status = 0;
    waitpid(kids[n], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::printf("nccl conformance: node %zu of [%s] failed (%s %d)\n", n, filter.c_str(),
                  WIFEXITED(status) ? "exit" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
      ok = false;
    }
  }
  return ok;
}

// A --gtest_filter given is run as one pair; else everything, the lost
// daemon last and alone (its node 1 leaves without running what follows).
int launch(int argc, char** argv) {
  std::string filter;
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--gtest_filter=", 15) == 0) filter = argv[i] + 15;
  const char* lost = "NcclFailures.ALostDaemonIsNamed";
  const bool ok = filter.empty() ? run_pair(argv[0], std::string("-") + lost) && run_pair(argv[0], lost)
                                 : run_pair(argv[0], filter);
  if (!ok) return 1;
  std::printf("nccl conformance: 2 daemons on one GPU passed%s%s\n", filter.empty() ? "" : " ", filter.c_str());
  return 0;
}

}  // namespace
}  // namespace zerod::comm::test

int main(int argc, char** argv) {
  if (std::getenv("ZEROD_NCCL_TEST_NODE") != nullptr) {
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
  }
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    std::printf("SKIPPED: no CUDA device is visible (%s): the nccl plugin's conformance test needs a GPU "
                "(bench/gpu/run.sh nccl runs it on one)\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  // run_parity.sh asks whether there is a GPU, and nothing more.
  if (argc > 1 && std::strcmp(argv[1], "--probe") == 0) return 0;
  return zerod::comm::test::launch(argc, argv);
}
