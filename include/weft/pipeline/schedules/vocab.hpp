// weft/pipeline/schedules/vocab.hpp — the vocabulary-balanced 1F1B schedules of "Balancing
// Pipeline Parallelism with Vocabulary Parallelism" (Yeung et al., MLSys 2025): the output layer
// split into S and T passes on every rank around the C0 all-reduce (1-barrier variant) or C0 and
// C1 (2-barrier variant), the input layer's IF/IB passes, and their broadcasts, all collectives in
// one global order.
#pragma once

#include <weft/pipeline/action.hpp>
#include <weft/pipeline/cost_model.hpp>
#include <weft/pipeline/detail/check.hpp>
#include <weft/pipeline/detail/deps.hpp>
#include <weft/pipeline/schedule.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace weft::pipeline {

//! The relative costs the generator plans with (per stage and microbatch; the vocabulary passes
//! per rank). They decide where S, T, IF and IB go between the transformer passes and where each
//! rank joins each collective; the schedule is valid whatever the real costs are.
struct vocab_plan_costs {
  double forward = 1.0;
  double backward = 2.0;
  double vocab_forward = 0.5;
  double vocab_backward = 0.25;
  double input_forward = 0.0;
  double input_backward = 0.0;
  double collective_latency = 0.0;
  double p2p = 0.0;
  //! Per-stage forward and backward times (size p) for stages whose costs differ; empty: every
  //! stage plans with `forward` and `backward`.
  std::vector<double> forward_per_stage{};
  std::vector<double> backward_per_stage{};
};

//! Planning costs taken from a cost model of the same shape (stage 0's F and B, its S/T/IF/IB).
inline vocab_plan_costs plan_costs(cost_model const& c) {
  vocab_plan_costs k;
  k.forward = c.forward.at(0);
  k.backward = c.backward_input.at(0) + c.backward_weight.at(0);
  k.vocab_forward = c.vocab_forward;
  k.vocab_backward = c.vocab_backward;
  k.input_forward = c.input_forward;
  k.input_backward = c.input_backward;
  k.collective_latency = c.collective_latency;
  k.p2p = c.p2p_time();
  return k;
}

struct vocab_options {
  vocab_plan_costs costs{};
  bool unchecked = false;
  //! Per rank (size p), the forwards it runs before its first backward, in [1, m]; empty: the
  //! schedule's own min(p - r - 1 + barriers, m). Deeper warm-ups hold more activations and can
  //! hide uneven stages (the schedule search varies them).
  std::vector<int> warmup{};
};

namespace detail {

//! Transformer order of vocabulary-parallel 1F1B on rank r: min(p-r-1+extra, m) warmup forwards
//! (extra = 1 or 2 barriers: the last stage waits for C0, or C1, before each backward, and every
//! rank fills that wait with forwards), then F/B pairs, then the remaining backwards.
inline std::vector<action> vocab_transformer_order(schedule const& s, int r, int extra,
                                                   std::vector<int> const& depth = {}) {
  int const p = s.num_ranks(), m = s.num_microbatches();
  int const warmup =
      depth.empty() ? std::min(p - r - 1 + extra, m) : depth[static_cast<std::size_t>(r)];
  std::vector<action> out;
  for (int i = 0; i < warmup; ++i) out.push_back(s.make(op::forward, r, i));
  for (int i = 0; i < m - warmup; ++i) {
    out.push_back(s.make(op::forward, r, warmup + i));
    out.push_back(s.make(op::backward, r, i));
  }
  for (int i = m - warmup; i < m; ++i) out.push_back(s.make(op::backward, r, i));
  return out;
}

}  // namespace detail

