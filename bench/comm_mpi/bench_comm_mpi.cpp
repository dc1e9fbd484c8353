// bench_comm_mpi: all-reduce bandwidth and small-message latency of the mpi
// comm plugin between daemons. Run one process per node under mpirun (each
// with --local ranks as threads); node 0 prints.
//
// B is the buffer of each rank (f32). algbw = B / time, the nccl-tests
// definition; busbw = algbw * 2(N-1)/N for N nodes: the bytes each daemon
// puts on its link per second (a daemon reduces its ranks first, so what
// crosses the network is one buffer per daemon, not per rank). A link of
// rate R caps busbw at R (full duplex: each daemon sends and receives at
// once), so "bus/link" = busbw / R is how close the all-reduce comes to the
// link's limit; "bus/iperf" compares it with what iperf3 (one TCP stream)
// got on the same link. With two nodes busbw = algbw.
//
//   bench_comm_mpi [--local N] [--mib 1,4,16,64] [--iters 5] [--link-bits R]
//                  [--iperf-bits I] [--spin-us S] [--segment BYTES] [--plugin-dir DIR]
//                  [--label TEXT]
#include <dlfcn.h>
#include <zerod/zerod_plugin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "team.h"

namespace zerod::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int local = 1;
  std::vector<size_t> mib = {1, 4, 16, 64};
  int iters = 5;
  double link_bits = 0;   // the link's limit, bits/s (0: unknown)
  double iperf_bits = 0;  // iperf3 on the same link, bits/s (0: not measured)
  std::string plugin_dir = ZEROD_BENCH_PLUGIN_DIR;
  std::string label;
  double spin_us = -1;  // the plugin's spin_us (-1: its default)
  double segment = -1;  // the plugin's segment, bytes (-1: its default)
};

bool parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return false;
    const char* v = argv[++i];
    if (a == "--local") {
      o->local = std::max(1, std::atoi(v));
    } else if (a == "--mib") {
      o->mib.clear();
      for (const char* p = v; *p != '\0';) {
        o->mib.push_back(static_cast<size_t>(std::max(1L, std::strtol(p, nullptr, 10))));
        const char* comma = std::strchr(p, ',');
        if (comma == nullptr) break;
        p = comma + 1;
      }
    } else if (a == "--iters") {
      o->iters = std::max(1, std::atoi(v));
    } else if (a == "--link-bits") {
      o->link_bits = std::atof(v);
    } else if (a == "--iperf-bits") {
      o->iperf_bits = std::atof(v);
    } else if (a == "--plugin-dir") {
      o->plugin_dir = v;
    } else if (a == "--label") {
      o->label = v;
    } else if (a == "--spin-us") {
      o->spin_us = std::atof(v);
    } else if (a == "--segment") {
      o->segment = std::atof(v);
    } else {
      return false;
    }
  }
  return true;
}

int env_int(const char* a, const char* b, int def) {
  const char* v = std::getenv(a);
  if (v == nullptr) v = std::getenv(b);
  return v != nullptr ? std::atoi(v) : def;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

[[noreturn]] void die(const char* what, const std::string& why) {
  std::fprintf(stderr, "bench_comm_mpi: %s: %s\n", what, why.c_str());
  std::exit(1);
}

}  // namespace
}  // namespace zerod::bench

