// weft/pipeline/search/search.hpp — schedule search: given a cost model (per-stage F, I, W,
// point-to-point time, activation and parameter bytes, optionally vocabulary passes) and a memory
// limit per rank, finds a schedule of small makespan that fits, from the hand-written generators,
// a list scheduler, Tessel-style repetends and a local search (with vocabulary passes: the
// vocabulary-parallel 1F1B family, re-planned). The result is an ordinary schedule.
#pragma once

#include <weft/core/error.hpp>
#include <weft/pipeline/action.hpp>
#include <weft/pipeline/cost_model.hpp>
#include <weft/pipeline/schedule.hpp>
#include <weft/pipeline/schedules/gpipe.hpp>
#include <weft/pipeline/schedules/one_f_one_b.hpp>
#include <weft/pipeline/schedules/vocab.hpp>
#include <weft/pipeline/schedules/zero_bubble.hpp>
#include <weft/pipeline/search/list_scheduler.hpp>
#include <weft/pipeline/search/repetend.hpp>
#include <weft/pipeline/simulate.hpp>
#include <weft/pipeline/validate.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace weft::pipeline::search {

struct search_options {
  //! Per rank, the most bytes it may hold: parameters plus peak activations, as
  //! simulation::peak_memory_bytes counts them (an activation lives from F to W, or B). Empty: no
  //! limit.
  std::vector<double> memory_limit;
  bool hand_seeds = true;   //!< include GPipe, 1F1B and ZB-H1 among the candidates
  bool list = true;         //!< the list scheduler over its policies
  int repetend_window = 2;  //!< repetends over up to this many microbatches (0: none; at most 3)
  //! Schedules the local search may time (0: no local search). Each costs one pass over the
  //! schedule's actions.
  int local_search_evaluations = 3000;
};

//! A schedule and what it was found by.
struct search_result {
  schedule best;   //!< compute-only, validated; lower() it for the executor
  simulation sim;  //!< simulate(best, costs)
  double makespan = 0;
  std::vector<double> peak_memory;  //!< per rank, sim.peak_memory_bytes
  std::string method;  //!< the generator of the winning candidate, "+ local search" if improved
  //! The fastest hand-written schedule (GPipe, 1F1B, ZB-H1) that fits, "" if none does.
  std::string best_hand;
  double best_hand_makespan = std::numeric_limits<double>::infinity();
  int candidates = 0;   //!< distinct schedules timed by the constructive generators
  int evaluations = 0;  //!< schedules timed by the local search
  int local_moves = 0;  //!< improvements it accepted
};

//! True when every rank's peak memory is within its limit (empty limit: always).
inline bool fits_memory(simulation const& sim, std::vector<double> const& limit) {
  for (std::size_t r = 0; r < limit.size() && r < sim.peak_memory_bytes.size(); ++r)
    if (sim.peak_memory_bytes[r] > limit[r] * (1 + 1e-12)) return false;
  return true;
}

//! The hand-written schedules the search starts from and is compared against: GPipe, 1F1B and
//! ZB-H1 on p ranks (1F1B and ZB-H1 unchecked when m < p).
inline std::vector<std::pair<std::string, schedule>> hand_schedules(int p, int m) {
  generator_options const o{m < p};
  return {
      {"gpipe", gpipe(p, m)}, {"1f1b", one_f_one_b(p, m, o)}, {"zb-h1", zero_bubble_h1(p, m, o)}};
}

