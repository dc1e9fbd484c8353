// bench_comm_mpi: all-reduce bandwidth and small-message latency of the mpi
// comm plugin between daemons, beside torch.distributed's gloo backend on
// the same nodes and link. Run one process per node under mpirun (each with
// --local ranks as threads); node 0 prints.
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
// The peer is what a user on CPUs between nodes would pick instead:
// torch.distributed with the gloo backend (DeepSpeed's comm runs on it
// there). After zerod's runs, each node starts one torch_gloo_nodes.py
// under the project's venv python, rank = node index, world = node count.
// They meet at node 0: its address on the interface the plugin's traffic
// took (endpoint.h: GLOO_SOCKET_IFNAME, else Open MPI's btl_tcp_if_include,
// else what the host name resolves to) and a free port, which every node
// learns over MPI before the launch (an all_gather of the plugin: the bench
// reaches MPI only through it, whose threads own MPI's calls). gloo
// all-reduces the same sizes with the same 2 warm-up and --iters calls,
// each result checked on every node, node 0's median its figure, and takes
// latencies the same way. Its rows sit under zerod's; zerod/gloo = gloo's
// time / zerod's (zerod's busbw / gloo's; for latency, calls per second):
// above 1, zerod is faster. When torch or gloo cannot run, one line says
// why and zerod's figures stand alone; --no-gloo leaves the peer out.
//
//   bench_comm_mpi [--local N] [--mib 1,4,16,64] [--iters 5] [--link-bits R]
//                  [--iperf-bits I] [--spin-us S] [--segment BYTES] [--plugin-dir DIR]
//                  [--label TEXT] [--python PATH] [--no-gloo]
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

#include "../python_peer.h"
#include "endpoint.h"
#include "gloo_nodes.h"
#include "team.h"

namespace zerod::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kWarmup = 2;
constexpr int kLatencyBatches = 10;  // the first is dropped
constexpr int kLatencyCalls = 200;

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
  bool gloo = true;
  std::string python;  // the peer's python; empty: the venv's (peer_python)
};

std::vector<size_t> parse_sizes(const char* v) {
  std::vector<size_t> out;
  for (const char* p = v; *p != '\0';) {
    out.push_back(static_cast<size_t>(std::max(1L, std::strtol(p, nullptr, 10))));
    const char* comma = std::strchr(p, ',');
    if (comma == nullptr) break;
    p = comma + 1;
  }
  return out;
}

bool parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-gloo") {
      o->gloo = false;
      continue;
    }
    if (i + 1 >= argc) return false;
    const char* v = argv[++i];
    if (a == "--local") {
      o->local = std::max(1, std::atoi(v));
    } else if (a == "--mib") {
      o->mib = parse_sizes(v);
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
    } else if (a == "--python") {
      o->python = v;
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

const zd_comm_v2* load_plugin(const std::string& dir) {
  const std::string path = dir + "/zd_comm_mpi.so";
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) die("loading the plugin", dlerror());
  auto entry = reinterpret_cast<zd_plugin_entry_fn>(dlsym(handle, ZD_PLUGIN_ENTRY_SYMBOL));
  if (entry == nullptr) die("loading the plugin", "no entry point in " + path);
  const zd_comm_v2* d = nullptr;
  for (const zd_plugin_header* const* h = entry(); *h != nullptr; ++h) {
    if ((*h)->kind == ZD_PLUGIN_COMM && (*h)->abi_version == 2) d = reinterpret_cast<const zd_comm_v2*>(*h);
  }
  if (d == nullptr) die("loading the plugin", "no comm v2 descriptor in " + path);
  return d;
}

// The plugin's hyperparameters: its defaults, spin_us and segment as asked.
struct Hparams {
  std::vector<double> values;
  double spin_us = 0;
  double segment = 0;
};

Hparams hparams(const zd_comm_v2* d, const Options& o) {
  Hparams h;
  for (uint32_t i = 0; i < d->hparam_count; ++i) {
    const bool spin = std::strcmp(d->hparams[i].name, "spin_us") == 0;
    const bool segment = std::strcmp(d->hparams[i].name, "segment") == 0;
    double v = d->hparams[i].defaults[0];
    if (spin && o.spin_us >= 0) v = o.spin_us;
    if (segment && o.segment > 0) v = o.segment;
    h.values.push_back(v);
    if (spin) h.spin_us = v;
    if (segment) h.segment = v;
  }
  return h;
}

