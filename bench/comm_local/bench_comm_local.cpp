// bench_comm_local: how close the local comm plugin's collectives come to
// this machine's memory bandwidth.
//
// In one run: memcpy of a buffer of the same size on 1 and 2 threads (and
// on N for N ranks), then all_reduce, reduce_scatter, all_gather (in
// place) and all_to_all on f32 buffers of that size, one rank thread each,
// through the plugin's v2 descriptor as the engine loads it. Every figure is
// the median of the timed iterations after the warm-up ones. Sizes follow
// nccl-tests: B is the larger buffer of a rank (all_reduce: buf;
// reduce_scatter: send; all_gather: recv; all_to_all: send); algbw = B /
// time; busbw = algbw * 2(N-1)/N for all_reduce and algbw * (N-1)/N for the
// others.
//
// Shared memory has no link, so the bound is memory traffic. The bytes each
// collective must move, over all ranks: all_reduce reads N*B and writes N*B;
// reduce_scatter reads N*B and writes B; all_gather in place reads and
// writes (N-1)*B each; all_to_all reads and writes N*B each. A memcpy of B moves 2*B. "traffic/memcpy" compares the rate
// at which the collective moves its bytes with memcpy's on N threads (or
// the most threads measured): 1.0 means it runs at memcpy speed.
//
// Every collective first runs once on deterministic inputs (inputs.h) and
// its output on every rank is checked against the exact expected values; a
// wrong one ends the run with exit status 1. The timed calls follow on the
// same buffers.
//
// Beside it, the peer a user would otherwise pick on a CPU:
// torch.distributed with the gloo backend (what DeepSpeed's comm runs on
// there), torch_gloo.py run by the project's venv python on the same
// collectives, sizes, warm-up and timed counts, median rule and checked
// inputs, one process per rank; "speedup" is gloo's time / ours.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gloo_peer.h"
#include "inputs.h"
#include "loader.h"
#include "team.h"

namespace zerod::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  // 64 MiB: gloo on 2 processes takes about 10 s of the run on a 2-core
  // VM, and 4 times that at 256 MiB.
  size_t mib = 64;
  std::vector<int> ranks = {2};
  int iters = 10;
  int warmup = 2;
  double spin_us = 50;
  std::string plugin_dir = ZEROD_BENCH_PLUGIN_DIR;
  bool peer = true;
  GlooOptions gloo = [] {
    GlooOptions g;
    g.venv_python = ZEROD_BENCH_VENV_PYTHON;
    g.script = ZEROD_BENCH_GLOO_SCRIPT;
    return g;
  }();
};

void usage(const char* argv0) {
  std::printf(
      "usage: %s [--mib 64] [--ranks 2] [--iters 10] [--warmup 2] [--spin-us 50] [--plugin-dir DIR]\n"
      "          [--python PATH] [--no-peer]\n"
      "  --ranks N runs 2 ranks, and N too when N > 2; a list (--ranks 3,4) runs exactly those.\n"
      "  Needs about 2 * N * MiB of memory for N ranks, all_to_all's send and receive buffers (256 MiB,\n"
      "  4 ranks: 2.1 GB), and the gloo peer about 3 * MiB per rank.\n"
      "  The peer, torch.distributed's gloo backend (torch_gloo.py), runs in the venv\n"
      "  scripts/python-venv.sh makes (build/venv) unless --python names another (without the venv,\n"
      "  /usr/bin/python3); --no-peer leaves it out.\n"
      "  On a 2-core VM the defaults run in 15-20 s (most of it gloo's), --ranks 4 in about 40 s.\n",
      argv0);
}

std::vector<int> parse_list(const char* v) {
  std::vector<int> out;
  for (const char* p = v; *p != '\0';) {
    char* end = nullptr;
    const long n = std::strtol(p, &end, 10);
    if (end == p || n < 1 || n > 64) return {};
    out.push_back(static_cast<int>(n));
    p = *end == ',' ? end + 1 : end;
    if (*end != ',' && *end != '\0') return {};
  }
  return out;
}

bool parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      usage(argv[0]);
      std::exit(0);
    }
    if (a == "--no-peer") {
      o->peer = false;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s: %s needs a value\n", argv[0], a.c_str());
      return false;
    }
    const char* v = argv[++i];
    if (a == "--mib") {
      o->mib = static_cast<size_t>(std::max(1L, std::atol(v)));
    } else if (a == "--ranks") {
      o->ranks = parse_list(v);
      if (o->ranks.empty()) return false;
      if (o->ranks.size() == 1 && o->ranks[0] > 2) o->ranks.insert(o->ranks.begin(), 2);
    } else if (a == "--iters") {
      o->iters = std::max(1, std::atoi(v));
    } else if (a == "--warmup") {
      o->warmup = std::max(0, std::atoi(v));
    } else if (a == "--spin-us") {
      o->spin_us = std::atof(v);
    } else if (a == "--plugin-dir") {
      o->plugin_dir = v;
    } else if (a == "--python") {
      o->gloo.python = v;
    } else {
      std::fprintf(stderr, "%s: unknown option %s\n", argv[0], a.c_str());
      return false;
    }
  }
  return true;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Median seconds of team.run(fn) over the timed iterations.