namespace detail {

//! What the local search compares: makespan, then the sum of the ranks' finish times (so that a
//! move that frees a rank earlier without yet shortening the makespan is kept).
struct quick_timing {
  bool ok = false;
  double makespan = 0;
  double finish_sum = 0;
  std::vector<double> peak_bytes;  //!< activations + parameters per rank
};

//! simulate() specialised to what the search builds (compute-only, one stage per rank, F/I/W):
//! the same timing rules in flat arrays, for the local search's many trials. Accepted schedules
//! are re-timed and validated by simulate() and validate().
inline quick_timing quick_time(schedule const& s, cost_model const& c) {
  int const p = s.num_ranks(), m = s.num_microbatches();
  auto const P = static_cast<std::size_t>(p), M = static_cast<std::size_t>(m);
  double const inf = std::numeric_limits<double>::infinity();
  double const p2p = c.p2p_time();
  std::vector<double> f_done(P * M, inf), i_done(P * M, inf), clock(P, 0.0);
  std::vector<std::size_t> pos(P, 0);
  quick_timing out;
  out.peak_bytes.assign(P, 0.0);
  std::size_t remaining = s.total_actions();
  for (bool progress = true; progress && remaining > 0;) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      auto const ri = static_cast<std::size_t>(r);
      auto const& prog = s.actions(r);
      while (pos[ri] < prog.size()) {
        auto const& a = prog[pos[ri]];
        auto const k = ri * M + static_cast<std::size_t>(a.microbatch);
        double ready = clock[ri], cost = 0;
        if (a.kind == op::forward) {
          if (r > 0) ready = std::max(ready, f_done[k - M] + p2p);
          cost = c.forward[ri];
        } else if (a.kind == op::backward_input) {
          ready = std::max(ready, f_done[k]);
          if (r < p - 1) ready = std::max(ready, i_done[k + M] + p2p);
          cost = c.backward_input[ri];
        } else {
          ready = std::max(ready, i_done[k]);
          cost = c.backward_weight[ri];
        }
        if (ready == inf) break;
        clock[ri] = ready + cost;
        if (a.kind == op::forward) f_done[k] = clock[ri];
        if (a.kind == op::backward_input) i_done[k] = clock[ri];
        ++pos[ri];
        --remaining;
        progress = true;
      }
    }
  }
  if (remaining > 0) return out;
  out.ok = true;
  for (int r = 0; r < p; ++r) {
    auto const ri = static_cast<std::size_t>(r);
    out.makespan = std::max(out.makespan, clock[ri]);
    out.finish_sum += clock[ri];
    double const act = ri < c.activation_bytes.size() ? c.activation_bytes[ri] : 0.0;
    double bytes = 0, peak = 0;
    for (auto const& a : s.actions(r)) {
      if (a.kind == op::forward) bytes += act;
      if (a.kind == op::backward_weight) bytes -= act;
      peak = std::max(peak, bytes);
    }
    out.peak_bytes[ri] = peak + (ri < c.parameter_bytes.size() ? c.parameter_bytes[ri] : 0.0);
  }
  return out;
}

inline std::uint64_t fingerprint(schedule const& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (int r = 0; r < s.num_ranks(); ++r) {
    for (auto const& a : s.actions(r)) {
      h = (h ^ (static_cast<std::uint64_t>(a.kind) << 40 ^ static_cast<std::uint64_t>(a.tag) << 32 ^
                static_cast<std::uint64_t>(static_cast<std::uint32_t>(a.microbatch)))) *
          1099511628211ull;
    }
    h = (h ^ 0xffu) * 1099511628211ull;
  }
  return h;
}

//! Whether the costs describe vocabulary-parallel passes (S, T, IF, IB on every rank).
inline bool has_vocab_passes(cost_model const& c) noexcept {
  return c.vocab_forward > 0 || c.vocab_backward > 0 || c.input_forward > 0 || c.input_backward > 0;
}

