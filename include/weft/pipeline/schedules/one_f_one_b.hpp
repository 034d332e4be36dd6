// weft/pipeline/schedules/one_f_one_b.hpp — non-interleaved 1F1B (Megatron-Core's
// forward_backward_pipelining_without_interleaving; PyTorch's Schedule1F1B) as a compute-only
// schedule: warmup forwards, one-forward-one-backward pairs, cooldown backwards.
#pragma once

#include <weft/core/error.hpp>                  // detail::concat
#include <weft/pipeline/detail/check.hpp>       // detail::require
#include <weft/pipeline/schedule.hpp>           // schedule, op
#include <weft/pipeline/schedules/options.hpp>  // generator_options

#include <algorithm>

namespace weft::pipeline {

//! 1F1B: rank r runs min(p-r-1, m) warmup forwards, then F/B pairs, then the remaining backwards.
//! Peak in-flight min(p-r, m). Rejects m < p (PyTorch; torchtitan#775 hung) unless unchecked.
inline schedule one_f_one_b(int p, int m, generator_options opt = {}) {
  detail::require(p >= 1, "p", ">= 1", p, "p >= 1");
  detail::require(m >= 1, "m", ">= 1", m, "m >= 1");
  if (!opt.unchecked)
    detail::require(m >= p, "m", ::weft::detail::concat(">= p (", p, ")"), m, "m >= p");
  schedule s(p, p, m);
  for (int r = 0; r < p; ++r) {
    int const warmup = std::min(p - r - 1, m);
    int const steady = m - warmup;
    for (int i = 0; i < warmup; ++i) s.push(r, s.make(op::forward, r, i));
    for (int i = 0; i < steady; ++i) {
      s.push(r, s.make(op::forward, r, warmup + i));
      s.push(r, s.make(op::backward, r, i));
    }
    for (int i = steady; i < m; ++i) s.push(r, s.make(op::backward, r, i));
  }
  return s;
}

}  // namespace weft::pipeline