double time_runs(Team& team, const Options& o, const std::function<void(int)>& fn) {
  std::vector<double> t;
  for (int i = 0; i < o.warmup + o.iters; ++i) {
    const auto t0 = Clock::now();
    team.run(fn);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (i >= o.warmup) t.push_back(s);
  }
  return median(t);
}

using Buffer = std::unique_ptr<float[]>;

// Buffers filled by the thread of the rank that owns them (first touch).
std::vector<Buffer> make_buffers(Team& team, size_t count, float value) {
  std::vector<Buffer> b(static_cast<size_t>(team.size()));
  for (auto& p : b) p.reset(new float[count]);
  team.run([&](int r) { std::fill(b[r].get(), b[r].get() + count, value); });
  return b;
}

// memcpy of `bytes`, split over `threads`: bytes copied per second.
double memcpy_rate(size_t bytes, int threads, const Options& o) {
  const size_t n = bytes / sizeof(float);
  Team team(threads);
  Buffer src(new float[n]), dst(new float[n]);
  team.run([&](int t) {
    size_t b, e;
    split(n, threads, t, &b, &e);
    std::fill(src.get() + b, src.get() + e, 1.0f);
    std::fill(dst.get() + b, dst.get() + e, 0.0f);
  });
  const double s = time_runs(team, o, [&](int t) {
    size_t b, e;
    split(n, threads, t, &b, &e);
    std::memcpy(dst.get() + b, src.get() + b, (e - b) * sizeof(float));
  });
  return static_cast<double>(bytes) / s;
}

// Each rank's buffer of count elements holding its inputs, in blocks of
// chunk elements, filled by the rank's thread (first touch).
std::vector<Buffer> make_inputs(Team& team, size_t count, size_t chunk) {
  std::vector<Buffer> b(static_cast<size_t>(team.size()));
  for (auto& p : b) p.reset(new float[count]);
  team.run([&](int r) {
    for (size_t i = 0; i < count; ++i) b[r][i] = input_value(r, i / chunk, i % chunk);
  });
  return b;
}

// Exits with status 1, naming the first wrong element, unless every rank's
// out[i] (count elements) equals expected(rank, i).
template <typename Expected>
void verify(Team& team, const char* op, const std::vector<Buffer>& out, size_t count, Expected expected) {
  std::vector<size_t> bad(out.size(), count);
  team.run([&](int r) {
    for (size_t i = 0; i < count; ++i) {
      if (out[r][i] != expected(r, i)) {
        bad[r] = i;
        return;
      }
    }
  });
  for (int r = 0; r < team.size(); ++r) {
    const size_t i = bad[r];
    if (i == count) continue;
    std::fprintf(stderr, "bench_comm_local: %s on %d ranks gave a wrong result: rank %d, element %zu is %g where %g "
                 "was expected\n", op, team.size(), r, i, static_cast<double>(out[r][i]),
                 static_cast<double>(expected(r, i)));
    std::exit(1);
  }
}

struct Row {
  const char* op;
  int ranks;
  double seconds;
  double bus_factor;      // busbw / algbw
  double traffic_factor;  // bytes moved / B
};

void check(zd_status st, const LocalComm& comm, int rank) {
  if (st == ZD_OK) return;
  std::fprintf(stderr, "collective failed on rank %d: %s\n", rank, comm.desc()->last_error(comm.inst(), rank));
  std::exit(1);
}