inline void check_search_inputs(int p, int m, cost_model const& c, search_options const& o) {
  WEFT_EXPECTS(p >= 1, "p", ">= 1", p);
  WEFT_EXPECTS(m >= 1, "m", ">= 1", m);
  auto const P = static_cast<std::size_t>(p);
  auto const stages = ::weft::detail::concat("p (", p, ")");
  WEFT_EXPECTS(c.forward.size() == P, "costs.forward.size()", stages, c.forward.size());
  WEFT_EXPECTS(c.backward_input.size() == P, "costs.backward_input.size()", stages,
               c.backward_input.size());
  WEFT_EXPECTS(c.backward_weight.size() == P, "costs.backward_weight.size()", stages,
               c.backward_weight.size());
  WEFT_EXPECTS(c.activation_bytes.empty() || c.activation_bytes.size() == P,
               "costs.activation_bytes.size()", ::weft::detail::concat("0 or p (", p, ")"),
               c.activation_bytes.size());
  WEFT_EXPECTS(c.parameter_bytes.empty() || c.parameter_bytes.size() == P,
               "costs.parameter_bytes.size()", ::weft::detail::concat("0 or p (", p, ")"),
               c.parameter_bytes.size());
  WEFT_EXPECTS(o.memory_limit.empty() || o.memory_limit.size() == P, "options.memory_limit.size()",
               ::weft::detail::concat("0 (no limit) or p (", p, ")"), o.memory_limit.size());
  for (std::size_t r = 0; r < P; ++r) {
    WEFT_EXPECTS(c.forward[r] > 0, ::weft::detail::concat("costs.forward[", r, "]"), "> 0",
                 c.forward[r]);
    WEFT_EXPECTS(c.backward_input[r] > 0, ::weft::detail::concat("costs.backward_input[", r, "]"),
                 "> 0", c.backward_input[r]);
    WEFT_EXPECTS(c.backward_weight[r] >= 0,
                 ::weft::detail::concat("costs.backward_weight[", r, "]"), ">= 0",
                 c.backward_weight[r]);
  }
  WEFT_EXPECTS(c.p2p_time() >= 0, "costs.p2p_time()", ">= 0", c.p2p_time());
  for (auto [x, name] : {std::pair{c.vocab_forward, "costs.vocab_forward"},
                         std::pair{c.vocab_backward, "costs.vocab_backward"},
                         std::pair{c.input_forward, "costs.input_forward"},
                         std::pair{c.input_backward, "costs.input_backward"}})
    WEFT_EXPECTS(x >= 0, name, ">= 0", x);
  if (has_vocab_passes(c)) {
    WEFT_EXPECTS(p >= 2, "p",
                 ">= 2 when the costs have vocabulary passes (they shard the output layer over "
                 "the pipeline ranks)",
                 p);
    WEFT_EXPECTS(m >= p, "m",
                 ::weft::detail::concat(">= p (", p,
                                        ") when the costs have vocabulary passes (the "
                                        "vocabulary-parallel 1F1B needs it)"),
                 m);
  }
  WEFT_EXPECTS(o.repetend_window >= 0 && o.repetend_window <= 3, "options.repetend_window",
               "in [0, 3]", o.repetend_window);
  WEFT_EXPECTS(o.local_search_evaluations >= 0, "options.local_search_evaluations", ">= 0",
               o.local_search_evaluations);
  // Every schedule holds at least one activation of its stage on each rank.
  for (std::size_t r = 0; r < o.memory_limit.size(); ++r) {
    double const need = (r < c.activation_bytes.size() ? c.activation_bytes[r] : 0.0) +
                        (r < c.parameter_bytes.size() ? c.parameter_bytes[r] : 0.0);
    WEFT_EXPECTS(o.memory_limit[r] >= need, ::weft::detail::concat("options.memory_limit[", r, "]"),
                 ::weft::detail::concat(">= ", need,
                                        " (the parameters plus one microbatch's activations of "
                                        "stage ",
                                        r, ": no schedule needs less)"),
                 o.memory_limit[r]);
  }
}

//! One local-search move on rank r: the action at `from` moves to position `to`.
inline void move_action(std::vector<action>& prog, std::size_t from, std::size_t to) {
  auto const a = prog[from];
  if (from < to)
    std::copy(prog.begin() + static_cast<std::ptrdiff_t>(from) + 1,
              prog.begin() + static_cast<std::ptrdiff_t>(to) + 1,
              prog.begin() + static_cast<std::ptrdiff_t>(from));
  else
    std::copy_backward(prog.begin() + static_cast<std::ptrdiff_t>(to),
                       prog.begin() + static_cast<std::ptrdiff_t>(from),
                       prog.begin() + static_cast<std::ptrdiff_t>(from) + 1);
  prog[to] = a;
}

//! Whether moving prog[from] to `to` keeps the program well formed: no other action of the same
//! kind, and no action of the same microbatch (its producer or consumer on this stage), is jumped.
inline bool movable(std::vector<action> const& prog, std::size_t from, std::size_t to) {
  auto const lo = std::min(from, to), hi = std::max(from, to);
  for (std::size_t j = lo; j <= hi; ++j) {
    if (j == from) continue;
    if (prog[j].kind == prog[from].kind || prog[j].microbatch == prog[from].microbatch)
      return false;
  }
  return true;
}

}  // namespace detail

