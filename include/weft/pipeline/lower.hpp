// weft/pipeline/lower.hpp — turns a compute-only schedule into an executable one: a SEND/RECV
// pair for every dependency between ranks, ordered so the schedule cannot deadlock (rank-parity
// rule for pairs of ranks that exchange in both directions), with the collectives kept in their
// one global order, and each SEND placed early enough that, under the cost model lowered for, it
// delays no receiver where a deadlock-free order allows it.
#pragma once

#include <weft/core/error.hpp>
#include <weft/pipeline/action.hpp>
#include <weft/pipeline/cost_model.hpp>
#include <weft/pipeline/detail/deps.hpp>
#include <weft/pipeline/schedule.hpp>
#include <weft/pipeline/simulate.hpp>
#include <weft/pipeline/validate.hpp>  // replay semantics: recv_for_need, partner_of; check

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <tuple>
#include <vector>

namespace weft::pipeline {

namespace detail {

//! Demand-driven construction: replays the compute-only schedule in lock-step and, whenever a
//! rank waits for data whose producer has run, appends the SEND to the producer's program and the
//! RECV to the consumer's at that moment. The construction is itself a rendezvous execution, so
//! the result cannot deadlock; pairs between the same two ranks in one step go lower-rank-
//! receives-first.
inline schedule lower_by_replay(schedule const& s) {
  int const p = s.num_ranks();
  action_index const index(s);
  schedule out(s.num_ranks(), s.num_stages(), s.num_microbatches(), s.style(), s.vocab());
  std::vector<std::size_t> pos(static_cast<std::size_t>(p), 0);
  std::vector<std::vector<char>> done(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) done[static_cast<std::size_t>(r)].assign(s.actions(r).size(), 0);
  // Messages delivered: key (recv kind, stage, mb) -> received.
  std::vector<char> received(2u * static_cast<std::size_t>(s.num_stages()) *
                                 static_cast<std::size_t>(s.num_microbatches()),
                             0);
  auto recv_slot = [&](action const& rv) {
    return (static_cast<std::size_t>(rv.kind == op::recv_backward) *
                static_cast<std::size_t>(s.num_stages()) +
            static_cast<std::size_t>(rv.stage)) *
               static_cast<std::size_t>(s.num_microbatches()) +
           static_cast<std::size_t>(rv.microbatch);
  };
  auto is_done = [&](int rank, int i) {
    return rank >= 0 && i >= 0 &&
           done[static_cast<std::size_t>(rank)][static_cast<std::size_t>(i)] != 0;
  };
  // Needs of `a` on rank r: satisfied, or the RECVs still missing (with producers done) via
  // `wanted`.
  auto ready = [&](action const& a, int r, std::vector<action>* wanted) {
    bool ok = true;
    for (auto const& n : needs_of(s, a, r)) {
      if (n.what == need::type::collective) {
        ok = ok && is_done(r, index.collective_pos(r, n.tag, n.mb));
        continue;
      }
      auto const l = index.resolve(n);
      if (l.count == 0) return false;
      if (l.rank == r) {
        ok = ok && is_done(l.rank, l.pos);
        continue;
      }
      action rv;
      if (!is_compute(a.kind) || !recv_for_need(a, n, rv)) return false;
      rv = s.make(rv.kind, rv.stage, rv.microbatch);
      if (received[recv_slot(rv)]) continue;
      ok = false;
      if (wanted != nullptr && is_done(l.rank, l.pos)) wanted->push_back(rv);
    }
    return ok;
  };
  std::size_t remaining = s.total_actions();
  while (remaining > 0) {
    bool progress = false;
    // Compute: at most one per rank per step, so the lock-step resembles unit time.
    for (int r = 0; r < p; ++r) {
      auto const ri = static_cast<std::size_t>(r);
      if (pos[ri] >= s.actions(r).size()) continue;
      auto const& a = s.actions(r)[pos[ri]];
      if (is_compute(a.kind) && ready(a, r, nullptr)) {
        out.push(r, a);
        done[ri][pos[ri]++] = 1;
        --remaining;
        progress = true;
      }
    }
    // Collectives: once every rank stands at the same one with its preconditions met.
    {
      action const* first = pos[0] < s.actions(0).size() ? &s.actions(0)[pos[0]] : nullptr;
      bool all = first != nullptr && first->kind == op::collective;
      for (int r = 0; r < p && all; ++r) {
        auto const ri = static_cast<std::size_t>(r);
        all = pos[ri] < s.actions(r).size() && s.actions(r)[pos[ri]] == *first &&
              ready(*first, r, nullptr);
      }
      if (all) {
        for (int r = 0; r < p; ++r) {
          auto const ri = static_cast<std::size_t>(r);
          out.push(r, s.actions(r)[pos[ri]]);
          done[ri][pos[ri]++] = 1;
          --remaining;
        }
        progress = true;
      }
    }
    // Messages the waiting ranks need and can have now.
    std::vector<std::tuple<int, int, int, action>> pairs;  // (low, high, receiver-is-high, recv)
    for (int r = 0; r < p; ++r) {
      auto const ri = static_cast<std::size_t>(r);
      if (pos[ri] >= s.actions(r).size()) continue;
      auto const& a = s.actions(r)[pos[ri]];
      if (!is_compute(a.kind)) continue;
      std::vector<action> wanted;
      ready(a, r, &wanted);
      for (auto const& rv : wanted)
        pairs.emplace_back(std::min(r, rv.peer), std::max(r, rv.peer), r > rv.peer, rv);
    }
    std::stable_sort(pairs.begin(), pairs.end(), [](auto const& x, auto const& y) {
      return std::tuple{std::get<0>(x), std::get<1>(x), std::get<2>(x)} <
             std::tuple{std::get<0>(y), std::get<1>(y), std::get<2>(y)};
    });
    for (auto const& [lo, hi, high_receives, rv] : pairs) {
      (void)lo;
      (void)hi;
      (void)high_receives;
      auto const send = partner_of(rv);
      out.push(rv.peer, s.make(send.kind, send.stage, send.microbatch));
      out.push(owner_rank(s, rv.kind, rv.stage), rv);
      received[recv_slot(rv)] = 1;
      progress = true;
    }
    if (!progress) {
      std::string stuck;
      for (int r = 0; r < p; ++r)
        if (pos[static_cast<std::size_t>(r)] < s.actions(r).size())
          stuck += ::weft::detail::concat(
              " rank ", r, " at #", pos[static_cast<std::size_t>(r)], " ",
              to_string(s.actions(r)[pos[static_cast<std::size_t>(r)]]), ";");
      WEFT_THROW(schedule_error,
                 "lower: the compute schedule cannot progress (rule `deadlock`); waiting:", stuck);
    }
  }
  return out;
}

//! Placement by time. The replay above is a lock-step in which every compute takes one step, so
//! when a backward costs two forwards (interleaved 1F1B) a receiver starts waiting a step or two
//! after its data was made and the SEND lands after one or two later computes of the sender: an
//! executor that runs the program in order sends that much late (measured: interleaved 1F1B at
//! p = 4 ran 9-12 % over its compute-only simulation). Here the compute-only schedule is simulated
//! under `costs` and each message is placed by the times found: the RECV right before its
//! consumer, the SEND after the last compute of the sender that ends by the consumer's start less
//! the transfer time (so it is on time under `costs`, and as late as that allows, which keeps
//! rendezvous waits short), ops between the same two computes by consumer start, ties lower-rank-
//! receives-first. Nothing guarantees that this order is deadlock-free under rendezvous semantics
//! (collectives act as barriers there: the vocabulary schedules' usually is not); lower() keeps
//! it only when validate accepts it.
inline schedule lower_by_time(schedule const& s, cost_model const& costs) {
  int const p = s.num_ranks();
  auto const sim = simulate(s, costs);
  action_index const index(s);
  double const p2p = costs.p2p_time();
  struct placed {
    std::size_t before = 0;  // index in the compute-only program it goes before
    double key = 0;          // the consumer's start
    int tie = 0;             // equal keys: the lower rank of a pair receives first
    action a{};
  };
  std::vector<std::vector<placed>> ops(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) {
    auto const ri = static_cast<std::size_t>(r);
    auto const& prog = s.actions(r);
    for (std::size_t j = 0; j < prog.size(); ++j) {
      auto const& consumer = prog[j];
      if (!is_compute(consumer.kind)) continue;
      for (auto const& n : needs_of(s, consumer, r)) {
        if (n.what == need::type::collective) continue;
        auto const l = index.resolve(n);
        action rv;
        if (l.count == 0 || l.rank == r || !recv_for_need(consumer, n, rv)) continue;
        rv = s.make(rv.kind, rv.stage, rv.microbatch);
        auto const sd = partner_of(rv);
        auto const send = s.make(sd.kind, sd.stage, sd.microbatch);
        double const key = sim.times[ri][j].start;
        double const deadline = key - p2p + 1e-9 * (1.0 + std::abs(key));
        auto const li = static_cast<std::size_t>(l.rank);
        auto const& from = s.actions(l.rank);
        auto const produced = static_cast<std::size_t>(l.pos);
        std::size_t before = produced + 1;
        for (std::size_t k = produced + 1; k < from.size(); ++k)
          if (is_compute(from[k].kind) && sim.times[li][k].finish <= deadline) before = k + 1;
        ops[ri].push_back({j, key, r < l.rank ? 0 : 1, rv});
        ops[li].push_back({before, key, l.rank < r ? 1 : 0, send});
      }
    }
  }
  schedule out(s.num_ranks(), s.num_stages(), s.num_microbatches(), s.style(), s.vocab());
  for (int r = 0; r < p; ++r) {
    auto& mine = ops[static_cast<std::size_t>(r)];
    std::stable_sort(mine.begin(), mine.end(), [](placed const& x, placed const& y) {
      return std::tuple{x.before, x.key, x.tie, x.a.peer, x.a.stage, x.a.microbatch} <
             std::tuple{y.before, y.key, y.tie, y.a.peer, y.a.stage, y.a.microbatch};
    });
    auto const& prog = s.actions(r);
    std::size_t k = 0;
    for (std::size_t j = 0; j <= prog.size(); ++j) {
      for (; k < mine.size() && mine[k].before == j; ++k) out.push(r, mine[k].a);
      if (j < prog.size()) out.push(r, prog[j]);
    }
  }
  return out;
}

}  // namespace detail

//! Lowers a compute-only schedule (no SEND/RECV) to one with explicit point-to-point ops: each
//! RECV right before the action that needs it, exchanges between two ranks in one step lower-rank-
//! receives-first (the rank-parity rule), and the result passes `validate` (its rendezvous replay
//! included). Two constructions: the demand-driven replay (detail::lower_by_replay: each SEND
//! where its rank stands when the receiver starts waiting; no pair straddles a collective; valid by
//! construction) and the placement by time under `costs` (detail::lower_by_time: each SEND early
//! enough to delay no receiver under `costs`). The second is returned when validate accepts it and
//! a lowered schedule runs faster with it under `costs` (simulate follows the program order of a
//! lowered schedule), the first otherwise: so the result is never slower under `costs` than the
//! replay's, and simulates exactly like `s` whenever the placement by time is valid (in the
//! tests: every generator at p <= 8 but the vocabulary-balanced ones, whose collectives stop it;
//! their lowered programs stay slower than their compute-only form). Under costs other than
//! `costs` SENDs can be late again: lower with the costs the schedule will run under. (The
//! executor posts its receives early and its sends without blocking, so any valid order is safe
//! to run; validate's rendezvous replay is the stricter rule, kept for blocking transports.)
//! `run_as`: the execution the result must be valid for (check's replay_model). The default,
//! rendezvous, suits any transport. replay_model::executor() lowers for weft's executor (receives
//! posted up front, sends that never block; its collectives overlapped or not): there the
//! vocabulary-balanced schedules' placement by time is valid (their messages keep their order in
//! each direction, not across the two), and their lowered programs simulate exactly like their
//! compute-only form (tests: p = 2, 3, 4, 8 up to m = 32), where the rendezvous lowering is up to
//! 1.9x slower. Validate such a program with the same model.
//! Throws schedule_error if `s` already has point-to-point ops, breaks validate's mapping rule, or
//! its dataflow cannot progress; what simulate throws for a cost model that does not cover `s`.
inline schedule lower(schedule const& s, cost_model const& costs, replay_model run_as = {}) {
  if (s.has_p2p())
    WEFT_THROW(schedule_error,
               "argument `s`: expected a compute-only schedule, actual one that already "
               "has SEND/RECV actions");
  detail::require_mapping(s, "lower");
  auto replayed = detail::lower_by_replay(s);
  if (s.num_ranks() == 1) return replayed;
  auto timed = detail::lower_by_time(s, costs);
  if (!check(timed, run_as).ok) return replayed;
  double const by_time = simulate(timed, costs).makespan;
  double const by_replay = simulate(replayed, costs).makespan;
  return by_time < by_replay - 1e-9 * (1.0 + by_replay) ? timed : replayed;
}

//! Lowers for the unit model in which the schedules are designed (F = I = W per stage, 1/v per
//! chunk, no output layer: unit_costs(s, 1, 1, 1, 0)); see the overload above.
inline schedule lower(schedule const& s, replay_model run_as = {}) {
  if (s.has_p2p())
    WEFT_THROW(schedule_error,
               "argument `s`: expected a compute-only schedule, actual one that already "
               "has SEND/RECV actions");
  detail::require_mapping(s, "lower");
  return lower(s, unit_costs(s, 1.0, 1.0, 1.0, 0.0), run_as);
}

}  // namespace weft::pipeline