std::vector<Row> run_collectives(int world, size_t bytes, const Options& o) {
  std::vector<Row> rows;
  LocalComm comm(o.plugin_dir, world, o.spin_us);
  if (comm.desc() == nullptr) {
    std::fprintf(stderr, "cannot load the local comm plugin: %s\n", comm.error().c_str());
    std::exit(1);
  }
  const zd_comm_v2& d = *comm.desc();
  const double n = world;
  const size_t count = bytes / sizeof(float);
  const size_t chunk = count / static_cast<size_t>(world);
  Team team(world);
  {
    // The values grow N-fold per timed call; even if they reached infinity,
    // IEEE adds of infinities run at full speed (only subnormals are slow).
    std::vector<Buffer> buf = make_inputs(team, count, chunk);
    const auto call = [&](int r) {
      const zd_comm_call c{sizeof(zd_comm_call), r, 1, 0, 0, "bench all_reduce"};
      check(d.all_reduce(comm.inst(), &c, buf[r].get(), count, ZD_COMM_F32, ZD_REDUCE_SUM), comm, r);
    };
    team.run(call);
    verify(team, "all_reduce", buf, count, [&](int, size_t i) { return input_sum(world, i / chunk, i % chunk); });
    const double s = time_runs(team, o, call);
    rows.push_back({"all_reduce", world, s, 2 * (n - 1) / n, 2 * n});
  }
  {
    std::vector<Buffer> send = make_inputs(team, chunk * world, chunk);
    std::vector<Buffer> recv = make_buffers(team, chunk, 0.0f);
    const auto call = [&](int r) {
      const zd_comm_call c{sizeof(zd_comm_call), r, 2, 0, 0, "bench reduce_scatter"};
      check(d.reduce_scatter(comm.inst(), &c, send[r].get(), recv[r].get(), chunk, ZD_COMM_F32, ZD_REDUCE_SUM), comm,
            r);
    };
    team.run(call);
    verify(team, "reduce_scatter", recv, chunk,
           [&](int r, size_t j) { return input_sum(world, static_cast<size_t>(r), j); });
    const double s = time_runs(team, o, call);
    rows.push_back({"reduce_scatter", world, s, (n - 1) / n, n + 1});
  }
  {
    // In place, as ZeRO-3 gathers a parameter around the shard it owns.
    // Before the call, block k of rank r holds input_value(r, k, j); after
    // it, rank k's own block: input_value(k, k, j).
    std::vector<Buffer> recv = make_inputs(team, chunk * world, chunk);
    const auto call = [&](int r) {
      const zd_comm_call c{sizeof(zd_comm_call), r, 3, 0, 0, "bench all_gather"};
      check(d.all_gather(comm.inst(), &c, recv[r].get() + r * chunk, recv[r].get(), chunk, ZD_COMM_F32), comm, r);
    };
    team.run(call);
    verify(team, "all_gather", recv, chunk * world, [&](int, size_t i) {
      const size_t k = i / chunk;
      return input_value(static_cast<int>(k), k, i % chunk);
    });
    const double s = time_runs(team, o, call);
    rows.push_back({"all_gather", world, s, (n - 1) / n, 2 * (n - 1)});
  }
  {
    // B per rank in, B out: each rank reads N-1 blocks of B/N from the
    // others and writes them, plus its own block.
    // Block k of rank r's recv is block r of rank k's send.
    std::vector<Buffer> send = make_inputs(team, chunk * world, chunk);
    std::vector<Buffer> recv = make_buffers(team, chunk * world, 0.0f);
    const auto call = [&](int r) {
      const zd_comm_call c{sizeof(zd_comm_call), r, 6, 0, 0, "bench all_to_all"};
      check(d.all_to_all(comm.inst(), &c, send[r].get(), recv[r].get(), chunk, ZD_COMM_F32), comm, r);
    };
    team.run(call);
    verify(team, "all_to_all", recv, chunk * world, [&](int r, size_t i) {
      return input_value(static_cast<int>(i / chunk), static_cast<size_t>(r), i % chunk);
    });
    const double s = time_runs(team, o, call);
    rows.push_back({"all_to_all", world, s, (n - 1) / n, 2 * n});
  }
  return rows;
}

// Median microseconds per call of a tiny all_reduce and of a barrier,
// called back to back on every rank thread.
void latency(int world, const Options& o) {
  LocalComm comm(o.plugin_dir, world, o.spin_us);
  if (comm.desc() == nullptr) return;
  const zd_comm_v2& d = *comm.desc();
  Team team(world);
  constexpr int kCalls = 500;
  std::vector<float> one(static_cast<size_t>(world), 1.0f);
  Options batches = o;
  batches.warmup = 1;
  batches.iters = 9;
  const double ar = time_runs(team, batches, [&](int r) {
    const zd_comm_call c{sizeof(zd_comm_call), r, 4, 0, 0, "bench latency"};
    for (int i = 0; i < kCalls; ++i) {
      one[r] = 1.0f;
      check(d.all_reduce(comm.inst(), &c, &one[r], 1, ZD_COMM_F32, ZD_REDUCE_SUM), comm, r);
    }
  });
  const double bar = time_runs(team, batches, [&](int r) {
    const zd_comm_call c{sizeof(zd_comm_call), r, 5, 0, 0, "bench barrier"};
    for (int i = 0; i < kCalls; ++i) check(d.barrier(comm.inst(), &c), comm, r);
  });
  std::printf("latency, %d ranks, spin %g us: all_reduce of 1 f32 %.2f us, barrier %.2f us (median per call)\n",
              world, o.spin_us, ar / kCalls * 1e6, bar / kCalls * 1e6);
}

