// GPU memory and stream signals cross a process boundary the way the daemon
// hands a rank its device pool (engine/device/cuda_shared.h): the parent
// allocates a chunk and the signals, passes their fds over a unix socket
// with SCM_RIGHTS, the child maps them, reads what the parent wrote, writes
// its own bytes on a stream and records kTrainerDone after them; the
// parent's stream waits for the signal and the parent reads the child's
// bytes. Then the child is SIGKILLed, and the parent's memory still holds
// them: a trainer that dies loses nothing the daemon holds.
//
// The second and third tests are what each side does when the other dies
// mid-step (transport/process_exit.h): the child records a signal behind
// work that never finishes, and is SIGKILLed; the parent's stream waits for
// that record, which never runs. SharedSignals::release must end that wait:
// the daemon's own signals after its trainer died (the second), and the
// trainer's imported ones after the daemon that created them died (the
// third). Each also says whether the wait was still held after the kill
// (what the release is for), and checks that the parent sees the child's
// record pending (what Device::trainer_pending asks). Interprocess CUDA
// events failed the same tests on an H200 (2026-11-27): a later record
// did not end the wait. The signals live in a page of host memory since
// (signal_page.h), so the release is a store from the CPU.
//
// The fourth is the every-step path: a live child records kTrainerDone
// behind 300 ms of work on its stream and answers at once; the parent's
// wait holds while that work runs, then ends, with the child's bytes there.
//
// The fifth and sixth are a side whose GPU context fails (a kernel of its
// faulted: an illegal address) while it lives on: the record it queued
// behind that kernel never runs, and the other side's hangup watch only
// releases for a process that has exited, so the failing side must release
// its own signal as soon as a CUDA call of its says its context failed
// (SharedSignals::release_if_context_failed). The fifth's child is a
// trainer, through libzerod's TrainerLink (its record before a call, its
// quiesce at the model's end): the parent checks that its wait holds once
// the child's kernel has failed (what the release is for), then that the
// child's next call ends it within 10 s, the child alive. The sixth's is a
// daemon, through a shared cuda device (trainer_waits()), which makes no
// call after its kernel failed: its device's own watch of the context
// (ContextFailureWatch) must end the parent's wait within 10 s all the
// same, and the child's next call (synchronize()) must fail naming the
// daemon's context.
//
// Bounded on every path, so that a failure on a GPU fails fast instead of
// hanging: each wait on a stream is an event polled with a deadline; each
// child dies with its parent (PR_SET_PDEATHSIG) and within 2 minutes
// (alarm), and is killed and reaped on every exit of its test; the parent
// closes its copy of the child's socket end, so a child that crashed reads
// as end of stream at once; and a wait left on a stream when a test ends
// early is released (the child killed first) and drained before
// ~SharedSignals unregisters the page under it.
//
// Needs a GPU: reported skipped, with the reason, elsewhere. Its own
// executable, each test forking before anything starts CUDA in its process
// (a CUDA context does not survive fork): ctest runs each test in a process
// of its own. Run by hand with several of its tests in one process, every
// test after the first is reported skipped, saying so, rather than failing
// in its child as if the code were wrong.
#include "device/cuda_kernels.h"
#include "device/cuda_shared.h"
#include "device/select.h"
#include "memory/arena.h"  // SharedArena, complete for a default SharedSignals
#include "memory/ledger.h"
#include "runtime/workers.h"
#include "trainer_link.h"  // libzerod's side (libzerod/src)
#include "transport/connection.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

using namespace zerod;
using namespace zerod::transport;

