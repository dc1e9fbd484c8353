// bench_cpu_adam: our CPU Adam against DeepSpeed's (DeepSpeedCPUAdam), and
// against what moving its bytes costs on this machine.
//
// In one run, at each thread count: (a) a STREAM-style triad, (b) the same
// traffic as an fp32 Adam step (read p, g, m, v; write p, m, v: 28 B/param)
// with FMAs only, four ways (the compiler's loop, intrinsics shaped like
// the kernel, those with software prefetch, and those walking a range's two
// halves at once as the AVX2 kernel does), the fastest of which is the reference
// the percentages refer to. It is a reference, not a ceiling: no loop here
// is proven the fastest way to move those bytes, and the kernel, whose
// arithmetic spaces out its memory requests, can beat it; (c) our kernel through the adamw
// plugin as the engine loads it, ranges split over std::threads, on memory
// from the host tier plugin (huge pages, as a job gets it) and again with
// its huge_pages = false, and (e)
// DeepSpeedCPUAdam (from a virtual environment, scripts/python-venv.sh) in
// a subprocess with OMP_NUM_THREADS = the same count, fp32 and with a bf16
// working copy, and fp32 with torch's huge-page opt-in, interleaved round
// by round (ours, DeepSpeed, ours, ...), with ours on each vector ISA in
// the same rounds (whether auto picked the fastest); (f) ours again as the
// engine calls it in a training step: 32768-element tiles taken by whichever
// thread is free, on each ISA, without a working copy, with a bf16 one and
// with an fp32 one (--no-tiles leaves it out); (d)
// torch.optim.AdamW, the fastest of its CPU implementations (foreach off and
// on, and fused where torch >= 2.4 has it), run by the venv's python (torch
// 2.x, as DeepSpeed's side) unless --python names another; its version is
// printed beside it. Every figure is the median over rounds of each round's
// median step. The VM's bandwidth drifts between runs, so compare within a
// run; the last line says how busy other processes kept the CPUs meanwhile.
#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zerod/zerod_plugin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "../python_peer.h"
#include "host_memory.h"
#include "team.h"
#include "traffic.h"

