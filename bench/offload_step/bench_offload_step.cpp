// Step time of one fixed model with its optimizer state (fp32 master copy and
// Adam's two moments) in the device pool, in host RAM and on NVMe, in one
// run, as ratios to the device pool. Beside them, in the same run:
//   - the disk's own limit: fio (libaio, O_DIRECT, the tier's block size and
//     queue depth) reading and writing the same bytes in the same folder; the
//     NVMe step cannot beat max(disk time, in-RAM step time);
//   - the peers: DeepSpeedCPUAdam (what DeepSpeed's ZeRO-Offload steps on
//     the host) and torch.optim.AdamW, each stepping the same number of
//     parameters in
//     RAM (the in-memory step a PyTorch user would otherwise run), the
//     fastest of its CPU variants (fused where torch >= 2.4 has it), run by
//     build/venv's python (torch 2.x) when it is there, else the system's;
//     the torch version is printed beside it. It is set against zd_step run
//     with offload.overlap = false (the "overlap off" rows): with the
//     overlap on, zd_step returns before the host's part of the update is
//     done, while torch's opt.step() includes all of it.
// The parameters every placement ends with are compared: they must be equal,
// and no longer their initial values (an update that did nothing would be
// equal everywhere too; --lr 1e-30, whose steps round away in fp32, shows
// that the check catches one).
//
//   bench_offload_step [--params 32e6] [--layers 8] [--steps 5] [--lr 1e-3] [--dir /var/tmp]
//                      [--threads 0] [--no-torch] [--no-deepspeed]
#include <zerod/zerod.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../nvme/fio_run.h"
#include "../python_peer.h"

