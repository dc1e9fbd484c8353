// Plain references of the compressing optimizers, written from the published
// algorithms as docs/onebit.md states them for zerod (1-bit Adam, DeepSpeed's
// OnebitAdam; 0/1 Adam, Lu et al. 2022 / DeepSpeed's ZeroOneAdam; 1-bit
// LAMB, Li et al. 2021 / DeepSpeed's OnebitLamb): W ranks on one thread,
// every rank's state kept separately, the 1-bit average from
// tests/comm/onebit_reference.h. fp32 element arithmetic with the fused
// multiply-adds the documented equations have, norms and sums in double in
// element order (what stage 0 does; the stages that split a tensor across
// owners sum its parts in rank order, so they agree to rounding).
#pragma once

#include "../comm/onebit_reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

namespace zerod_test::ref {

using zerod::comm::test::OnebitRank;
using zerod::comm::test::onebit_reference;
using zerod::comm::test::ref_chunk;

// The problem: tensors, initial values, each rank's gradients.
struct Problem {
  std::vector<uint64_t> sizes;
  std::function<float(size_t tensor, uint64_t i)> init;
  std::function<float(int rank, int step, size_t tensor, uint64_t i)> grad;  // step 0-based
  int world = 2;
  int steps = 8;
  double lr = 1e-2;
};

struct Hyper {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, wd = 0.0;
};

// One rank's copy of a tensor's state.
struct TensorState {
  std::vector<float> p, m, v, x;  // x: u (0/1 Adam) or v_fresh (1-bit LAMB)
};

using Weights = std::vector<std::vector<float>>;  // rank 0's parameters, per tensor

inline std::vector<TensorState> init_state(const Problem& pr) {
  std::vector<TensorState> s(pr.sizes.size());
  for (size_t k = 0; k < s.size(); ++k) {
    const uint64_t n = pr.sizes[k];
    s[k].p.resize(n);
    for (uint64_t i = 0; i < n; ++i) s[k].p[i] = pr.init(k, i);
    s[k].m.assign(n, 0.0f);
    s[k].v.assign(n, 0.0f);
    s[k].x.assign(n, 0.0f);
  }
  return s;
}

// The averaged gradient as the engine forms it: each rank's pre-divided by
// W, summed in rank order.
inline float averaged(const Problem& pr, int step, size_t k, uint64_t i) {
  float g = 0.0f;
  for (int r = 0; r < pr.world; ++r) g += pr.grad(r, step, k, i) * (1.0f / static_cast<float>(pr.world));
  return g;
}

// Per-tensor 1-bit exchange state of every rank.
struct Exchanges {
  std::vector<std::vector<OnebitRank>> per_tensor;  // [tensor][rank]
  std::vector<OnebitRank> fused;                    // [rank], all tensors packed
  Exchanges(const Problem& pr) : per_tensor(pr.sizes.size()), fused(static_cast<size_t>(pr.world)) {
    uint64_t total = 0;
    for (size_t k = 0; k < pr.sizes.size(); ++k) {
      per_tensor[k].resize(static_cast<size_t>(pr.world));
      for (OnebitRank& r : per_tensor[k]) {
        r.worker_error.assign(pr.sizes[k], 0.0f);
        r.server_error.assign(ref_chunk(pr.sizes[k], pr.world), 0.0f);
      }
      total += pr.sizes[k];
    }
    for (OnebitRank& r : fused) {
      r.worker_error.assign(total, 0.0f);
      r.server_error.assign(ref_chunk(total, pr.world), 0.0f);
    }
  }
  void reset() {
    for (auto& t : per_tensor)
      for (OnebitRank& r : t) {
        std::fill(r.worker_error.begin(), r.worker_error.end(), 0.0f);
        std::fill(r.server_error.begin(), r.server_error.end(), 0.0f);
      }
  }
  // x[r]: rank r's values of tensor k; on return each holds the average.
  void average(size_t k, std::vector<std::vector<float>>& x) {
    auto& ranks = per_tensor[k];
    for (size_t r = 0; r < ranks.size(); ++r) ranks[r].buf = x[r];
    onebit_reference(ranks, x[0].size());
    for (size_t r = 0; r < ranks.size(); ++r) x[r] = ranks[r].buf;
  }
};

inline float update_of(const Hyper& h, float m, float d, float p) {
  const float u = m / d;
  return h.wd != 0.0 ? std::fma(static_cast<float>(h.wd), p, u) : u;
}

inline float denom(const Hyper& h, float v) { return std::sqrt(v) + static_cast<float>(h.eps); }

// ---------------------------------------------------------------------------
// 1-bit Adam: warm-up Adam (no bias correction) for steps <= freeze, then
// each rank's local momentum is averaged 1-bit and v is frozen.
inline Weights onebit_adam(const Problem& pr, const Hyper& h, int freeze) {
  auto s = init_state(pr);
  Exchanges ex(pr);
  const float b1 = static_cast<float>(h.beta1), b2 = static_cast<float>(h.beta2);
  const float omb1 = static_cast<float>(1.0 - h.beta1), omb2 = static_cast<float>(1.0 - h.beta2);
  const float neg_lr = static_cast<float>(-pr.lr);
  for (int step = 0; step < pr.steps; ++step) {
    const int t = step + 1;
    for (size_t k = 0; k < s.size(); ++k) {
      TensorState& st = s[k];
      const uint64_t n = pr.sizes[k];
      if (t <= freeze) {
        for (uint64_t i = 0; i < n; ++i) {
          const float g = averaged(pr, step, k, i);
          st.m[i] = std::fma(omb1, g, b1 * st.m[i]);
          st.v[i] = std::fma(omb2, g * g, b2 * st.v[i]);
        }
      } else {
        std::vector<std::vector<float>> x(static_cast<size_t>(pr.world), std::vector<float>(n));
        for (int r = 0; r < pr.world; ++r)
          for (uint64_t i = 0; i < n; ++i) x[r][i] = std::fma(omb1, pr.grad(r, step, k, i), b1 * st.m[i]);
        ex.average(k, x);
        st.m = x[0];
      }
      for (uint64_t i = 0; i < n; ++i)
        st.p[i] = std::fma(neg_lr, update_of(h, st.m[i], denom(h, st.v[i]), st.p[i]), st.p[i]);
    }
  }
  Weights w;
  for (const TensorState& st : s) w.push_back(st.p);
  return w;
}

// ---------------------------------------------------------------------------
// 0/1 Adam. variance(t) and sync(t) are the schedules (1-based update t);
// local steps after var_freeze when `local` (each rank keeps its own p, m,
// u), else a 1-bit momentum sync every step with v frozen (1-bit Adam's
// compressed step). The error feedback restarts when v freezes.
struct ZeroOneSchedule {
  std::function<bool(int64_t)> variance;
  std::function<bool(int64_t)> sync;
  int64_t var_freeze = 0;
  bool local = true;
};

inline Weights zero_one_adam(const Problem& pr, const Hyper& h, const ZeroOneSchedule& sc) {
  // Every rank's own copy (they differ only in local steps).
  std::vector<std::vector<TensorState>> s(static_cast<size_t>(pr.world), init_state(pr));
  Exchanges ex(pr);
  const float b1 = static_cast<float>(h.beta1), b2 = static_cast<float>(h.beta2);
  const float omb1 = static_cast<float>(1.0 - h.beta1), omb2 = static_cast<float>(1.0 - h.beta2);
  const float neg_lr = static_cast<float>(-pr.lr);
  float lrs = 0.0f;
  const size_t W = static_cast<size_t>(pr.world);
  for (int step = 0; step < pr.steps; ++step) {
    const int64_t t = step + 1;
    const bool frozen = t > sc.var_freeze;
    if (frozen && sc.local) {
      if (t == sc.var_freeze + 1) ex.reset();
      lrs += static_cast<float>(pr.lr);
      const bool syncs = sc.sync(t);
      for (size_t k = 0; k < pr.sizes.size(); ++k) {
        const uint64_t n = pr.sizes[k];
        std::vector<std::vector<float>> x(W, std::vector<float>(n));
        for (size_t r = 0; r < W; ++r) {
          TensorState& st = s[r][k];
          for (uint64_t i = 0; i < n; ++i) {
            const float m = std::fma(omb1, pr.grad(static_cast<int>(r), step, k, i), b1 * st.m[i]);
            const float d = denom(h, st.v[i]);
            const float upd = update_of(h, m, d, st.p[i]);
            const float p = std::fma(neg_lr, upd, st.p[i]);
            const float u = std::fma(neg_lr, upd, st.x[i]);
            st.m[i] = m;
            st.x[i] = u;
            st.p[i] = p;
            if (syncs) {
              st.p[i] = p - u;
              x[r][i] = u * d;
            }
          }
        }
        if (!syncs) continue;
        ex.average(k, x);
        for (size_t r = 0; r < W; ++r) {
          TensorState& st = s[r][k];
          for (uint64_t i = 0; i < n; ++i) {
            const float a = x[r][i];
            st.p[i] = st.p[i] + a / denom(h, st.v[i]);
            st.m[i] = -(a / lrs);
            st.x[i] = 0.0f;
          }
        }
      }
      if (syncs) lrs = 0.0f;
      continue;
    }
    if (frozen) {
      if (t == sc.var_freeze + 1) ex.reset();
      for (size_t k = 0; k < pr.sizes.size(); ++k) {
        const uint64_t n = pr.sizes[k];
        std::vector<std::vector<float>> x(W, std::vector<float>(n));
        for (size_t r = 0; r < W; ++r)
          for (uint64_t i = 0; i < n; ++i)
            x[r][i] = std::fma(omb1, pr.grad(static_cast<int>(r), step, k, i), b1 * s[r][k].m[i]);
        ex.average(k, x);
        for (size_t r = 0; r < W; ++r) {
          TensorState& st = s[r][k];
          st.m = x[r];
          for (uint64_t i = 0; i < n; ++i)
            st.p[i] = std::fma(neg_lr, update_of(h, st.m[i], denom(h, st.v[i]), st.p[i]), st.p[i]);
        }
      }
      continue;
    }
    const bool variance = !frozen && sc.variance(t);
    for (size_t k = 0; k < pr.sizes.size(); ++k) {
      const uint64_t n = pr.sizes[k];
      std::vector<float> g(n);
      if (variance) {
        for (uint64_t i = 0; i < n; ++i) g[i] = averaged(pr, step, k, i);
      } else {
        std::vector<std::vector<float>> x(W, std::vector<float>(n));
        for (size_t r = 0; r < W; ++r)
          for (uint64_t i = 0; i < n; ++i) x[r][i] = pr.grad(static_cast<int>(r), step, k, i);
        ex.average(k, x);
        g = x[0];
      }
      for (size_t r = 0; r < W; ++r) {
        TensorState& st = s[r][k];
        for (uint64_t i = 0; i < n; ++i) {
          st.m[i] = std::fma(omb1, g[i], b1 * st.m[i]);
          if (variance) st.v[i] = std::fma(omb2, g[i] * g[i], b2 * st.v[i]);
          st.p[i] = std::fma(neg_lr, update_of(h, st.m[i], denom(h, st.v[i]), st.p[i]), st.p[i]);
        }
      }
    }
  }
  Weights w;
  for (const TensorState& st : s[0]) w.push_back(st.p);
  return w;
}

// ---------------------------------------------------------------------------
// 1-bit LAMB.
struct LambHyper {
  double max_coeff = 10, min_coeff = 0.01, coeff_beta = 0.9, factor_max = 4, factor_min = 0.5, threshold = 0.1;
  int freeze = 3;
};

inline Weights onebit_lamb(const Problem& pr, const Hyper& h, const LambHyper& lh) {
  auto s = init_state(pr);  // x = v_fresh
  Exchanges ex(pr);
  const size_t T = pr.sizes.size();
  const size_t W = static_cast<size_t>(pr.world);
  const float b1 = static_cast<float>(h.beta1), b2 = static_cast<float>(h.beta2);
  const float omb1 = static_cast<float>(1.0 - h.beta1), omb2 = static_cast<float>(1.0 - h.beta2);
  const float eps = static_cast<float>(h.eps);
  std::vector<float> frozen(T, 0.0f), last(T, 0.0f), scale(T, 0.0f), coeff(T, 0.0f);
  auto scale_of = [&](size_t k) { return scale[k] > 0.0f ? scale[k] : 1.0f; };
  for (int step = 0; step < pr.steps; ++step) {
    const int t = step + 1;
    if (t <= lh.freeze) {
      std::vector<double> rms(T);
      double rms_sum = 0.0;
      for (size_t k = 0; k < T; ++k) {
        TensorState& st = s[k];
        double pp = 0, uu = 0, mm = 0;
        for (uint64_t i = 0; i < pr.sizes[k]; ++i) {
          const float g = averaged(pr, step, k, i);
          st.m[i] = std::fma(omb1, g, b1 * st.m[i]);
          st.v[i] = std::fma(omb2, g * g, b2 * st.v[i]);
          st.x[i] = st.v[i];
          const float upd = update_of(h, st.m[i], denom(h, st.v[i]), st.p[i]);
          pp += static_cast<double>(st.p[i]) * st.p[i];
          uu += static_cast<double>(upd) * upd;
          mm += static_cast<double>(st.m[i]) * st.m[i];
        }
        const double wn = std::sqrt(pp), un = std::sqrt(uu);
        double c = 1.0;
        if (wn != 0.0 && un != 0.0) c = std::min(lh.max_coeff, std::max(lh.min_coeff, wn / un));
        if (c != 1.0) frozen[k] = static_cast<float>(lh.coeff_beta * frozen[k] + (1.0 - lh.coeff_beta) * c);
        coeff[k] = static_cast<float>(c);
        rms[k] = std::sqrt(mm / static_cast<double>(pr.sizes[k]));
        rms_sum += rms[k];
      }
      const double united = rms_sum / static_cast<double>(T);
      for (size_t k = 0; k < T; ++k) scale[k] = rms[k] > 0.0 ? static_cast<float>(united / rms[k]) : 1.0f;
    } else {
      // Every rank's scaled local momentum, all tensors packed, one exchange.
      uint64_t total = 0;
      for (uint64_t n : pr.sizes) total += n;
      for (size_t r = 0; r < W; ++r) {
        ex.fused[r].buf.resize(total);
        uint64_t at = 0;
        for (size_t k = 0; k < T; ++k) {
          for (uint64_t i = 0; i < pr.sizes[k]; ++i)
            ex.fused[r].buf[at + i] =
                std::fma(omb1, pr.grad(static_cast<int>(r), step, k, i), b1 * s[k].m[i]) * scale_of(k);
          at += pr.sizes[k];
        }
      }
      onebit_reference(ex.fused, total);
      uint64_t at = 0;
      for (size_t k = 0; k < T; ++k) {
        TensorState& st = s[k];
        double uu = 0, pre = 0, ratio = 0;
        for (uint64_t i = 0; i < pr.sizes[k]; ++i) {
          const float m = ex.fused[0].buf[at + i] / scale_of(k);
          const float g = (m - st.m[i] * b1) / omb1;
          st.x[i] = std::fma(omb2, g * g, b2 * st.x[i]);
          const float d = denom(h, st.v[i]);
          const float u_pre = m / d;
          const float upd = h.wd != 0.0 ? std::fma(static_cast<float>(h.wd), st.p[i], u_pre) : u_pre;
          st.m[i] = m;
          uu += static_cast<double>(upd) * upd;
          pre += static_cast<double>(u_pre) * u_pre;
          ratio = std::max(ratio, static_cast<double>(d / (std::sqrt(st.x[i]) + eps)));
        }
        at += pr.sizes[k];
        double factor = ratio;
        if (h.wd > 0.0 && uu > 0.0) {
          const double ur = std::min(1.0, std::sqrt(pre) / std::sqrt(uu));
          factor = factor * ur + (1.0 - ur);
        }
        factor = std::min(lh.factor_max, std::max(lh.factor_min, factor));
        const double l = last[k] > 0.0f ? last[k] : 1.0;
        factor = std::min(l * (1.0 + lh.threshold), std::max(l * (1.0 - lh.threshold), factor));
        last[k] = static_cast<float>(factor);
        coeff[k] = static_cast<float>(frozen[k] * factor);
      }
    }
    for (size_t k = 0; k < T; ++k) {
      TensorState& st = s[k];
      const float neg = static_cast<float>(-pr.lr * static_cast<double>(coeff[k]));
      for (uint64_t i = 0; i < pr.sizes[k]; ++i)
        st.p[i] = std::fma(neg, update_of(h, st.m[i], denom(h, st.v[i]), st.p[i]), st.p[i]);
    }
  }
  Weights w;
  for (const TensorState& st : s) w.push_back(st.p);
  return w;
}

}  // namespace zerod_test::ref
