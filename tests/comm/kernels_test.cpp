// The reduction kernels called directly, each ISA path this CPU runs against
// the plain reference, with NaN, infinities, signed zeros, subnormals, and
// lengths around the tile size.
#include <kernels.h>

#include "comm_test_util.h"

namespace zerod::comm::test {
namespace {

using ReduceFn = void (*)(const ReduceJob&);

struct Path {
  const char* name;
  ReduceFn fn;
};

std::vector<Path> paths() {
  std::vector<Path> p = {{"baseline", kernels::base::reduce}};
#if ZEROD_COMM_X86
  if (kernels::avx2_supported()) p.push_back({"avx2", kernels::avx2::reduce});
#endif
  return p;
}

Dtype to_dtype(zd_comm_dtype dt) {
  return dt == ZD_COMM_F32 ? Dtype::f32 : dt == ZD_COMM_BF16 ? Dtype::bf16 : dt == ZD_COMM_F16 ? Dtype::f16 : Dtype::f64;
}

TEST(Kernels, EveryPathMatchesTheReference) {
  const size_t counts[] = {1, 7, 8, 9, 2047, 2048, 2049, 5000};
  for (const Path& path : paths()) {
    for (zd_comm_dtype dt : {ZD_COMM_F32, ZD_COMM_BF16, ZD_COMM_F16, ZD_COMM_F64}) {
      for (zd_reduce_op op : {ZD_REDUCE_SUM, ZD_REDUCE_MAX}) {
        for (size_t count : counts) {
          for (int nsrc = 1; nsrc <= 5; nsrc += 2) {
            std::vector<Buffer> src;
            std::vector<const Buffer*> refs;
            for (int k = 0; k < nsrc; ++k) src.push_back(random_buffer(dt, count, count * 31 + k, true));
            for (const auto& b : src) refs.push_back(&b);
            Buffer want(dt, count);
            reference_reduce(op, refs, 0, count, &want, 0);
            // Destinations: a separate buffer and, in place, the first source.
            Buffer out(dt, count);
            std::vector<const void*> srcs;
            for (auto& b : src) srcs.push_back(b.data());
            void* dsts[] = {out.data(), src[0].data()};
            ReduceJob job;
            job.srcs = srcs.data();
            job.nsrc = nsrc;
            job.dsts = dsts;
            job.ndst = 2;
            job.count = count;
            job.dtype = to_dtype(dt);
            job.op = op == ZD_REDUCE_SUM ? Reduce::sum : Reduce::max;
            // Non-temporal stores must write the same bits.
            job.stream = nsrc == 3;
            path.fn(job);
            // One source: a copy, except that 16-bit NaNs come out in their
            // rounded form; compare with the reference all the same.
            EXPECT_TRUE(same_values(want, out)) << path.name << " " << name_of(dt) << " op " << op << " count "
                                                << count << " nsrc " << nsrc;
            EXPECT_EQ(out.bytes, src[0].bytes) << path.name << ": every destination gets the same bits";
          }
        }
      }
    }
  }
}

TEST(Kernels, DispatchNamesItsPath) {
  const std::string isa = kernel_isa();
  EXPECT_TRUE(isa == "avx2" || isa == "baseline") << isa;
}

}  // namespace
}  // namespace zerod::comm::test