namespace {

struct Options {
  double params = 32e6;
  int layers = 8;
  int steps = 5;
  double lr = 1e-3;
  std::string dir = "/var/tmp";
  int threads = 0;
  bool torch = true;
  bool deepspeed = true;
};

struct Result {
  std::string name;
  double step_ms = 0;       // median whole step: forward, backward, zd_step
  double optimizer_ms = 0;  // median zd_step alone
  uint64_t bytes[3] = {0, 0, 0};
  std::vector<std::vector<float>> final_params;
};

[[noreturn]] void die(const std::string& what, zd_model* m = nullptr) {
  std::fprintf(stderr, "bench_offload_step: %s failed: %s\n", what.c_str(),
               m ? zd_model_last_error(m) : zd_last_error());
  std::exit(1);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Every tensor's initial values: fixed pseudo-random ones, the same in each
// placement.
std::vector<float> initial_values(size_t n) {
  std::vector<float> init(n);
  uint32_t seed = 12345;
  for (float& x : init) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<float>(seed >> 8) / 16777216.0f - 0.5f;
  }
  return init;
}

// --lr as a Lua number (round-trips a double).
std::string lua_number(double v) {
  char s[32];
  std::snprintf(s, sizeof s, "%.17g", v);
  return s;
}

Result run(const std::string& name, const std::string& offload, const Options& o) {
  Result r;
  r.name = name;
  zd_client* c = nullptr;
  if (zd_connect("embedded:", nullptr, &c)) die("zd_connect");
  const std::string job = "return { optimizer = { type = 'adamw', lr = " + lua_number(o.lr) + " }, threads = " +
                          std::to_string(o.threads) + (offload.empty() ? "" : ", offload = " + offload) +
                          " }";
  zd_model_options mo = ZD_MODEL_OPTIONS_INIT;
  mo.script_text = job.c_str();
  mo.script_name = "offload_step.lua";
  zd_model* m = nullptr;
  if (zd_model_create(c, &mo, &m)) die("zd_model_create (" + name + ")");
  const auto per_layer = static_cast<int64_t>(o.params / o.layers);
  const std::vector<float> init = initial_values(static_cast<size_t>(per_layer));
  std::vector<zd_module_id> modules;
  std::vector<zd_param_id> ids;
  for (int l = 0; l < o.layers; ++l) {
    const std::string pname = "layer" + std::to_string(l) + ".weight", mname = "layer" + std::to_string(l);
    zd_param_desc d = ZD_PARAM_DESC_INIT;
    d.name = pname.c_str();
    d.module = mname.c_str();
    d.ndim = 1;
    d.shape = &per_layer;
    d.init = init.data();
    zd_param_id id = 0;
    if (zd_model_register_param(m, &d, &id)) die("zd_model_register_param", m);
    ids.push_back(id);
  }
  if (zd_model_finalize(m)) die("zd_model_finalize (" + name + ")", m);
  for (int l = 0; l < o.layers; ++l) {
    zd_module_id mid = 0;
    if (zd_model_find_module(m, ("layer" + std::to_string(l)).c_str(), &mid)) die("find_module", m);
    modules.push_back(mid);
  }
  // The gradient a trainer would write: fixed pseudo-random values, so each
  // placement sees the same ones.
  std::vector<float> grad(init.size());
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = 1e-3f * init[(i * 7919) % init.size()];

  std::vector<double> step_ms, opt_ms;
  for (int s = 0; s < o.steps + 1; ++s) {  // the first step warms up
    const auto t0 = std::chrono::steady_clock::now();
    for (zd_module_id mid : modules)
      if (zd_forward_begin(m, mid) || zd_forward_end(m, mid)) die("forward", m);
    for (size_t l = modules.size(); l-- > 0;) {
      if (zd_backward_begin(m, modules[l])) die("zd_backward_begin", m);
      zd_view v{};
      v.struct_size = sizeof v;
      if (zd_grad_view(m, ids[l], &v)) die("zd_grad_view", m);
      std::memcpy(v.data, grad.data(), v.nbytes);
      if (zd_backward_end(m, modules[l])) die("zd_backward_end", m);
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (zd_step(m, nullptr)) die("zd_step (" + name + ")", m);
    const auto t2 = std::chrono::steady_clock::now();
    if (s > 0) {
      step_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t0).count());
      opt_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
  }
  r.step_ms = median(step_ms);
  r.optimizer_ms = median(opt_ms);
  const zd_tier tiers[3] = {ZD_TIER_DEVICE, ZD_TIER_HOST, ZD_TIER_NVME};
  for (int t = 0; t < 3; ++t) {
    zd_memory_figures f = ZD_MEMORY_FIGURES_INIT;
    if (zd_model_memory(m, -1, tiers[t], ZD_MEM_ALL, &f)) die("zd_model_memory", m);
    r.bytes[t] = f.current;
  }
  for (zd_param_id id : ids) {
    std::vector<float> v(init.size());
    if (zd_param_read(m, id, ZD_DTYPE_F32, v.data(), v.size() * 4)) die("zd_param_read", m);
    r.final_params.push_back(std::move(v));
  }
  zd_model_destroy(m);
  zd_disconnect(c);
  return r;
}

struct TorchFigure {
  double ms = -1;       // one opt.step(), < 0 when not measured
  std::string python;   // the interpreter that ran it
  std::string version;  // "2.15.0+cu132 threads=2"
  std::string variant;  // the fastest: "fused=True", "foreach=True", ...
  std::string error;    // why not measured
};

// Why a peer script gave no figure: how it ended, and its last line (a
// Python error's own words, on stderr).
std::string peer_failure(const zerod::bench::PeerRun& run, const std::string& python) {
  if (run.status < 0) return "cannot run " + python;
  const std::string ended = run.status == 0           ? "exit status 0, no result"
                            : WIFEXITED(run.status)   ? "exit status " + std::to_string(WEXITSTATUS(run.status))
                            : WIFSIGNALED(run.status) ? "killed by signal " + std::to_string(WTERMSIG(run.status))
                                                      : "wait status " + std::to_string(run.status);
  return run.last.empty() ? ended : ended + ": " + run.last;
}

// torch.optim.AdamW on the same number of parameters, from bench/cpu_adam's
// script, in the venv's python (torch 2.x, as scripts/python-venv.sh makes
// it) when there is one, else the system's. Its stderr is folded in, so
// that a failure says why rather than passing for a missing torch.
TorchFigure torch_step(const Options& o) {
  TorchFigure f;
  f.python = zerod::bench::peer_python("", ZEROD_BENCH_VENV_PYTHON);
  const int threads = o.threads > 0 ? o.threads : static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  const std::string cmd = "'" + f.python + "' '" + ZEROD_BENCH_TORCH_SCRIPT + "' --params " +
                          std::to_string(static_cast<long long>(o.params)) + " --threads " +
                          std::to_string(threads) + " --steps " + std::to_string(o.steps) + " 2>&1";
  double rate = -1;
  const zerod::bench::PeerRun run = zerod::bench::run_peer_script(cmd, f.python, [&](const char* line) {
    if (std::strncmp(line, "best ", 5) == 0) {
      char* end = nullptr;
      rate = std::strtod(line + 5, &end);
      f.variant = end && *end == ' ' ? end + 1 : "";
      return true;
    }
    if (std::strncmp(line, "torch ", 6) == 0) {
      f.version = line + 6;
      return true;
    }
    return false;
  });
  if (run.status == 0 && rate > 0) f.ms = o.params / rate * 1e3;
  else f.error = peer_failure(run, f.python);
  return f;
}

struct DeepSpeedFigure {
  double ms = -1;       // one DeepSpeedCPUAdam step, < 0 when not measured
  std::string version;  // "deepspeed 0.19.x torch 2.x threads=2 isa=..."
  std::string error;    // why not measured
};

// DeepSpeedCPUAdam on the same number of fp32 parameters (bench/cpu_adam's
// script: the op is built at its first use and cached), in the venv's
// python, OMP_NUM_THREADS as the op takes its thread count from there.
DeepSpeedFigure deepspeed_step(const Options& o) {
  DeepSpeedFigure f;
  const std::string python = zerod::bench::peer_python("", ZEROD_BENCH_VENV_PYTHON);
  const int threads = o.threads > 0 ? o.threads : static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  const std::string cmd = "OMP_NUM_THREADS=" + std::to_string(threads) + " '" + python + "' '" +
                          ZEROD_BENCH_DEEPSPEED_SCRIPT + "' --params " +
                          std::to_string(static_cast<long long>(o.params)) + " --threads " +
                          std::to_string(threads) + " --steps " + std::to_string(o.steps) + " 2>&1";
  double rate = -1;
  std::string last;
  const int status = zerod::bench::run_peer_lines(cmd, [&](const char* line) {
    if (std::sscanf(line, "rate %lf", &rate) == 1) return;
    if (std::strncmp(line, "deepspeed ", 10) == 0) f.version = line + 10;
    else if (line[0] != '\0') last = line;
  });
  if (status == 0 && rate > 0) f.ms = o.params / rate * 1e3;
  else f.error = status < 0 ? "cannot run " + python : last.empty() ? python + ": no result" : last;
  return f;
}

// Whether every placement ended with the same parameters as the first.
bool identical_everywhere(const std::vector<Result>& results) {
  for (size_t k = 1; k < results.size(); ++k)
    if (results[k].final_params != results[0].final_params) return false;
  return true;
}

// Whether every tensor of every placement differs from its initial values:
// placements that all did nothing would be identical too.
bool all_moved(const std::vector<Result>& results, const std::vector<float>& init) {
  for (const Result& r : results)
    for (const std::vector<float>& tensor : r.final_params)
      if (tensor == init) return false;
  return true;
}

std::string gib(uint64_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f GiB", static_cast<double>(b) / (1 << 30));
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_offload_step: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--params") o.params = std::atof(next());
    else if (a == "--layers") o.layers = std::atoi(next());
    else if (a == "--steps") o.steps = std::atoi(next());
    else if (a == "--lr") o.lr = std::atof(next());
    else if (a == "--dir") o.dir = next();
    else if (a == "--threads") o.threads = std::atoi(next());
    else if (a == "--no-torch") o.torch = false;
    else if (a == "--no-deepspeed") o.deepspeed = false;
    else {
      std::fprintf(stderr,
                   "usage: bench_offload_step [--params 32e6] [--layers 8] [--steps 5] [--lr 1e-3] "
                   "[--dir /var/tmp] [--threads 0] [--no-torch] [--no-deepspeed]\n");
      return 2;
    }
  }
  if (o.layers < 1 || o.steps < 1 || o.params < o.layers) {
    std::fprintf(stderr, "bench_offload_step: --params, --layers and --steps must be positive\n");
    return 2;
  }
  if (!(o.lr > 0.0 && std::isfinite(o.lr))) {  // the job refuses lr 0
    std::fprintf(stderr, "bench_offload_step: --lr must be a finite number above 0\n");
    return 2;
  }
  char tmpl[4096];
  std::snprintf(tmpl, sizeof tmpl, "%s/zerod-offload-bench-XXXXXX", o.dir.c_str());
  if (!mkdtemp(tmpl)) {
    std::fprintf(stderr, "bench_offload_step: cannot make a folder in %s: %s\n", o.dir.c_str(),
                 std::strerror(errno));
    return 1;
  }
  const std::string store = tmpl;
  const auto n = static_cast<uint64_t>(o.params) / static_cast<uint64_t>(o.layers) * static_cast<uint64_t>(o.layers);
  std::printf("bench_offload_step: %llu fp32 parameters in %d tensors, AdamW (lr %g), stage 0, one rank; "
              "median of %d steps after one warm-up\nNVMe store: %s\n\n",
              static_cast<unsigned long long>(n), o.layers, o.lr, o.steps, store.c_str());

