// GPU memory and an event cross a process boundary the way the daemon will
// hand a rank its device pool (engine/device/cuda_shared.h): the parent
// allocates a chunk, passes its fd over a unix socket with SCM_RIGHTS, the
// child maps it, reads what the parent wrote, writes its own bytes on a
// stream and records the parent's interprocess event after them; the parent
// waits on the event on its side and reads the child's bytes. Then the
// child is SIGKILLed, and the parent's memory still holds them: a trainer
// that dies loses nothing the daemon holds.
//
// Needs a GPU: reported skipped, with the reason, elsewhere. Its own
// executable, one test: the process forks before anything starts CUDA
// (a CUDA context does not survive fork).
#include "device/cuda_shared.h"
#include "transport/connection.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

using namespace zerod;
using namespace zerod::transport;

namespace {

constexpr uint64_t kBytes = uint64_t{3} << 20;  // not a multiple of the granularity: rounded up
constexpr int kNoGpu = 77;

struct Offer {
  uint64_t bytes;
  SharedEventHandle event;
};

std::string gpu_missing() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("no usable GPU: ") + cudaGetErrorString(e);
  if (n == 0) return "no GPU";
  return "";
}

bool all_bytes(const void* dev, uint64_t n, unsigned char want) {
  std::vector<unsigned char> host(n);
  if (cudaMemcpy(host.data(), dev, n, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
  for (unsigned char c : host)
    if (c != want) return false;
  return true;
}

// The child: maps what it is offered and answers with "" or what went wrong.
[[noreturn]] void child(Connection& c) {
  std::string answer;
  try {
    if (!gpu_missing().empty()) _exit(kNoGpu);
    Frame f = c.receive(1024, 30000);
    if (f.fds.size() != 1 || f.body.size() != sizeof(Offer)) throw std::runtime_error("a malformed offer");
    Offer o;
    std::memcpy(&o, f.body.data(), sizeof o);
    SharedDeviceChunk mine = SharedDeviceChunk::import(f.fds[0].get(), o.bytes, 0);
    if (!all_bytes(mine.data(), mine.size(), 0x11)) throw std::runtime_error("the parent's bytes are not there");
    cudaStream_t s = nullptr;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) throw std::runtime_error("no stream");
    if (cudaMemsetAsync(mine.data(), 0x5A, mine.size(), s) != cudaSuccess) throw std::runtime_error("memset failed");
    SharedEvent done = SharedEvent::open(o.event);
    done.record(s);
    if (cudaStreamSynchronize(s) != cudaSuccess) throw std::runtime_error("the stream failed");
  } catch (const std::exception& e) {
    answer = e.what();
  }
  FrameHeader h;
  c.send(h, std::as_bytes(std::span(answer.data(), answer.size())), {}, 30000);
  pause();  // until the parent kills it
  _exit(0);
}

TEST(CudaShared, AChunkAndAnEventCrossAProcessAndOutliveIt) {
  auto [parent_end, child_end] = connection_pair();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) child(child_end);

  const std::string missing = gpu_missing();
  if (!missing.empty()) {
    int status = 0;
    waitpid(pid, &status, 0);
    GTEST_SKIP() << "shared GPU memory cannot be tested here: " << missing;
  }
  SharedDeviceChunk chunk = SharedDeviceChunk::allocate(0, kBytes, "the test's chunk");
  EXPECT_GE(chunk.size(), kBytes);
  EXPECT_EQ(chunk.size() % cuda_shared_granularity(0), 0u);
  ASSERT_EQ(cudaMemset(chunk.data(), 0x11, chunk.size()), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  SharedEvent done = SharedEvent::create();
  const Offer o{chunk.size(), done.handle()};
  const int fd = chunk.export_fd();
  ASSERT_GE(fd, 0);
  parent_end.send(FrameHeader{}, std::as_bytes(std::span(&o, 1)), std::span(&fd, 1), 30000);
  close(fd);

  Frame answer = parent_end.receive(4096, 60000);
  const std::string said(reinterpret_cast<const char*>(answer.body.data()), answer.body.size());
  ASSERT_EQ(said, "") << "the child: " << said;
  done.synchronize();  // the child's write, as its event says
  EXPECT_TRUE(all_bytes(chunk.data(), chunk.size(), 0x5A)) << "the child's bytes, seen by the parent";

  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_TRUE(all_bytes(chunk.data(), chunk.size(), 0x5A)) << "the memory outlives the process that mapped it";
  ASSERT_EQ(cudaMemset(chunk.data(), 0x22, chunk.size()), cudaSuccess);
  EXPECT_TRUE(all_bytes(chunk.data(), chunk.size(), 0x22));
}

}  // namespace