namespace zerod::bench {
namespace {

struct Options {
  size_t params = 100'000'000;
  int steps = 10;
  int warmup = 1;
  std::vector<int> threads = {1, 2};
  std::string plugin_dir = ZEROD_BENCH_PLUGIN_DIR;
  std::string torch_script = ZEROD_BENCH_TORCH_SCRIPT;
  std::string python;  // empty: the venv's (ds_python) when it is there, else /usr/bin/python3
  bool torch = true;
  std::string ds_python = ZEROD_BENCH_VENV_PYTHON;
  std::string ds_script = ZEROD_BENCH_DEEPSPEED_SCRIPT;
  bool deepspeed = true;
  bool tiles = true;
  int rounds = 3;
};

void usage(const char* argv0) {
  std::printf(
      "usage: %s [--params N] [--steps S] [--warmup W] [--threads 1,2] [--plugin-dir DIR]\n"
      "          [--torch-script PATH] [--python PATH] [--no-torch] [--rounds R]\n"
      "          [--deepspeed-python PATH] [--no-deepspeed] [--no-tiles]\n"
      "  DeepSpeed runs in the venv scripts/python-venv.sh makes (build/venv by default), and torch\n"
      "  too unless --python names another (without the venv, /usr/bin/python3).\n"
      "  N may be written 1e8. Needs about 36*N bytes of memory (N = 100M: 3.6 GB): two Adam states of\n"
      "  18 bytes a parameter, one in each kind of host memory. DeepSpeed's subprocess holds 18*N more\n"
      "  beside them, and about 0.7 GB of its own (54*N + 0.7 GB in all; --no-deepspeed leaves it out).\n",
      argv0);
}

bool parse(int argc, char** argv, Options* o) {
  static const std::string with_value[] = {"--params",       "--steps",       "--warmup",
                                           "--threads",      "--plugin-dir",  "--torch-script",
                                           "--python",       "--rounds",      "--deepspeed-python"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-torch") {
      o->torch = false;
      continue;
    }
    if (a == "--no-deepspeed") {
      o->deepspeed = false;
      continue;
    }
    if (a == "--no-tiles") {
      o->tiles = false;
      continue;
    }
    if (a == "--help" || a == "-h") {
      usage(argv[0]);
      std::exit(0);
    }
    if (std::find(std::begin(with_value), std::end(with_value), a) == std::end(with_value)) {
      std::fprintf(stderr, "%s: unknown option %s\n", argv[0], a.c_str());
      return false;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s: %s needs a value\n", argv[0], a.c_str());
      return false;
    }
    const char* v = argv[++i];
    if (a == "--params") {
      const double n = std::strtod(v, nullptr);
      if (!(n >= 1.0)) return false;
      o->params = static_cast<size_t>(n);
    } else if (a == "--steps") {
      o->steps = std::max(1, std::atoi(v));
    } else if (a == "--warmup") {
      o->warmup = std::max(0, std::atoi(v));
    } else if (a == "--threads") {
      o->threads.clear();
      for (const char* s = v; *s != '\0';) {
        char* end = nullptr;
        const long t = std::strtol(s, &end, 10);
        if (end == s || t < 1) return false;
        o->threads.push_back(static_cast<int>(t));
        s = *end == ',' ? end + 1 : end;
      }
      if (o->threads.empty()) return false;
    } else if (a == "--plugin-dir") {
      o->plugin_dir = v;
    } else if (a == "--rounds") {
      o->rounds = std::max(1, std::atoi(v));
    } else if (a == "--deepspeed-python") {
      o->ds_python = v;
    } else if (a == "--torch-script") {
      o->torch_script = v;
    } else {
      o->python = v;
    }
  }
  return true;
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median seconds per step of fn(begin, end, step) on every thread, step
// counting from 1 (warm-up steps included), n elements split over the team.
template <typename F>
double time_steps(Team& team, size_t n, const Options& o, F&& fn) {
  std::vector<double> times;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    const double t0 = now();
    team.run([&](int t) {
      size_t b, e;
      split(n, team.size(), t, &b, &e);
      fn(b, e, int64_t{s} + 1);
    });
    if (s >= o.warmup) times.push_back(now() - t0);
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

// The adamw plugin, opened and instantiated the way the engine does it.
struct AdamwPlugin {
  void* handle = nullptr;
  const zd_optimizer_v1* desc = nullptr;
  void* inst = nullptr;
  std::string path;

  bool open(const std::string& dir) {
    path = dir + "/zd_optimizer_adamw.so";
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      std::fprintf(stderr, "cannot load %s: %s\n", path.c_str(), dlerror());
      return false;
    }
    auto entry = reinterpret_cast<zd_plugin_entry_fn>(dlsym(handle, ZD_PLUGIN_ENTRY_SYMBOL));
    for (const zd_plugin_header* const* h = entry ? entry() : nullptr; h && *h; ++h) {
      if ((*h)->kind == ZD_PLUGIN_OPTIMIZER && (*h)->abi_version == 1) {
        desc = reinterpret_cast<const zd_optimizer_v1*>(*h);
      }
    }
    if (desc == nullptr) {
      std::fprintf(stderr, "%s has no optimizer v%d descriptor\n", path.c_str(), 1);
      return false;
    }
    std::vector<double> values;  // the spec defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, wd 0.01
    for (uint32_t i = 0; i < desc->hparam_count; ++i) {
      for (int32_t j = 0; j < desc->hparams[i].count; ++j) values.push_back(desc->hparams[i].defaults[j]);
    }
    char err[256] = "";
    if (desc->create(nullptr, values.data(), values.size(), &inst, err, sizeof err) != ZD_OK) {
      std::fprintf(stderr, "adamw create failed: %s\n", err);
      return false;
    }
    return true;
  }
  ~AdamwPlugin() {
    if (inst != nullptr) desc->destroy(inst);
    if (handle != nullptr) dlclose(handle);
  }
};

const char* isa_label(zd_isa isa) {
  switch (isa) {
    case ZD_ISA_SCALAR: return "scalar";
    case ZD_ISA_AVX2: return "avx2";
    case ZD_ISA_AVX512: return "avx512";
    default: return "auto";
  }
}

zd_isa best_isa(const zd_optimizer_v1* d) {
  for (const zd_isa isa : {ZD_ISA_AVX512, ZD_ISA_AVX2}) {
    if (d->supports_isa(isa)) return isa;
  }
  return ZD_ISA_SCALAR;
}

// torch.optim.AdamW's params/s (its fastest CPU variant), or why not.
struct TorchResult {
  double rate = 0.0;
  std::string variant;
  std::string version;
  std::string python;
  std::string error;
};

TorchResult run_torch(const Options& o, int threads) {
  TorchResult r;
  // The venv's python has a fused CPU AdamW (torch >= 2.4).
  r.python = peer_python(o.python, o.ds_python);
  if (access(r.python.c_str(), X_OK) != 0) {
    r.error = r.python + " not found";
    return r;
  }
  const std::string cmd = "'" + r.python + "' '" + o.torch_script + "' --params " + std::to_string(o.params) +
                          " --threads " + std::to_string(threads) + " --steps " + std::to_string(o.steps) +
                          " --warmup " + std::to_string(o.warmup) + " 2>&1";
  std::string last;
  const int status = run_peer_lines(cmd, [&](const char* line) {
    char variant[64];
    double rate;
    if (std::sscanf(line, "best %lf %63s", &rate, variant) == 2) {
      r.rate = rate;
      r.variant = variant;
    } else if (std::strncmp(line, "torch ", 6) == 0) {
      r.version = line + 6;
    }
    if (line[0] != '\0') last = line;
  });
  if (status < 0) r.error = "cannot run " + r.python;
  else if (status != 0 || r.rate <= 0.0) r.error = last.empty() ? "no result" : last;
  return r;
}

// DeepSpeedCPUAdam's params/s, or why not.
struct DsResult {
  double rate = 0.0;
  std::string version;
  std::string error;
};

DsResult run_deepspeed(const Options& o, int threads, bool bf16, bool thp = false) {
  DsResult r;
  if (access(o.ds_python.c_str(), X_OK) != 0) {
    r.error = o.ds_python + " not found (make it with scripts/python-venv.sh)";
    return r;
  }
  // THP_MEM_ALLOC_ENABLE=1 is torch's opt-in to huge pages for its CPU
  // tensors (2 MiB-aligned and madvised from 2 MiB up); off by default.
  const std::string cmd = std::string(thp ? "THP_MEM_ALLOC_ENABLE=1 " : "") + "OMP_NUM_THREADS=" +
                          std::to_string(threads) + " '" + o.ds_python + "' '" + o.ds_script +
                          "' --params " + std::to_string(o.params) + " --threads " + std::to_string(threads) +
                          " --steps " + std::to_string(o.steps) + " --warmup " + std::to_string(o.warmup) +
                          (bf16 ? " --bf16" : "") + " 2>&1";
  std::string last;
  const int status = run_peer_lines(cmd, [&](const char* line) {
    double rate;
    if (std::sscanf(line, "rate %lf", &rate) == 1) r.rate = rate;
    else if (std::strncmp(line, "deepspeed ", 10) == 0) r.version = line;
    if (line[0] != '\0' && std::strncmp(line, "rate ", 5) != 0) last = line;
  });
  if (status < 0) {
    r.error = "cannot run " + o.ds_python;
    return r;
  }
  if (status != 0 || r.rate <= 0.0) r.error = last.empty() ? "no result" : last;
  return r;
}

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

std::string cpu_model() {
  FILE* f = std::fopen("/proc/cpuinfo", "r");
  if (f == nullptr) return "?";
  char line[256];
  std::string model = "?";
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, "model name", 10) == 0) {
      const char* c = std::strchr(line, ':');
      model = c ? c + 2 : line;
      model.erase(model.find_last_not_of(" \n") + 1);
      break;
    }
  }
  std::fclose(f);
  return model;
}

