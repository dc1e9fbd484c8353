// The one CPU-feature probe (zerod/kit/cpu.h): its answers against the
// kernel's own list (/proc/cpuinfo), and every user of it picking its path
// from the same answers (the engine's gradient sums, the optimizer kernels,
// the comm reduction).
#include <gtest/gtest.h>
#include <zerod/kit/cpu.h>
#include <zerod/optim/kernels.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "grad/grad_math.h"  // engine
#include "kernels.h"    // plugins/comm/local

namespace zerod {
namespace {

// The flags of the first processor in /proc/cpuinfo; empty where there is none.
std::set<std::string> cpuinfo_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string w; words >> w;) flags.insert(w);
    return flags;
  }
  return {};
}

TEST(CpuProbe, AgreesWithTheKernelsFlags) {
#if ZEROD_KIT_CPU_X86
  const std::set<std::string> flags = cpuinfo_flags();
  if (flags.empty()) GTEST_SKIP() << "no flags line in /proc/cpuinfo to compare with";
  const cpu::Features& f = cpu::features();
  EXPECT_EQ(f.sse42, flags.count("sse4_2") == 1);
  EXPECT_EQ(f.avx2, flags.count("avx2") == 1);
  EXPECT_EQ(f.fma, flags.count("fma") == 1);
  EXPECT_EQ(f.f16c, flags.count("f16c") == 1);
  EXPECT_EQ(f.avx512f, flags.count("avx512f") == 1);
  EXPECT_EQ(f.avx512bw, flags.count("avx512bw") == 1);
  EXPECT_EQ(f.avx512vl, flags.count("avx512vl") == 1);
#else
  const cpu::Features& f = cpu::features();
  EXPECT_FALSE(f.avx2 || f.fma || f.f16c || f.sse42 || f.avx512f) << "x86 features reported off x86";
#endif
}

TEST(CpuProbe, EveryUserPicksFromTheSameAnswers) {
  const cpu::Features& f = cpu::features();
  EXPECT_EQ(cpu::has_avx2_fma_f16c(), f.avx2 && f.fma && f.f16c);
  EXPECT_EQ(cpu::has_avx512_f_bw_vl(), cpu::has_avx2_fma_f16c() && f.avx512f && f.avx512bw && f.avx512vl);
  EXPECT_EQ(optim::isa_supported(optim::Isa::avx2), cpu::has_avx2_fma_f16c());
  EXPECT_EQ(optim::isa_supported(optim::Isa::avx512), cpu::has_avx512_f_bw_vl());
#if ZEROD_GRAD_MATH_X86
  EXPECT_EQ(detail::cpu_has_avx2_fma(), f.avx2 && f.fma);
#endif
#if ZEROD_COMM_X86
  EXPECT_EQ(comm::kernels::avx2_supported(), f.avx2 && f.f16c);
#endif
}

}  // namespace
}  // namespace zerod
