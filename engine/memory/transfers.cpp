#include "memory/transfers.h"

#include "runtime/dtype.h"
#include "error.h"
#include "memory/memory.h"
#include "model/rank_resources.h"
#include "observe/probe.h"

#include <algorithm>
#include <exception>
#include <string>
#include <utility>
#include <vector>

namespace zerod {

Transfers::Transfers(RankResources& res)
    : res_(res), gradients_(res, kGradientStagingBytes, "the gradients' staging buffer (gradients leaving the device)"),
      working_(res, kWorkingStagingBytes, "the working copy's staging buffer (updates going to the device)"),
      scratch_(res.ledger) {}

bool Transfers::bytes_travel() const { return !res_.device->host_addressable(); }

void Transfers::reserve_staging(bool gradients, bool working, uint64_t scratch_bytes) {
  try {
    if (gradients) gradients_.reserve();
    if (working) working_.reserve();
    scratch_.reserve(scratch_bytes);
  } catch (...) {
    gradients_.release();
    working_.release();
    throw;
  }
}

std::unique_ptr<CommStream> Transfers::leaving_stream(const char* role) const {
  return std::make_unique<CommStream>(bytes_travel(), role);
}

void Transfers::add_to_host(std::span<const PoolAdd> adds, uint64_t ready) {
  Device& d = *res_.device;
  if (adds.empty()) return;  // nothing leaves: the staging buffer is not taken
  if (!bytes_travel()) {
    // The host reads the pool in place: the same adds as the chunks below
    // (on the workers, the window's first contribution written rather than
    // added, each tile's norm partials taken while it is in cache), straight
    // from the pool. Done on the calling thread alone, adding into the zeros
    // and then reading each parameter again for its norm, they took 21 ms
    // of bench_offload_step's 64 ms host step on 2 cores (12 ms so).
    for (const PoolAdd& a : adds)
      parallel_accumulate(res_.workers, a.src, a.src_dt, a.dst, a.dst_dt, a.n, a.first,
                          a.norm.sums ? &a.norm : nullptr);
    return;
  }
  // Off the device: downloaded a chunk at a time into one half of the
  // page-locked staging buffer while the host's workers add the chunk in
  // the other half; the window's first contribution is written rather
  // than added (the accumulators are zero), which spares reading them:
  // about 40% of the bytes the host moves for bf16 gradients into fp32
  // accumulators. The chunks of all the adds make one sequence, so the
  // copy engine is not idle while an add's last chunk is added, nor the
  // workers while the next add's first chunk arrives (one parameter at a
  // time, they took turns: an H200 moved a 1.3B GPT's gradients off at
  // about 4 GB/s).
  HostStaging::Lease stage(gradients_);
  const uint64_t half = stage.size() / 2;
  struct Chunk {
    size_t add;
    uint64_t off, n;
  };
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < adds.size(); ++i) {
    // Chunks of whole norm tiles, so a chunk's partials are the tiles'.
    const uint64_t most = half / dtype_size(adds[i].src_dt) / kTile * kTile;
    for (uint64_t off = 0; off < adds[i].n; off += most) chunks.push_back({i, off, std::min(most, adds[i].n - off)});
  }
  uint64_t ticket[2] = {0, 0};
  auto download = [&](size_t c, int h) {
    const PoolAdd& a = adds[chunks[c].add];
    const size_t ssz = dtype_size(a.src_dt);
    ticket[h] = d.download(stage.data() + h * half, static_cast<const std::byte*>(a.src) + chunks[c].off * ssz,
                           chunks[c].n * ssz, ready);
  };
  // A failure part-way (a wait or an add that throws) must not give the
  // buffer back while the other half's download may still be writing into
  // it: the next lease (the next step's, after a failed one) would take
  // memory the copy engine is still filling.
  struct DrainOnFailure {
    Device& d;
    const uint64_t (&ticket)[2];
    const int entered = std::uncaught_exceptions();
    ~DrainOnFailure() {
      if (std::uncaught_exceptions() == entered) return;  // every chunk waited for on the way
      for (uint64_t t : ticket) try {
          d.transfer_wait(t);
        } catch (...) {  // the error already on its way says what failed
        }
    }
  } drain{d, ticket};
  if (!chunks.empty()) download(0, 0);
  int h = 0;
  for (size_t c = 0; c < chunks.size(); ++c, h ^= 1) {
    // The other half's add is done: it may take the next chunk.
    if (c + 1 < chunks.size()) download(c + 1, h ^ 1);
    d.transfer_wait(ticket[h]);  // traced by the device ("wait for transfer")
    const PoolAdd& a = adds[chunks[c].add];
    const uint64_t off = chunks[c].off;
    const NormTiles part{a.norm.sums ? a.norm.sums + off / kTile : nullptr, a.norm.real > off ? a.norm.real - off : 0};
    // Traced with its bytes, so a trace gives the host's rate for the adds
    // beside the waits for the chunks' downloads.
    observe::EventArgs ev;
    ev.bytes = chunks[c].n * dtype_size(a.src_dt);
    observe::Span add(res_.probe, "grads", "host add", ev);
    parallel_accumulate(res_.workers, stage.data() + h * half, a.src_dt,
                        static_cast<std::byte*>(a.dst) + off * dtype_size(a.dst_dt), a.dst_dt, chunks[c].n, a.first,
                        a.norm.sums ? &part : nullptr);
  }
}