namespace {

constexpr uint64_t kBytes = uint64_t{3} << 20;  // not a multiple of the granularity: rounded up
constexpr int kNoGpu = 77;

struct Offer {
  uint64_t bytes;  // the chunk's (the first fd; the second is the signals' page)
};

// What the child answered ("" where all went well there).
std::string child_answer(Connection& parent_end) {
  Frame answer = parent_end.receive(4096, 60000);
  return std::string(reinterpret_cast<const char*>(answer.body.data()), answer.body.size());
}

// Offers `chunk` and `signals` to the child as the daemon offers a rank its
// pool and signals: an Offer, with the chunk's fd and the signals' page.
void offer_chunk_and_signals(Connection& parent_end, const SharedDeviceChunk& chunk, const SharedSignals& signals) {
  const Offer o{chunk.size()};
  const int fd = chunk.export_fd();
  ASSERT_GE(fd, 0);
  const int fds[] = {fd, signals.page_fd()};
  parent_end.send(FrameHeader{}, std::as_bytes(std::span(&o, 1)), fds, 30000);
  close(fd);
}

// The fds of `s` as the daemon sends them.
std::vector<int> signal_fds(const SharedSignals& s) { return {s.page_fd()}; }

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
    if (f.fds.size() != 2 || f.body.size() != sizeof(Offer)) throw std::runtime_error("a malformed offer");
    Offer o;
    std::memcpy(&o, f.body.data(), sizeof o);
    SharedDeviceChunk mine = SharedDeviceChunk::import(f.fds[0].get(), o.bytes, 0);
    SharedSignals signals = SharedSignals::import(f.fds[1].get(), 0);
    if (!all_bytes(mine.data(), mine.size(), 0x11)) throw std::runtime_error("the parent's bytes are not there");
    cudaStream_t s = nullptr;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) throw std::runtime_error("no stream");
    if (cudaMemsetAsync(mine.data(), 0x5A, mine.size(), s) != cudaSuccess) throw std::runtime_error("memset failed");
    signals.record(kTrainerDone, s);
    if (cudaStreamSynchronize(s) != cudaSuccess) throw std::runtime_error("the stream failed");
  } catch (const std::exception& e) {
    answer = e.what();
  }
  FrameHeader h;
  c.send(h, std::as_bytes(std::span(answer.data(), answer.size())), {}, 30000);
  pause();  // until the parent kills it
  _exit(0);
}

// Records `id` on a new stream behind a host function that never returns:
// a record that runs only if the process lives on, which it will not.
void record_behind_endless_work(const SharedSignals& signals, SignalId id) {
  cudaStream_t s = nullptr;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) throw std::runtime_error("no stream");
  auto endless = [](void*) {
    for (;;) pause();
  };
  if (cudaLaunchHostFunc(s, endless, nullptr) != cudaSuccess) throw std::runtime_error("no host function");
  signals.record(id, s);
}

// The killed trainer (the second test's child): records the parent's
// kTrainerDone behind endless work, says so, and waits to be killed.
[[noreturn]] void child_records_behind_endless_work(Connection& c) {
  std::string answer;
  try {
    if (!gpu_missing().empty()) _exit(kNoGpu);
    Frame f = c.receive(1024, 30000);
    if (f.fds.size() != 1) throw std::runtime_error("a malformed offer");
    static SharedSignals signals = SharedSignals::import(f.fds[0].get(), 0);
    record_behind_endless_work(signals, kTrainerDone);
  } catch (const std::exception& e) {
    answer = e.what();
  }
  FrameHeader h;
  c.send(h, std::as_bytes(std::span(answer.data(), answer.size())), {}, 30000);
  pause();
  _exit(0);
}

// The killed daemon (the third test's child): creates the signals, sends
// them, records kZerodDone behind endless work, says so, and waits to be
// killed.
[[noreturn]] void child_creates_and_records_behind_endless_work(Connection& c) {
  if (!gpu_missing().empty()) _exit(kNoGpu);
  std::string answer;
  try {
    static SharedSignals signals = SharedSignals::create(0, "the child's signals");  // lives until the kill
    const std::vector<int> fds = signal_fds(signals);
    c.send(FrameHeader{}, {}, fds, 30000);
    Frame opened = c.receive(1024, 60000);  // the parent has mapped them
    record_behind_endless_work(signals, kZerodDone);
  } catch (const std::exception& e) {
    answer = e.what();
  }
  c.send(FrameHeader{}, std::as_bytes(std::span(answer.data(), answer.size())), {}, 30000);
  pause();
  _exit(0);
}

