// bench_nvme: sequential write then read of a store through the nvme tier
// plugin, against fio (libaio, O_DIRECT) with the same block size, queue
// depth and size, on the same file system; rounds interleave the two so
// both see the same machine. The target is >= 90% of fio.
//
//   bench_nvme [--dir /tmp] [--size 1GiB] [--block-size 1MiB] [--queue-depth 8] [--rounds 3]
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fio_run.h"
#include "tier_run.h"

namespace {

using zerod::bench::FioRun;
using zerod::bench::Settings;
using zerod::bench::TierRun;

// "1GiB", "512MiB", "64K", "4096": binary units.
bool parse_size(const char* text, uint64_t* out) {
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  if (end == text || v <= 0) return false;
  std::string unit = end;
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double scale = 1;
  if (unit == "k" || unit == "kib" || unit == "kb") scale = 1024.0;
  else if (unit == "m" || unit == "mib" || unit == "mb") scale = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib" || unit == "gb") scale = 1024.0 * 1024 * 1024;
  else if (!unit.empty() && unit != "b") return false;
  *out = static_cast<uint64_t>(v * scale);
  return true;
}

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--dir /tmp] [--size 1GiB] [--block-size 1MiB] [--queue-depth 8] [--rounds 3]\n", argv0);
  return 2;
}

struct Figures {
  std::vector<double> write, read;
};

double lowest(const std::vector<double>& v) { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }
double best(const std::vector<double>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

std::string cell(const std::vector<double>& v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%5.2f [%4.2f-%4.2f]", median(v) / 1e9, lowest(v) / 1e9, best(v) / 1e9);
  return buf;
}

std::string human(uint64_t bytes) {
  char buf[32];
  if (bytes % (uint64_t{1} << 30) == 0) std::snprintf(buf, sizeof buf, "%lluGiB", static_cast<unsigned long long>(bytes >> 30));
  else if (bytes % (uint64_t{1} << 20) == 0) std::snprintf(buf, sizeof buf, "%lluMiB", static_cast<unsigned long long>(bytes >> 20));
  else if (bytes % 1024 == 0) std::snprintf(buf, sizeof buf, "%lluKiB", static_cast<unsigned long long>(bytes >> 10));
  else std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(bytes));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  int rounds = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage(argv[0]);
    const char* v = argv[++i];
    if (a == "--dir") s.dir = v;
    else if (a == "--size" && parse_size(v, &s.size)) {}
    else if (a == "--block-size" && parse_size(v, &s.block_size)) {}
    else if (a == "--queue-depth" && std::atoi(v) > 0) s.queue_depth = static_cast<uint64_t>(std::atoi(v));
    else if (a == "--rounds" && std::atoi(v) > 0) rounds = std::atoi(v);
    else return usage(argv[0]);
  }
  s.size = s.size / s.block_size * s.block_size;  // whole blocks, as fio does them
  if (s.size == 0) {
    std::fprintf(stderr, "bench_nvme: --size must be at least one block\n");
    return 2;
  }

  TierRun ours(ZEROD_BENCH_PLUGIN_DIR, s);
  if (!ours.ok()) {
    std::fprintf(stderr, "bench_nvme: the nvme tier: %s\n", ours.error().c_str());
    return 1;
  }
  const std::string missing = zerod::bench::fio_missing();
  std::printf("bench_nvme: %s in %s, block %s, queue depth %llu, sequential, O_DIRECT; %d rounds\n",
              human(s.size).c_str(), s.dir.c_str(), human(s.block_size).c_str(),
              static_cast<unsigned long long>(s.queue_depth), rounds);
  std::printf("  %s\n", ours.describe().c_str());
  if (!missing.empty()) std::printf("  %s: printing zerod's figures only\n", missing.c_str());

  Figures tier, fio;
  FioRun f(s);
  bool fio_ok = missing.empty();
  for (int r = 0; r < rounds; ++r) {
    // Interleaved, so a noisy neighbour hits both alike.
    const double w = ours.write();
    double fw = fio_ok ? f.write() : 0;
    const double rd = ours.read();
    double fr = fio_ok ? f.read() : 0;
    if (w < 0 || rd < 0) {
      std::fprintf(stderr, "bench_nvme: the nvme tier: %s\n", ours.error().c_str());
      return 1;
    }
    if (r == 0 && !ours.verify()) {
      std::fprintf(stderr, "bench_nvme: the nvme tier read back different bytes than it wrote\n");
      return 1;
    }
    if (fio_ok && (fw < 0 || fr < 0)) {
      std::printf("  %s: printing zerod's figures only\n", f.error().c_str());
      fio_ok = false;
    }
    tier.write.push_back(w);
    tier.read.push_back(rd);
    if (fio_ok) {
      fio.write.push_back(fw);
      fio.read.push_back(fr);
    }
  }

  // Medians: a virtual disk's host cache makes single runs jump.
  std::printf("\n  GB/s, median [min-max] of %d   write                read\n", rounds);
  std::printf("  zerod nvme (libaio)          %s   %s\n", cell(tier.write).c_str(), cell(tier.read).c_str());
  if (fio_ok) {
    std::printf("  fio (libaio, direct=1)       %s   %s\n", cell(fio.write).c_str(), cell(fio.read).c_str());
    std::printf("  ours/fio, medians            %5.0f%%               %5.0f%%\n",
                100 * median(tier.write) / median(fio.write), 100 * median(tier.read) / median(fio.read));
  }
  return 0;
}
