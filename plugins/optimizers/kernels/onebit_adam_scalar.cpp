// The scalar 1-bit Adam reference, also the fallback on CPUs without AVX2.
#include "onebit_adam_element.h"

namespace zerod::optim {

bool onebit_adam_scalar(const OnebitAdamParams& hp, OnebitPhase phase, const Range& r, const AdamState& s) {
  using detail::Work;
  const detail::OnebitConsts c = detail::prepare_onebit(hp);
  return detail::with_phase(
      phase, r, [&]<Dtype G, Work W>() { detail::onebit_warmup_loop<G, W>(c, r, s, 0); },
      [&]<Dtype G>() { detail::onebit_momentum_loop<G>(c, r, s, 0); },
      [&]<Work W>() { detail::onebit_frozen_loop<W>(c, r, s, 0); });
}

}  // namespace zerod::optim