int main(int argc, char** argv) {
  using namespace zerod::bench;
  Options o;
  if (!parse(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: %s [--local N] [--mib 1,4,16,64] [--iters N] [--link-bits R] [--iperf-bits I] "
                 "[--spin-us S] [--segment BYTES] [--plugin-dir DIR] [--label TEXT]\n(run one per node under mpirun)\n",
                 argv[0]);
    return 2;
  }
  const int node = env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK", 0);
  const int nodes = env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", 1);
  const int world = nodes * o.local;
  const int first = node * o.local;

  const std::string path = o.plugin_dir + "/zd_comm_mpi.so";
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) die("loading the plugin", dlerror());
  auto entry = reinterpret_cast<zd_plugin_entry_fn>(dlsym(handle, ZD_PLUGIN_ENTRY_SYMBOL));
  if (entry == nullptr) die("loading the plugin", "no entry point in " + path);
  const zd_comm_v2* d = nullptr;
  for (const zd_plugin_header* const* h = entry(); *h != nullptr; ++h) {
    if ((*h)->kind == ZD_PLUGIN_COMM && (*h)->abi_version == 2) d = reinterpret_cast<const zd_comm_v2*>(*h);
  }
  if (d == nullptr) die("loading the plugin", "no comm v2 descriptor in " + path);
  std::vector<double> values;
  double spin_used = 0, segment_used = 0;
  for (uint32_t i = 0; i < d->hparam_count; ++i) {
    const bool spin = std::strcmp(d->hparams[i].name, "spin_us") == 0;
    const bool segment = std::strcmp(d->hparams[i].name, "segment") == 0;
    double v = d->hparams[i].defaults[0];
    if (spin && o.spin_us >= 0) v = o.spin_us;
    if (segment && o.segment > 0) v = o.segment;
    values.push_back(v);
    if (spin) spin_used = v;
    if (segment) segment_used = v;
  }
  const zd_comm_config cfg{sizeof(zd_comm_config), world, first, o.local};
  void* inst = nullptr;
  char err[1024] = "";
  if (d->create(nullptr, values.data(), values.size(), &cfg, &inst, err, sizeof err) != ZD_OK) {
    die("creating the instance", err);
  }
  auto check = [&](zd_status st, int rank) {
    if (st != ZD_OK) die("collective", d->last_error(inst, rank));
  };
  Team team(o.local);
  const bool printer = node == 0;
  const double n = nodes;
  const double bus_factor = nodes > 1 ? 2 * (n - 1) / n : 1.0;
  if (printer) {
    std::printf("bench_comm_mpi%s%s: %d nodes x %d ranks, f32 all_reduce, median of %d after 2 warm-up; spin_us %g, "
                "segment %g KiB\n",
                o.label.empty() ? "" : " ", o.label.c_str(), nodes, o.local, o.iters, spin_used, segment_used / 1024);
    if (o.link_bits > 0) std::printf("link limit %.3f Gbit/s per direction", o.link_bits / 1e9);
    if (o.iperf_bits > 0) {
      std::printf("%siperf3 on the same link %.3f Gbit/s", o.link_bits > 0 ? "; " : "", o.iperf_bits / 1e9);
    }
    if (o.link_bits > 0 || o.iperf_bits > 0) std::printf("\n");
    std::printf("%9s %10s %12s %12s %10s %10s %14s\n", "size", "time ms", "algbw Gb/s", "busbw Gb/s", "bus/link",
                "bus/iperf", "net bytes/op");
  }
  uint64_t tag = 1;
  for (size_t mib : o.mib) {
    const size_t count = (mib << 20) / sizeof(float);
    std::vector<std::unique_ptr<float[]>> bufs(static_cast<size_t>(o.local));
    team.run([&](int i) {
      bufs[i].reset(new float[count]);
      std::fill(bufs[i].get(), bufs[i].get() + count, 1.0f);
    });
    std::vector<double> times;
    zd_comm_figures f0 = ZD_COMM_FIGURES_INIT, f1 = ZD_COMM_FIGURES_INIT;
    for (int it = 0; it < 2 + o.iters; ++it) {
      d->figures(inst, first, &f0);
      const auto t0 = Clock::now();
      team.run([&](int i) {
        const zd_comm_call c{sizeof(zd_comm_call), first + i, tag, 0, 0, "bench all_reduce"};
        check(d->all_reduce(inst, &c, bufs[i].get(), count, ZD_COMM_F32, ZD_REDUCE_SUM), first + i);
      });
      ++tag;
      if (it >= 2) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      d->figures(inst, first, &f1);
    }
    const double s = median(times);
    const double bytes = static_cast<double>(count * sizeof(float));
    const double alg = bytes * 8 / s;
    const double bus = alg * bus_factor;
    if (printer) {
      std::printf("%5zu MiB %10.2f %12.3f %12.3f", mib, s * 1e3, alg / 1e9, bus / 1e9);
      if (o.link_bits > 0) std::printf(" %10.3f", bus / o.link_bits);
      else std::printf(" %10s", "-");
      if (o.iperf_bits > 0) std::printf(" %10.3f", bus / o.iperf_bits);
      else std::printf(" %10s", "-");
      std::printf(" %14llu\n", static_cast<unsigned long long>(f1.network_bytes_sent - f0.network_bytes_sent));
    }
  }
  // Latency: many small calls back to back, median of 9 batches.
  constexpr int kCalls = 200;
  float one[64];
  for (const char* what : {"all_reduce of 1 f32", "barrier"}) {
    const bool barrier = std::strcmp(what, "barrier") == 0;
    std::vector<double> per_call;
    for (int batch = 0; batch < 10; ++batch) {
      const auto t0 = Clock::now();
      team.run([&](int i) {
        for (int k = 0; k < kCalls; ++k) {
          const zd_comm_call c{sizeof(zd_comm_call), first + i, tag + static_cast<uint64_t>(k), 0, 0, "latency"};
          one[i] = 1.0f;
          check(barrier ? d->barrier(inst, &c) : d->all_reduce(inst, &c, &one[i], 1, ZD_COMM_F32, ZD_REDUCE_SUM),
                first + i);
        }
      });
      tag += kCalls;
      if (batch > 0) per_call.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / kCalls);
    }
    if (printer) std::printf("latency: %s %.1f us per call (median of 9 batches of %d)\n", what,
                             median(per_call) * 1e6, kCalls);
  }
  d->destroy(inst);
  return 0;
}
