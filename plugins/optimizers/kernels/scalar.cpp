// The scalar reference kernels, also the fallback on CPUs without AVX2.
#include "element.h"

namespace zerod::optim {

bool adam_scalar(const AdamParams& hp, const Range& r, const AdamState& s) {
  const detail::AdamConsts c = detail::prepare_adam(hp);
  return detail::with_state(s, [&]<detail::St S>() {
    return detail::with_types(r, [&]<Dtype G, detail::Work W>() { detail::adam_loop<G, W, S>(c, r, s, 0); });
  });
}

bool sgd_scalar(const SgdParams& hp, const Range& r, float* momentum_buffer) {
  const detail::SgdConsts c = detail::prepare_sgd(hp);
  return detail::with_types(
      r, [&]<Dtype G, detail::Work W>() { detail::sgd_loop<G, W>(c, r, momentum_buffer, 0); });
}

}  // namespace zerod::optim