  std::vector<Result> results;
  results.push_back(run("device pool", "", o));
  results.push_back(run("host", "{ optimizer = 'host' }", o));
  results.push_back(run("nvme", "{ optimizer = 'nvme', nvme_path = '" + store + "' }", o));
  results.push_back(run("nvme, ratio 0.5", "{ optimizer = 'nvme', ratio = 0.5, nvme_path = '" + store + "' }", o));
  // The whole update inside zd_step, for the comparison with torch's opt.step().
  results.push_back(run("host, overlap off", "{ optimizer = 'host', overlap = false }", o));
  results.push_back(run("nvme, overlap off", "{ optimizer = 'nvme', overlap = false, nvme_path = '" + store + "' }", o));
  rmdir(store.c_str());

  // The disk's limit: the optimizer state (master + 2 moments, 12 B/param)
  // is read and written once per step.
  const uint64_t state = n * 12;
  double fio_read = -1, fio_write = -1;
  std::string fio_note = zerod::bench::fio_missing();
  if (fio_note.empty()) {
    zerod::bench::Settings s;
    s.dir = o.dir;
    s.size = std::min<uint64_t>(state, uint64_t{4} << 30) / (1 << 20) * (1 << 20);
    zerod::bench::FioRun fio(s);
    fio_write = fio.write();
    fio_read = fio_write > 0 ? fio.read() : -1;
    if (fio_read < 0) fio_note = fio.error();
  }
  const TorchFigure torch = o.torch ? torch_step(o) : TorchFigure{};
  const DeepSpeedFigure ds = o.deepspeed ? deepspeed_step(o) : DeepSpeedFigure{};