// The live trainer (the fourth test's child): maps the chunk and the
// signals, queues 300 ms of work on its stream, then its bytes, then its
// record of kTrainerDone, and answers at once, before the stream gets
// there. It lives on until killed; so do the mappings its stream uses.
[[noreturn]] void child_records_behind_a_delay(Connection& c) {
  if (!gpu_missing().empty()) _exit(kNoGpu);
  std::string answer;
  SharedDeviceChunk mine;
  SharedSignals signals;
  try {
    Frame f = c.receive(1024, 30000);
    if (f.fds.size() != 2 || f.body.size() != sizeof(Offer)) throw std::runtime_error("a malformed offer");
    Offer o;
    std::memcpy(&o, f.body.data(), sizeof o);
    mine = SharedDeviceChunk::import(f.fds[0].get(), o.bytes, 0);
    signals = SharedSignals::import(f.fds[1].get(), 0);
    cudaStream_t s = nullptr;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) throw std::runtime_error("no stream");
    auto delay = [](void*) { usleep(300000); };
    if (cudaLaunchHostFunc(s, delay, nullptr) != cudaSuccess) throw std::runtime_error("no host function");
    if (cudaMemsetAsync(mine.data(), 0x5A, mine.size(), s) != cudaSuccess) throw std::runtime_error("memset failed");
    signals.record(kTrainerDone, s);
  } catch (const std::exception& e) {
    answer = e.what();
  }
  c.send(FrameHeader{}, std::as_bytes(std::span(answer.data(), answer.size())), {}, 30000);
  for (;;) pause();  // until the parent kills it
}

// What the child says after its call that found its context failed: the
// error its stream reports now ("" where it has none).
void say_the_streams_error(Connection& c, cudaStream_t s) {
  const cudaError_t e = cudaStreamQuery(s);
  const std::string said = e == cudaSuccess || e == cudaErrorNotReady ? "" : cudaGetErrorName(e);
  c.send(FrameHeader{}, std::as_bytes(std::span(said.data(), said.size())), {}, 30000);
}

// An illegal address: a kernel that writes there fails this process's
// context.
void* const kUnmapped = reinterpret_cast<void*>(0x10);

// The live trainer whose kernel fails (the fifth test's child), through
// libzerod's TrainerLink as a rank under the daemon: maps the signals,
// queues 300 ms of work on its stream, then a kernel that faults, then a
// zerod call's record of kTrainerDone (before_call), and answers. At the
// parent's word it ends its model as a trainer that caught the error does
// (quiesce: its synchronize finds the context failed), says what its
// stream reports, and lives on until killed.
[[noreturn]] void child_records_behind_a_failing_kernel(Connection& c) {
  if (!gpu_missing().empty()) _exit(kNoGpu);
  std::string answer;
  std::unique_ptr<zerod::abi::TrainerLink> link;
  cudaStream_t s = nullptr;
  try {
    Frame f = c.receive(1024, 30000);
    if (f.fds.size() != 1) throw std::runtime_error("a malformed offer");
    link = std::make_unique<zerod::abi::TrainerLink>(ZD_DEVICE_CUDA, 0, StreamLink{f.fds[0].get()},
                                                     /*watch=*/nullptr, getppid());
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) throw std::runtime_error("no stream");
    link->set_stream(s);
    auto delay = [](void*) { usleep(300000); };
    if (cudaLaunchHostFunc(s, delay, nullptr) != cudaSuccess) throw std::runtime_error("no host function");
    if (cuda_kernels::scale(kUnmapped, ZD_DTYPE_F32, 1 << 20, 2.0f, s) != 0)
      throw std::runtime_error("the faulting kernel was refused at its launch");
    link->before_call();
  } catch (const std::exception& e) {
    answer = e.what();
  }
  c.send(FrameHeader{}, std::as_bytes(std::span(answer.data(), answer.size())), {}, 30000);
  if (answer.empty()) {
    Frame go = c.receive(1024, 60000);
    link->quiesce();
    say_the_streams_error(c, s);
  }
  for (;;) pause();  // until the parent kills it
}

