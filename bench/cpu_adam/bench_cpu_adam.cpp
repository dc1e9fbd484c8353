// bench_cpu_adam: how close our CPU Adam comes to this machine's memory
// bandwidth, and how it compares with torch.optim.AdamW.
//
// In one run, at each thread count: (a) a STREAM-style triad, (b) a
// pure-traffic Adam proxy (28 B/param) giving the bandwidth bound in
// params/s, (c) our kernel loaded through the adamw plugin as the engine
// loads it, ranges split over std::threads, as % of (b) from the same run,
// (d) torch.optim.AdamW in a subprocess. Every figure is the median of the
// timed steps after the warm-up ones. The VM's bandwidth drifts between
// runs, so compare (c) with (b) of the same run, not with old numbers.
#include <dlfcn.h>
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
  std::string python = "/usr/bin/python3";
  bool torch = true;
};

void usage(const char* argv0) {
  std::printf(
      "usage: %s [--params N] [--steps S] [--warmup W] [--threads 1,2] [--plugin-dir DIR]\n"
      "          [--torch-script PATH] [--python PATH] [--no-torch]\n"
      "  N may be written 1e8. Needs about 18*N bytes of memory (N = 100M: 1.8 GB).\n",
      argv0);
}

bool parse(int argc, char** argv, Options* o) {
  static const std::string with_value[] = {"--params", "--steps", "--warmup", "--threads",
                                           "--plugin-dir", "--torch-script", "--python"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-torch") {
      o->torch = false;
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
    } else if (a == "--torch-script") {
      o->torch_script = v;
    } else {
      o->python = v;
    }
  }
  return true;
}

// 64-byte aligned, uninitialised (first touch happens in the fill, by the team).
template <typename T>
struct Array {
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> ptr;
  explicit Array(size_t n)
      : ptr(static_cast<T*>(std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64))) {
    if (!ptr) {
      std::fprintf(stderr, "out of memory allocating %zu bytes\n", n * sizeof(T));
      std::exit(1);
    }
  }
  T* get() const { return ptr.get(); }
};

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

// torch.optim.AdamW's params/s (the faster foreach variant), or why not.
struct TorchResult {
  double rate = 0.0;
  std::string variant;
  std::string version;
  std::string error;
};

TorchResult run_torch(const Options& o, int threads) {
  TorchResult r;
  if (access(o.python.c_str(), X_OK) != 0) {
    r.error = o.python + " not found";
    return r;
  }
  const std::string cmd = o.python + " '" + o.torch_script + "' --params " + std::to_string(o.params) +
                          " --threads " + std::to_string(threads) + " --steps " + std::to_string(o.steps) +
                          " --warmup " + std::to_string(o.warmup) + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) {
    r.error = "cannot run " + o.python;
    return r;
  }
  char line[512];
  std::string last;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    line[std::strcspn(line, "\n")] = '\0';
    char variant[64];
    double rate;
    if (std::sscanf(line, "best %lf %63s", &rate, variant) == 2) {
      r.rate = rate;
      r.variant = variant;
    } else if (std::strncmp(line, "torch ", 6) == 0) {
      r.version = line + 6;
    }
    if (line[0] != '\0') last = line;
  }
  const int status = pclose(f);
  if (status != 0 || r.rate <= 0.0) r.error = last.empty() ? "no result" : last;
  return r;
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