struct SizeRow {
  size_t mib = 0;
  double seconds = 0;  // median
  unsigned long long net_bytes = 0;  // this daemon's network bytes sent by one all_reduce
};

// This node's daemon: one plugin instance serving --local ranks as threads.
class Daemon {
 public:
  Daemon(const zd_comm_v2* d, const std::vector<double>& values, int node, int nodes, int local)
      : d_(d), first_(node * local), local_(local), world_(nodes * local), team_(local) {
    const zd_comm_config cfg{sizeof(zd_comm_config), world_, first_, local_};
    char err[1024] = "";
    if (d_->create(nullptr, values.data(), values.size(), &cfg, &inst_, err, sizeof err) != ZD_OK) {
      die("creating the instance", err);
    }
  }
  ~Daemon() { close(); }
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Ends the instance, so that its threads leave the cores to the peer.
  void close() {
    if (inst_ != nullptr) d_->destroy(inst_);
    inst_ = nullptr;
  }

  SizeRow all_reduce(size_t mib, int iters) {
    const size_t count = (mib << 20) / sizeof(float);
    std::vector<std::unique_ptr<float[]>> bufs(static_cast<size_t>(local_));
    team_.run([&](int i) {
      bufs[i].reset(new float[count]);
      std::fill(bufs[i].get(), bufs[i].get() + count, 1.0f);
    });
    std::vector<double> times;
    zd_comm_figures f0 = ZD_COMM_FIGURES_INIT, f1 = ZD_COMM_FIGURES_INIT;
    for (int it = 0; it < kWarmup + iters; ++it) {
      d_->figures(inst_, first_, &f0);
      const auto t0 = Clock::now();
      team_.run([&](int i) {
        const zd_comm_call c{sizeof(zd_comm_call), first_ + i, tag_, 0, 0, "bench all_reduce"};
        check(d_->all_reduce(inst_, &c, bufs[i].get(), count, ZD_COMM_F32, ZD_REDUCE_SUM), first_ + i);
      });
      ++tag_;
      if (it >= kWarmup) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      d_->figures(inst_, first_, &f1);
    }
    return {mib, median(times), static_cast<unsigned long long>(f1.network_bytes_sent - f0.network_bytes_sent)};
  }

  // Seconds per call of many small calls back to back, the median of the
  // batches after the first.
  double latency(bool barrier) {
    float one[64];
    std::vector<double> per_call;
    for (int batch = 0; batch < kLatencyBatches; ++batch) {
      const auto t0 = Clock::now();
      team_.run([&](int i) {
        for (int k = 0; k < kLatencyCalls; ++k) {
          const zd_comm_call c{sizeof(zd_comm_call), first_ + i, tag_ + static_cast<uint64_t>(k), 0, 0, "latency"};
          one[i] = 1.0f;
          check(barrier ? d_->barrier(inst_, &c) : d_->all_reduce(inst_, &c, &one[i], 1, ZD_COMM_F32, ZD_REDUCE_SUM),
                first_ + i);
        }
      });
      tag_ += kLatencyCalls;
      if (batch > 0) per_call.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / kLatencyCalls);
    }
    return median(per_call);
  }

  // Every node's `record` (at most kRecord - 1 bytes of text), in node order.
  std::vector<std::string> gather(const std::string& record) {
    constexpr size_t kRecord = 256;
    std::vector<char> send(kRecord, '\0');
    std::memcpy(send.data(), record.data(), std::min(record.size(), kRecord - 1));
    std::vector<std::vector<char>> recv(static_cast<size_t>(local_), std::vector<char>(world_ * kRecord));
    team_.run([&](int i) {
      const zd_comm_call c{sizeof(zd_comm_call), first_ + i, tag_, 0, 0, "bench: gloo rendezvous"};
      check(d_->all_gather(inst_, &c, send.data(), recv[i].data(), kRecord, ZD_COMM_U8), first_ + i);
    });
    ++tag_;
    std::vector<std::string> out;
    for (int r = 0; r < world_; r += local_) out.emplace_back(recv[0].data() + r * kRecord);
    return out;
  }

 private:
  void check(zd_status st, int rank) {
    if (st != ZD_OK) die("collective", d_->last_error(inst_, rank));
  }

  const zd_comm_v2* d_;
  void* inst_ = nullptr;
  int first_, local_, world_;
  Team team_;
  uint64_t tag_ = 1;
};