// CPU time the whole machine spent busy (/proc/stat, all CPUs), and what this
// process and its finished children (DeepSpeed, torch) spent, in seconds:
// the difference is other processes', which share the memory bandwidth the
// figures measure.
struct CpuUse {
  double machine = 0.0, ours = 0.0;
  static CpuUse now() {
    CpuUse u;
    if (FILE* f = std::fopen("/proc/stat", "r")) {
      unsigned long long user = 0, nice = 0, sys = 0, idle = 0, iowait = 0, irq = 0, softirq = 0;
      if (std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu", &user, &nice, &sys, &idle, &iowait, &irq,
                      &softirq) == 7)
        u.machine = double(user + nice + sys + irq + softirq) / double(sysconf(_SC_CLK_TCK));
      std::fclose(f);
    }
    for (const int who : {RUSAGE_SELF, RUSAGE_CHILDREN}) {
      rusage r{};
      getrusage(who, &r);
      u.ours += double(r.ru_utime.tv_sec + r.ru_stime.tv_sec) + 1e-6 * double(r.ru_utime.tv_usec + r.ru_stime.tv_usec);
    }
    return u;
  }
};

// One table row: a label and one cell per thread count.
void row(const char* label, const std::vector<std::string>& cells) {
  std::printf("%-56s", label);
  for (const auto& c : cells) std::printf("  %-24s", c.c_str());
  std::printf("\n");
}

