// A hostile client against a real `zerod serve`: it speaks the protocol by
// hand and sends a staging memfd shorter than it claims, one it shrinks
// after sending, and absurd sizes, offsets and shapes. Each must get an
// error reply (never SIGBUS in the daemon), and the same daemon must then
// train a normal job for another client.
#include "error.h"
#include "transport/client.h"
#include "wire.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

using namespace zerod;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// "exited with status 0", "killed by signal 7 (Bus error)".
std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  return "status " + std::to_string(status);
}

// Starts argv with extra environment variables, stdout and stderr to `log`.
pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env_extra,
            const std::string& log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_strings(env_extra);
  for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
  std::vector<char*> env;
  for (auto& e : env_strings) env.push_back(e.data());
  env.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, args[0], &fa, nullptr, args.data(), env.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error("posix_spawn " + argv[0] + ": " + std::strerror(rc));
  return pid;
}

// Waits for pid at most timeout_s; kills it if it is still running then.
int wait_for(pid_t pid, double timeout_s) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > until) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      ADD_FAILURE() << "pid " << pid << " did not finish within " << timeout_s << " s; killed";
      return status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return status;
}

// A memfd of `size` bytes; `seals` are added when not 0.
transport::UniqueFd make_memfd(uint64_t size, int seals) {
  transport::UniqueFd fd(memfd_create("hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_TRUE(fd.valid()) << std::strerror(errno);
  EXPECT_EQ(ftruncate(fd.get(), static_cast<off_t>(size)), 0) << std::strerror(errno);
  if (seals) {
    EXPECT_EQ(fcntl(fd.get(), F_ADD_SEALS, seals), 0) << std::strerror(errno);
  }
  return fd;
}

constexpr int kSealed = F_SEAL_SHRINK | F_SEAL_GROW;
constexpr uint64_t kMiB = uint64_t{1} << 20;

class HostileClient : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/zerod-hostile-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    socket_ = dir_ + "/zerod.sock";
    daemon_log_ = dir_ + "/serve.log";
    daemon_ = spawn({ZEROD_CLI, "serve", "--nproc", "1", "--job", ZEROD_TEST_JOB, "--socket", socket_}, {},
                    daemon_log_);
    struct stat st{};
    for (int i = 0; i < 500 && stat(socket_.c_str(), &st) != 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_EQ(stat(socket_.c_str(), &st), 0) << "the daemon did not start:\n" << read_file(daemon_log_);
    // The file appears at bind(), a moment before listen(): until then a
    // connect is refused, which a test would take for the daemon's answer.
    std::string refused;
    for (int i = 0; i < 500; ++i) {
      try {
        transport::connect_unix(socket_, 1000);
        refused.clear();
        break;
      } catch (const Error& e) {
        refused = e.what();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    ASSERT_TRUE(refused.empty()) << "the daemon does not accept connections: " << refused << "\n"
                                 << read_file(daemon_log_);
  }

  void TearDown() override {
    if (daemon_ > 0) {
      kill(daemon_, SIGTERM);
      const int status = wait_for(daemon_, 60);
      const std::string log = read_file(daemon_log_);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "zerod serve " << describe_status(status) << " when stopped:\n" << log;
      for (const char* report : {"ERROR: AddressSanitizer", "runtime error:", "ThreadSanitizer", "LeakSanitizer"})
        EXPECT_EQ(log.find(report), std::string::npos) << "the daemon's log has a sanitizer report:\n" << log;
    }
    std::filesystem::remove_all(dir_);
  }

  // The daemon is still running; if not, how it ended and its log.
  void expect_daemon_alive(const std::string& after) {
    int status = 0;
    if (waitpid(daemon_, &status, WNOHANG) == daemon_) {
      daemon_ = -1;
      FAIL() << "after " << after << ", zerod serve " << describe_status(status) << ":\n"
             << read_file(daemon_log_);
    }
  }

  transport::Connection connect() { return transport::connect_unix(socket_, 5000); }

  // One request and its reply. A daemon that dies answering throws here,
  // with how it died.
  v1::Reply rpc(transport::Connection& c, const v1::Request& req, std::vector<int> fds = {}) {
    const uint32_t id = next_id_++;
    transport::Frame f;
    try {
      wire::send(c, wire::kRequest, id, req, fds, 5000);
      f = c.receive(wire::kMaxBody, 30000);
    } catch (const Error& e) {
      int status = 0;
      if (waitpid(daemon_, &status, 0) == daemon_) {
        daemon_ = -1;
        throw std::runtime_error("no reply (" + std::string(e.what()) + "): zerod serve " +
                                 describe_status(status) + "; its log:\n" + read_file(daemon_log_));
      }
      throw;
    }
    EXPECT_EQ(f.header.request_id, id);
    v1::Reply r;
    wire::parse(f, &r, "reply");
    return r;
  }

  // A rank-0 connection with a model: what a client has before it stages data.
  transport::Connection rank_with_model() {
    auto c = connect();
    v1::Request hello;
    hello.mutable_hello()->set_abi_version(ZD_ABI_VERSION);
    hello.mutable_hello()->set_role("rank");
    hello.mutable_hello()->set_rank(0);
    hello.mutable_hello()->set_world_size(1);
    v1::Reply r = rpc(c, hello);
    EXPECT_FALSE(r.has_error()) << r.error().message();
    v1::Request create;
    create.mutable_create_model()->set_script_text("return { optimizer = { type = 'sgd' } }");
    create.mutable_create_model()->set_script_name("hostile.lua");
    r = rpc(c, create);
    EXPECT_FALSE(r.has_error()) << r.error().message();
    model_ = r.create_model().model();
    return c;
  }

  static v1::Request staging(uint64_t size) {
    v1::Request req;
    req.mutable_staging()->set_size(size);
    return req;
  }

  v1::Request register_param(const std::string& name, std::vector<int64_t> shape, bool init,
                             uint64_t offset = 0, int32_t init_dtype = 0) const {
    v1::Request req;
    v1::RegisterParam* p = req.mutable_register_param();
    p->set_model(model_);
    p->set_name(name);
    p->set_module("m");
    p->set_dtype(ZD_DTYPE_F32);
    for (int64_t e : shape) p->add_shape(e);
    p->set_has_init(init);
    p->set_init_dtype(init_dtype);
    p->set_staging_offset(offset);
    return req;
  }

  // The reply is an error with this status whose message contains `text`.
  static void expect_error(const v1::Reply& r, zd_status status, const std::string& text) {
    ASSERT_TRUE(r.has_error()) << "expected an error containing '" << text << "', got success";
    EXPECT_EQ(r.error().status(), status) << r.error().message();
    EXPECT_NE(r.error().message().find(text), std::string::npos) << r.error().message();
  }

  // Another client trains a normal job on the same daemon: the C trainer of
  // the end-to-end tests, 20 steps, through libzerod.
  void expect_a_normal_job_trains() {
    const std::string log = dir_ + "/rank0.log";
    const pid_t pid = spawn({ZEROD_RANK_SCENARIO, "normal"},
                            {"ZEROD_ENDPOINT=unix:" + socket_, "ZEROD_RANK=0", "ZEROD_WORLD_SIZE=1",
                             std::string("ZEROD_JOB=") + ZEROD_TEST_JOB},
                            log);
    const int status = wait_for(pid, 120);
    const std::string out = read_file(log);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "the normal job " << describe_status(status) << ":\n" << out;
    EXPECT_NE(out.find("rank 0: checksum"), std::string::npos) << out;
    expect_daemon_alive("the normal job");
  }

  std::string dir_, socket_, daemon_log_;
  pid_t daemon_ = -1;
  int32_t model_ = 0;
  uint32_t next_id_ = 1;
};

}  // namespace

// (a) A sealed memfd shorter than the size claimed: mapping it whole and
// touching its tail would raise SIGBUS in the daemon.
TEST_F(HostileClient, AShortMemfdIsRefused) {
  {
    auto c = rank_with_model();
    auto fd = make_memfd(4096, kSealed);
    expect_error(rpc(c, staging(kMiB), {fd.get()}), ZD_ERR_INVALID_ARGUMENT,
                 "holds 4096 bytes, fewer than the 1048576 claimed");
    // Initial values inside the claimed size but past the file's end.
    expect_error(rpc(c, register_param("w", {1000}, true, kMiB / 2)), ZD_ERR_INVALID_ARGUMENT,
                 "has not sent one");
    expect_daemon_alive("a short sealed memfd");
    // The same without seals: refused for the seals before its size matters.
    auto loose = make_memfd(4096, 0);
    expect_error(rpc(c, staging(kMiB), {loose.get()}), ZD_ERR_INVALID_ARGUMENT, "not sealed against resizing");
    expect_error(rpc(c, register_param("w", {1000}, true, kMiB / 2)), ZD_ERR_INVALID_ARGUMENT,
                 "has not sent one");
    expect_daemon_alive("a short unsealed memfd");
    // The connection is still served.
    v1::Request ok = register_param("w", {1000}, false);
    const v1::Reply r = rpc(c, ok);
    EXPECT_FALSE(r.has_error()) << r.error().message();
  }
  expect_a_normal_job_trains();
}

// (b) A memfd of the right size, unsealed, shrunk to nothing once the daemon
// has it: every later touch of the daemon's mapping would raise SIGBUS.
TEST_F(HostileClient, AMemfdThatCanShrinkIsRefused) {
  {
    auto c = rank_with_model();
    auto fd = make_memfd(kMiB, 0);
    expect_error(rpc(c, staging(kMiB), {fd.get()}), ZD_ERR_INVALID_ARGUMENT, "not sealed against resizing");
    ASSERT_EQ(ftruncate(fd.get(), 0), 0);
    expect_error(rpc(c, register_param("w", {1000}, true, 0)), ZD_ERR_INVALID_ARGUMENT, "has not sent one");
    expect_daemon_alive("a memfd shrunk after it was sent");

    // Sealed against shrinking only: the protocol asks for both seals, so
    // a size the daemon checked stays the size for as long as it maps it.
    auto half = make_memfd(kMiB, F_SEAL_SHRINK);
    expect_error(rpc(c, staging(kMiB), {half.get()}), ZD_ERR_INVALID_ARGUMENT, "not sealed against resizing");

    // Not a memfd at all: a pipe, a regular file.
    int p[2];
    ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
    transport::UniqueFd r(p[0]), w(p[1]);
    expect_error(rpc(c, staging(kMiB), {r.get()}), ZD_ERR_INVALID_ARGUMENT, "is not a memfd");
    const std::string file = dir_ + "/staging.bin";
    transport::UniqueFd f(open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    ASSERT_TRUE(f.valid());
    ASSERT_EQ(ftruncate(f.get(), static_cast<off_t>(kMiB)), 0);
    expect_error(rpc(c, staging(kMiB), {f.get()}), ZD_ERR_INVALID_ARGUMENT, "is not a memfd");
    // A sealed memfd reopened read-only: the daemon must be able to write it.
    auto good = make_memfd(kMiB, kSealed);
    const std::string proc = "/proc/self/fd/" + std::to_string(good.get());
    transport::UniqueFd ro(open(proc.c_str(), O_RDONLY | O_CLOEXEC));
    ASSERT_TRUE(ro.valid());
    expect_error(rpc(c, staging(kMiB), {ro.get()}), ZD_ERR_INVALID_ARGUMENT, "not open for reading and writing");
    // Two fds, or none.
    expect_error(rpc(c, staging(kMiB), {good.get(), good.get()}), ZD_ERR_INVALID_ARGUMENT, "carries one fd");
    expect_error(rpc(c, staging(kMiB)), ZD_ERR_INVALID_ARGUMENT, "carries one fd");
    expect_daemon_alive("fds that are not sealed memfds");
  }
  expect_a_normal_job_trains();
}

// (c) Absurd sizes, offsets and shapes: each refused with what was wrong,
// before anything is allocated, mapped or read.
TEST_F(HostileClient, AbsurdSizesOffsetsAndShapesAreRefused) {
  {
    auto c = rank_with_model();
    auto fd = make_memfd(kMiB, kSealed);
    expect_error(rpc(c, staging(0), {fd.get()}), ZD_ERR_INVALID_ARGUMENT, "a size of 0 bytes");
    expect_error(rpc(c, staging(uint64_t{1} << 62), {fd.get()}), ZD_ERR_INVALID_ARGUMENT, "more than the limit");
    expect_error(rpc(c, staging(UINT64_MAX), {fd.get()}), ZD_ERR_INVALID_ARGUMENT, "more than the limit");
    expect_daemon_alive("absurd staging sizes");
    const v1::Reply ok = rpc(c, staging(kMiB), {fd.get()});
    ASSERT_FALSE(ok.has_error()) << ok.error().message();

    // Shapes whose element count overflows 64 bits, or is only very large.
    expect_error(rpc(c, register_param("huge", {int64_t{1} << 40, int64_t{1} << 40}, true)),
                 ZD_ERR_INVALID_ARGUMENT, "too large");
    expect_error(rpc(c, register_param("wrap", {INT64_MAX, INT64_MAX, 4}, true)), ZD_ERR_INVALID_ARGUMENT,
                 "too large");
    expect_error(rpc(c, register_param("neg", {-5, 4}, true)), ZD_ERR_INVALID_ARGUMENT,
                 "extent -5 in dimension 0");
    expect_error(rpc(c, register_param("zero", {0}, false)), ZD_ERR_INVALID_ARGUMENT, "extent 0");
    expect_error(rpc(c, register_param("flat", {}, false)), ZD_ERR_INVALID_ARGUMENT, "0 dimensions");
    expect_error(rpc(c, register_param("deep", std::vector<int64_t>(100000, 1), false)), ZD_ERR_INVALID_ARGUMENT,
                 "100000 dimensions");
    // Initial values past the staging arena, with offsets that wrap.
    expect_error(rpc(c, register_param("far", {4}, true, UINT64_MAX - 3)), ZD_ERR_INVALID_ARGUMENT,
                 "is outside its 1048576 bytes");
    expect_error(rpc(c, register_param("edge", {4}, true, kMiB - 8)), ZD_ERR_INVALID_ARGUMENT,
                 "is outside its 1048576 bytes");
    expect_error(rpc(c, register_param("bigger", {int64_t{1} << 20}, true)), ZD_ERR_INVALID_ARGUMENT,
                 "is outside its 1048576 bytes");
    expect_error(rpc(c, register_param("dtype", {4}, true, 0, 77)), ZD_ERR_INVALID_ARGUMENT, "invalid dtype (77)");
    expect_daemon_alive("absurd shapes");

    // A real parameter, then whole-parameter reads and writes with absurd
    // ranges in the staging arena.
    v1::Reply r = rpc(c, register_param("w", {1000}, true, 0));
    ASSERT_FALSE(r.has_error()) << r.error().message();
    const int32_t param = r.register_param().param();
    v1::Request fin;
    fin.mutable_call()->set_model(model_);
    fin.mutable_call()->set_op(v1::ModelCall::FINALIZE);
    r = rpc(c, fin);
    ASSERT_FALSE(r.has_error()) << r.error().message();
    for (const auto& [offset, bytes] : std::vector<std::pair<uint64_t, uint64_t>>{
             {0, UINT64_MAX}, {UINT64_MAX, 4000}, {kMiB - 100, 4000}, {UINT64_MAX - 100, 4000}}) {
      for (int write = 0; write < 2; ++write) {
        v1::Request io;
        v1::ParamData* d = write ? io.mutable_param_write() : io.mutable_param_read();
        d->set_model(model_);
        d->set_param(param);
        d->set_dtype(ZD_DTYPE_F32);
        d->set_bytes(bytes);
        d->set_staging_offset(offset);
        expect_error(rpc(c, io), ZD_ERR_INVALID_ARGUMENT, "in the client's staging arena");
      }
    }
    // Model calls with absurd numbers.
    v1::Request call;
    call.mutable_call()->set_model(model_);
    call.mutable_call()->set_op(v1::ModelCall::FORWARD_BEGIN);
    call.mutable_call()->set_module(INT32_MAX);
    EXPECT_TRUE(rpc(c, call).has_error());
    call.mutable_call()->set_op(static_cast<v1::ModelCall::Op>(1000));
    expect_error(rpc(c, call), ZD_ERR_INVALID_ARGUMENT, "unknown model call");
    v1::Request mem;
    mem.mutable_memory()->set_model(model_);
    mem.mutable_memory()->set_rank(INT32_MAX);
    EXPECT_TRUE(rpc(c, mem).has_error());
    mem.mutable_memory()->set_rank(0);
    mem.mutable_memory()->set_tier(-7);
    expect_error(rpc(c, mem), ZD_ERR_INVALID_ARGUMENT, "out of range");
    // A good read still works on this connection after all of that.
    v1::Request read;
    v1::ParamData* d = read.mutable_param_read();
    d->set_model(model_);
    d->set_param(param);
    d->set_dtype(ZD_DTYPE_F32);
    d->set_bytes(4000);
    r = rpc(c, read);
    EXPECT_FALSE(r.has_error()) << r.error().message();
    expect_daemon_alive("absurd reads and writes");
  }
  expect_a_normal_job_trains();
}