namespace detail {

//! The candidates a search has timed: keeps the fastest that fits the memory limit and validates,
//! and the fastest hand-written one that fits.
struct candidate_pool {
  cost_model const& costs;
  std::vector<double> const& limit;
  search_result& out;
  std::unordered_set<std::uint64_t> seen{};

  //! a faster than b by more than rounding (b infinite: a finite).
  static bool better(double a, double b) {
    double const inf = std::numeric_limits<double>::infinity();
    return b == inf ? a < inf : a < b - 1e-9 * std::max(1.0, b);
  }

  //! Times a candidate; keeps it if it fits, validates and beats the best so far. Returns the best
  //! makespan so far.
  double consider(schedule&& s, std::string const& method) {
    double const inf = std::numeric_limits<double>::infinity();
    if (!seen.insert(fingerprint(s)).second) return inf;
    ++out.candidates;
    simulation sim;
    try {
      sim = simulate(s, costs);
    } catch (schedule_error const&) {
      return inf;  // a repetend whose rank waits on a pass it runs later
    }
    if (!fits_memory(sim, limit)) return inf;
    if (better(sim.makespan, out.makespan) && check(s).ok) {
      out.makespan = sim.makespan;
      out.best = std::move(s);
      out.sim = std::move(sim);
      out.method = method;
    }
    return out.makespan;
  }

  //! A hand-written schedule: the bar the search must meet (when it fits), and a seed.
  void hand(schedule&& s, std::string const& name, bool seed) {
    auto const sim = simulate(s, costs);
    if (fits_memory(sim, limit) && better(sim.makespan, out.best_hand_makespan)) {
      out.best_hand = name;
      out.best_hand_makespan = sim.makespan;
    }
    if (seed) consider(std::move(s), name);
  }
};

//! The search when the costs have vocabulary passes (S, T, IF, IB on every rank, the output layer
//! sharded over the pipeline as in "Balancing Pipeline Parallelism with Vocabulary Parallelism"):
//! the hand-written schedules are vocab_one_f_one_b with one and two barriers, planned with its
//! default costs and with plan_costs(costs); the search plans the same family with each stage's
//! own F and B, the vocabulary passes weighted 1/2, 1 or 2 in the plan (which moves S and T between
//! the transformer passes), and warm-up depths shifted by -2..+3 from the schedule's own, per rank
//! or all ranks alike. Every candidate is simulated with the real costs and validated.
inline search_result search_vocab(int p, int m, cost_model const& costs,
                                  search_options const& options) {
  search_result out;
  out.makespan = std::numeric_limits<double>::infinity();
  candidate_pool pool{costs, options.memory_limit, out};
  auto const P = static_cast<std::size_t>(p);
  auto variant_name = [](vocab_variant v) {
    return std::string(v == vocab_variant::one_barrier ? "vocab-1f1b-1" : "vocab-1f1b-2");
  };
  for (auto v : {vocab_variant::one_barrier, vocab_variant::two_barrier}) {
    pool.hand(vocab_one_f_one_b(p, m, v), variant_name(v), options.hand_seeds);
    pool.hand(vocab_one_f_one_b(p, m, v, {plan_costs(costs), false}),
              variant_name(v) + " (planned)", options.hand_seeds);
  }
  if (options.list) {
    for (auto v : {vocab_variant::one_barrier, vocab_variant::two_barrier}) {
      int const extra = v == vocab_variant::one_barrier ? 1 : 2;
      for (bool per_stage : {false, true})
        for (double st : {0.5, 1.0, 2.0})
          for (int shift : {-2, -1, 0, 1, 2, 3})
            for (bool flat : {false, true}) {
              vocab_options o{plan_costs(costs), false, {}};
              if (per_stage) {
                o.costs.forward_per_stage = costs.forward;
                o.costs.backward_per_stage.resize(P);
                for (std::size_t r = 0; r < P; ++r)
                  o.costs.backward_per_stage[r] =
                      costs.backward_input[r] + costs.backward_weight[r];
              }
              o.costs.vocab_forward *= st;
              o.costs.vocab_backward *= st;
              o.warmup.resize(P);
              for (int r = 0; r < p; ++r) {
                int const own = (flat ? p - 1 : p - r - 1) + extra + shift;
                o.warmup[static_cast<std::size_t>(r)] = std::clamp(own, 1, m);
              }
              std::string name = ::weft::detail::concat(
                  variant_name(v), " plan(", per_stage ? "per-stage" : "stage-0", ", S/T x", st,
                  ", warm-up ", flat ? "flat " : "", shift >= 0 ? "+" : "", shift, ")");
              try {
                pool.consider(vocab_one_f_one_b(p, m, v, o), name);
              } catch (schedule_error const&) {
                // a plan the generator could not complete: not a candidate
              }
            }
    }
  }
  if (out.makespan == std::numeric_limits<double>::infinity())
    WEFT_THROW(schedule_error, "search_schedule: no candidate fits the memory limit (p=", p,
               ", m=", m, ")");
  out.peak_memory = out.sim.peak_memory_bytes;
  return out;
}

}  // namespace detail