__attribute__((format(printf, 1, 2))) std::string fmt(const char* f, ...) {
  char buf[64];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

// (a): a triad on three arrays of n/2 doubles (4n bytes each, far beyond any cache).
void measure_triad(const Options& o, HostMemory& memory) {
  const size_t len = std::max<size_t>(o.params / 2, 1);
  Array<double> a(memory, len), b(memory, len), c(memory, len);
  std::vector<std::string> cells;
  for (const int t : o.threads) {
    Team team(t);
    team.run([&](int k) {
      size_t lo, hi;
      split(len, t, k, &lo, &hi);
      for (size_t i = lo; i < hi; ++i) a.get()[i] = 0.0, b.get()[i] = 1.0, c.get()[i] = 2.0;
    });
    const double s = time_steps(team, len, o, [&](size_t lo, size_t hi, int64_t) {
      triad(a.get() + lo, b.get() + lo, c.get() + lo, 3.0, hi - lo);
    });
    cells.push_back(fmt("%.1f GB/s", 24.0 * double(len) / s / 1e9));
  }
  row("(a) STREAM triad, double (24 B/elem)", cells);
}

// An Adam step's operands, p, g, m, v in fp32 and a bf16 working copy (18
// bytes per parameter), in one kind of host memory.
struct AdamState {
  size_t n;
  Array<float> p, g, m, v;
  Array<uint16_t> work;
  AdamState(HostMemory& memory, size_t count)
      : n(count), p(memory, n), g(memory, n), m(memory, n), v(memory, n), work(memory, n) {}

  void fill(Team& team) {
    team.run([&](int k) {
      size_t lo, hi;
      split(n, team.size(), k, &lo, &hi);
      std::mt19937 rng(static_cast<unsigned>(k) + 1);
      std::normal_distribution<float> normal;
      for (size_t i = lo; i < hi; ++i) {
        p.get()[i] = normal(rng);
        g.get()[i] = normal(rng);
        m.get()[i] = 0.0f;
        v.get()[i] = 0.0f;
        work.get()[i] = 0;
      }
    });
  }
  // Zero state, so each configuration starts at step 1 as a fresh optimizer.
  void reset(Team& team) {
    team.run([&](int k) {
      size_t lo, hi;
      split(n, team.size(), k, &lo, &hi);
      std::memset(m.get() + lo, 0, (hi - lo) * sizeof(float));
      std::memset(v.get() + lo, 0, (hi - lo) * sizeof(float));
    });
  }
};

// One Adam step over the whole of `on` the way the engine runs it
// (engine/runtime/workers.cpp, parallel_update with zero_grad): calls of kTile
// elements, each thread taking the next tile as it finishes one, and each
// tile's gradient zeroed right after its update. Returns params/s (median
// step).
constexpr size_t kTile = size_t{1} << 15;  // engine/runtime/workers.h

// work: ZD_DTYPE_BF16 (on.work), ZD_DTYPE_F32 (work32), or 0 for none.
double run_tiles(const Options& o, Team& team, const AdamwPlugin& plugin, AdamState& on, zd_isa isa, int work,
                 float* work32) {
  on.reset(team);
  const size_t n = on.n, tiles = (n + kTile - 1) / kTile;
  std::atomic<zd_status> failed{ZD_OK};
  std::vector<double> times;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    std::atomic<size_t> next{0};
    const double t0 = now();
    team.run([&](int) {
      for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < tiles;) {
        const size_t lo = i * kTile, count = std::min(kTile, n - lo);
        zd_optimizer_update u{};
        u.struct_size = sizeof u;
        u.count = count;
        u.master = on.p.get() + lo;
        u.grad = on.g.get() + lo;
        u.grad_dtype = ZD_DTYPE_F32;
        u.work = work == ZD_DTYPE_BF16  ? static_cast<void*>(on.work.get() + lo)
                 : work == ZD_DTYPE_F32 ? static_cast<void*>(work32 + lo)
                                        : nullptr;
        u.work_dtype = work ? static_cast<zd_dtype>(work) : ZD_DTYPE_BF16;
        u.state[0] = on.m.get() + lo;
        u.state[1] = on.v.get() + lo;
        u.grad_scale = 1.0;
        u.lr = 1e-3;
        u.step = int64_t{s} + 1;
        const zd_status status = plugin.desc->update(plugin.inst, isa, &u);
        if (status != ZD_OK) failed = status;
        std::memset(on.g.get() + lo, 0, count * sizeof(float));
      }
    });
    if (s >= o.warmup) times.push_back(now() - t0);
  }
  if (failed != ZD_OK) {
    std::fprintf(stderr, "update failed with status %d\n", failed.load());
    std::exit(1);
  }
  return double(n) / median(times);
}