void Transfers::upload_to_pool(void* dst, const void* src, uint64_t bytes) {
  Device& d = *res_.device;
  d.upload_after_stream();
  const uint64_t t = d.upload(dst, src, bytes);
  d.stream_waits(t);
  res_.note_shard_upload(t);
}

void Transfers::before_host_writes() {
  if (!bytes_travel()) return;
  res_.device->upload_after_stream();
  res_.wait_shard_uploads();
}

void Transfers::bounce(const Memory& in_mem, const void* in, uint64_t in_bytes, void* out, uint64_t out_bytes,
                       const HostCollective& fn) {
  // Pageable memory of the host scratch, not the staging buffers: these
  // collectives (ranks of a device the host cannot address, in several
  // processes) wait for the network, not for this copy, until the comm
  // plugins take device buffers.
  HostScratch::Lease host_in = scratch_.take(in_bytes, "the host copy of a collective's input (a bounce)");
  in_mem.copy_out(host_in.data(), in, in_bytes);
  if (in == out && in_bytes == out_bytes) {
    fn(host_in.data(), host_in.data());
    res_.pool_memory.copy_in(out, host_in.data(), out_bytes);
    return;
  }
  HostScratch::Lease host_out = scratch_.take(out_bytes, "the host copy of a collective's output (a bounce)");
  fn(host_in.data(), host_out.data());
  if (out_bytes) res_.pool_memory.copy_in(out, host_out.data(), out_bytes);
}

HostWindow::HostWindow(const Memory& m, void* at, uint64_t bytes, Access access, const char* what)
    : memory_(&m), at_(at), bytes_(bytes) {
  if (m.host_writes() || bytes == 0) {
    host_ = static_cast<std::byte*>(at);
    return;
  }
  copy_ = m.host_scratch().take(bytes, what);
  host_ = copy_.data();
  if (access & kRead) m.copy_out(host_, at, bytes);
  write_back_ = (access & kWrite) != 0;
}

HostWindow::HostWindow(const TieredBuffer& b, uint64_t begin, uint64_t n, size_t esz, Access access,
                       const char* what) {
  if (n == 0) return;
  if (!b.in_one_segment(begin, n))
    fail(ZD_ERR_INTERNAL, std::string(what) + ": elements " + std::to_string(begin) + ".." +
                              std::to_string(begin + n) + " are not in one memory segment");
  *this = HostWindow(*b.segment_at(begin).memory, b.addr(begin), n * esz, access, what);
}

HostWindow& HostWindow::operator=(HostWindow&& o) noexcept {
  if (this != &o) {
    memory_ = o.memory_;
    at_ = o.at_;
    bytes_ = o.bytes_;
    write_back_ = std::exchange(o.write_back_, false);
    copy_ = std::move(o.copy_);
    host_ = std::exchange(o.host_, nullptr);
  }
  return *this;
}

void HostWindow::done() {
  if (!write_back_) return;
  write_back_ = false;
  memory_->copy_in(at_, host_, bytes_);
}

}  // namespace zerod