// The gloo run this node is to make, or why none can be made.
struct GlooPlan {
  GlooNodesRun run;
  std::string why;
};

// Every node says whether it can run the peer ("ok ADDRESS PORT", the port
// node 0's) or why not ("no WHY"), and all learn all: either every node
// launches or none does (one launching alone would wait out the
// rendezvous's timeout for nodes that never come).
GlooPlan plan_gloo(Daemon& daemon, const Options& o, int node, int nodes) {
  GlooPlan p;
  p.run.python = peer_python(o.python, ZEROD_BENCH_VENV_PYTHON);
  std::string why = peer_python_missing(p.run.python);
  const Endpoint ep = local_endpoint();
  if (why.empty()) why = ep.why;
  int port = 0;
  if (why.empty() && node == 0 && (port = free_port(ep.address)) == 0) why = "no free TCP port on " + ep.address;
  const std::vector<std::string> records =
      daemon.gather(why.empty() ? "ok " + ep.address + " " + std::to_string(port) : "no " + why);
  for (int k = 0; k < nodes; ++k) {
    if (records[k].rfind("ok ", 0) != 0) {
      const std::string& r = records[k];
      p.why = (nodes > 1 ? "node " + std::to_string(k) + ": " : "") + r.substr(std::min<size_t>(3, r.size()));
      return p;
    }
  }
  char address[64];
  int master_port = 0;
  if (std::sscanf(records[0].c_str(), "ok %63s %d", address, &master_port) != 2) {
    p.why = "node 0's rendezvous record is garbled: " + records[0];
    return p;
  }
  p.run.master = std::string(address) + ":" + std::to_string(master_port);
  p.run.script = ZEROD_BENCH_GLOO_NODES_SCRIPT;
  p.run.mib = o.mib;
  p.run.iters = o.iters;
  p.run.node = node;
  p.run.nodes = nodes;
  p.run.ifname = ep.ifname;
  return p;
}

GlooNodesResult run_gloo(const GlooPlan& plan, int node) {
  GlooNodesResult g;
  if (!plan.why.empty()) {
    g.error = plan.why;  // every node knows it; node 0 prints it
    return g;
  }
  g = run_gloo_nodes(plan.run);
  // Only node 0 prints; another node's own failure goes to its stderr.
  if (!g.error.empty() && node != 0) std::fprintf(stderr, "bench_comm_mpi: node %d: gloo: %s\n", node, g.error.c_str());
  return g;
}

void print_header(const Options& o, int nodes, const Hparams& h) {
  std::printf("bench_comm_mpi%s%s: %d nodes x %d ranks, f32 all_reduce, median of %d after %d warm-up; spin_us %g, "
              "segment %g KiB\n",
              o.label.empty() ? "" : " ", o.label.c_str(), nodes, o.local, o.iters, kWarmup, h.spin_us,
              h.segment / 1024);
  if (o.link_bits > 0) std::printf("link limit %.3f Gbit/s per direction", o.link_bits / 1e9);
  if (o.iperf_bits > 0) {
    std::printf("%siperf3 on the same link %.3f Gbit/s", o.link_bits > 0 ? "; " : "", o.iperf_bits / 1e9);
  }
  if (o.link_bits > 0 || o.iperf_bits > 0) std::printf("\n");
}

void print_peer(const Options& o, const GlooPlan& plan, const GlooNodesResult& g) {
  if (!o.gloo) {
    std::printf("gloo: not run (--no-gloo)\n");
  } else if (!g.error.empty()) {
    std::printf("gloo not available: %s\n", g.error.c_str());
  } else {
    std::printf("gloo: torch.distributed %s (%s), one process per node, rendezvous at %s (%s); every result checked "
                "on every node\nzerod/gloo = gloo's time / zerod's: above 1, zerod is faster\n",
                g.version.c_str(), plan.run.python.c_str(), plan.run.master.c_str(), plan.run.ifname.c_str());
  }
}