// (f): the engine's tiles, on each vector ISA and on auto, fp32 without a
// working copy, with a bf16 one and with an fp32 one (what the engine writes
// for fp32 parameters: the master's copy in the device's memory),
// interleaved round by round.
void measure_tiles(const Options& o, const AdamwPlugin& plugin, AdamState& st, HostMemory& memory) {
  struct Config {
    zd_isa isa;
    int work;  // run_tiles' work
  };
  Array<float> work32(memory, st.n);
  std::vector<Config> configs;
  for (const int work : {0, int{ZD_DTYPE_BF16}, int{ZD_DTYPE_F32}}) {
    for (const zd_isa isa : {ZD_ISA_AUTO, ZD_ISA_AVX2, ZD_ISA_AVX512}) {
      if (plugin.desc->supports_isa(isa)) configs.push_back({isa, work});
    }
  }
  std::vector<std::vector<std::string>> cells(configs.size());
  for (const int t : o.threads) {
    Team team(t);
    std::vector<std::vector<double>> rates(configs.size());
    for (int round = 0; round < o.rounds; ++round) {
      for (size_t c = 0; c < configs.size(); ++c)
        rates[c].push_back(run_tiles(o, team, plugin, st, configs[c].isa, configs[c].work, work32.get()));
    }
    for (size_t c = 0; c < configs.size(); ++c) cells[c].push_back(fmt("%.0f M/s", median(rates[c]) / 1e6));
  }
  for (size_t c = 0; c < configs.size(); ++c) {
    const std::string label = std::string("(f) engine tiles, ours ") + isa_label(configs[c].isa) +
                              (configs[c].work == ZD_DTYPE_BF16  ? " + bf16 work copy"
                               : configs[c].work == ZD_DTYPE_F32 ? " + fp32 work copy"
                                                                 : " fp32");
    row(label.c_str(), cells[c]);
  }
  std::printf("\n(f) %zu-element calls, each thread taking the next tile as it finishes one, the tile's gradient "
              "zeroed after its update (engine/runtime/workers.cpp parallel_update); %d rounds, interleaved\n",
              kTile, o.rounds);
}

