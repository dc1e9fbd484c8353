#include "memory/transfers.h"

#include "runtime/dtype.h"
#include "error.h"
#include "memory/memory.h"
#include "model/rank_resources.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace zerod {

bool Transfers::bytes_travel() const { return !res_.device->host_addressable(); }

std::unique_ptr<CommStream> Transfers::leaving_stream(const char* role) const {
  return std::make_unique<CommStream>(bytes_travel(), role);
}

void Transfers::add_to_host(const void* src, zd_dtype src_dt, void* dst_v, zd_dtype dst_dt, uint64_t n, bool first,
                            const NormTiles* norm, uint64_t ready) {
  auto* dst = static_cast<std::byte*>(dst_v);
  Device& d = *res_.device;
  if (!bytes_travel()) {
    zerod::accumulate(src, src_dt, dst, dst_dt, n);
    if (norm) norm_tiles(dst, dst_dt, n, *norm);
    return;
  }
  // Off the device: downloaded a chunk at a time into one half of the
  // page-locked staging buffer while the host's workers add the chunk in
  // the other half; the window's first contribution is written rather
  // than added (the accumulators are zero), which spares reading them:
  // about 40% of the bytes the host moves for bf16 gradients into fp32
  // accumulators.
  HostStaging::Lease stage(gradients_);
  const size_t ssz = dtype_size(src_dt), dsz = dtype_size(dst_dt);
  // Chunks of whole norm tiles, so a chunk's partials are the tiles'.
  const uint64_t half = stage.size() / 2, chunk = half / ssz / kTile * kTile;
  const auto* from = static_cast<const std::byte*>(src);
  uint64_t ticket[2] = {0, 0};
  auto download = [&](uint64_t off, int h) {
    ticket[h] = d.download(stage.data() + h * half, from + off * ssz, std::min(chunk, n - off) * ssz, ready);
  };
  if (n) download(0, 0);
  int h = 0;
  for (uint64_t off = 0; off < n; off += chunk, h ^= 1) {
    // The other half's add is done: it may take the next chunk.
    if (off + chunk < n) download(off + chunk, h ^ 1);
    d.transfer_wait(ticket[h]);
    const NormTiles part = norm ? NormTiles{norm->sums + off / kTile, norm->real > off ? norm->real - off : 0}
                                : NormTiles{nullptr, 0};
    parallel_accumulate(res_.workers, stage.data() + h * half, src_dt, dst + off * dsz, dst_dt,
                        std::min(chunk, n - off), first, norm ? &part : nullptr);
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
  // Plain heap memory, made per collective: these collectives (ranks of a
  // device the host cannot address, in several processes) wait for the
  // network, not for this copy, until the comm plugins take device buffers.
  std::vector<std::byte> host_in(in_bytes);
  in_mem.copy_out(host_in.data(), in, in_bytes);
  if (in == out && in_bytes == out_bytes) {
    fn(host_in.data(), host_in.data());
    res_.pool_memory.copy_in(out, host_in.data(), out_bytes);
    return;
  }
  std::vector<std::byte> host_out(out_bytes);
  fn(host_in.data(), host_out.data());
  if (out_bytes) res_.pool_memory.copy_in(out, host_out.data(), out_bytes);
}

HostWindow::HostWindow(const Memory& m, void* at, uint64_t bytes, Access access)
    : memory_(&m), at_(at), bytes_(bytes) {
  if (m.host_writes() || bytes == 0) {
    host_ = static_cast<std::byte*>(at);
    return;
  }
  // Aligned as the pool's blocks are, so the host's vector loops take the
  // same paths over the copy as over the bytes themselves.
  copy_ = AlignedBuffer(bytes, 64);
  host_ = copy_.data();
  if (access & kRead) m.copy_out(host_, at, bytes);
  write_back_ = (access & kWrite) != 0;
}

HostWindow::HostWindow(const TieredBuffer& b, uint64_t begin, uint64_t n, size_t esz, Access access,
                       const char* what) {
  if (n == 0) return;
  if (!b.addressable(begin, n) || b.segment_at(begin).begin + b.segment_at(begin).count < begin + n)
    fail(ZD_ERR_INTERNAL, std::string(what) + ": elements " + std::to_string(begin) + ".." +
                              std::to_string(begin + n) + " are not in one memory segment");
  *this = HostWindow(*b.segment_at(begin).memory, b.addr(begin), n * esz, access);
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
