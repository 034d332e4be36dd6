// weft/pipeline/search/list_scheduler.hpp — a priority-driven list scheduler for zero-bubble
// style schedules (F, I, W on p ranks, one stage each): an event simulation in which every rank,
// when it frees up, runs the ready action its policy prefers, within an in-flight cap and a
// memory limit. One of the candidate generators of search.hpp.
#pragma once

#include <weft/core/error.hpp>
#include <weft/pipeline/action.hpp>
#include <weft/pipeline/cost_model.hpp>
#include <weft/pipeline/schedule.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace weft::pipeline::search {

//! How a rank chooses among its ready actions. Every rank runs its F, I and W in increasing
//! microbatch order (validate's FIFO rule), so a rank only ever chooses between three candidates:
//! its next F, its next I and its next W.
struct list_policy {
  //! When W runs. `eager`: as soon as its I is done (the fused backward of 1F1B); `filler`: only
  //! when no F or I is ready (ZB-H1/H2: deferred W fill the bubbles), or when the in-flight cap
  //! or the memory limit stops the next F.
  enum class w_mode : std::uint8_t { eager, filler };
  //! The in-flight cap (stage-microbatches from F to W) on rank r before the memory limit:
  //! `staggered`: p - r + extra (1F1B's warm-up depth plus `extra`); `uniform`: p + extra on every
  //! rank (ZB-H1 holds p everywhere, ZB-H2 2p - 1).
  enum class cap_mode : std::uint8_t { staggered, uniform };

  w_mode w = w_mode::filler;
  cap_mode cap = cap_mode::staggered;
  int extra = 0;               //!< added to the cap; may be negative (at least 1 stays)
  bool backward_first = true;  //!< when F and I are both ready, run I (1F1B) or F (GPipe)
  //! With `filler`, a W starts only if no F or I whose inputs are already scheduled becomes ready
  //! before the W would finish (keeps a short gap from delaying the critical path).
  bool w_fits_gap = false;

  [[nodiscard]] std::string name() const {
    return ::weft::detail::concat(
        "list(", w == w_mode::eager ? "W eager" : (w_fits_gap ? "W fills gaps" : "W deferred"),
        ", cap ", cap == cap_mode::staggered ? "p-r" : "p", extra >= 0 ? "+" : "", extra, ", ",
        backward_first ? "I first" : "F first", ")");
  }
};

//! Per-rank limits the list scheduler keeps: at most `max_in_flight[r]` stage-microbatches and
//! `max_activation_bytes[r]` activation bytes between F and W. Empty vectors: no limit.
struct list_limits {
  std::vector<int> max_in_flight;
  std::vector<double> max_activation_bytes;
};