// (b) and (c), with (e) interleaved. `huge` is the host tier's memory as a
// job gets it (huge pages), `small` the same tier with huge_pages = false.
// Returns our fp32 rate (ISA auto, huge pages) per thread count.
std::vector<double> measure_adam(const Options& o, const AdamwPlugin& plugin, zd_isa best, HostMemory& huge,
                                 HostMemory& small) {
  const size_t n = o.params;
  // st4k only for the rows that compare page sizes: freed before (f), whose
  // fp32 working copy would otherwise add to both states at the peak.
  AdamState st(huge, n);
  std::optional<AdamState> st4k(std::in_place, small, n);

  std::vector<double> reference(o.threads.size());
  std::vector<std::string> cells;
  const char* variant_names[kProxyVariants] = {"compiler's loop", "kernel-shaped, AVX2", "kernel-shaped + prefetch",
                                               "kernel-shaped, two halves"};
  std::vector<std::vector<std::string>> variant_cells(kProxyVariants);
  for (size_t k = 0; k < o.threads.size(); ++k) {
    Team team(o.threads[k]);
    if (k == 0) st.fill(team), st4k->fill(team);
    for (int var = 0; var < kProxyVariants; ++var) {
      bool ran = true;
      const double s = time_steps(team, n, o, [&](size_t lo, size_t hi, int64_t) {
        ran = adam_proxy_variant(var, st.p.get() + lo, st.g.get() + lo, st.m.get() + lo, st.v.get() + lo, 1e-3f,
                                 hi - lo);
      });
      const double rate = ran ? double(n) / s : 0.0;
      reference[k] = std::max(reference[k], rate);
      variant_cells[static_cast<size_t>(var)].push_back(
          ran ? fmt("%.0f M/s (%.1f GB/s)", rate / 1e6, 28.0 * rate / 1e9) : std::string("not on this CPU"));
    }
    cells.push_back(fmt("%.0f M/s (%.1f GB/s)", reference[k] / 1e6, 28.0 * reference[k] / 1e9));
  }
  for (int var = 0; var < kProxyVariants; ++var)
    row((std::string("(b) same traffic, 28 B/param: ") + variant_names[var]).c_str(),
        variant_cells[static_cast<size_t>(var)]);
  row("(b) reference = the fastest of these (not a ceiling)", cells);

  struct Config {
    zd_isa isa;
    bool bf16_work;
  };
  auto run_ours = [&](Team& team, AdamState& on, const Config& cfg) {
    on.reset(team);
    std::atomic<zd_status> failed{ZD_OK};
    const double s = time_steps(team, n, o, [&](size_t lo, size_t hi, int64_t step) {
      zd_optimizer_update u{};
      u.struct_size = sizeof u;
      u.count = hi - lo;
      u.master = on.p.get() + lo;
      u.grad = on.g.get() + lo;
      u.grad_dtype = ZD_DTYPE_F32;
      u.work = cfg.bf16_work ? on.work.get() + lo : nullptr;
      u.work_dtype = ZD_DTYPE_BF16;
      u.state[0] = on.m.get() + lo;
      u.state[1] = on.v.get() + lo;
      u.grad_scale = 1.0;
      u.lr = 1e-3;
      u.step = step;
      const zd_status status = plugin.desc->update(plugin.inst, cfg.isa, &u);
      if (status != ZD_OK) failed = status;
    });
    if (failed != ZD_OK) {
      std::fprintf(stderr, "update failed with status %d\n", failed.load());
      std::exit(1);
    }
    return double(n) / s;
  };

  // One series per row, interleaved round by round so that the VM's drift
  // falls on all of them alike: ours (huge pages, then 4 KiB), DeepSpeed
  // (torch's default memory, then torch's huge-page opt-in), fp32 then with
  // the bf16 working copy; then ours on each vector ISA named (fp32), the
  // figures that say whether auto picked the fastest.
  enum Series { kOurs, kOurs4k, kDs, kDsThp, kOursBf16, kDsBf16, kAvx2, kAvx512, kSeries };
  std::vector<std::string> series_cells[kSeries], ratio_cells[3];
  std::vector<double> ours(o.threads.size());
  std::string ds_version, ds_error = o.deepspeed ? "" : "--no-deepspeed";
  auto deepspeed = [&](int threads, bool bf16, bool thp, std::vector<double>* into) {
    if (!ds_error.empty()) return;
    const DsResult d = run_deepspeed(o, threads, bf16, thp);
    if (!d.error.empty()) ds_error = d.error;
    else into->push_back(d.rate), ds_version = d.version;
  };
  for (size_t k = 0; k < o.threads.size(); ++k) {
    Team team(o.threads[k]);
    std::vector<double> rates[kSeries];
    for (int round = 0; round < o.rounds; ++round) {
      rates[kOurs].push_back(run_ours(team, st, {ZD_ISA_AUTO, false}));
      rates[kOurs4k].push_back(run_ours(team, *st4k, {ZD_ISA_AUTO, false}));
      deepspeed(o.threads[k], false, false, &rates[kDs]);
      deepspeed(o.threads[k], false, true, &rates[kDsThp]);
      rates[kOursBf16].push_back(run_ours(team, st, {ZD_ISA_AUTO, true}));
      deepspeed(o.threads[k], true, false, &rates[kDsBf16]);
      if (plugin.desc->supports_isa(ZD_ISA_AVX2)) rates[kAvx2].push_back(run_ours(team, st, {ZD_ISA_AVX2, false}));
      if (plugin.desc->supports_isa(ZD_ISA_AVX512))
        rates[kAvx512].push_back(run_ours(team, st, {ZD_ISA_AVX512, false}));
    }
    double med[kSeries] = {};
    for (int r = 0; r < kSeries; ++r) {
      if (rates[r].empty()) continue;
      med[r] = median(rates[r]);
      series_cells[r].push_back(fmt("%.0f M/s  %3.0f%% of (b)", med[r] / 1e6, 100.0 * med[r] / reference[k]));
    }
    ours[k] = med[kOurs];
    if (ds_error.empty()) {
      ratio_cells[0].push_back(fmt("%.2fx", med[kOurs] / med[kDs]));
      ratio_cells[1].push_back(fmt("%.2fx", med[kOurs] / med[kDsThp]));
      ratio_cells[2].push_back(fmt("%.2fx", med[kOursBf16] / med[kDsBf16]));
    }
  }
  const std::string auto_isa = isa_label(best);
  row(("(c) ours " + auto_isa + " (auto) fp32, host tier memory").c_str(), series_cells[kOurs]);
  row(("(c) ours " + auto_isa + " fp32, host tier huge_pages = false").c_str(), series_cells[kOurs4k]);
  if (ds_error.empty()) {
    row("(e) DeepSpeedCPUAdam fp32 (torch's memory as it comes)", series_cells[kDs]);
    row("(e) DeepSpeedCPUAdam fp32, THP_MEM_ALLOC_ENABLE=1", series_cells[kDsThp]);
  }
  row(("(c) ours " + auto_isa + " (auto) + bf16 work copy").c_str(), series_cells[kOursBf16]);
  if (ds_error.empty()) {
    row("(e) DeepSpeedCPUAdam + bf16 copy_()", series_cells[kDsBf16]);
    row("    ours / DeepSpeed, fp32", ratio_cells[0]);
    row("    ours / DeepSpeed with torch's huge pages, fp32", ratio_cells[1]);
    row("    ours / DeepSpeed, bf16 work copy", ratio_cells[2]);
  }
  if (!series_cells[kAvx2].empty()) row("(c) ours avx2 fp32 (same rounds)", series_cells[kAvx2]);
  if (!series_cells[kAvx512].empty()) row("(c) ours avx512 fp32 (same rounds)", series_cells[kAvx512]);
  cells.clear();
  for (size_t k = 0; k < o.threads.size(); ++k) {
    Team team(o.threads[k]);
    const double rate = run_ours(team, st, {ZD_ISA_SCALAR, false});
    cells.push_back(fmt("%.0f M/s  %3.0f%% of (b)", rate / 1e6, 100.0 * rate / reference[k]));
  }
  row("(c) ours scalar fp32", cells);
  if (ds_error.empty())
    std::printf("\n(e) %s; %d rounds, each: ours, then DeepSpeed (a subprocess, OMP_NUM_THREADS = the column's "
                "threads); its bf16 row adds the copy_ to a bf16 tensor that ZeRO-Offload does after the step\n",
                ds_version.c_str(), o.rounds);
  else
    std::printf("\n(e) DeepSpeedCPUAdam: not run: %s\n", ds_error.c_str());
  st4k.reset();
  if (o.tiles) measure_tiles(o, plugin, st, huge);
  return ours;
}