// The live daemon whose kernel fails (the sixth test's child), through a
// shared cuda device: sends its signals, and once the parent has mapped
// them queues about half a second of work on zerod's stream, then a kernel
// that faults, then the record a begin call makes (trainer_waits), and
// answers. It makes no other call until the parent's word: then it
// synchronizes (as its next call would), which fails, sends that error's
// message, and lives on until killed.
[[noreturn]] void child_device_records_behind_a_failing_kernel(Connection& c) {
  if (!gpu_missing().empty()) _exit(kNoGpu);
  std::string answer;
  MemoryLedger ledger;
  ThreadPool pool{1};
  std::mutex pool_mu;
  Workers workers{pool, pool_mu};
  std::unique_ptr<Device> device;
  try {
    device = open_shared_device("cuda", ledger, workers, 0, "the child's device");
    c.send(FrameHeader{}, {}, std::vector<int>{device->stream_link().page_fd}, 30000);
    Frame mapped = c.receive(1024, 60000);
    constexpr uint64_t kFloats = uint64_t{1} << 28;  // 1 GiB: about 1 ms a pass on an H200
    const Block work = device->allocate(kFloats * sizeof(float), ZD_MEM_BUFFERS, "the child's work");
    // Long enough that the parent sees the record pending before the
    // kernel behind this work fails.
    for (int i = 0; i < 500; ++i) device->scale(work.ptr, ZD_DTYPE_F32, kFloats, 1.0f);
    device->scale(kUnmapped, ZD_DTYPE_F32, 1 << 20, 2.0f);
    device->trainer_waits();
  } catch (const std::exception& e) {
    answer = e.what();
  }
  c.send(FrameHeader{}, std::as_bytes(std::span(answer.data(), answer.size())), {}, 30000);
  if (answer.empty()) {
    Frame go = c.receive(1024, 60000);
    std::string said = "no error";
    try {
      device->synchronize();
    } catch (const std::exception& e) {  // the failed context, as expected
      said = e.what();
    }
    c.send(FrameHeader{}, std::as_bytes(std::span(said.data(), said.size())), {}, 30000);
  }
  for (;;) pause();  // until the parent kills it; its device's teardown would wait on nothing here
}

// Whether `e` completes within `ms`.
bool completes_within(cudaEvent_t e, int ms) {
  for (int waited = 0;; waited += 10) {
    const cudaError_t q = cudaEventQuery(e);
    if (q == cudaSuccess) return true;
    if (q != cudaErrorNotReady) {
      ADD_FAILURE() << "cudaEventQuery: " << cudaGetErrorString(q);
      return false;
    }
    if (waited >= ms) return false;
    usleep(10000);
  }
}

// Whether `s` gets through what is queued on it now within `ms` (an event
// recorded there, polled: never an unbounded synchronize).
bool stream_done_within(cudaStream_t s, int ms) {
  cudaEvent_t e = nullptr;
  if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
    ADD_FAILURE() << "cudaEventCreateWithFlags failed";
    return false;
  }
  const cudaError_t r = cudaEventRecord(e, s);
  if (r != cudaSuccess) ADD_FAILURE() << "cudaEventRecord: " << cudaGetErrorString(r);
  const bool done = r == cudaSuccess && completes_within(e, ms);
  cudaEventDestroy(e);  // an event still pending is freed once it completes
  return done;
}

// A forked child: killed and reaped on every exit of the test that forked
// it (an ASSERT included), never left paused.
struct Child {
  Child() = default;
  ~Child() { kill_and_reap(); }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  // Its wait status (the one reaped before, where it was: a guard may have
  // reaped it first); 0 where there was none to reap.
  int kill_and_reap() {
    if (pid <= 0) return reaped;
    kill(pid, SIGKILL);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    pid = -1;
    reaped = status;
    return status;
  }
  pid_t pid = -1;
  int reaped = 0;
};

// What gpu_missing() said in this process, once a test's parent asked
// (which starts CUDA here): a child forked after that would inherit a
// context that does not survive fork, and fail.
std::optional<std::string> parent_gpu_missing;

