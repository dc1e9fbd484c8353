// One rank of bench/onebit: a model of --params parameters in --layers
// tensors whose gradients are made up (each rank its own), trained for
// --steps steps under the job zerod run gives it. The working copies are
// fp32, or bf16 with --dtype bf16 (the job then says precision = "bf16").
// Rank 0 prints, for the steps after --skip, the median and the mean step
// time and the bytes each step put on links and on the network
// (zd_model_comm_figures), one line per figure:
//   onebit_rank: step_ms 123.4
//   onebit_rank: mean_step_ms 130.2
//   onebit_rank: bytes_per_step 5000000
//   onebit_rank: network_bytes_per_step 2500000
//   onebit_rank: checksum 0.1234
// (with --step-times 1 also every measured step's time, in order:
//   onebit_rank: step_times 120.1 118.7 ...)
// and every rank the CPUs it may run on (mpirun binds by default; the bench
// shows that zerod run undid it):
//   onebit_rank: rank 1 cpus 0-1
#include <zerod/zerod.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

[[noreturn]] void die(const char* what, zd_model* m) {
  std::fprintf(stderr, "onebit_rank: %s failed: %s\n", what, m ? zd_model_last_error(m) : zd_last_error());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  double params = 25e6;
  int layers = 8, steps = 12, skip = 4;
  bool bf16 = false, step_times = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--params") params = std::atof(argv[i + 1]);
    else if (a == "--layers") layers = std::atoi(argv[i + 1]);
    else if (a == "--steps") steps = std::atoi(argv[i + 1]);
    else if (a == "--skip") skip = std::atoi(argv[i + 1]);
    else if (a == "--dtype") bf16 = std::string(argv[i + 1]) == "bf16";
    else if (a == "--step-times") step_times = std::atoi(argv[i + 1]) != 0;
  }
  zd_client* c = nullptr;
  if (zd_connect(nullptr, nullptr, &c)) die("zd_connect", nullptr);
  zd_client_info info = ZD_CLIENT_INFO_INIT;
  zd_client_get_info(c, &info);
  zd_model* m = nullptr;
  const zd_model_options o = ZD_MODEL_OPTIONS_INIT;  // the job `zerod run --job` names (ZEROD_JOB)
  if (zd_model_create(c, &o, &m)) die("zd_model_create", nullptr);
  const auto per = static_cast<int64_t>(params / layers);
  std::vector<float> init(static_cast<size_t>(per));
  for (size_t i = 0; i < init.size(); ++i) init[i] = 0.01f * std::sin(static_cast<float>(i));
  std::vector<zd_param_id> ids;
  for (int l = 0; l < layers; ++l) {
    const std::string name = "w" + std::to_string(l), mod = "layer" + std::to_string(l);
    zd_param_desc d = ZD_PARAM_DESC_INIT;
    d.name = name.c_str();
    d.module = mod.c_str();
    d.ndim = 1;
    d.shape = &per;
    d.init = init.data();
    d.dtype = bf16 ? ZD_DTYPE_BF16 : ZD_DTYPE_F32;
    d.init_dtype = ZD_DTYPE_F32;
    zd_param_id id;
    if (zd_model_register_param(m, &d, &id)) die("register", m);
    ids.push_back(id);
  }
  if (zd_model_finalize(m)) die("finalize", m);
  std::vector<float> grad(init.size());
  std::vector<uint16_t> grad16(bf16 ? init.size() : 0);
  std::vector<double> ms;
  zd_comm_figures before = ZD_COMM_FIGURES_INIT, after = ZD_COMM_FIGURES_INIT;
  for (int s = 0; s < steps; ++s) {
    if (s == skip && zd_model_comm_figures(m, -1, &before)) die("comm figures", m);
    for (size_t i = 0; i < grad.size(); ++i)
      grad[i] = 1e-3f * std::cos(static_cast<float>(i % 977) + 0.37f * static_cast<float>(s + 3 * info.rank));
    for (size_t i = 0; i < grad16.size(); ++i) {  // round to nearest even (no NaNs here)
      uint32_t u;
      std::memcpy(&u, &grad[i], 4);
      grad16[i] = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (int l = layers; l-- > 0;) {
      if (zd_backward_begin(m, l)) die("backward_begin", m);
      zd_view g = ZD_VIEW_INIT;
      if (zd_grad_view(m, ids[static_cast<size_t>(l)], &g)) die("grad_view", m);
      if (g.nbytes == grad16.size() * 2) {  // 16-bit gradients beside 16-bit working copies
        std::memcpy(g.data, grad16.data(), g.nbytes);
      } else {
        std::memcpy(g.data, grad.data(), g.nbytes);
      }
      if (zd_backward_end(m, l)) die("backward_end", m);
    }
    if (zd_step(m, nullptr)) die("zd_step", m);
    const auto t1 = std::chrono::steady_clock::now();
    if (s >= skip) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  if (zd_model_comm_figures(m, -1, &after)) die("comm figures", m);
  std::vector<float> w(init.size());
  double sum = 0;
  for (zd_param_id id : ids) {
    if (zd_param_read(m, id, ZD_DTYPE_F32, w.data(), w.size() * 4)) die("param_read", m);
    for (float x : w) sum += x;
  }
  {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line))
      if (line.rfind("Cpus_allowed_list:", 0) == 0)
        std::printf("onebit_rank: rank %d cpus %s\n", info.rank, line.substr(line.find_first_not_of(" \t", 18)).c_str());
  }
  if (info.rank == 0) {
    if (step_times) {  // every measured step, in order (bench/checkpoint/bench_snapshots.sh)
      std::printf("onebit_rank: step_times");
      for (double x : ms) std::printf(" %.2f", x);
      std::printf("\n");
    }
    std::sort(ms.begin(), ms.end());
    const double n = static_cast<double>(steps - skip);
    double total = 0;
    for (double x : ms) total += x;
    std::printf("onebit_rank: step_ms %.1f\n", ms.empty() ? 0.0 : ms[ms.size() / 2]);
    std::printf("onebit_rank: mean_step_ms %.1f\n", ms.empty() ? 0.0 : total / static_cast<double>(ms.size()));
    std::printf("onebit_rank: bytes_per_step %.0f\n", static_cast<double>(after.bytes_sent - before.bytes_sent) / n);
    std::printf("onebit_rank: network_bytes_per_step %.0f\n",
                static_cast<double>(after.network_bytes_sent - before.network_bytes_sent) / n);
    std::printf("onebit_rank: checksum %.6f\n", sum);
  }
  zd_model_destroy(m);
  zd_disconnect(c);
  return 0;
}