// (d): torch in a subprocess, same size, steps and threads.
void measure_torch(const Options& o, const std::vector<double>& ours) {
  if (!o.torch) {
    std::printf("(d) torch: not run (--no-torch)\n");
    return;
  }
  std::vector<std::string> rates, ratios;
  std::string version, variants, python;
  for (size_t k = 0; k < o.threads.size(); ++k) {
    const TorchResult r = run_torch(o, o.threads[k]);
    if (!r.error.empty()) {
      std::printf("(d) torch: not available (%s)\n", r.error.c_str());
      return;
    }
    version = r.version;
    python = r.python;
    variants += (variants.empty() ? "" : ", ") + r.variant;
    rates.push_back(fmt("%.0f M/s", r.rate / 1e6));
    ratios.push_back(fmt("%.2fx", ours[k] / r.rate));
  }
  row("(d) torch.optim.AdamW, best of foreach/fused", rates);
  row("    ours (c, auto, fp32) / torch", ratios);
  std::printf("\ntorch %s (%s); fastest variant per column: %s\n", version.c_str(), python.c_str(),
              variants.c_str());
}

int run(const Options& o) {
  AdamwPlugin plugin;
  if (!plugin.open(o.plugin_dir)) return 1;
  const zd_isa best = best_isa(plugin.desc);

  std::printf("bench_cpu_adam: N = %zu params, %d timed steps after %d warm-up, median per step\n", o.params,
              o.steps, o.warmup);
  std::printf("cpu: %s, %u hardware threads; ISA auto = %s\nplugin: %s\n", cpu_model().c_str(),
              std::thread::hardware_concurrency(), isa_label(best), plugin.path.c_str());
  std::printf("ours = adamw plugin defaults (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight_decay 0.01)\n");
  // Every buffer comes from the host tier plugin, as a job's optimizer state
  // on offload.optimizer = "host" does.
  HostMemory huge(o.plugin_dir, true), small(o.plugin_dir, false);
  std::printf("memory: %s\n  and for the huge_pages = false row: %s\n\n", huge.describe().c_str(),
              small.describe().c_str());
  std::vector<std::string> header;
  for (const int t : o.threads) header.push_back(std::to_string(t) + (t == 1 ? " thread" : " threads"));
  row("", header);

  const CpuUse start = CpuUse::now();
  const double t0 = now();
  measure_triad(o, huge);
  const std::vector<double> ours = measure_adam(o, plugin, best, huge, small);  // its buffers are freed on return
  measure_torch(o, ours);
  const CpuUse end = CpuUse::now();
  const double cpus = std::thread::hardware_concurrency(), wall = now() - t0;
  const double others = std::max(0.0, (end.machine - start.machine) - (end.ours - start.ours));
  std::printf("\nother processes kept %.0f%% of the %.0f CPUs busy during the %.0f s of this run%s\n",
              100.0 * others / (cpus * wall), cpus, wall,
              others > 0.05 * cpus * wall ? " (they share the memory bandwidth: the figures assume a quiet machine)"
                                           : "");
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
