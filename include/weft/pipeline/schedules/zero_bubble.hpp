// weft/pipeline/schedules/zero_bubble.hpp — the zero-bubble family with the backward split into
// I (input gradient) and W (weight gradient): ZB-H1 (1F1B memory, W deferred to fill the
// cooldown bubble), ZB-H2 (2p - 1 in flight, no bubble inside a rank's window) and ZBV (two
// chunks per rank in a V; PyTorch's ScheduleZBVZeroBubble order).
#pragma once

#include <weft/pipeline/detail/check.hpp>
#include <weft/pipeline/schedule.hpp>
#include <weft/pipeline/schedules/options.hpp>  // generator_options
#include <weft/pipeline/search/list_scheduler.hpp>

#include <algorithm>
#include <deque>

namespace weft::pipeline {

//! ZB-H1 on p ranks: rank r runs 1F1B's min(p-r-1, m) warmup forwards; each steady iteration
//! runs F then I, and from the r-th iteration on also W of the oldest microbatch whose I is done;
//! the cooldown runs I then the oldest pending W, and the last Ws close the schedule. Peak
//! in-flight (F minus W) is p on every rank; with F = I = W the makespan is
//! m(F+I+W) + (p-1)(F+I-W), a third of 1F1B's bubble. Rejects m < p unless unchecked.
inline schedule zero_bubble_h1(int p, int m, generator_options opt = {}) {
  detail::require(p >= 1, "p", ">= 1", p, "p >= 1");
  detail::require(m >= 1, "m", ">= 1", m, "m >= 1");
  if (!opt.unchecked)
    detail::require(m >= p, "m", ::weft::detail::concat(">= p (", p, ")"), m, "m >= p");
  schedule s(p, p, m);
  for (int r = 0; r < p; ++r) {
    int const warmup = std::min(p - r - 1, m);
    int const steady = m - warmup;
    int next_w = 0;
    for (int i = 0; i < warmup; ++i) s.push(r, s.make(op::forward, r, i));
    for (int k = 0; k < steady; ++k) {
      s.push(r, s.make(op::forward, r, warmup + k));
      s.push(r, s.make(op::backward_input, r, k));
      if (k >= r) s.push(r, s.make(op::backward_weight, r, next_w++));
    }
    for (int k = steady; k < m; ++k) {
      s.push(r, s.make(op::backward_input, r, k));
      s.push(r, s.make(op::backward_weight, r, next_w++));
    }
    while (next_w < m) s.push(r, s.make(op::backward_weight, r, next_w++));
  }
  return s;
}

//! ZB-H2 on p ranks (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR'24, §3: extra warm-up
//! forwards up to 2p - 1 in flight, the W passes moved to the tail so that the schedule is a
//! parallelogram). Built greedily in unit time (F = I = W) by search::list_schedule: each rank,
//! whenever it is free, runs its next I if its gradient has arrived, else its next F while fewer
//! than 2p - 1 microbatches are between F and W, else its oldest pending W. With F = I = W every
//! rank's busy window (first action to last) is exactly 3m when m >= 2p - 1: no bubble inside it
//! (tests/pipeline/zero_bubble.test.cpp checks p = 1..8). One step alone still takes 3m + p - 1,
//! as ZB-H1's; the gain is the period of repeated steps where each rank starts the next one as
//! it finishes (the paper's optimizer post-validation): 3m against ZB-H1's 3m + p - 1. Peak
//! in-flight is min(m, 2p - 1) on every rank, about twice 1F1B's. Rejects m < p unless unchecked.
inline schedule zero_bubble_h2(int p, int m, generator_options opt = {}) {
  detail::require(p >= 1, "p", ">= 1", p, "p >= 1");
  detail::require(m >= 1, "m", ">= 1", m, "m >= 1");
  if (!opt.unchecked)
    detail::require(m >= p, "m", ::weft::detail::concat(">= p (", p, ")"), m, "m >= p");
  cost_model unit;
  auto const P = static_cast<std::size_t>(p);
  unit.forward.assign(P, 1.0);
  unit.backward_input.assign(P, 1.0);
  unit.backward_weight.assign(P, 1.0);
  search::list_policy policy;
  policy.w = search::list_policy::w_mode::filler;
  policy.cap = search::list_policy::cap_mode::uniform;
  policy.extra = p - 1;  // 2p - 1 on every rank
  policy.backward_first = true;
  return search::list_schedule(p, m, unit, policy);
}

struct zbv_options {
  int chunks = 2;  //!< must be 2: ZBV is defined for exactly two chunks per rank
  bool unchecked = false;
};

//! ZBV on p ranks (2p stages in a V: rank r holds stages r and 2p-1-r), in the order of PyTorch's
//! ScheduleZBVZeroBubble: warmup 2(p-r)-1 x F0, r x (F1, F0), p-r x (F1, I1, W1); steady
//! (F0, I0, W0, F1, I1, W1) until every chunk-0 forward has run; cooldown r x (I0, I1),
//! p-r x (I0, W0), then the remaining W1 and W0. The order is built for max(2p-1, m)
//! microbatches and the ones beyond m dropped, as PyTorch does. With F = I = W every rank's busy
//! window is exactly 3m (m >= 2p-1); peak in-flight is p stage-microbatches (2p chunks).
inline schedule zero_bubble_v(int p, int m, zbv_options opt = {}) {
  detail::require(p >= 1, "p", ">= 1", p, "p >= 1");
  detail::require(m >= 1, "m", ">= 1", m, "m >= 1");
  detail::require(opt.chunks == 2, "chunks", 2, opt.chunks, "exactly two chunks per rank");
  int const n = std::max(2 * p - 1, m);
  schedule s(p, 2 * p, m, placement::v);
  for (int r = 0; r < p; ++r) {
    int const c0 = r, c1 = 2 * p - 1 - r;
    int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
    auto emit = [&](op k, int stage, int mb) {
      if (mb < m) s.push(r, s.make(k, stage, mb));
    };
    for (int i = 0; i < 2 * (p - r) - 1; ++i) emit(op::forward, c0, f0++);
    for (int i = 0; i < r; ++i) {
      emit(op::forward, c1, f1++);
      emit(op::forward, c0, f0++);
    }
    for (int i = 0; i < p - r; ++i) {
      emit(op::forward, c1, f1++);
      emit(op::backward_input, c1, b1);
      emit(op::backward_weight, c1, b1++);
    }
    while (f1 < f0 || f0 < n) {
      if (f0 < n) emit(op::forward, c0, f0++);
      emit(op::backward_input, c0, b0);
      emit(op::backward_weight, c0, b0++);
      emit(op::forward, c1, f1++);
      emit(op::backward_input, c1, b1);
      emit(op::backward_weight, c1, b1++);
    }
    int w0 = b0, w1 = b1;
    for (int i = 0; i < r; ++i) {
      emit(op::backward_input, c0, b0++);
      emit(op::backward_input, c1, b1++);
    }
    for (int i = 0; i < p - r; ++i) {
      emit(op::backward_input, c0, b0++);
      emit(op::backward_weight, c0, w0++);
    }
    while (w1 < b1) emit(op::backward_weight, c1, w1++);
    while (w0 < b0) emit(op::backward_weight, c0, w0++);
  }
  (void)opt.unchecked;
  return s;
}

}  // namespace weft::pipeline