//! Vocabulary-balanced 1F1B on p ranks with `barriers` = vocab_variant::one_barrier (default in
//! the paper's code: S computes the input-gradient partial, C0 completes it; peak in-flight
//! p-r+1) or two_barrier (T computes it, C1 completes it; p-r+2). Built by list-scheduling every
//! rank with `opt.costs`: the transformer passes keep their 1F1B order; S, T, IB run as soon as
//! their inputs arrive, before any transformer pass that is ready at the same time (so S(i) runs
//! at nearly the same time everywhere and C0 does not stall the last stage, the aim of the
//! paper's BSF/BFS placement); rank r runs IF(i)
//! once i <= (its forwards so far) + r + 1 (r+1 up front, as in the paper's code). Each rank
//! joins collective k after exactly the passes that finished by k's planned start, which gives
//! one global collective order that cannot deadlock. Rejects p < 2 and m < p unless unchecked.
inline schedule vocab_one_f_one_b(int p, int m, vocab_variant barriers, vocab_options opt = {}) {
  detail::require(barriers == vocab_variant::one_barrier || barriers == vocab_variant::two_barrier,
                  "barriers", "one_barrier or two_barrier", to_string(barriers),
                  "a vocabulary-parallel variant");
  detail::require(p >= 1, "p", ">= 1", p, "p >= 1");
  detail::require(m >= 1, "m", ">= 1", m, "m >= 1");
  if (!opt.unchecked) {
    detail::require(p >= 2, "p", ">= 2 (vocabulary parallelism shards over the pipeline)", p,
                    "p >= 2");
    detail::require(m >= p, "m", ::weft::detail::concat(">= p (", p, ")"), m, "m >= p");
  }
  auto const& k = opt.costs;
  detail::require(k.forward > 0 && k.backward > 0, "costs.forward/backward", "> 0", k.forward,
                  "positive costs");
  detail::require(k.vocab_forward >= 0 && k.vocab_backward >= 0 && k.input_forward >= 0 &&
                      k.input_backward >= 0 && k.collective_latency >= 0 && k.p2p >= 0,
                  "costs", ">= 0", k.vocab_forward, "non-negative costs");
  auto const P = static_cast<std::size_t>(p);
  for (auto const* v : {&k.forward_per_stage, &k.backward_per_stage}) {
    detail::require(v->empty() || v->size() == P, "costs.forward_per_stage/backward_per_stage",
                    ::weft::detail::concat("empty or size p (", p, ")"), v->size(),
                    "per-stage planning costs sized p");
    for (double x : *v)
      detail::require(x > 0, "costs.forward_per_stage/backward_per_stage", "> 0", x,
                      "positive per-stage costs");
  }
  detail::require(opt.warmup.empty() || opt.warmup.size() == P, "warmup",
                  ::weft::detail::concat("empty or size p (", p, ")"), opt.warmup.size(),
                  "a warm-up depth per rank");
  for (int w : opt.warmup)
    detail::require(w >= 1 && w <= m, "warmup", ::weft::detail::concat("in [1, m (", m, ")]"), w,
                    "warm-up depths within the microbatches");

  schedule s(p, p, m, placement::loop, barriers);
  int const extra = barriers == vocab_variant::one_barrier ? 1 : 2;
  // Strictly positive planning durations keep "finished by" and "started after" apart.
  double const eps = 1e-6 * (k.forward + k.backward);
  auto dur = [&](op kind, int stage) {
    auto const st = static_cast<std::size_t>(stage);
    switch (kind) {
      case op::forward: return k.forward_per_stage.empty() ? k.forward : k.forward_per_stage[st];
      case op::backward:
        return k.backward_per_stage.empty() ? k.backward : k.backward_per_stage[st];
      case op::vocab_forward: return std::max(k.vocab_forward, eps);
      case op::vocab_backward: return std::max(k.vocab_backward, eps);
      case op::input_forward: return std::max(k.input_forward, eps);
      case op::input_backward: return std::max(k.input_backward, eps);
      default: return 0.0;
    }
  };
  double const coll_c = std::max(k.collective_latency, eps);
  double const inf = std::numeric_limits<double>::infinity();

  // Streams per rank: 0 transformer (fixed order), 1 S, 2 T, 3 IF, 4 IB.
  constexpr int kStreams = 5;
  constexpr op vocab_ops[] = {op::forward, op::vocab_forward, op::vocab_backward, op::input_forward,
                              op::input_backward};
  std::vector<std::vector<action>> transformer(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r)
    transformer[static_cast<std::size_t>(r)] =
        detail::vocab_transformer_order(s, r, extra, opt.warmup);
  std::vector<std::array<int, kStreams>> head(static_cast<std::size_t>(p),
                                              std::array<int, kStreams>{});
  std::vector<int> forwards(static_cast<std::size_t>(p), 0);
  std::vector<double> free_at(static_cast<std::size_t>(p), 0.0);
  std::vector<std::vector<std::pair<action, double>>> order(
      static_cast<std::size_t>(p));  // action, finish

  // Finish times: transformer (op, stage, mb) and vocabulary (op, rank, mb) passes.
  auto slot = [&](op kind, int stage, int mb) {
    return (static_cast<std::size_t>(kind) * static_cast<std::size_t>(p) +
            static_cast<std::size_t>(stage)) *
               static_cast<std::size_t>(m) +
           static_cast<std::size_t>(mb);
  };
  std::vector<double> finish(13u * static_cast<std::size_t>(p) * static_cast<std::size_t>(m), inf);
  // Collective planned start times (before latency), per tag and microbatch.
  auto cslot = [&](collective_kind t, int mb) {
    return static_cast<std::size_t>(t) * static_cast<std::size_t>(m + 1) +
           static_cast<std::size_t>(mb);
  };
  std::vector<double> coll_start(6u * static_cast<std::size_t>(m + 1), inf);

  auto finished = [&](op kind, int stage, int mb) -> double {
    if (stage < 0 || stage >= p || mb < 0 || mb >= m) return inf;
    return finish[slot(kind, stage, mb)];
  };
  // A collective's start once all its inputs are planned: max of its local preconditions over
  // ranks (and, for BX, the previous C0 on the last stage).
  auto collective_start = [&](collective_kind t, int mb) -> double {
    double at = 0;
    auto need_done = [&](double x) { at = std::max(at, x); };
    switch (t) {
      case collective_kind::broadcast_output:
        if (mb < m) need_done(finished(op::forward, p - 1, mb));
        if (mb > 0) {
          double const c0 = coll_start[cslot(collective_kind::c0, mb - 1)];
          need_done(c0 + coll_c);
        }
        break;
      case collective_kind::c0:
        for (int r = 0; r < p; ++r) need_done(finished(op::vocab_forward, r, mb));
        break;
      case collective_kind::c1:
        for (int r = 0; r < p; ++r) need_done(finished(op::vocab_backward, r, mb));
        break;
      case collective_kind::reduce_input:
        for (int r = 0; r < p; ++r) need_done(finished(op::input_forward, r, mb));
        break;
      case collective_kind::broadcast_input: need_done(finished(op::backward, 0, mb)); break;
      case collective_kind::none: return inf;
    }
    return at;
  };
  // Until nothing changes: BX(i) waits for C0(i-1), which may become known in the same pass.
  auto refresh_collectives = [&] {
    for (bool changed = true; changed;) {
      changed = false;
      for (collective_kind t :
           {collective_kind::broadcast_output, collective_kind::c0, collective_kind::c1,
            collective_kind::reduce_input, collective_kind::broadcast_input}) {
        if (t == collective_kind::c1 && barriers != vocab_variant::two_barrier) continue;
        int const n = t == collective_kind::broadcast_output ? m + 1 : m;
        for (int mb = 0; mb < n; ++mb) {
          auto& c = coll_start[cslot(t, mb)];
          if (c == inf) {
            c = collective_start(t, mb);
            changed = changed || c != inf;
          }
        }
      }
    }
  };
  // When the inputs of `a` on rank r are there (inf if not planned yet).
  auto ready_at = [&](action const& a, int r) -> double {
    double at = 0;
    for (auto const& n : detail::needs_of(s, a, r)) {
      double x;
      if (n.what == detail::need::type::collective) {
        double const c = (n.mb >= 0 && n.mb <= m) ? coll_start[cslot(n.tag, n.mb)] : inf;
        x = c + coll_c;
      } else {
        int const owner = detail::owner_rank(s, n.kind, n.stage);
        x = finished(n.what == detail::need::type::grad ? op::backward : n.kind, n.stage, n.mb);
        if (owner != r) x += k.p2p;
      }
      at = std::max(at, x);
    }
    return at;
  };
  auto candidate = [&](int r, int stream) -> std::optional<action> {
    auto const ri = static_cast<std::size_t>(r);
    int const h = head[ri][static_cast<std::size_t>(stream)];
    if (stream == 0) {
      auto const& q = transformer[ri];
      if (h >= static_cast<int>(q.size())) return std::nullopt;
      return q[static_cast<std::size_t>(h)];
    }
    if (h >= m) return std::nullopt;
    if (stream == 3 && h > forwards[ri] + r + 1) return std::nullopt;  // IF lookahead
    return s.make(vocab_ops[stream], r, h);
  };

  std::size_t remaining = 0;
  for (int r = 0; r < p; ++r)
    remaining += transformer[static_cast<std::size_t>(r)].size() + 4u * static_cast<std::size_t>(m);
  refresh_collectives();
  while (remaining > 0) {
    int best_rank = -1, best_stream = -1;
    double best_est = inf;
    for (int r = 0; r < p; ++r) {
      auto const ri = static_cast<std::size_t>(r);
      // This rank's pick: among passes ready when it frees up, the vocabulary ones first (S, T,
      // IF, IB: S gates C0, which every rank and the last stage's backward wait on); otherwise
      // the one that can start earliest.
      int pick = -1;
      double pick_est = inf;
      bool pick_now = false;
      for (int stream : {1, 2, 3, 4, 0}) {
        auto const a = candidate(r, stream);
        if (!a) continue;
        double const est = std::max(free_at[ri], ready_at(*a, r));
        if (est == inf) continue;
        bool const now = est <= free_at[ri];
        if ((now && !pick_now) || (now == pick_now && est < pick_est)) {
          pick = stream;
          pick_est = est;
          pick_now = now;
        }
      }
      if (pick >= 0 && pick_est < best_est) {
        best_est = pick_est;
        best_rank = r;
        best_stream = pick;
      }
    }
    if (best_rank < 0)
      WEFT_THROW(schedule_error, "vocab_one_f_one_b: internal planning stalled (p=", p, ", m=", m,
                 ")");
    auto const ri = static_cast<std::size_t>(best_rank);
    action const a = *candidate(best_rank, best_stream);
    double const end = best_est + dur(a.kind, a.stage);
    finish[slot(a.kind, a.stage, a.microbatch)] = end;
    free_at[ri] = end;
    order[ri].emplace_back(a, end);
    ++head[ri][static_cast<std::size_t>(best_stream)];
    if (a.kind == op::forward) ++forwards[ri];
    --remaining;
    refresh_collectives();
  }

  // The global collective order: by planned start, ties in a fixed (microbatch, kind) order that
  // respects BX(i) after C0(i-1) after S(i) after BX(i).
  std::vector<std::tuple<double, int, int, action>> colls;
  for (auto const& c : detail::required_collectives(s)) {
    int rank_of_kind = 0;
    switch (c.tag) {
      case collective_kind::reduce_input: rank_of_kind = 0; break;
      case collective_kind::broadcast_output: rank_of_kind = 1; break;
      case collective_kind::c0: rank_of_kind = 2; break;
      case collective_kind::c1: rank_of_kind = 3; break;
      case collective_kind::broadcast_input: rank_of_kind = 4; break;
      case collective_kind::none: break;
    }
    colls.emplace_back(coll_start[cslot(c.tag, c.microbatch)], c.microbatch, rank_of_kind, c);
  }
  std::sort(colls.begin(), colls.end(), [](auto const& x, auto const& y) {
    return std::tie(std::get<0>(x), std::get<1>(x), std::get<2>(x)) <
           std::tie(std::get<0>(y), std::get<1>(y), std::get<2>(y));
  });
  // Each rank joins collective k after the passes that finished by k's start.
  for (int r = 0; r < p; ++r) {
    auto const ri = static_cast<std::size_t>(r);
    std::size_t i = 0;
    auto const& ops = order[ri];
    for (auto const& [start, mb, kind_rank, c] : colls) {
      (void)mb;
      (void)kind_rank;
      while (i < ops.size() && ops[i].second <= start) s.push(r, ops[i++].first);
      s.push(r, c);
    }
    while (i < ops.size()) s.push(r, ops[i++].first);
  }
  return s;
}

}  // namespace weft::pipeline
