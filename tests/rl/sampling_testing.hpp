// tests/rl/sampling_testing.hpp — shared by sampling.test.cpp and its CUDA twin: how close a coin
// lies to a CDF boundary of a row, in sample_row's arithmetic, so a test can allow a sampler whose
// sums run in another order to draw the neighbouring token there and only there.
#pragma once

#include "support/checks.hpp"
#include <weft/rl/sampling.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

namespace weft::test {

//! min over v of |coin · S − Σ_{w <= v} e^{x_w − m}| / S for row z at inverse temperature inv_tau
//! (x = z · inv_tau, m its max, S the row's sum), in token order as rl::detail::sample_row sums.
template <class T>
double boundary_distance(T const* z, index_t vocab, double inv_tau, double coin) {
  auto const x = [&](index_t v) { return rl::detail::logit_as_double(z[v]) * inv_tau; };
  double mx = -inf, sum = 0, cum = 0, best = inf;
  for (index_t v = 0; v < vocab; ++v) mx = std::max(mx, x(v));
  for (index_t v = 0; v < vocab; ++v) sum += std::exp(x(v) - mx);
  for (index_t v = 0; v < vocab; ++v) {
    cum += std::exp(x(v) - mx);
    best = std::min(best, std::abs(coin * sum - cum) / sum);
  }
  return best;
}

}  // namespace weft::test