// Forks `body` as the child, before this process starts CUDA. "" where
// this process sees a GPU; else why not, the child (which exits at once
// then) reaped, or not forked where this process started CUDA before.
std::string start_child(void (*body)(Connection&), Connection& parent_end, Connection& child_end, Child* kid) {
  if (parent_gpu_missing)
    return parent_gpu_missing->empty()
               ? "CUDA already started in this process: run one CudaShared test per process (ctest does)"
               : *parent_gpu_missing;
  const pid_t parent = getpid();
  kid->pid = fork();
  if (kid->pid < 0) return "";  // the test's ASSERT_GT(pid, 0) fails
  if (kid->pid == 0) {
    // Dies with the parent, whatever kills it, and in 2 minutes at most
    // (SIGALRM), paused or stuck.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);  // the parent died before the prctl
    alarm(120);
    { Connection theirs(std::move(parent_end)); }  // closed in the child
    body(child_end);
  }
  // The parent's copy of the child's end closed: a child that dies reads
  // as end of stream at once, not as a receive's 60 s timeout.
  { Connection theirs(std::move(child_end)); }
  std::string missing = gpu_missing();
  parent_gpu_missing = missing;
  if (!missing.empty()) {
    while (waitpid(kid->pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    kid->pid = -1;
  }
  return missing;
}

// On every exit of a test whose stream `waiting` may still wait on
// `signals`' `id`: where it is not through already, the child killed (a
// release is only for a process that can no longer run its record), the
// signal released, and the stream drained, so that ~SharedSignals never
// unregisters the page under a live wait; then the stream destroyed. A
// stream that still waits ends the process: its teardown would hang too.
struct ReleaseOnExit {
  ReleaseOnExit(const SharedSignals& s, SignalId i, Child& c, cudaStream_t& w)
      : signals(s), id(i), child(c), waiting(w) {}
  ~ReleaseOnExit() {
    if (!waiting) return;
    // A grace of a second: an event just recorded behind a wait that is
    // through may still read as not ready at its first query.
    if (!stream_done_within(waiting, 1000)) {
      child.kill_and_reap();
      signals.release(id);
    }
    if (!stream_done_within(waiting, 10000)) {
      std::fprintf(stderr, "FAILED: a stream still waited 10 s after its signal's release; exiting\n");
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(1);
    }
    cudaStreamDestroy(waiting);
    waiting = nullptr;
  }
  ReleaseOnExit(const ReleaseOnExit&) = delete;
  ReleaseOnExit& operator=(const ReleaseOnExit&) = delete;
  const SharedSignals& signals;
  SignalId id;
  Child& child;
  cudaStream_t& waiting;
};

TEST(CudaShared, AChunkAndSignalsCrossAProcessAndOutliveIt) {
  auto [parent_end, child_end] = connection_pair();
  Child kid;
  if (const std::string missing = start_child(child, parent_end, child_end, &kid); !missing.empty())
    GTEST_SKIP() << "shared GPU memory cannot be tested here: " << missing;
  ASSERT_GT(kid.pid, 0);
  SharedDeviceChunk chunk = SharedDeviceChunk::allocate(0, kBytes, "the test's chunk");
  EXPECT_GE(chunk.size(), kBytes);
  EXPECT_EQ(chunk.size() % cuda_shared_granularity(0), 0u);
  ASSERT_EQ(cudaMemset(chunk.data(), 0x11, chunk.size()), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  SharedSignals signals = SharedSignals::create(0, "the test's signals");
  ASSERT_NO_FATAL_FAILURE(offer_chunk_and_signals(parent_end, chunk, signals));
  ASSERT_EQ(child_answer(parent_end), "") << "from the child";
  // Else the wait below would hold: the child's record ran before it answered.
  ASSERT_FALSE(signals.pending(kTrainerDone)) << "the child's stream ran its record before it answered";
  {
    cudaStream_t waiting = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&waiting, cudaStreamNonBlocking), cudaSuccess);
    const ReleaseOnExit release_on_exit(signals, kTrainerDone, kid, waiting);
    signals.wait_on(kTrainerDone, waiting);  // the child's write, as its signal says
    ASSERT_TRUE(stream_done_within(waiting, 10000)) << "the wait on the child's record, which had run, held 10 s";
  }
  EXPECT_TRUE(all_bytes(chunk.data(), chunk.size(), 0x5A)) << "the child's bytes, seen by the parent";

  const int status = kid.kill_and_reap();
  EXPECT_TRUE(WIFSIGNALED(status)) << "the child was still there to kill";
  EXPECT_TRUE(all_bytes(chunk.data(), chunk.size(), 0x5A)) << "the memory outlives the process that mapped it";
  ASSERT_EQ(cudaMemset(chunk.data(), 0x22, chunk.size()), cudaSuccess);
  EXPECT_TRUE(all_bytes(chunk.data(), chunk.size(), 0x22));
}

// The common part of the last two tests: the latest record of `signals`'
// `id` is the child's, queued behind endless work. This process's stream
// waits for it; the child is killed; release must end the wait.
void expect_a_killed_record_released(const SharedSignals& signals, SignalId id, Child& child, const char* who) {
  cudaStream_t waiting = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&waiting, cudaStreamNonBlocking), cudaSuccess);
  const ReleaseOnExit release_on_exit(signals, id, child, waiting);
  cudaEvent_t after = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&after, cudaEventDisableTiming), cudaSuccess);
  signals.wait_on(id, waiting);
  ASSERT_EQ(cudaEventRecord(after, waiting), cudaSuccess);
  EXPECT_FALSE(completes_within(after, 500)) << "the wait holds while the child's work runs";
  EXPECT_TRUE(signals.pending(id)) << "this process sees the other's record pending (Device::trainer_pending asks so)";

  child.kill_and_reap();
  const bool held_after_kill = !completes_within(after, 2000);
  std::printf("%s: a record left queued by a SIGKILLed process: the wait on it was %s 2 s after the kill\n", who,
              held_after_kill ? "still held (the release is needed)" : "released by the driver itself");
  ::testing::Test::RecordProperty("held_after_kill", held_after_kill ? "yes" : "no");

  signals.release(id);
  if (!completes_within(after, 10000)) {
    // A stream that waits forever would hang this process's teardown too.
    std::fprintf(stderr, "FAILED (%s): release did not end the wait on the killed process's record\n", who);
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(1);
  }
  EXPECT_FALSE(signals.pending(id));
  // The signal goes on: a record made after the release (a trainer that
  // started again) is waited for as before.
  cudaEventDestroy(after);
  cudaStream_t recording = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&recording, cudaStreamNonBlocking), cudaSuccess);
  signals.record(id, recording);
  signals.wait_on(id, waiting);
  const bool later_record_ends_wait = stream_done_within(waiting, 10000);
  EXPECT_TRUE(stream_done_within(recording, 10000)) << "this process's own record did not run";
  cudaStreamDestroy(recording);
  ASSERT_TRUE(later_record_ends_wait) << "a wait on a record made after the release held 10 s";
  EXPECT_FALSE(signals.pending(id));
}

