// bench_onebit_compress: how fast 1-bit Adam's compression runs next to a
// plain memcpy of the same fp32 buffer.
//
// Figures are GB/s of the memory each pass touches (bytes read plus bytes
// written, per rank, as listed below), each the median of the timed
// iterations after the warm-up ones, and their ratio to memcpy's rate of the
// same kind (it reads and writes the buffer once: 8 bytes per fp32) on as
// many threads as ranks. Bytes per element of the pass:
//   worker pack     read buf, err; write a sign bit          8 + 1/8
//   worker commit   read buf, err, a sign bit; write buf, err 16 + 1/8
//   server pack     (per element of the chunk) read W sign bits and err,
//                   write a sign bit                         4 + (W + 1)/8
//   server commit   read W sign bits and err, write err      8 + W/8
//   driver          the four passes: worker passes on the whole buffer,
//                   server passes on the rank's chunk (count / W); the
//                   exchanges' copies of sign bits are not counted
// Rows per ISA path:
//   worker pack    signs + sum of squares of buf + error (first pass)
//   worker commit  new worker error and the result (last pass)
//   server pack    one rank's chunk at world W: the weighted sign sum, its
//                  signs and sum of squares, reported per element of the full
//                  buffer (the chunk is count / W of it)
//   server commit  the new server error, recomputing the sum (last pass)
//   driver         a whole compressed_all_reduce per rank, W rank threads of
//                  a team exchanging by copies between barriers; "kept": with
//                  an onebit::Scratch kept between calls, so that no call
//                  faults in fresh pages
// The passes are memory-bound on large buffers, so a pass that moves its bytes
// as fast as memcpy moves its own shows 1.00.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "onebit.h"
#include "onebit_kernels.h"
#include "team.h"

namespace zerod::bench {
namespace {

namespace ob = zerod::comm::onebit;
using Clock = std::chrono::steady_clock;

struct Options {
  size_t mib = 256;
  int iters = 10;
  int warmup = 2;
  std::vector<int> worlds = {1, 2, 4};
};

void usage(const char* argv0) {
  std::printf(
      "usage: %s [--mib 256] [--iters 10] [--warmup 2] [--worlds 1,2,4]\n"
      "  MiB of fp32 per rank; needs about (2 W + 2) * MiB of memory at world W.\n",
      argv0);
}

bool parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      usage(argv[0]);
      std::exit(0);
    }
    if (i + 1 >= argc) return false;
    const char* v = argv[++i];
    if (a == "--mib") {
      o->mib = static_cast<size_t>(std::max(1L, std::atol(v)));
    } else if (a == "--iters") {
      o->iters = std::max(1, std::atoi(v));
    } else if (a == "--warmup") {
      o->warmup = std::max(0, std::atoi(v));
    } else if (a == "--worlds") {
      o->worlds.clear();
      for (const char* p = v; *p != '\0';) {
        char* end = nullptr;
        const long w = std::strtol(p, &end, 10);
        if (end == p || w < 1) return false;
        o->worlds.push_back(static_cast<int>(w));
        p = *end == ',' ? end + 1 : end;
      }
    } else {
      return false;
    }
  }
  return true;
}