  const double base = results[0].step_ms;
  std::printf("%-17s %10s %12s %10s %10s %10s %10s\n", "optimizer state", "step ms", "zd_step ms", "vs device",
              "device", "host", "nvme");
  for (const Result& r : results)
    std::printf("%-17s %10.1f %12.1f %9.2fx %10s %10s %10s\n", r.name.c_str(), r.step_ms, r.optimizer_ms,
                r.step_ms / base, gib(r.bytes[0]).c_str(), gib(r.bytes[1]).c_str(), gib(r.bytes[2]).c_str());

  std::printf("\nlimits and peer, same run:\n");
  if (fio_read > 0) {
    const double disk_ms = (static_cast<double>(state) / fio_read + static_cast<double>(state) / fio_write) * 1e3;
    const double bound = std::max(disk_ms, results[0].step_ms);
    std::printf("  fio (libaio, O_DIRECT, 1 MiB blocks, qd 8): read %.2f GB/s, write %.2f GB/s\n", fio_read / 1e9,
                fio_write / 1e9);
    std::printf("  disk time to read and write %s of state: %.1f ms; bound max(disk, in-RAM step) = %.1f ms\n",
                gib(state).c_str(), disk_ms, bound);
    std::printf("  nvme step / bound: %.2fx (1.00x = disk and CPU fully overlapped at the disk's speed)\n",
                results[2].step_ms / bound);
  } else {
    std::printf("  fio: not measured (%s)\n", fio_note.c_str());
  }
  if (torch.ms > 0)
    std::printf("  torch.optim.AdamW (%s; torch %s, %s), same parameters in RAM: %.1f ms per step\n"
                "  zd_step with offload.overlap off (the whole update inside the call, as in opt.step()) over "
                "torch's: host %.2fx, nvme %.2fx\n",
                torch.variant.c_str(), torch.version.c_str(), torch.python.c_str(), torch.ms,
                results[4].optimizer_ms / torch.ms, results[5].optimizer_ms / torch.ms);
  else if (o.torch)
    std::printf("  torch.optim.AdamW: not measured (%s: %s)\n", torch.python.c_str(), torch.error.c_str());
  if (ds.ms > 0)
    std::printf("  DeepSpeedCPUAdam (%s), same parameters in RAM: %.1f ms per step\n"
                "  zd_step with offload.overlap off over DeepSpeed's: host %.2fx, nvme %.2fx\n",
                ds.version.c_str(), ds.ms, results[4].optimizer_ms / ds.ms, results[5].optimizer_ms / ds.ms);
  else if (o.deepspeed)
    std::printf("  DeepSpeedCPUAdam: not measured (%s)\n", ds.error.c_str());

  const bool same = identical_everywhere(results);
  const bool moved = all_moved(results, initial_values(static_cast<size_t>(n) / static_cast<size_t>(o.layers)));
  std::printf("\nparameters after %d steps identical in every placement: %s\n", o.steps + 1, same ? "yes" : "NO");
  std::printf("parameters after %d steps moved from their initial values: %s\n", o.steps + 1, moved ? "yes" : "NO");
  return same && moved ? 0 : 1;
}