// One table row: a label and one cell per thread count.
void row(const char* label, const std::vector<std::string>& cells) {
  std::printf("%-44s", label);
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
void measure_triad(const Options& o) {
  const size_t len = std::max<size_t>(o.params / 2, 1);
  Array<double> a(len), b(len), c(len);
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

// (b) and (c). Returns our fp32 rate (ISA auto) per thread count.
std::vector<double> measure_adam(const Options& o, const AdamwPlugin& plugin, zd_isa best) {
  const size_t n = o.params;
  // p, g, m, v in fp32 and a bf16 working copy: 18 bytes per parameter.
  Array<float> p(n), g(n), m(n), v(n);
  Array<uint16_t> work(n);
  auto fill = [&](Team& team) {
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
  };
  // Zero state, so each configuration starts at step 1 as a fresh optimizer.
  auto reset = [&](Team& team) {
    team.run([&](int k) {
      size_t lo, hi;
      split(n, team.size(), k, &lo, &hi);
      std::memset(m.get() + lo, 0, (hi - lo) * sizeof(float));
      std::memset(v.get() + lo, 0, (hi - lo) * sizeof(float));
    });
  };

  std::vector<double> bound(o.threads.size());
  std::vector<std::string> cells;
  for (size_t k = 0; k < o.threads.size(); ++k) {
    Team team(o.threads[k]);
    if (k == 0) fill(team);
    const double s = time_steps(team, n, o, [&](size_t lo, size_t hi, int64_t) {
      adam_proxy(p.get() + lo, g.get() + lo, m.get() + lo, v.get() + lo, 1e-3f, hi - lo);
    });
    bound[k] = double(n) / s;
    cells.push_back(fmt("%.0f M/s (%.1f GB/s)", bound[k] / 1e6, 28.0 * bound[k] / 1e9));
  }
  row("(b) Adam traffic proxy (28 B/param)", cells);

  struct Config {
    zd_isa isa;
    bool bf16_work;
  };
  std::vector<Config> configs = {{ZD_ISA_AUTO, false}, {ZD_ISA_AUTO, true}};
  if (best == ZD_ISA_AVX512) configs.push_back({ZD_ISA_AVX2, false});
  configs.push_back({ZD_ISA_SCALAR, false});
  std::vector<double> ours(o.threads.size());
  for (const Config& cfg : configs) {
    cells.clear();
    for (size_t k = 0; k < o.threads.size(); ++k) {
      Team team(o.threads[k]);
      reset(team);
      std::atomic<zd_status> failed{ZD_OK};
      const double s = time_steps(team, n, o, [&](size_t lo, size_t hi, int64_t step) {
        zd_optimizer_update u{};
        u.struct_size = sizeof u;
        u.count = hi - lo;
        u.master = p.get() + lo;
        u.grad = g.get() + lo;
        u.grad_dtype = ZD_DTYPE_F32;
        u.work = cfg.bf16_work ? work.get() + lo : nullptr;
        u.work_dtype = ZD_DTYPE_BF16;
        u.state[0] = m.get() + lo;
        u.state[1] = v.get() + lo;
        u.grad_scale = 1.0;
        u.lr = 1e-3;
        u.step = step;
        const zd_status st = plugin.desc->update(plugin.inst, cfg.isa, &u);
        if (st != ZD_OK) failed = st;
      });
      if (failed != ZD_OK) {
        std::fprintf(stderr, "update failed with status %d\n", failed.load());
        std::exit(1);
      }
      const double rate = double(n) / s;
      if (cfg.isa == ZD_ISA_AUTO && !cfg.bf16_work) ours[k] = rate;
      cells.push_back(fmt("%.0f M/s  %3.0f%% of (b)", rate / 1e6, 100.0 * rate / bound[k]));
    }
    const std::string label = std::string("(c) ours ") + isa_label(cfg.isa == ZD_ISA_AUTO ? best : cfg.isa) +
                              (cfg.isa == ZD_ISA_AUTO ? " (auto)" : "") +
                              (cfg.bf16_work ? " + bf16 work copy" : " fp32");
    row(label.c_str(), cells);
  }
  return ours;
}

// (d): torch in a subprocess, same size, steps and threads.
void measure_torch(const Options& o, const std::vector<double>& ours) {
  if (!o.torch) {
    std::printf("(d) torch: not run (--no-torch)\n");
    return;
  }
  std::vector<std::string> rates, ratios;
  std::string version, variants;
  for (size_t k = 0; k < o.threads.size(); ++k) {
    const TorchResult r = run_torch(o, o.threads[k]);
    if (!r.error.empty()) {
      std::printf("(d) torch: not available (%s)\n", r.error.c_str());
      return;
    }
    version = r.version;
    variants += (variants.empty() ? "" : ", ") + r.variant;
    rates.push_back(fmt("%.0f M/s", r.rate / 1e6));
    ratios.push_back(fmt("%.2fx", ours[k] / r.rate));
  }
  row("(d) torch.optim.AdamW, best of foreach", rates);
  row("    ours (c, auto, fp32) / torch", ratios);
  std::printf("\ntorch %s; faster variant per column: %s\n", version.c_str(), variants.c_str());
}

int run(const Options& o) {
  AdamwPlugin plugin;
  if (!plugin.open(o.plugin_dir)) return 1;
  const zd_isa best = best_isa(plugin.desc);

  std::printf("bench_cpu_adam: N = %zu params, %d timed steps after %d warm-up, median per step\n", o.params,
              o.steps, o.warmup);
  std::printf("cpu: %s, %u hardware threads; ISA auto = %s\nplugin: %s\n", cpu_model().c_str(),
              std::thread::hardware_concurrency(), isa_label(best), plugin.path.c_str());
  std::printf("ours = adamw plugin defaults (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight_decay 0.01)\n\n");
  std::vector<std::string> header;
  for (const int t : o.threads) header.push_back(std::to_string(t) + (t == 1 ? " thread" : " threads"));
  row("", header);

  measure_triad(o);
  const std::vector<double> ours = measure_adam(o, plugin, best);  // its buffers are freed on return
  measure_torch(o, ours);
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