// Median seconds of fn over the timed iterations.
double median_seconds(const Options& o, const std::function<void()>& fn) {
  for (int i = 0; i < o.warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < o.iters; ++i) {
    const auto a = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// memcpy on `threads` threads of a team, each copying a buffer of its own.
double memcpy_gbps(const Options& o, size_t count, int threads) {
  std::vector<std::vector<float>> src, dst;
  for (int t = 0; t < threads; ++t) {
    src.push_back(random_floats(count, 1));
    dst.emplace_back(count, 0.0f);
  }
  Team team(threads);
  const double s = median_seconds(
      o, [&] { team.run([&](int t) { std::memcpy(dst[t].data(), src[t].data(), count * sizeof(float)); }); });
  return 2.0 * static_cast<double>(count * sizeof(float)) / s / 1e9;  // read + write
}

// Bytes touched per element of each pass (see the top of this file).
constexpr double kWorkerPackBytes = 8.0 + 1.0 / 8;
constexpr double kWorkerCommitBytes = 16.0 + 1.0 / 8;
double server_pack_bytes(int world) { return 4.0 + (world + 1) / 8.0; }
double server_commit_bytes(int world) { return 8.0 + world / 8.0; }

void row(const char* what, const char* isa, int world, double gbps, double memcpy) {
  std::printf("%-15s %-7s %5d %10.2f %10.2f\n", what, isa, world, gbps, gbps / memcpy);
}

// W threads calling the driver, meeting at a barrier for each exchange.
class Exchanges {
 public:
  explicit Exchanges(int world) : world_(world), barrier_(world), sends_(static_cast<size_t>(world)) {}
  ob::Exchange for_rank(int rank) {
    ob::Exchange e;
    e.all_to_all = [this, rank](const void* s, void* r, uint64_t b) { return swap(rank, s, r, b, true); };
    e.all_gather = [this, rank](const void* s, void* r, uint64_t b) { return swap(rank, s, r, b, false); };
    return e;
  }

 private:
  zd_status swap(int rank, const void* send, void* recv, uint64_t bytes, bool to_all) {
    sends_[static_cast<size_t>(rank)] = static_cast<const uint8_t*>(send);
    barrier_.arrive_and_wait();
    for (int k = 0; k < world_; ++k) {
      const uint8_t* src = sends_[static_cast<size_t>(k)] + (to_all ? static_cast<uint64_t>(rank) * bytes : 0);
      std::memcpy(static_cast<uint8_t*>(recv) + static_cast<uint64_t>(k) * bytes, src, bytes);
    }
    barrier_.arrive_and_wait();
    return ZD_OK;
  }
  int world_;
  std::barrier<> barrier_;
  std::vector<const uint8_t*> sends_;
};

void bench_kernels(const Options& o, size_t count, ob::detail::Isa isa, double memcpy1) {
  const auto& k = ob::detail::kernels(isa);
  const char* name = ob::detail::isa_name(isa);
  const double elems = static_cast<double>(count);
  std::vector<float> buf = random_floats(count, 2), err = random_floats(count, 3);
  std::vector<uint8_t> bits((count + 7) / 8);
  double sink = 0.0;
  double s = median_seconds(o, [&] { sink += k.worker_pack(buf.data(), err.data(), count, bits.data()); });
  row("worker pack", name, 1, elems * kWorkerPackBytes / s / 1e9, memcpy1);
  s = median_seconds(o, [&] { k.worker_commit(buf.data(), err.data(), count, 0.3f, bits.data(), 0.2f); });
  row("worker commit", name, 1, elems * kWorkerCommitBytes / s / 1e9, memcpy1);
  for (const int world : o.worlds) {
    // A chunk of count / W elements, W blocks of its signs.
    const size_t n = count / static_cast<size_t>(world) / 8 * 8;
    std::vector<std::vector<uint8_t>> blocks(static_cast<size_t>(world), bits);
    std::vector<const uint8_t*> ptrs;
    std::vector<float> w(static_cast<size_t>(world), 0.1f);
    for (const auto& b : blocks) ptrs.push_back(b.data());
    const ob::detail::ServerInput in{ptrs.data(), w.data(), world};
    s = median_seconds(o, [&] { sink += k.server_pack(in, err.data(), n, bits.data()); });
    row("server pack", name, world, static_cast<double>(n) * server_pack_bytes(world) / s / 1e9, memcpy1);
    s = median_seconds(o, [&] { k.server_commit(in, err.data(), n, 0.1f); });
    row("server commit", name, world, static_cast<double>(n) * server_commit_bytes(world) / s / 1e9, memcpy1);
  }
  if (sink == 42.0) std::printf(" ");  // keeps the sums alive
}

void bench_driver(const Options& o, size_t count, ob::detail::Isa isa, int world, double memcpy_w, bool keep) {
  const auto& k = ob::detail::kernels(isa);
  std::vector<std::vector<float>> buf, we, se;
  for (int r = 0; r < world; ++r) {
    buf.push_back(random_floats(count, 10 + static_cast<uint64_t>(r)));
    we.emplace_back(count, 0.0f);
    se.emplace_back(ob::chunk_elems(count, world), 0.0f);
  }
  Exchanges ex(world);
  std::vector<ob::Exchange> exchanges;
  for (int r = 0; r < world; ++r) exchanges.push_back(ex.for_rank(r));
  std::vector<ob::Scratch> scratch(static_cast<size_t>(world));
  std::atomic<bool> ok{true};
  Team team(world);
  const double s = median_seconds(o, [&] {
    team.run([&](int r) {
      const size_t i = static_cast<size_t>(r);
      if (ob::detail::compressed_all_reduce_with(k, r, world, buf[i].data(), count, we[i].data(), se[i].data(),
                                                 exchanges[i], keep ? &scratch[i] : nullptr) != ZD_OK) {
        ok = false;
      }
    });
  });
  if (!ok) std::printf("driver failed\n");
  const double chunk = static_cast<double>(ob::chunk_elems(count, world));
  const double bytes = static_cast<double>(count) * (kWorkerPackBytes + kWorkerCommitBytes) +
                       chunk * (server_pack_bytes(world) + server_commit_bytes(world));
  row(keep ? "driver, kept" : "driver", ob::detail::isa_name(isa), world, bytes / s / 1e9, memcpy_w);
}

int run(const Options& o) {
  const size_t count = o.mib * 1024 * 1024 / sizeof(float);
  std::printf("1-bit compression, %zu MiB of fp32 (%zu elements) per rank, median of %d after %d warm-up\n", o.mib,
              count, o.iters, o.warmup);
  std::printf("best ISA: %s; %u hardware threads\n\n", ob::detail::isa_name(ob::detail::best_isa()),
              std::thread::hardware_concurrency());
  const double memcpy1 = memcpy_gbps(o, count, 1);
  std::printf("%-15s %-7s %5s %10s %10s\n", "what", "isa", "world", "GB/s", "x memcpy");
  row("memcpy", "-", 1, memcpy1, memcpy1);
  std::vector<double> memcpy_by_world;
  for (const int w : o.worlds) {
    const double m = w == 1 ? memcpy1 : memcpy_gbps(o, count, w);
    memcpy_by_world.push_back(m);
    if (w > 1) row("memcpy", "-", w, m, m);
  }
  for (const auto isa : {ob::detail::Isa::scalar, ob::detail::Isa::avx2}) {
    if (!ob::detail::isa_supported(isa)) continue;
    bench_kernels(o, count, isa, memcpy1);
    for (const bool keep : {false, true}) {
      for (size_t i = 0; i < o.worlds.size(); ++i) bench_driver(o, count, isa, o.worlds[i], memcpy_by_world[i], keep);
    }
  }
  std::printf(
      "\nGB/s: bytes each pass reads and writes, per rank per second (memcpy: 8 per fp32). memcpy at world W:\n"
      "W threads, each copying its own buffer.\n"
      "Kernels are compared with memcpy on 1 thread; the driver at world W with memcpy on W threads.\n");
  return 0;
}

}  // namespace
}  // namespace zerod::bench

int main(int argc, char** argv) {
  zerod::bench::Options o;
  if (!zerod::bench::parse(argc, argv, &o)) {
    zerod::bench::usage(argv[0]);
    return 2;
  }
  return zerod::bench::run(o);
}
