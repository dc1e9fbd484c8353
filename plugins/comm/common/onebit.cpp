// The 1-bit compressed average (zerod_plugin.h, above zd_comm_v2) over the
// plugin's two byte collectives.
//
// Nothing the caller owns is written until both exchanges have succeeded:
// the first pass over buf and worker_error only reads them (signs and the
// norm), the server's first pass only reads server_error, and the commit at
// the end recomputes x and y from the untouched inputs (the same fp32
// operations give the same bits) to write the new errors and the result.
// Recomputing costs one more read of the inputs but no scratch of count
// floats, which would cost a write and a read as well.
#include "onebit.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "onebit_kernels.h"

namespace zerod::comm::onebit {
namespace {

// Where chunk r and its block live; see zd_comm_v2 for the cut.
struct Layout {
  uint64_t count;
  uint64_t chunk;     // elements per chunk, a multiple of 8
  uint64_t scale_at;  // byte offset of the scale in a block
  uint64_t block;     // bytes per block

  Layout(uint64_t n, int32_t world)
      : count(n), chunk(chunk_elems(n, world)), scale_at((chunk / 8 + 3) / 4 * 4), block(scale_at + 4) {}

  uint64_t begin(int32_t r) const {
    const uint64_t b = static_cast<uint64_t>(r) * chunk;
    return b < count ? b : count;
  }
  uint64_t elems(int32_t r) const {
    const uint64_t b = begin(r);
    return count - b < chunk ? count - b : chunk;
  }
};

// The root mean square the scales are, 0 over no elements.
float rms(double sum_squares, uint64_t n) {
  return n == 0 ? 0.0f : static_cast<float>(std::sqrt(sum_squares / static_cast<double>(n)));
}

float read_scale(const uint8_t* block, const Layout& l) {
  float f;
  std::memcpy(&f, block + l.scale_at, sizeof f);
  return f;
}

// Zeroes the bytes of a block past the signs of its n elements (so that no
// uninitialised byte goes on the wire) and writes the scale.
void finish_block(uint8_t* block, const Layout& l, uint64_t n, float scale) {
  const uint64_t used = (n + 7) / 8;
  std::memset(block + used, 0, l.scale_at - used);
  std::memcpy(block + l.scale_at, &scale, sizeof scale);
}

zd_status run(const detail::Kernels& k, int32_t rank, int32_t world, float* buf, uint64_t count, float* worker_error,
              float* server_error, const Exchange& exchange, Scratch* kept) {
  if (world < 1 || rank < 0 || rank >= world || !exchange.all_to_all || !exchange.all_gather) {
    return ZD_ERR_INVALID_ARGUMENT;
  }
  if (count == 0) return ZD_OK;  // the same on every rank: nothing to exchange
  if (buf == nullptr || worker_error == nullptr || server_error == nullptr) return ZD_ERR_INVALID_ARGUMENT;

  const Layout l(count, world);
  const size_t w = static_cast<size_t>(world);
  // send1 | recv1 | send2 | recv2: world, world, 1 and world blocks.
  Scratch own;
  uint8_t* const send1 = (kept != nullptr ? kept : &own)->reserve((3 * w + 1) * l.block);
  if (send1 == nullptr) return ZD_ERR_OUT_OF_MEMORY;
  std::vector<const uint8_t*> bits(w);
  std::vector<float> weights(w);
  uint8_t* const recv1 = send1 + w * l.block;
  uint8_t* const send2 = recv1 + w * l.block;
  uint8_t* const recv2 = send2 + l.block;

  // Worker: the signs of x = buf + worker_error, chunk r into block r, and
  // one scale for all of them.
  double sum = 0.0;
  for (int32_t r = 0; r < world; ++r) {
    const uint64_t b = l.begin(r);
    sum += k.worker_pack(buf + b, worker_error + b, l.elems(r), send1 + r * l.block);
  }
  const float s = rms(sum, count);
  for (int32_t r = 0; r < world; ++r) finish_block(send1 + r * l.block, l, l.elems(r), s);
  zd_status st = exchange.all_to_all(send1, recv1, l.block);
  if (st != ZD_OK) return st;

  // Server: this rank's chunk of every worker's signs, weighted by s_k / W.
  const uint64_t n = l.elems(rank);
  for (size_t r = 0; r < w; ++r) {
    bits[r] = recv1 + r * l.block;
    weights[r] = static_cast<float>(static_cast<double>(read_scale(bits[r], l)) / static_cast<double>(world));
  }
  const detail::ServerInput in{bits.data(), weights.data(), world};
  const float t = rms(n == 0 ? 0.0 : k.server_pack(in, server_error, n, send2), n);
  finish_block(send2, l, n, t);
  st = exchange.all_gather(send2, recv2, l.block);
  if (st != ZD_OK) return st;

  // Commit: the new errors and the result.
  for (int32_t r = 0; r < world; ++r) {
    const uint64_t b = l.begin(r);
    const uint8_t* block = recv2 + r * l.block;
    k.worker_commit(buf + b, worker_error + b, l.elems(r), s, block, read_scale(block, l));
  }
  if (n > 0) k.server_commit(in, server_error, n, t);
  return ZD_OK;
}

}  // namespace

uint64_t chunk_elems(uint64_t count, int32_t world) {
  if (world < 1) return 0;
  const uint64_t w = static_cast<uint64_t>(world);
  const uint64_t per_rank = count / w + (count % w != 0 ? 1 : 0);
  return (per_rank + 7) / 8 * 8;
}

uint64_t block_bytes(uint64_t count, int32_t world) { return Layout(count, world).block; }

uint8_t* Scratch::reserve(uint64_t bytes) {
  if (bytes > size_) {
    std::unique_ptr<uint8_t[]> grown(new (std::nothrow) uint8_t[bytes]);
    if (!grown) return nullptr;
    data_ = std::move(grown);
    size_ = bytes;
  }
  return data_.get();
}

namespace detail {

zd_status compressed_all_reduce_with(const Kernels& kernels, int32_t rank, int32_t world, float* buf, uint64_t count,
                                     float* worker_error, float* server_error, const Exchange& exchange,
                                     Scratch* scratch) {
  // Nothing may unwind into the plugin's C entry points: an exchange that
  // throws, or a vector that cannot grow, becomes a status.
  try {
    return run(kernels, rank, world, buf, count, worker_error, server_error, exchange, scratch);
  } catch (const std::bad_alloc&) {
    return ZD_ERR_OUT_OF_MEMORY;
  } catch (...) {
    return ZD_ERR_INTERNAL;
  }
}

}  // namespace detail

zd_status compressed_all_reduce(int32_t rank, int32_t world, float* buf, uint64_t count, float* worker_error,
                                float* server_error, const Exchange& exchange, Scratch* scratch) {
  static const detail::Kernels& kernels = detail::kernels(detail::best_isa());
  return detail::compressed_all_reduce_with(kernels, rank, world, buf, count, worker_error, server_error, exchange,
                                            scratch);
}

zd_status compressed_all_reduce(int32_t rank, int32_t world, float* buf, uint64_t count, float* worker_error,
                                float* server_error, const Exchange& exchange) {
  return compressed_all_reduce(rank, world, buf, count, worker_error, server_error, exchange, nullptr);
}

}  // namespace zerod::comm::onebit