// One row: the link columns from busbw, then net bytes and zerod/gloo when known.
void print_row(const Options& o, const char* who, size_t mib, double seconds, double bus_factor,
               const char* net_bytes, const char* ratio) {
  const double alg = static_cast<double>(mib << 20) * 8 / seconds;
  const double bus = alg * bus_factor;
  std::printf("%5zu MiB %-5s %10.2f %12.3f %12.3f", mib, who, seconds * 1e3, alg / 1e9, bus / 1e9);
  char cell[32];
  for (double limit : {o.link_bits, o.iperf_bits}) {
    std::snprintf(cell, sizeof cell, "%.3f", bus / limit);
    std::printf(" %10s", limit > 0 ? cell : "-");
  }
  std::printf(" %14s", net_bytes);
  if (ratio[0] != '\0') std::printf(" %10s", ratio);
  std::printf("\n");
}

void print_rows(const Options& o, const std::vector<SizeRow>& rows, const GlooNodesResult& g, double bus_factor) {
  std::printf("%9s %-5s %10s %12s %12s %10s %10s %14s %10s\n", "size", "by", "time ms", "algbw Gb/s", "busbw Gb/s",
              "bus/link", "bus/iperf", "net bytes/op", "zerod/gloo");
  for (const SizeRow& r : rows) {
    const auto peer = g.seconds.find(r.mib);
    char ratio[32] = "-";
    if (peer != g.seconds.end()) std::snprintf(ratio, sizeof ratio, "%.2f", peer->second / r.seconds);
    print_row(o, "zerod", r.mib, r.seconds, bus_factor, std::to_string(r.net_bytes).c_str(), ratio);
    if (peer != g.seconds.end()) print_row(o, "gloo", r.mib, peer->second, bus_factor, "-", "");
  }
}

void print_latency(const char* what, double seconds, double gloo_seconds) {
  std::printf("latency: %s %.1f us per call (median of %d batches of %d)", what, seconds * 1e6, kLatencyBatches - 1,
              kLatencyCalls);
  if (gloo_seconds > 0) std::printf("; gloo %.1f us, zerod/gloo %.2f", gloo_seconds * 1e6, gloo_seconds / seconds);
  std::printf("\n");
}

}  // namespace
}  // namespace zerod::bench

int main(int argc, char** argv) {
  using namespace zerod::bench;
  Options o;
  if (!parse(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: %s [--local N] [--mib 1,4,16,64] [--iters N] [--link-bits R] [--iperf-bits I] "
                 "[--spin-us S] [--segment BYTES] [--plugin-dir DIR] [--label TEXT] [--python PATH] [--no-gloo]\n"
                 "(run one per node under mpirun; the gloo peer runs in the venv scripts/python-venv.sh makes)\n",
                 argv[0]);
    return 2;
  }
  const int node = env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK", 0);
  const int nodes = env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", 1);
  const zd_comm_v2* d = load_plugin(o.plugin_dir);
  const Hparams h = hparams(d, o);
  Daemon daemon(d, h.values, node, nodes, o.local);

  std::vector<SizeRow> rows;
  for (size_t mib : o.mib) rows.push_back(daemon.all_reduce(mib, o.iters));
  const double all_reduce_latency = daemon.latency(false);
  const double barrier_latency = daemon.latency(true);

  GlooPlan plan;
  GlooNodesResult gloo;
  if (o.gloo) plan = plan_gloo(daemon, o, node, nodes);
  daemon.close();
  if (o.gloo) gloo = run_gloo(plan, node);

  if (node != 0) return 0;
  print_header(o, nodes, h);
  print_peer(o, plan, gloo);
  const double n = nodes;
  print_rows(o, rows, gloo, nodes > 1 ? 2 * (n - 1) / n : 1.0);
  print_latency("all_reduce of 1 f32", all_reduce_latency, gloo.all_reduce_latency);
  print_latency("barrier", barrier_latency, gloo.barrier_latency);
  return 0;
}