// The daemon's side: its own signals, the killed trainer's record.
TEST(CudaShared, AWaitOnARecordAKilledProcessNeverRanIsReleased) {
  auto [parent_end, child_end] = connection_pair();
  Child kid;
  if (const std::string missing = start_child(child_records_behind_endless_work, parent_end, child_end, &kid);
      !missing.empty())
    GTEST_SKIP() << "stream signals cannot be tested here: " << missing;
  ASSERT_GT(kid.pid, 0);
  SharedSignals signals = SharedSignals::create(0, "the test's signals");
  parent_end.send(FrameHeader{}, {}, signal_fds(signals), 30000);
  ASSERT_EQ(child_answer(parent_end), "") << "from the child";
  expect_a_killed_record_released(signals, kTrainerDone, kid, "the daemon's side");
}

// The trainer's side: the killed daemon's signals (mapped here, which keeps
// the page), the killed daemon's record.
TEST(CudaShared, AWaitOnARecordAKilledCreatorNeverRanIsReleased) {
  auto [parent_end, child_end] = connection_pair();
  Child kid;
  if (const std::string missing =
          start_child(child_creates_and_records_behind_endless_work, parent_end, child_end, &kid);
      !missing.empty())
    GTEST_SKIP() << "stream signals cannot be tested here: " << missing;
  ASSERT_GT(kid.pid, 0);
  Frame offer = parent_end.receive(1024, 60000);
  ASSERT_EQ(offer.fds.size(), 1u);
  SharedSignals signals = SharedSignals::import(offer.fds[0].get(), 0);
  parent_end.send(FrameHeader{}, {}, {}, 30000);
  ASSERT_EQ(child_answer(parent_end), "") << "from the child";
  expect_a_killed_record_released(signals, kZerodDone, kid, "the trainer's side");
}

