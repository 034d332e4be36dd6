// weft/pipeline/schedules/gpipe.hpp — GPipe (all forwards, then all backwards; PyTorch's
// ScheduleGPipe) and non-interleaved 1F1B (Megatron-Core's forward_backward_pipelining_without_
// interleaving), as compute-only schedules.
#pragma once

#include <weft/pipeline/detail/check.hpp>
#include <weft/pipeline/schedule.hpp>

#include <algorithm>

namespace weft::pipeline {

//! Options shared by the generators. `unchecked` skips the rules that Megatron and PyTorch apply
//! to a configuration (not the basic ones: positive sizes), so experiments and tests can build
//! what those systems reject.
struct generator_options {
  bool unchecked = false;
};

//! GPipe on p ranks: F(0..m-1) then B(0..m-1) on every stage. Peak in-flight m on every rank.
inline schedule gpipe(int p, int m) {
  detail::require(p >= 1, "p", ">= 1", p, "p >= 1");
  detail::require(m >= 1, "m", ">= 1", m, "m >= 1");
  schedule s(p, p, m);
  for (int r = 0; r < p; ++r) {
    for (int i = 0; i < m; ++i) s.push(r, s.make(op::forward, r, i));
    for (int i = 0; i < m; ++i) s.push(r, s.make(op::backward, r, i));
  }
  return s;
}

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
