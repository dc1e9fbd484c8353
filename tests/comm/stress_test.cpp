// Back-to-back collectives with random ops, dtypes, counts, roots and
// in-place choices, every result checked right after the call returns: a
// rank returning while another still writes its buffer shows up as a wrong
// value here (and as a race under ThreadSanitizer).
#include <random>

#include "comm_test_util.h"

namespace zerod::comm::test {
namespace {

enum class Kind { all_reduce, reduce_scatter, all_gather, broadcast, barrier, all_to_all };

// One collective, the same on every rank (drawn from the shared seed).
struct Plan {
  Kind kind;
  zd_comm_dtype dtype;
  zd_reduce_op op;
  size_t count;
  int root;
  bool in_place;
};

Plan plan_of(uint64_t seed, int step, int world) {
  std::mt19937_64 rng(seed * 1000003u + static_cast<uint64_t>(step));
  const zd_comm_dtype dtypes[] = {ZD_COMM_F32, ZD_COMM_BF16, ZD_COMM_F16, ZD_COMM_F64};
  Plan p;
  p.kind = static_cast<Kind>(rng() % 6);
  p.dtype = dtypes[rng() % 4];
  // Bytes move but are not reduced.
  const bool copies = p.kind == Kind::all_gather || p.kind == Kind::broadcast || p.kind == Kind::all_to_all;
  if (copies && rng() % 4 == 0) p.dtype = ZD_COMM_U8;
  p.op = rng() % 2 ? ZD_REDUCE_SUM : ZD_REDUCE_MAX;
  p.count = rng() % 4 == 0 ? rng() % 5000 : rng() % 100;
  p.root = static_cast<int>(rng() % static_cast<uint64_t>(world));
  p.in_place = rng() % 2 == 0;
  return p;
}

// Rank r's input to the collective: what it holds before the call.
size_t input_count(const Plan& p, int world) {
  return p.kind == Kind::reduce_scatter || p.kind == Kind::all_to_all ? p.count * static_cast<size_t>(world) : p.count;
}

void stress(int world, double spin_us, int steps, uint64_t seed) {
  Comm comm(world, spin_us);
  std::vector<Buffer> input(world);
  on_ranks(world, [&](int r) {
    for (int step = 0; step < steps; ++step) {
      const Plan p = plan_of(seed, step, world);
      const size_t n = p.count;
      const size_t total = n * static_cast<size_t>(world);
      input[r] = random_buffer(p.dtype, input_count(p, world), seed ^ (static_cast<uint64_t>(step) << 8) ^ r, true);
      Buffer buf = input[r];
      Buffer out(p.dtype, p.kind == Kind::all_gather || p.kind == Kind::all_to_all ? total : n);
      const zd_comm_call c = call_for(r, static_cast<uint64_t>(step), "stress");
      const zd_comm_v2& d = comm.d();
      zd_status st = ZD_OK;
      switch (p.kind) {
        case Kind::all_reduce: st = d.all_reduce(comm.inst(), &c, buf.data(), n, p.dtype, p.op); break;
        case Kind::reduce_scatter:
          st = d.reduce_scatter(comm.inst(), &c, buf.data(), p.in_place ? buf.at(r * n) : out.data(), n, p.dtype, p.op);
          if (p.in_place && n > 0) std::memcpy(out.data(), buf.at(r * n), n * size_of(p.dtype));
          break;
        case Kind::all_gather:
          if (p.in_place && n > 0) std::memcpy(out.at(r * n), buf.data(), n * size_of(p.dtype));
          st = d.all_gather(comm.inst(), &c, p.in_place ? out.at(r * n) : buf.data(), out.data(), n, p.dtype);
          break;
        case Kind::broadcast: st = d.broadcast(comm.inst(), &c, buf.data(), n, p.dtype, p.root); break;
        case Kind::barrier: st = d.barrier(comm.inst(), &c); break;
        case Kind::all_to_all: st = d.all_to_all(comm.inst(), &c, buf.data(), out.data(), n, p.dtype); break;
      }
      ASSERT_EQ(st, ZD_OK) << "step " << step << ": " << comm.error(r);

      // Checked against every rank's input, which stays put until the
      // barrier below.
      std::vector<const Buffer*> all;
      for (const auto& b : input) all.push_back(&b);
      Buffer want(p.dtype, 0);
      switch (p.kind) {
        case Kind::all_reduce:
          want = Buffer(p.dtype, n);
          reference_reduce(p.op, all, 0, n, &want, 0);
          EXPECT_TRUE(same_values(want, buf)) << "step " << step << ", rank " << r;
          break;
        case Kind::reduce_scatter:
          want = Buffer(p.dtype, n);
          reference_reduce(p.op, all, r * n, n, &want, 0);
          EXPECT_TRUE(same_values(want, out)) << "step " << step << ", rank " << r;
          break;
        case Kind::all_gather:
          want = Buffer(p.dtype, total);
          for (int k = 0; k < world && n > 0; ++k) std::memcpy(want.at(k * n), input[k].data(), n * size_of(p.dtype));
          EXPECT_EQ(want.bytes, out.bytes) << "step " << step << ", rank " << r;
          break;
        case Kind::broadcast: EXPECT_EQ(input[p.root].bytes, buf.bytes) << "step " << step << ", rank " << r; break;
        case Kind::barrier: break;
        case Kind::all_to_all:
          want = Buffer(p.dtype, total);
          for (int k = 0; k < world && n > 0; ++k) {
            std::memcpy(want.at(k * n), input[k].at(r * n), n * size_of(p.dtype));
          }
          EXPECT_EQ(want.bytes, out.bytes) << "step " << step << ", rank " << r;
          break;
      }
      const zd_comm_call next = call_for(r, ~0ull, "inputs may change");
      ASSERT_EQ(d.barrier(comm.inst(), &next), ZD_OK) << comm.error(r);
    }
  });
}

TEST(Stress, FourRanksTwoHundredRandomCollectives) { stress(4, 50.0, 200, 1); }

TEST(Stress, ThreeRanksSleepingAtOnce) { stress(3, 0.0, 200, 2); }

TEST(Stress, TwoRanksLongSpin) { stress(2, 2000.0, 200, 3); }

}  // namespace
}  // namespace zerod::comm::test