//! Builds a compute-only split-backward schedule (p ranks, p stages, every backward as I then W)
//! by list scheduling under `costs` (forward, backward_input, backward_weight per stage, the
//! point-to-point time, activation bytes per stage). Costs must be sized p with F and I > 0 and
//! W >= 0 (search_schedule checks them). The schedule is valid by construction; its timing under
//! `simulate(s, costs)` is the one planned here.
inline schedule list_schedule(int p, int m, cost_model const& costs, list_policy const& policy,
                              list_limits const& limits = {}) {
  WEFT_EXPECTS(p >= 1, "p", ">= 1", p);
  WEFT_EXPECTS(m >= 1, "m", ">= 1", m);
  auto const P = static_cast<std::size_t>(p);
  WEFT_EXPECTS(costs.forward.size() == P && costs.backward_input.size() == P &&
                   costs.backward_weight.size() == P,
               "costs.forward/backward_input/backward_weight.size()",
               ::weft::detail::concat("p (", p, ")"), costs.forward.size());
  double const inf = std::numeric_limits<double>::infinity();
  double const p2p = costs.p2p_time();
  auto act = [&](int r) {
    auto const i = static_cast<std::size_t>(r);
    return i < costs.activation_bytes.size() ? costs.activation_bytes[i] : 0.0;
  };

  schedule s(p, p, m);
  auto const M = static_cast<std::size_t>(m);
  std::vector<double> f_done(P * M, inf), i_done(P * M, inf);
  auto at = [M](int r, int mb) {
    return static_cast<std::size_t>(r) * M + static_cast<std::size_t>(mb);
  };
  std::vector<int> nf(P, 0), ni(P, 0), nw(P, 0);
  std::vector<double> bytes(P, 0.0), wake(P, 0.0);
  std::vector<char> blocked(P, 0);
  std::vector<int> cap(P);
  for (int r = 0; r < p; ++r) {
    int const base = policy.cap == list_policy::cap_mode::staggered ? p - r : p;
    int c = std::max(1, base + policy.extra);
    auto const ri = static_cast<std::size_t>(r);
    if (ri < limits.max_in_flight.size()) c = std::min(c, std::max(1, limits.max_in_flight[ri]));
    cap[ri] = c;
  }
  auto bytes_ok = [&](int r) {
    auto const ri = static_cast<std::size_t>(r);
    if (ri >= limits.max_activation_bytes.size()) return true;
    // One activation always fits: search_schedule refuses a limit below it.
    return nw[ri] == nf[ri] || bytes[ri] + act(r) <= limits.max_activation_bytes[ri] * (1 + 1e-12);
  };

  std::size_t remaining = 3 * P * M;
  while (remaining > 0) {
    int r = -1;
    for (int q = 0; q < p; ++q) {
      auto const qi = static_cast<std::size_t>(q);
      if (blocked[qi] || nw[qi] == m) continue;
      if (r < 0 || wake[qi] < wake[static_cast<std::size_t>(r)]) r = q;
    }
    if (r < 0)
      WEFT_THROW(schedule_error, "list_schedule: internal planning stalled (p=", p, ", m=", m, ", ",
                 policy.name(), ")");
    auto const ri = static_cast<std::size_t>(r);
    double const t = wake[ri];
    // When each candidate's inputs are there (inf: its producer is not scheduled yet).
    double ready_f = inf, ready_i = inf, ready_w = inf;
    bool const f_allowed = nf[ri] < m && nf[ri] - nw[ri] < cap[ri] && bytes_ok(r);
    if (f_allowed) ready_f = r == 0 ? 0.0 : f_done[at(r - 1, nf[ri])] + p2p;
    if (ni[ri] < nf[ri]) {
      ready_i = f_done[at(r, ni[ri])];
      if (r < p - 1) ready_i = std::max(ready_i, i_done[at(r + 1, ni[ri])] + p2p);
    }
    if (nw[ri] < ni[ri]) ready_w = i_done[at(r, nw[ri])];
    bool const f_now = ready_f <= t, i_now = ready_i <= t, w_now = ready_w <= t;
    double const w_cost = costs.backward_weight[ri];
    op pick = op::collective;  // none
    if (policy.w == list_policy::w_mode::eager && w_now) {
      pick = op::backward_weight;
    } else if (f_now || i_now) {
      if (f_now && i_now)
        pick = policy.backward_first ? op::backward_input : op::forward;
      else
        pick = f_now ? op::forward : op::backward_input;
    } else if (w_now) {
      bool const fits = !policy.w_fits_gap || std::min(ready_f, ready_i) >= t + w_cost;
      // A W that frees the slot the next F waits for always runs.
      bool const frees = nf[ri] < m && !f_allowed;
      if (fits || frees) pick = op::backward_weight;
    }
    if (pick == op::collective) {
      double const next = std::min({ready_f, ready_i, ready_w});
      if (next < inf) {
        // Nothing to run now: wake when the earliest known input arrives (a W skipped for a
        // gap wakes when the gap closes).
        double later = inf;
        for (double x : {ready_f, ready_i, ready_w})
          if (x > t) later = std::min(later, x);
        wake[ri] = later < inf ? later : t;
        if (later == inf) blocked[ri] = 1;  // only a skipped W now: wait for news
      } else {
        blocked[ri] = 1;
      }
      continue;
    }
    double finish = t;
    switch (pick) {
      case op::forward:
        finish = t + costs.forward[ri];
        f_done[at(r, nf[ri])] = finish;
        bytes[ri] += act(r);
        s.push(r, s.make(op::forward, r, nf[ri]++));
        break;
      case op::backward_input:
        finish = t + costs.backward_input[ri];
        i_done[at(r, ni[ri])] = finish;
        s.push(r, s.make(op::backward_input, r, ni[ri]++));
        break;
      default:
        finish = t + w_cost;
        bytes[ri] -= act(r);
        s.push(r, s.make(op::backward_weight, r, nw[ri]++));
        break;
    }
    wake[ri] = finish;
    --remaining;
    // News for every waiting rank: re-examine it at the time it stopped.
    for (auto& b : blocked) b = 0;
  }
  return s;
}

}  // namespace weft::pipeline::search