// The every-step path, both sides alive: zerod's stream waits for the
// trainer's record, which its stream reaches after 300 ms of work. The
// wait holds meanwhile, then ends, and the bytes the trainer wrote before
// its record are there.
TEST(CudaShared, AWaitOnALiveRecordBehindWorkHoldsThenEnds) {
  auto [parent_end, child_end] = connection_pair();
  Child kid;
  if (const std::string missing = start_child(child_records_behind_a_delay, parent_end, child_end, &kid);
      !missing.empty())
    GTEST_SKIP() << "stream signals cannot be tested here: " << missing;
  ASSERT_GT(kid.pid, 0);
  SharedDeviceChunk chunk = SharedDeviceChunk::allocate(0, kBytes, "the test's chunk");
  ASSERT_EQ(cudaMemset(chunk.data(), 0x11, chunk.size()), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  SharedSignals signals = SharedSignals::create(0, "the test's signals");
  ASSERT_NO_FATAL_FAILURE(offer_chunk_and_signals(parent_end, chunk, signals));
  ASSERT_EQ(child_answer(parent_end), "") << "from the child";

  cudaStream_t waiting = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&waiting, cudaStreamNonBlocking), cudaSuccess);
  const ReleaseOnExit release_on_exit(signals, kTrainerDone, kid, waiting);
  cudaEvent_t after = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&after, cudaEventDisableTiming), cudaSuccess);
  signals.wait_on(kTrainerDone, waiting);
  ASSERT_EQ(cudaEventRecord(after, waiting), cudaSuccess);
  EXPECT_FALSE(completes_within(after, 100)) << "the wait ended while the child's 300 ms of work before its record ran";
  const bool ended = completes_within(after, 5000);
  cudaEventDestroy(after);
  ASSERT_TRUE(ended) << "the wait on the live child's record did not end within 5 s";
  EXPECT_FALSE(signals.pending(kTrainerDone));
  EXPECT_TRUE(all_bytes(chunk.data(), chunk.size(), 0x5A)) << "the child's bytes, written before its record";
}

// The live trainer's test: `signals`' `id` was last recorded by the live
// child behind a kernel of its that faults. This process's stream waits
// for it: the wait holds once the kernel has failed, and the child's next
// CUDA call, at `go`, must end it, the child still alive. (A daemon's
// device ends it before its next call: its own test, below.)
void expect_the_failed_sides_record_released(const SharedSignals& signals, SignalId id, Connection& parent_end,
                                             Child& child) {
  ASSERT_TRUE(signals.pending(id)) << "the child's record was queued behind its work (its answer came first)";
  cudaStream_t waiting = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&waiting, cudaStreamNonBlocking), cudaSuccess);
  const ReleaseOnExit release_on_exit(signals, id, child, waiting);
  cudaEvent_t after = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&after, cudaEventDisableTiming), cudaSuccess);
  signals.wait_on(id, waiting);
  ASSERT_EQ(cudaEventRecord(after, waiting), cudaSuccess);
  // Past the child's work: its kernel has failed, and the record behind it
  // never ran (a wait that ends here ran it: the kernel did not fault).
  EXPECT_FALSE(completes_within(after, 2000)) << "the child's record ran: its kernel did not fail its context";
  parent_end.send(FrameHeader{}, {}, {}, 30000);  // go: the child's next call
  const std::string said = child_answer(parent_end);
  std::printf("the child's stream after its call: %s\n", said.empty() ? "no error" : said.c_str());
  EXPECT_NE(said, "") << "the child's context did not fail";
  const bool released = completes_within(after, 10000);
  int status = 0;
  const bool alive = waitpid(child.pid, &status, WNOHANG) == 0;
  cudaEventDestroy(after);
  ASSERT_TRUE(alive) << "the child died: only its own release, alive, is what this tests";
  if (!released) {
    // A stream that waits forever would hang this process's teardown too.
    std::fprintf(stderr, "FAILED: the child's failed context did not release the wait on its record within 10 s\n");
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(1);
  }
  EXPECT_FALSE(signals.pending(id));
}

