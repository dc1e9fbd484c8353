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
//
// Before the driver is timed, its first call's result and new errors on every
// rank are checked against a double-precision transcription of the equations
// in zerod_plugin.h (above zd_comm_v2); a wrong value, or a rank's call
// failing (the others then leave their exchange rather than wait for it),
// leaves the row out and ends the run with exit status 1.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
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
  int fail_rank = -1;  // a rank whose exchanges fail, for the tests; -1: none
};

void usage(const char* argv0) {
  std::printf(
      "usage: %s [--mib 256] [--iters 10] [--warmup 2] [--worlds 1,2,4] [--fail-rank R]\n"
      "  MiB of fp32 per rank; needs about (2 W + 3) * MiB of memory at world W.\n"
      "  --fail-rank R: rank R's exchanges fail (a test of the failure path: no row, exit status 1).\n",
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
    } else if (a == "--fail-rank") {
      o->fail_rank = std::atoi(v);
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
  Exchanges(int world, int fail_rank)
      : world_(world), fail_rank_(fail_rank), barrier_(world), sends_(static_cast<size_t>(world)) {}
  ob::Exchange for_rank(int rank) {
    ob::Exchange e;
    e.all_to_all = [this, rank](const void* s, void* r, uint64_t b) { return swap(rank, s, r, b, true); };
    e.all_gather = [this, rank](const void* s, void* r, uint64_t b) { return swap(rank, s, r, b, false); };
    return e;
  }
  // Called by a rank whose driver call failed, in place of its remaining
  // exchanges: it counts as the rank's arrival at the barrier the others
  // wait at and leaves the barrier, so that they see the failure there and
  // leave their exchange (and their call) rather than wait for good.
  void abandon() {
    failed_ = true;
    barrier_.arrive_and_drop();
  }

 private:
  zd_status swap(int rank, const void* send, void* recv, uint64_t bytes, bool to_all) {
    if (rank == fail_rank_) return ZD_ERR_INTERNAL;
    sends_[static_cast<size_t>(rank)] = static_cast<const uint8_t*>(send);
    if (!meet()) return ZD_ERR_INTERNAL;
    for (int k = 0; k < world_; ++k) {
      const uint8_t* src = sends_[static_cast<size_t>(k)] + (to_all ? static_cast<uint64_t>(rank) * bytes : 0);
      std::memcpy(static_cast<uint8_t*>(recv) + static_cast<uint64_t>(k) * bytes, src, bytes);
    }
    return meet() ? ZD_OK : ZD_ERR_INTERNAL;
  }
  // Every rank at the barrier; false when a rank's call failed by then (it
  // marked that before arriving, so every rank of the phase sees it).
  bool meet() {
    barrier_.arrive_and_wait();
    return !failed_;
  }
  int world_;
  int fail_rank_;
  std::barrier<> barrier_;
  std::atomic<bool> failed_{false};
  std::vector<const uint8_t*> sends_;
};

// Rank r's buffer before the driver's first call (its errors start at zero).
std::vector<float> driver_input(size_t count, int rank) {
  return random_floats(count, 10 + static_cast<uint64_t>(rank));
}

// The ranks' state after the first call, against the equations in
// zerod_plugin.h (above zd_comm_v2) computed in double from driver_input:
// each value within 1e-6, except where the server's |y| < 1e-6, whose sign
// fp32 and double may decide differently (tests/onebit/driver_test.cpp's
// rule). One rank's input is made again at a time: no copy of all of them.
// Prints the first wrong value; false then.
class Reference {
 public:
  Reference(size_t count, int world) : count_(count), world_(world), chunk_(ob::chunk_elems(count, world)) {}

  bool matches(const std::vector<std::vector<float>>& buf, const std::vector<std::vector<float>>& we,
               const std::vector<std::vector<float>>& se, const char* isa) {
    isa_ = isa;
    for (int q = 0; q < world_; ++q) {
      if (!worker_matches(q, we[static_cast<size_t>(q)])) return false;
    }
    for (int r = 0; r < world_; ++r) {
      if (!server_matches(r, buf, se[static_cast<size_t>(r)])) return false;
    }
    return true;
  }

 private:
  static constexpr double kTol = 1e-6;
  static double sgn(double x) { return x < 0.0 ? -1.0 : 1.0; }

  // Worker q: x = its input (its error starts at 0), s = ||x|| / sqrt(count),
  // error = x - s sign(x); keeps s and sign(x) for the servers.
  bool worker_matches(int q, const std::vector<float>& we) {
    const std::vector<float> x = driver_input(count_, q);
    double sum = 0.0;
    for (const float v : x) sum += double{v} * double{v};
    const double s = std::sqrt(sum / static_cast<double>(count_));
    scale_.push_back(s);
    std::vector<bool> negative(count_);
    for (size_t i = 0; i < count_; ++i) {
      negative[i] = x[i] < 0.0f;
      if (!near(we[i], double{x[i]} - s * sgn(x[i]), "worker error", q, i)) return false;
    }
    negative_.push_back(std::move(negative));
    return true;
  }

  // Server r: y = (1/W) sum_q s_q sign(x_q) over chunk r (its error starts
  // at 0), t = ||y|| / sqrt(n); every rank's result there is t sign(y), its
  // error y - t sign(y).
  bool server_matches(int r, const std::vector<std::vector<float>>& buf, const std::vector<float>& se) {
    const size_t b = std::min(static_cast<size_t>(r) * chunk_, count_), n = std::min(chunk_, count_ - b);
    std::vector<double> y(n);
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) {
      double acc = 0.0;
      for (size_t q = 0; q < scale_.size(); ++q) acc += negative_[q][b + i] ? -scale_[q] : scale_[q];
      y[i] = acc / world_;
      sum += y[i] * y[i];
    }
    const double t = n == 0 ? 0.0 : std::sqrt(sum / static_cast<double>(n));
    for (size_t i = 0; i < n; ++i) {
      if (std::fabs(y[i]) < kTol) continue;
      const double result = t * sgn(y[i]);
      if (!near(se[i], y[i] - result, "server error", r, i)) return false;
      for (int q = 0; q < world_; ++q) {
        if (!near(buf[static_cast<size_t>(q)][b + i], result, "result", q, b + i)) return false;
      }
    }
    return true;
  }

  bool near(float got, double want, const char* what, int rank, size_t i) const {
    if (std::fabs(double{got} - want) <= kTol) return true;
    std::printf("driver: %s at world %d gave a wrong %s: rank %d, element %zu is %.9g where %.9g was expected\n",
                isa_, world_, what, rank, i, double{got}, want);
    return false;
  }

  size_t count_;
  int world_;
  size_t chunk_;
  const char* isa_ = "";
  std::vector<double> scale_;
  std::vector<std::vector<bool>> negative_;
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

// The driver's row at world W, its first call checked before the timed
// ones; false (and no row) when a call failed or the check did.
bool bench_driver(const Options& o, size_t count, ob::detail::Isa isa, int world, double memcpy_w, bool keep) {
  const auto& k = ob::detail::kernels(isa);
  const char* name = ob::detail::isa_name(isa);
  std::vector<std::vector<float>> buf, we, se;
  for (int r = 0; r < world; ++r) {
    buf.push_back(driver_input(count, r));
    we.emplace_back(count, 0.0f);
    se.emplace_back(ob::chunk_elems(count, world), 0.0f);
  }
  Exchanges ex(world, o.fail_rank);
  std::vector<ob::Exchange> exchanges;
  for (int r = 0; r < world; ++r) exchanges.push_back(ex.for_rank(r));
  std::vector<ob::Scratch> scratch(static_cast<size_t>(world));
  std::atomic<bool> ok{true};
  Team team(world);
  const auto call = [&] {
    if (!ok) return;  // an earlier call failed: no more calls (every rank's, or none)
    team.run([&](int r) {
      const size_t i = static_cast<size_t>(r);
      if (ob::detail::compressed_all_reduce_with(k, r, world, buf[i].data(), count, we[i].data(), se[i].data(),
                                                 exchanges[i], keep ? &scratch[i] : nullptr) != ZD_OK) {
        ok = false;
        ex.abandon();
      }
    });
  };
  call();
  if (ok && !Reference(count, world).matches(buf, we, se, name)) return false;
  const double s = ok ? median_seconds(o, call) : 0.0;
  if (!ok) {
    std::printf("driver failed: %s%s at world %d, a rank's call returned an error\n", name, keep ? ", kept" : "",
                world);
    return false;
  }
  const double chunk = static_cast<double>(ob::chunk_elems(count, world));
  const double bytes = static_cast<double>(count) * (kWorkerPackBytes + kWorkerCommitBytes) +
                       chunk * (server_pack_bytes(world) + server_commit_bytes(world));
  row(keep ? "driver, kept" : "driver", name, world, bytes / s / 1e9, memcpy_w);
  return true;
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
  bool all_ok = true;
  for (const auto isa : {ob::detail::Isa::scalar, ob::detail::Isa::avx2}) {
    if (!ob::detail::isa_supported(isa)) continue;
    bench_kernels(o, count, isa, memcpy1);
    for (const bool keep : {false, true}) {
      for (size_t i = 0; i < o.worlds.size(); ++i)
        all_ok = bench_driver(o, count, isa, o.worlds[i], memcpy_by_world[i], keep) && all_ok;
    }
  }
  std::printf(
      "\nGB/s: bytes each pass reads and writes, per rank per second (memcpy: 8 per fp32). memcpy at world W:\n"
      "W threads, each copying its own buffer.\n"
      "Kernels are compared with memcpy on 1 thread; the driver at world W with memcpy on W threads.\n");
  return all_ok ? 0 : 1;
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