// The gloo table: per collective and rank count, ours and gloo's median
// times side by side, and the speedup gloo time / ours; or why gloo is not
// there (never a figure it did not produce).
void print_peer(const Options& o, const std::vector<Row>& rows, const std::map<int, GlooResult>& gloo) {
  if (!o.peer) {
    std::printf("\ntorch.distributed gloo: not run (--no-peer)\n");
    return;
  }
  std::string version, python;
  for (const auto& [n, g] : gloo) {
    if (!g.version.empty()) version = g.version;
    python = g.python;
  }
  std::printf("\nagainst torch.distributed, gloo backend (torch %s, %s; one process per rank, results checked the same "
              "way)\nspeedup = gloo time / zerod time: above 1, zerod is faster\n",
              version.empty() ? "?" : version.c_str(), python.c_str());
  std::printf("%-15s %5s %9s %9s %8s\n", "op", "ranks", "zerod ms", "gloo ms", "speedup");
  for (const Row& r : rows) {
    const GlooResult& g = gloo.at(r.ranks);
    const auto refused = g.refused.find(r.op);
    if (!g.error.empty() || refused != g.refused.end()) {
      std::printf("%-15s %5d %9.2f %9s %8s  gloo not available: %s\n", r.op, r.ranks, r.seconds * 1e3, "-", "-",
                  g.error.empty() ? refused->second.c_str() : g.error.c_str());
      continue;
    }
    const double peer = g.seconds.at(r.op);
    std::printf("%-15s %5d %9.2f %9.2f %8.2f\n", r.op, r.ranks, r.seconds * 1e3, peer * 1e3, peer / r.seconds);
  }
}

}  // namespace
}  // namespace zerod::bench

int main(int argc, char** argv) {
  using namespace zerod::bench;
  Options o;
  if (!parse(argc, argv, &o)) {
    usage(argv[0]);
    return 2;
  }
  const size_t bytes = o.mib << 20;
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  std::printf("bench_comm_local: f32, B = %zu MiB per rank, %d timed iterations after %d warm-up, medians; %ld CPUs\n",
              o.mib, o.iters, o.warmup, cpus);
  std::printf("every collective's result is checked on every rank against the expected values before it is timed\n");

  std::map<int, double> copy;  // threads -> bytes/s
  std::vector<int> threads = {1, 2};
  for (int n : o.ranks) {
    if (std::find(threads.begin(), threads.end(), n) == threads.end()) threads.push_back(n);
  }
  for (int t : threads) {
    copy[t] = memcpy_rate(bytes, t, o);
    std::printf("memcpy %zu MiB, %d thread%s: %6.2f GB/s copied (%.2f GB/s of traffic)\n", o.mib, t,
                t == 1 ? " " : "s", copy[t] / 1e9, 2 * copy[t] / 1e9);
  }
  std::printf("\n%-15s %5s %9s %11s %11s %10s %10s %13s %15s\n", "op", "ranks", "time ms", "algbw GB/s",
              "busbw GB/s", "bus/cpy1", "bus/cpy2", "traffic GB/s", "traffic/memcpy");
  std::vector<Row> all;
  std::map<int, GlooResult> gloo;  // ranks -> its figures, or why there are none
  o.gloo.mib = o.mib;
  o.gloo.iters = o.iters;
  o.gloo.warmup = o.warmup;
  for (int n : o.ranks) {
    const std::vector<Row> rows = run_collectives(n, bytes, o);
    all.insert(all.end(), rows.begin(), rows.end());
    for (const Row& r : rows) {
      const double alg = static_cast<double>(bytes) / r.seconds;
      const double bus = alg * r.bus_factor;
      const double traffic = r.traffic_factor * static_cast<double>(bytes) / r.seconds;
      const double copy_traffic = 2 * copy[n];
      std::printf("%-15s %5d %9.2f %11.2f %11.2f %10.2f %10.2f %13.2f %15.2f\n", r.op, r.ranks, r.seconds * 1e3,
                  alg / 1e9, bus / 1e9, bus / copy[1], bus / copy[2], traffic / 1e9, traffic / copy_traffic);
    }
    std::fflush(stdout);
    if (o.peer) gloo[n] = run_gloo(o.gloo, n);  // after ours, on the memory ours has freed
  }
  print_peer(o, all, gloo);
  std::printf("\n");
  for (int n : o.ranks) latency(n, o);
  return 0;
}