// The daemon's side: its own signals; the live trainer's kernel failed.
TEST(CudaShared, AWaitBehindAFailedKernelIsReleasedByTheLiveTrainer) {
  auto [parent_end, child_end] = connection_pair();
  Child kid;
  if (const std::string missing = start_child(child_records_behind_a_failing_kernel, parent_end, child_end, &kid);
      !missing.empty())
    GTEST_SKIP() << "stream signals cannot be tested here: " << missing;
  ASSERT_GT(kid.pid, 0);
  SharedSignals signals = SharedSignals::create(0, "the test's signals");
  parent_end.send(FrameHeader{}, {}, signal_fds(signals), 30000);
  ASSERT_EQ(child_answer(parent_end), "") << "from the child";
  expect_the_failed_sides_record_released(signals, kTrainerDone, parent_end, kid);
}

// The trainer's side: the live daemon's signals, mapped here; its device's
// kernel failed after the device's last call, and the daemon makes no
// other (the gap the device's ContextFailureWatch closes: a trainer waiting
// on the GPU for the record, a loss.item(), would wait for good). The wait
// ends within 10 s with no word to the child; the child's next call then
// fails naming the daemon's context, as the trainer's next zerod call
// would.
TEST(CudaShared, AWaitBehindAFailedKernelIsReleasedByTheLiveDaemonBeforeItsNextCall) {
  auto [parent_end, child_end] = connection_pair();
  Child kid;
  if (const std::string missing =
          start_child(child_device_records_behind_a_failing_kernel, parent_end, child_end, &kid);
      !missing.empty())
    GTEST_SKIP() << "stream signals cannot be tested here: " << missing;
  ASSERT_GT(kid.pid, 0);
  Frame offer = parent_end.receive(1024, 60000);
  ASSERT_EQ(offer.fds.size(), 1u) << "from the child: "
                                 << std::string(reinterpret_cast<const char*>(offer.body.data()), offer.body.size());
  SharedSignals signals = SharedSignals::import(offer.fds[0].get(), 0);
  parent_end.send(FrameHeader{}, {}, {}, 30000);
  ASSERT_EQ(child_answer(parent_end), "") << "from the child";
  ASSERT_TRUE(signals.pending(kZerodDone)) << "the child's record was queued behind its work (its answer came first)";

  cudaStream_t waiting = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&waiting, cudaStreamNonBlocking), cudaSuccess);
  const ReleaseOnExit release_on_exit(signals, kZerodDone, kid, waiting);
  cudaEvent_t after = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&after, cudaEventDisableTiming), cudaSuccess);
  signals.wait_on(kZerodDone, waiting);
  ASSERT_EQ(cudaEventRecord(after, waiting), cudaSuccess);
  const auto start = std::chrono::steady_clock::now();
  const bool released = completes_within(after, 10000);  // the child makes no call meanwhile
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  int status = 0;
  const bool alive = waitpid(kid.pid, &status, WNOHANG) == 0;
  cudaEventDestroy(after);
  ASSERT_TRUE(alive) << "the child died: only its own release, alive, is what this tests";
  if (!released) {
    // A stream that waits forever would hang this process's teardown too.
    std::fprintf(stderr, "FAILED: the live daemon's failed context did not release the wait on its record within "
                         "10 s without another call\n");
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(1);
  }
  std::printf("the wait ended %lld ms after it was queued (the child's work takes about 500 ms)\n",
              static_cast<long long>(took.count()));
  EXPECT_FALSE(signals.pending(kZerodDone));

  parent_end.send(FrameHeader{}, {}, {}, 30000);  // go: the child's next call
  const std::string said = child_answer(parent_end);
  std::printf("the child's next call: %s\n", said.c_str());
  EXPECT_NE(said.find("The zerod daemon's GPU context had failed before this call"), std::string::npos)
      << "the child's context did not fail, or its error does not name the daemon's: " << said;
}

}  // namespace