//! Searches for the split-backward schedule (p ranks, one stage each, every backward as I then W)
//! of least simulated makespan under `costs` that fits `options.memory_limit`. Candidates, each
//! timed by simulate() and validated before it is kept:
//!  1. the hand-written GPipe, 1F1B and ZB-H1 (seeds: the result is never slower than the best of
//!     them that fits);
//!  2. list_schedule over its policies (W eager or deferred, in-flight cap staggered or uniform
//!     with several depths, I or F first), capped by the memory limit;
//!  3. repetend_schedule over every pattern of up to `repetend_window` microbatches, with several
//!     warm-up depths and W lags;
//! then a local search from the best: an action moved into an idle gap before it on its rank, or
//! a W moved past its neighbour, kept when the makespan (then the sum of the ranks' finish times)
//! drops and the memory still fits. Deterministic. Throws invalid_argument_error naming the
//! argument for p or m < 1, cost vectors not sized p, non-positive F or I, negative vocabulary-pass
//! costs, or a memory limit below one microbatch's activations plus the parameters.
//!
//! Costs with vocabulary passes (S, T, IF or IB > 0) select the vocabulary-parallel family instead
//! (detail::search_vocab: p >= 2, m >= p): the bar is vocab_one_f_one_b with one and two barriers,
//! and the candidates are the same generator planned with per-stage costs, reweighted vocabulary
//! passes and other warm-up depths (fused backward; no local search).
inline search_result search_schedule(int p, int m, cost_model const& costs,
                                     search_options const& options = {}) {
  detail::check_search_inputs(p, m, costs, options);
  if (detail::has_vocab_passes(costs)) return detail::search_vocab(p, m, costs, options);
  auto const P = static_cast<std::size_t>(p);
  auto const& limit = options.memory_limit;
  double const inf = std::numeric_limits<double>::infinity();

  search_result out;
  out.makespan = inf;
  detail::candidate_pool pool{costs, limit, out};
  auto better = detail::candidate_pool::better;
  auto consider = [&](schedule&& s, std::string const& method) {
    return pool.consider(std::move(s), method);
  };

  for (auto& [name, s] : hand_schedules(p, m)) pool.hand(std::move(s), name, options.hand_seeds);

  if (options.list) {
    list_limits lim;
    if (!limit.empty()) {
      lim.max_activation_bytes.resize(P);
      for (std::size_t r = 0; r < P; ++r)
        lim.max_activation_bytes[r] =
            limit[r] - (r < costs.parameter_bytes.size() ? costs.parameter_bytes[r] : 0.0);
    }
    std::vector<int> extras = {-1, 0, 1, 2, p / 2, p - 1, p, 2 * p, m};
    std::sort(extras.begin(), extras.end());
    extras.erase(std::unique(extras.begin(), extras.end()), extras.end());
    for (auto cap : {list_policy::cap_mode::staggered, list_policy::cap_mode::uniform})
      for (int extra : extras)
        for (bool backward_first : {true, false})
          for (auto w : {list_policy::w_mode::filler, list_policy::w_mode::eager})
            for (bool gap : {false, true}) {
              if (w == list_policy::w_mode::eager && gap) continue;
              list_policy const pol{w, cap, extra, backward_first, gap};
              consider(list_schedule(p, m, costs, pol, lim), pol.name());
            }
  }

  for (int k = 1; k <= options.repetend_window; ++k) {
    // Longer windows multiply the patterns: fewer depths for them.
    std::vector<int> const warm =
        k == 1 ? std::vector<int>{0, 1, 2, p / 2} : std::vector<int>{0, 1};
    std::vector<int> const lags = k == 1 ? std::vector<int>{0, 1, 2} : std::vector<int>{0, 1};
    for (auto const& pattern : repetend_patterns(k))
      for (auto wsh : {repetend::shape::staggered, repetend::shape::uniform})
        for (int we : warm)
          for (auto lsh : {repetend::shape::uniform, repetend::shape::rising})
            for (int le : lags) {
              repetend rep{pattern, wsh, wsh == repetend::shape::uniform ? we + p - 1 : we, lsh,
                           le};
              consider(repetend_schedule(p, m, rep), rep.name());
            }
  }

  if (out.makespan == inf)
    WEFT_THROW(schedule_error, "search_schedule: no candidate fits the memory limit (p=", p,
               ", m=", m, ")");

  // Local search from the best candidate.
  if (options.local_search_evaluations > 0) {
    schedule cur = out.best;
    auto cur_t = detail::quick_time(cur, costs);
    auto fits = [&](detail::quick_timing const& t) {
      for (std::size_t r = 0; r < limit.size(); ++r)
        if (t.peak_bytes[r] > limit[r] * (1 + 1e-12)) return false;
      return true;
    };
    auto improves = [&](detail::quick_timing const& t) {
      if (!t.ok || !fits(t)) return false;
      if (better(t.makespan, cur_t.makespan)) return true;
      return !better(cur_t.makespan, t.makespan) && better(t.finish_sum, cur_t.finish_sum);
    };
    bool moved = false;
    auto try_move = [&](int r, std::size_t from, std::size_t to) {
      auto& prog = cur.actions(r);
      if (!detail::movable(prog, from, to)) return false;
      detail::move_action(prog, from, to);
      ++out.evaluations;
      auto t = detail::quick_time(cur, costs);
      if (improves(t)) {
        cur_t = std::move(t);
        ++out.local_moves;
        moved = true;
        return true;
      }
      detail::move_action(prog, to, from);
      return false;
    };
    for (bool improved = true; improved && out.evaluations < options.local_search_evaluations;) {
      improved = false;
      auto const sim = simulate(cur, costs);
      for (int r = 0; r < p && out.evaluations < options.local_search_evaluations; ++r) {
        auto const ri = static_cast<std::size_t>(r);
        auto const& prog = cur.actions(r);
        auto const& times = sim.times[ri];
        for (std::size_t i = 0; i < prog.size() && !improved; ++i) {
          if (out.evaluations >= options.local_search_evaluations) break;
          double const prev = i == 0 ? 0.0 : times[i - 1].finish;
          if (times[i].start > prev + 1e-12) {
            // An idle gap before i: pull the next F, I or W after it into the gap.
            for (op k : {op::backward_weight, op::backward_input, op::forward}) {
              std::size_t j = i + 1;
              while (j < prog.size() && prog[j].kind != k) ++j;
              if (j < prog.size() && try_move(r, j, i)) {
                improved = true;
                break;
              }
            }
          } else if (prog[i].kind == op::backward_weight && i + 1 < prog.size() &&
                     prog[i + 1].kind != op::backward_weight) {
            // A W right before an F or I that may have been ready earlier: let it go first.
            if (try_move(r, i + 1, i)) improved = true;
          }
        }
      }
    }
    if (moved) {
      auto sim = simulate(cur, costs);
      if (fits_memory(sim, limit) && better(sim.makespan, out.makespan) && check(cur).ok) {
        out.makespan = sim.makespan;
        out.best = std::move(cur);
        out.sim = std::move(sim);
        out.method += " + local search";
      }
    }
  }
  out.peak_memory = out.sim.peak_memory_bytes;
  return out;
}

}  // namespace weft::pipeline::search
