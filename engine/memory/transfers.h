// How a rank's bytes cross between the device pool and host memory: the one
// place that knows whether the host reads the pool through its pointers
// (the cpu device) or the bytes must travel (a GPU, the emulated device).
// It owns the page-locked staging buffers those crossings go through, the
// host scratch the host's copies of pool bytes take their memory from, and
// the bounce of a collective the comm plugins cannot run on the pool itself.
// The memories (memory.h) call it; engine parts call the memories. Host
// loops over bytes that may be in the pool open a HostWindow (below).
#pragma once

#include "comm/comm_stream.h"
#include "memory/host_scratch.h"
#include "memory/host_staging.h"
#include "memory/memory.h"
#include "memory/tiered_buffer.h"
#include "runtime/workers.h"

#include <zerod/zerod.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>

namespace zerod {

struct RankResources;

class Transfers {
 public:
  explicit Transfers(RankResources& res);
  Transfers(const Transfers&) = delete;
  Transfers& operator=(const Transfers&) = delete;

  // Whether bytes between the pool and host memory travel as the device's
  // copies (a GPU, the emulated device), rather than the host reading and
  // writing the pool in place (the cpu device, whose pool is host memory).
  bool bytes_travel() const;

  // Gradients leaving the pool for host accumulators pass through here.
  HostStaging& gradient_staging() { return gradients_; }
  // New working copies going from the host's updates to the pool.
  HostStaging& working_staging() { return working_; }
  // The host copies of pool bytes (HostWindow, bounce) take their memory here.
  HostScratch& host_scratch() { return scratch_; }
  // At finalize: the staging buffers the plan counts (Placement::host_staging)
  // and the host scratch at its size (Placement::host_windows) are made and
  // charged now, all or none.
  void reserve_staging(bool gradients, bool working, uint64_t scratch_bytes);

  // A stream for work that takes bytes off the pool into host memory: a
  // thread of its own where that is a transfer, so neither the rank's
  // collectives nor the trainer wait for the host's adds; inline where the
  // host reads the pool itself.
  std::unique_ptr<CommStream> leaving_stream(const char* role) const;

  // Each add's dst (host memory) += its src (the pool), in order: on the
  // calling thread where the host reads the pool; else downloaded a chunk
  // at a time through the gradients' staging buffer while the workers add
  // the chunk before, one add's chunks after another's without a pause
  // (Memory::add_from_pool says what the fields and ready mean).
  void add_to_host(std::span<const PoolAdd> adds, uint64_t ready);

  // bytes from host memory into the pool, on the upload queue (so it never
  // waits behind zerod's kernels or gradients leaving), ordered after
  // zerod's work issued so far (dst may be a block that work used), and
  // before zerod's later work. Whoever writes src next waits for it
  // (RankResources::wait_shard_uploads).
  void upload_to_pool(void* dst, const void* src, uint64_t bytes);

  // Before the host's updates write working copies in host memory or in
  // the pool: uploads into the pool are ordered after zerod's work issued
  // so far (gathers and the trainer's reads may still read what they
  // overwrite), and the gathers that upload straight from host shards are
  // done. Nothing to order where the host reads the pool.
  void before_host_writes();

  // A host collective over bytes the comm plugins cannot reach: in_bytes at
  // `in` (in memory `in_mem`) are copied into host memory, fn runs on that
  // copy and a host buffer of out_bytes, which is then copied to `out` in
  // the pool (none when out_bytes is 0: fn wrote where it belongs). In place
  // (in == out, in_bytes == out_bytes) fn gets one buffer twice. The host
  // buffers are the host scratch's, charged while the collective runs (the
  // plan does not size them: a host budget that cannot hold them refuses
  // the collective, naming it).
  using HostCollective = std::function<void(const void* host_in, void* host_out)>;
  void bounce(const class Memory& in_mem, const void* in, uint64_t in_bytes, void* out, uint64_t out_bytes,
              const HostCollective& fn);

 private:
  RankResources& res_;
  HostStaging gradients_;
  HostStaging working_;
  HostScratch scratch_;
};

// Host addresses for a loop the host runs over bytes of a memory: momentum
// compression's loops (the plugin's prepare, the exchange with its error
// feedback, the kept average's signs) and a planned optimizer pass, which
// are host code by design (the plugins' CPU kernels, the comm plugins'
// compressed all-reduce, per-tensor figures). Where the host writes the
// memory in place (host memory, the cpu device's pool) the window is the
// bytes themselves and costs nothing; else (a pool the host cannot
// address: a GPU, the emulated device) it is a copy in host memory, filled
// from the bytes when the loop reads them, and done() copies it back when
// the loop writes them, each by the memory's own copies (Memory::copy_out,
// copy_in, which return when the bytes are where they go). The loop runs
// the same code on the same values either way, so the results are the
// same bits as on the cpu device. A window dropped without done() (the
// loop threw) leaves the memory as it was.
//
// Why copies rather than kernels of the device's own: these loops are the
// plugins' host kernels and the comm plugins' host collectives; a device
// version of each is the device's business (engine/device/), and until
// there is one, the bytes go to where the code runs. A copy is a run of the
// rank's host scratch (Memory::host_scratch, host_scratch.h), which finalize
// reserved at the most that a compressed step's windows hold at once
// (Placement::host_windows): counted in the host tier's buffers, refused by
// its budget at finalize, and reused every step; on the devices that need
// it a compressed step moves the exchange buffer, the error feedback and
// the operands of a pass once each way.
class HostWindow {
 public:
  enum Access { kRead = 1, kWrite = 2, kReadWrite = 3 };
  HostWindow() = default;
  // bytes at `at`, in memory m; `what` names the copy where the host
  // budget refuses it (a copy beyond the reserved scratch).
  HostWindow(const Memory& m, void* at, uint64_t bytes, Access access,
             const char* what = "a host loop's copy of bytes in the device pool");
  // Elements [begin, begin + n) of b, of esz bytes each, which lie in one
  // of its memory segments (refused otherwise, naming `what`).
  HostWindow(const TieredBuffer& b, uint64_t begin, uint64_t n, size_t esz, Access access, const char* what);
  // A window moved from owes nothing: done() on it does nothing.
  HostWindow(HostWindow&& o) noexcept { *this = std::move(o); }
  HostWindow& operator=(HostWindow&& o) noexcept;
  HostWindow(const HostWindow&) = delete;
  HostWindow& operator=(const HostWindow&) = delete;

  std::byte* data() const { return host_; }
  float* f32() const { return reinterpret_cast<float*>(host_); }
  // What the loop wrote, back where it belongs (a copy opened for writing;
  // nothing for the bytes themselves). Once: a second call does nothing.
  void done();

 private:
  const Memory* memory_ = nullptr;
  void* at_ = nullptr;
  uint64_t bytes_ = 0;
  bool write_back_ = false;
  HostScratch::Lease copy_;
  std::byte* host_ = nullptr;
};

}  // namespace zerod
