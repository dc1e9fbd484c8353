// The cuda device's stream contract with an in-process trainer, on a GPU:
// trainer_waits_for(mark) makes the trainer's stream wait for zerod's work
// up to the mark and no further, where trainer_waits() waits for all of it.
// A forward waits so for its own module's gather, not for the gathers of
// later modules queued after it (Residency::trainer_waits).
//
// zerod's stream is held after the mark by making it wait for a stream of
// the test's whose host function blocks until released: work the trainer
// queues after trainer_waits_for(mark) must run while it is held, and work
// it queues after trainer_waits() must not. Each wait is bounded, and the
// hold is released on every path, so a failure never hangs the test.
//
// Needs a GPU: reported skipped, with the reason, elsewhere.
#include "device/select.h"
#include "error.h"
#include "memory/ledger.h"
#include "runtime/workers.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

namespace {

using namespace zerod;
using Clock = std::chrono::steady_clock;

// A host function on a stream that returns once `open` is set.
void CUDART_CB hold(void* open) {
  auto* flag = static_cast<std::atomic<bool>*>(open);
  const auto until = Clock::now() + std::chrono::seconds(30);
  while (!flag->load() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::microseconds(200));
}

// Whether `e` completes within `limit`.
bool completes(cudaEvent_t e, std::chrono::milliseconds limit) {
  const auto until = Clock::now() + limit;
  for (;;) {
    const cudaError_t r = cudaEventQuery(e);
    if (r == cudaSuccess) return true;
    if (r != cudaErrorNotReady) ADD_FAILURE() << "cudaEventQuery: " << cudaGetErrorString(r);
    if (r != cudaErrorNotReady || Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

TEST(CudaStream, TheTrainerWaitsForAMarkNotForZerodsLaterWork) {
  const CudaAvailability a = cuda_availability();
  if (a.devices == 0) GTEST_SKIP() << "the cuda device cannot be tested here: " << a.why;
  MemoryLedger ledger;
  ThreadPool pool{2};
  std::mutex pool_mu;
  Workers workers{pool, pool_mu};
  std::unique_ptr<Device> device = open_device("cuda", ledger, workers, -1, "stream-test");

  cudaStream_t trainer = nullptr, holder = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&trainer, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&holder, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t before = nullptr, after = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&before, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&after, cudaEventDisableTiming), cudaSuccess);
  std::atomic<bool> open{false};
  // On every exit, an ASSERT's return included: the hold opened and its
  // stream through before `open`, which the host function polls, leaves
  // the stack (else it would read a dead variable, for up to 30 s, while
  // ~CudaDevice waited for zerod's stream behind it).
  struct OpenOnExit {
    std::atomic<bool>& flag;
    cudaStream_t& stream;  // null once the test destroyed it
    ~OpenOnExit() {
      flag = true;
      if (stream && cudaStreamSynchronize(stream) != cudaSuccess) cudaGetLastError();
    }
  } open_on_exit{open, holder};

  // zerod's work up to the mark: a block zeroed.
  const Block b = device->allocate(1 << 20, ZD_MEM_BUFFERS, "a block before the mark");
  const uint64_t mark = device->mark();
  ASSERT_NE(mark, 0u) << "the cuda device marks its stream";
  // zerod's stream held after the mark: it waits for the holder's stream
  // (named the trainer's for one wait_for_trainer), then zeroes more.
  ASSERT_EQ(cudaLaunchHostFunc(holder, hold, &open), cudaSuccess);
  device->set_trainer_stream(holder);
  device->wait_for_trainer();
  device->set_trainer_stream(trainer);
  device->zero(b.ptr, 1 << 20);

  device->trainer_waits_for(mark);
  ASSERT_EQ(cudaEventRecord(before, trainer), cudaSuccess);
  const bool ran_while_held = completes(before, std::chrono::milliseconds(5000));
  device->trainer_waits();
  ASSERT_EQ(cudaEventRecord(after, trainer), cudaSuccess);
  const bool tail_ran_while_held = completes(after, std::chrono::milliseconds(300));
  open = true;
  EXPECT_TRUE(completes(after, std::chrono::milliseconds(30000))) << "the hold was released";
  device->synchronize();

  EXPECT_TRUE(ran_while_held) << "work after trainer_waits_for(mark) waited for zerod's work after the mark";
  // Else the hold held nothing, and the first check proves nothing.
  EXPECT_FALSE(tail_ran_while_held) << "work after trainer_waits() ran before zerod's work so far";

  device->release(b, ZD_MEM_BUFFERS);
  cudaEventDestroy(before);
  cudaEventDestroy(after);
  cudaStreamDestroy(holder);
  holder = nullptr;
  cudaStreamDestroy(trainer);
}

}  // namespace
